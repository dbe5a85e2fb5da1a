#!/usr/bin/env bash
# Memory under a long run: empty kernels at full speed from THREADS (default 1) threads for
# DURATION seconds (default 600) under cuptimon-lua bench/sum_durations.lua, the resident sets of
# the traced process and of the monitor sampled every second; prints their peaks and the
# least-squares slope of the second half, after the first minute (KiB/min):
#   bash bench/long_run.sh BUILD_DIR          (DURATION=600 THREADS=1)
# Samples and JSON go to $OUT (default /tmp/cuptimon-load). See bench/load.py.
set -euo pipefail
cd "$(dirname "$0")/.."
exec python3 bench/load.py long "$@"
