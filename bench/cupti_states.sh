#!/usr/bin/env bash
# What a launch costs in each state CUPTI can be left in, and how long CUPTI takes to come back
# (bench/cupti_states.cu, nothing of cuptimon inside). From the repository root on a GPU machine:
#   bash bench/cupti_states.sh BUILD_DIR     (about 3 min; LAUNCHES=200000 CYCLES=10
#                                             THREADS="1 4 16" REPS=6 DEADLINE_MS=3000)
# Output goes to $OUT (cupti_states.txt, cupti_subscribe_T.txt), else to /tmp/cuptimon-states.
set -uo pipefail
cd "$(dirname "$0")/.."
build="${1:?usage: bench/cupti_states.sh BUILD_DIR}"
out="${OUT:-/tmp/cuptimon-states}"
mkdir -p "$out"
prog="$build/gpu/cupti_states"
[ -x "$prog" ] || { echo "cupti_states: $prog is missing (a build with nvcc makes it)" >&2; exit 1; }
status=0
"$prog" --states "${LAUNCHES:-200000}" "${CYCLES:-10}" > "$out/cupti_states.txt" 2>&1
rc=$?
[ $rc = 77 ] && { echo "cupti_states: SKIP: no CUDA device"; exit 77; }
echo "== states (exit status $rc)"
grep -E "^SUMMARY|^FINALIZE|WRONG|cupti_states:" "$out/cupti_states.txt"
[ $rc = 0 ] || status=1
for t in ${THREADS:-1 4 16}; do
  timeout 120 "$prog" --subscribe "$t" "${REPS:-6}" "${DEADLINE_MS:-3000}" > "$out/cupti_subscribe_$t.txt" 2>&1
  rc=$?
  echo "== subscribe with $t launching threads (exit status $rc: 0 every call returned in time, 2 one did not)"
  grep -E "^TIME|^LATE|^RESULT|cupti_states:" "$out/cupti_subscribe_$t.txt"
  case $rc in 0|2) ;; *) status=1 ;; esac
done
echo "cupti_states: $([ $status = 0 ] && echo DONE || echo FAIL) (logs in $out)"
exit $status
