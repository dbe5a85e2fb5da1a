#!/bin/sh
# A stand-in for gpu/launch_loop --threads T --seconds S in bench/load.py's smoke test (no GPU):
# runs the fake CUDA app ($FAKE_CUDA_APP, under the fake CUPTI) writing 20000 kernel and 20000
# runtime records per thread, and prints launch_loop's lines for that many launches.
# STUB_EXTRA_LAUNCHES adds launches that were never made, so that the test can see a mismatch fail.
set -e
t=$2
n=$((t * 20000))
"$FAKE_CUDA_APP" --records $((2 * n)) --threads "$t" --kinds concurrent_kernel,runtime --linger-ms 600 >&2
echo "RESULT sweep threads $t launches $n seconds 0.600 launches_per_s $((n * 10 / 6))"
echo "LAUNCHED $((n + ${STUB_EXTRA_LAUNCHES:-0}))"
echo "PROCESS_CPU user_s 0.010 sys_s 0.010"
