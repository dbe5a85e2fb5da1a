#!/bin/sh
# expect.sh STATUS REGEX CMD [ARGS...]: the check behind every ctest test that looks at output.
#
# Runs CMD with its arguments, prints what it wrote (stdout and stderr together, so ctest shows it
# on failure), and passes (exit 0) only when CMD's exit status is STATUS and that output matches
# REGEX, an extended regular expression (grep -E) applied to the whole output at once: `.`
# matches a newline too, so "first.*second" may span lines. An empty REGEX checks the status only.
# ctest's PASS_REGULAR_EXPRESSION alone ignores the exit status, so a test that raised after
# printing the expected line would pass; this wrapper makes both count. Exit status: 0 on a
# match, 1 on a mismatch (saying which), 2 on a usage error.
if [ $# -lt 3 ]; then
  echo "usage: expect.sh STATUS REGEX CMD [ARGS...]" >&2
  exit 2
fi
want=$1
regex=$2
shift 2
out=$(mktemp "${TMPDIR:-/tmp}/expect.XXXXXX") || exit 2
trap 'rm -f "$out"' EXIT
"$@" >"$out" 2>&1
rc=$?
cat "$out"
ok=0
if [ "$rc" != "$want" ]; then
  echo "expect.sh: exit status $rc, expected $want" >&2
  ok=1
fi
if [ -n "$regex" ] && ! grep -Ezq -e "$regex" "$out"; then
  echo "expect.sh: the output does not match: $regex" >&2
  ok=1
fi
exit $ok
