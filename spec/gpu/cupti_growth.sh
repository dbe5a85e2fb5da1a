#!/usr/bin/env bash
# Which thread's cost grows with a long run's length, cuptimon's or CUPTI's, from
# the repository root on the device machine:
#   bash spec/gpu/cupti_growth.sh BUILD_DIR     (about 5 min; THREADS=16 CM_SECONDS=150
#                                                GAP_AT=0 FLOOR_SECONDS=100)
#
# Over a long run at a steady launch rate (16 launching threads, kernels and runtime API,
# per-thread buffers off) the traced process's threads other than the launching ones grow to a
# whole core, and from then on CUPTI's stage lag and the resident set grow (bench/RESULTS.md,
# "Throughput at many launching threads"). This script tells which thread that is, and
# whether CUPTI does the same without cuptimon:
#  1. cuptimon: bench/load.py long under bench/sum_durations.lua for CM_SECONDS, the CPU of each
#     thread sampled by name every second (cm-decode, cm-send and cm-control are the agent's;
#     CUPTI's threads and the main thread keep the program's name, launch_loop), and the kernel
#     and runtime records delivered so far in its LAG lines. With GAP_AT=T (0: none) tracing
#     stops for 2 s at T s and starts again (CM_BENCH_GAP_AT_S): does the grown cost start over?
#     (The ledger has the answer: it did not, and the gap made CUPTI fall further behind.) With
#     SHED_AT=T (0: none) runtime is shed for good at T s instead (CM_BENCH_SHED_AT_S, a budget:
#     kernels are never toggled): does CUPTI's worker recover with only kernel records to write?
#     That is the experiment a default shed needs first.
#  2. the floor (gpu/libcupti_floor.so, per-thread buffers off as the engine sets them, no
#     periodic flush, as the agent has none in this run) under the same load for FLOOR_SECONDS,
#     sampled the same way, with its lag from a record's end to its buffer's completion.
# Each prints its table and "CPU by thread name (share of a core), first minute -> last minute".
# The agent's lag guard is on as by default (CUPTIMON_GUARD_LAG_MS, 500): the LAG lines carry its
# measure (held_ms) and what it shed (guard_shed). CUPTIMON_GUARD_LAG_MS=0 in the environment runs
# the experiment without it; a lower limit tries the guard itself.
# Logs and samples go to $OUT (cm_* and floor_*), else to /tmp/cuptimon-growth.
set -u
B=$(cd "${1:-build}" && pwd)
LOG=${OUT:-/tmp/cuptimon-growth}
mkdir -p "$LOG"
THREADS=${THREADS:-16}
CM_SECONDS=${CM_SECONDS:-150}
GAP_AT=${GAP_AT:-0}
SHED_AT=${SHED_AT:-0}
FLOOR_SECONDS=${FLOOR_SECONDS:-100}
unset CUPTIMON_LIBCUPTI CUPTIMON_LIBCUDA
for f in "$B/cuptimon-lua" "$B/gpu/launch_loop" "$B/gpu/libcupti_floor.so"; do
  [ -e "$f" ] || { echo "cupti_growth.sh: $f is missing (build with nvcc)"; exit 1; }
done
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
status=0
what=""
[ "$GAP_AT" != 0 ] && what="$what, tracing off for 2 s at $GAP_AT s"
[ "$SHED_AT" != 0 ] && what="$what, runtime shed at $SHED_AT s"
echo "== cuptimon, $THREADS threads, $CM_SECONDS s$what"
CM_BENCH_GAP_AT_S=$([ "$GAP_AT" != 0 ] && echo "$GAP_AT") \
CM_BENCH_SHED_AT_S=$([ "$SHED_AT" != 0 ] && echo "$SHED_AT") \
  CUPTIMON_AGENT_LOG=info timeout $((CM_SECONDS + 60)) \
  python3 bench/load.py long "$B" --threads "$THREADS" --seconds "$CM_SECONDS" --out "$tmp/cm"
rc=$?
# A gap or a shed makes load.py's count check fail on purpose (records of launches in the gap, or
# the shed runtime records, are not traced), so with one only a run that did not finish fails here.
if [ -n "$what" ]; then [ -s "$tmp/cm/long_run.json" ] || status=1; elif [ $rc != 0 ]; then status=1; fi
cp "$tmp/cm/long_run.log" "$LOG/cm_run.log" 2>/dev/null
cp "$tmp/cm/long_run_samples.csv" "$LOG/cm_samples.csv" 2>/dev/null
echo "== floor, $THREADS threads, $FLOOR_SECONDS s"
FLOOR_PER_THREAD=0 FLOOR_FLUSH_MS=0 timeout $((FLOOR_SECONDS + 120)) \
  python3 bench/load.py floor "$B" --threads "$THREADS" --seconds "$FLOOR_SECONDS" --out "$tmp/floor" || status=1
cp "$tmp/floor/floor_run.log" "$LOG/floor_run.log" 2>/dev/null
cp "$tmp/floor/floor_run_samples.csv" "$LOG/floor_samples.csv" 2>/dev/null
exit $status
