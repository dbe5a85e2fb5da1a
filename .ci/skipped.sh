#!/bin/sh
# skipped.sh BUILD_DIR: after a ctest run, prints each test that was skipped with the reason it
# printed (its "SKIP: ..." line), so that a CI log says why, not only that, tests did not run
# (ctest lists a skipped test as "(Skipped)" and shows no output of it). A test says it skips
# with a line "SKIP: why" (and exit status 77); this reads ctest's own log of the last run,
# BUILD_DIR/Testing/Temporary/LastTest.log. Prints nothing when no test printed such a line.
log="${1:?usage: skipped.sh BUILD_DIR}/Testing/Temporary/LastTest.log"
[ -f "$log" ] || exit 0
awk '
  /^[0-9]+\/[0-9]+ Test: / { name = $3; reason = ""; next }
  /^SKIP: / && name != "" && reason == "" { reason = $0; next }
  /^<end of output>/ && reason != "" { printf "skipped: %s: %s\n", name, substr(reason, 7); name = "" }
' "$log"
