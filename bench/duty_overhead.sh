#!/usr/bin/env bash
# The duty cycle's overhead, on a GPU machine, from the repository root:
#   bash bench/duty_overhead.sh BUILD_DIR
# Runs bench/overhead.py with the configurations untraced, duty05 and duty10
# (scripts/count.lua --duty 0.05 / 0.1 --period-ms DUTY_PERIOD_MS --kinds kernel), and duty05d and
# duty10d (the same with CUPTIMON_DETACH_IDLE=1: CUPTI detached between windows) on the empty
# kernel launch loop and the PyTorch small-op loop (WORKLOADS=launch,torch by default; "train" adds
# the training loop of spec/gpu/duty_train.py, STEPS steps a run, default 4000): ROUNDS interleaved rounds (default 10), each
# run in its own process, in a shuffled order per round; the report gives the launching thread's
# CPU time and the wall time per launch (per op) with bootstrap 95% intervals, and per-round
# ratios against the untraced run of the same round. The goal: a median ratio of at most 1.01
# with an upper bound of at most 1.03.
#
# A duty cycle only shows its cost over many periods, so the runs are long and the period short
# by default: LAUNCHES=1500000 empty launches (a few seconds on a GPU) and
# OPS=750000 ops (a few seconds of timed loop), DUTY_PERIOD_MS=1000 (windows of 50 and
# 100 ms, 4 or 5 per run). With the recipes' 10 s period a run would hold one window or none. A
# shorter torch run (250,000 ops, under 2 s of loop) can print no estimate (no window completed
# in it), and holds 2 or 3 windows, some of them before the loop begins. The budget (BUDGET_S,
# default 540) stops starting rounds that would end past it: 10 rounds of three configurations
# (CONFIGS=untraced,duty05d,duty10d) on both workloads take about 7 minutes on a GPU (set
# WORKLOADS=launch for one workload, or CONFIGS for fewer configurations, to keep a margin).
# Output: tables on stdout and in $OUT/overhead.md (OUT defaults to /tmp/cuptimon-duty-overhead),
# every run in $OUT/overhead_runs.{csv,json}; each duty run's note has its estimate of the
# kernels launched against the launch loop's own count.
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -ge 1 ] || { echo "usage: bash bench/duty_overhead.sh BUILD_DIR" >&2; exit 2; }
export CONFIGS=${CONFIGS:-untraced,duty05,duty10,duty05d,duty10d}
export LAUNCHES=${LAUNCHES:-1500000}
export OPS=${OPS:-750000}
export STEPS=${STEPS:-4000}
export DUTY_PERIOD_MS=${DUTY_PERIOD_MS:-1000}
export OUT=${OUT:-/tmp/cuptimon-duty-overhead}
export OVERHEAD_COMMAND="bash bench/duty_overhead.sh BUILD_DIR (CONFIGS=$CONFIGS LAUNCHES=$LAUNCHES OPS=$OPS STEPS=$STEPS WORKLOADS=${WORKLOADS:-launch,torch} DUTY_PERIOD_MS=$DUTY_PERIOD_MS ROUNDS=${ROUNDS:-10})"
exec python3 bench/overhead.py "$@"
