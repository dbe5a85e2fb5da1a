#!/usr/bin/env bash
# Where the backlog forms under sustained load, on a GPU machine, from the
# repository root: for each launching-thread count, empty kernels at full speed for SECONDS under
#   1. nothing (the untraced launch rate),
#   2. the floor (build/gpu/libcupti_floor.so, kernels and runtime: CUPTI's own cost and rate),
#   3. cuptimon-lua bench/sum_durations.lua (kernels and runtime), which prints one LAG line a
#      second: the lag from a record's timestamp to CUPTI completing its buffer, to the agent's
#      decoder, the decode and send queues' waits, the lag at the monitor, and the agent's unsent
#      records.
# Each run's wall time from start to the process's end and its peak RSS are printed, with the
# exit's length from main's return (launch_loop's MAIN_RETURN_MONO_NS) to the process's end.
#   bash bench/stage_lag.sh BUILD_DIR        (THREADS="4 16" SECONDS_EACH=60 UNTRACED_SECONDS=20)
# UNTRACED_SECONDS=0 leaves out the untraced run, FLOOR=0 the floor's.
# Logs go to $OUT (default /tmp/cuptimon-lag).
set -uo pipefail
cd "$(dirname "$0")/.."
B=$(cd "${1:-build}" && pwd)
OUT=${OUT:-/tmp/cuptimon-lag}
mkdir -p "$OUT"
THREADS=${THREADS:-"4 16"}
SECS=${SECONDS_EACH:-60}
USECS=${UNTRACED_SECONDS:-20}
LOOP=$B/gpu/launch_loop

# Runs "$@" with its output in $OUT/$name.log; prints its result lines, how long the exit took
# after main returned, and the peak RSS.
run() {
  local name=$1
  shift
  local t0 t1
  t0=$(date +%s%N)
  if [ -x /usr/bin/time ]; then
    /usr/bin/time -f "MAXRSS_KIB %M" "$@" >"$OUT/$name.log" 2>&1
  else
    "$@" >"$OUT/$name.log" 2>&1
  fi
  local rc=$?
  t1=$(python3 -c 'import time; print(time.clock_gettime_ns(time.CLOCK_MONOTONIC))')
  local main_ns
  main_ns=$(grep -m1 -oE "^MAIN_RETURN_MONO_NS [0-9]+" "$OUT/$name.log" | awk '{print $2}')
  local exit_ms="?"
  [ -n "$main_ns" ] && exit_ms=$(((t1 - main_ns) / 1000000))
  echo "== $name: rc=$rc wall_s=$((($(date +%s%N) - t0) / 1000000000)) exit_after_main_ms<=$exit_ms"
  grep -E "^RESULT sweep|^SUM|^DELIVERED|^LOSS|MAXRSS_KIB|cupti_floor:|LOST" "$OUT/$name.log"
  grep -E "^LAG" "$OUT/$name.log" | awk 'NR % 5 == 1'
}

for t in $THREADS; do
  [ "$USECS" != 0 ] && run "untraced_t$t" "$LOOP" --threads "$t" --seconds "$USECS"
  [ "${FLOOR:-1}" = 1 ] && CUDA_INJECTION64_PATH=$B/gpu/libcupti_floor.so CUPTI_FLOOR_RUNTIME=1 \
    run "floor_t$t" "$LOOP" --threads "$t" --seconds "$SECS"
  CUPTIMON_AGENT_LOG=info run "cuptimon_t$t" "$B/cuptimon-lua" bench/sum_durations.lua -- \
    "$LOOP" --threads "$t" --seconds "$SECS"
  grep -E "exit: .* ms of a" "$OUT/cuptimon_t$t.log" | tail -1
done
