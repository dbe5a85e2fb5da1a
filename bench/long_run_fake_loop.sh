#!/bin/sh
# bench/long_run_fake.sh's stand-in for gpu/launch_loop --threads T --seconds S (no GPU): the
# fake CUDA app ($FAKE_CUDA_APP, under the fake CUPTI) writes one kernel and one runtime record
# per launch, at LONG_FAKE_RATE records per second (default 200000) over T threads, for S
# seconds. The launch count is known before it runs, so launch_loop's RESULT and LAUNCHED lines
# are printed first; then the app replaces this shell, so that bench/load.py samples the traced
# process itself, and its --stamp line gives the time of its exit() call (the exit's measure).
set -eu
t=$2
s=${4%.*}
rate=${LONG_FAKE_RATE:-200000}
n=$((rate / 2 * s))
echo "RESULT sweep threads $t launches $n seconds $s launches_per_s $((rate / 2))"
echo "LAUNCHED $n"
exec "$FAKE_CUDA_APP" --records $((2 * n)) --threads "$t" --rate "$rate" \
  --kinds concurrent_kernel,runtime --stamp
