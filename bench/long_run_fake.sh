#!/bin/sh
# Memory under a long run on the fake CUPTI (no GPU): bench/long_run.sh's measure of the agent,
# the wire, the monitor and the script under a steady load, with CUPTI replaced by the fake, so
# that what grows is cuptimon's alone. From the repository root:
#   sh bench/long_run_fake.sh BUILD_DIR      (DURATION=600 RATE=200000 THREADS=2)
# RATE records per second (half kernel, half runtime API, with the fake's records stamped now, so
# the stage lags and the lag guard see real times) from THREADS threads for DURATION seconds,
# under cuptimon-lua bench/sum_durations.lua; the resident sets of the traced process and of the
# monitor are sampled every second. RESULT: PASS when every record arrived, the exit was within
# its budget, and each slope over the second half (after the first minute) stayed under
# 1 MiB/min. Samples, log and JSON go to $OUT (default /tmp/cuptimon-load-fake).
set -eu
cd "$(dirname "$0")/.."
b=$(cd "${1:?usage: sh bench/long_run_fake.sh BUILD_DIR}" && pwd)
for f in "$b/engine/tests/libfake_cupti.so" "$b/engine/agent/fake_cuda_app" "$b/cuptimon-lua"; do
  [ -e "$f" ] || { echo "long_run_fake: $f is missing (cmake --build $b)" >&2; exit 1; }
done
export CM_BENCH_KEEP_ENV=1 FAKE_CUPTI_NOW_STAMPS=1
export CUPTIMON_LIBCUPTI="$b/engine/tests/libfake_cupti.so" CUPTIMON_LIBCUDA="$b/engine/tests/libfake_cupti.so"
export FAKE_CUDA_APP="$b/engine/agent/fake_cuda_app" LONG_FAKE_RATE="${RATE:-200000}"
exec python3 bench/load.py long "$b" --threads "${THREADS:-2}" --seconds "${DURATION:-600}" \
  --loop "$PWD/bench/long_run_fake_loop.sh" --out "${OUT:-/tmp/cuptimon-load-fake}"
