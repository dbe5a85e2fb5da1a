#!/usr/bin/env bash
# Throughput without loss: empty kernels from 1, 2, 4, 8 and 16 threads at full speed, each for
# SECONDS_EACH (default 30) seconds, under cuptimon-lua bench/sum_durations.lua (kernels and
# runtime API), from the repository root of a GPU machine:
#   bash bench/thread_sweep.sh BUILD_DIR      (THREADS=1,2,4,8,16 SECONDS_EACH=30)
# Prints one table row per thread count and RESULT: PASS when no record was lost anywhere; logs,
# samples and JSON go to $OUT (default /tmp/cuptimon-load). See bench/load.py.
set -euo pipefail
cd "$(dirname "$0")/.."
exec python3 bench/load.py sweep "$@"
