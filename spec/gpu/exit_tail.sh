#!/usr/bin/env bash
# How long the exit's fence really needs after a long run, from the repository root on
# the device machine:
#   bash spec/gpu/exit_tail.sh BUILD_DIR      (about 2.5 min; THREADS=4 SECONDS_LIST="30 60")
#
# A long run under cuptimon-lua bench/sum_durations.lua can leave the exit's sync fence
# unfinished at the 2 s budget's deadline, with a thread's records (launch_loop's 1,000 warm-up
# launches) missing, while short runs fence in well under a second (bench/RESULTS.md, "Memory
# under a long run"). This script runs the same load for each length in
# SECONDS_LIST with a 60 s exit budget, so nothing is cut, and prints for each run the agent's exit
# line (the exit's length, the sync fence's and the forced flush's times) and the kernel records
# against the launches. Logs go to $OUT when set, else to
# /tmp/cuptimon-exit-tail. Exit status 0 when every run delivered every kernel record.
set -u
B=$(cd "${1:-build}" && pwd)
LOG=${OUT:-/tmp/cuptimon-exit-tail}
mkdir -p "$LOG"
THREADS=${THREADS:-4}
SECONDS_LIST=${SECONDS_LIST:-30 60}
unset CUPTIMON_LIBCUPTI CUPTIMON_LIBCUDA
for f in "$B/cuptimon-lua" "$B/gpu/launch_loop"; do
  [ -e "$f" ] || { echo "exit_tail.sh: $f is missing (build with nvcc)"; exit 1; }
done
fail=0
for s in $SECONDS_LIST; do
  log=$LOG/exit_t${THREADS}_${s}s.log
  CUPTIMON_EXIT_BUDGET_MS=60000 CUPTIMON_AGENT_LOG=info timeout $((s + 120)) \
    "$B/cuptimon-lua" bench/sum_durations.lua -- "$B/gpu/launch_loop" --threads "$THREADS" \
    --seconds "$s" >"$log" 2>&1
  rc=$?
  launched=$(awk '/^LAUNCHED/ { print $2 }' "$log")
  kernels=$(awk '/^SUM kernels/ { print $3 }' "$log")
  echo "== $THREADS threads, $s s: status $rc, kernel records ${kernels:-?} of ${launched:-?} launches"
  grep -E "agent.*exit: [0-9]+ batches" "$log" | sed 's/^/   /'
  if [ "$rc" != 0 ] || [ -z "$kernels" ] || [ "$kernels" != "$launched" ]; then fail=1; fi
done
echo "exit_tail.sh: $([ $fail = 0 ] && echo "PASS (every kernel record delivered)" || echo FAIL)"
exit $fail
