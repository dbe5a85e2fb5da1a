#!/bin/sh
# exit_within_budget.sh LIMIT_MS CMD...: runs CMD (engine/tests/gpu/gpu_exit_spin, directly or
# under cuptimon-lua) and checks that it exited within LIMIT_MS of the moment the program's main
# returned, as the program printed it ("returning at <CLOCK_REALTIME ms>"). Exit status: 0 when
# in time and CMD succeeded, 77 when CMD skipped (no device), 1 otherwise. A run that hangs is
# killed at 120 s and fails.
limit=$1
shift
out=$(timeout -s KILL 120 "$@")
rc=$?
end=$(date +%s%3N)
printf '%s\n' "$out"
[ "$rc" -eq 77 ] && exit 77
t=$(printf '%s\n' "$out" | sed -n 's/.*returning at \([0-9]*\) ms.*/\1/p' | head -n 1)
if [ -z "$t" ]; then
  echo "FAIL: the program did not report when main returned (status $rc)"
  exit 1
fi
took=$((end - t))
echo "exit took $took ms after main returned (limit $limit ms), status $rc"
[ "$rc" -eq 0 ] || { echo "FAIL: status $rc"; exit 1; }
[ "$took" -le "$limit" ] || { echo "FAIL: over the limit"; exit 1; }
exit 0
