#!/usr/bin/env bash
# Device call E, on the build that keeps CUPTI attached in a process that uses CUDA graphs:
# torch.compile(mode="reduce-overhead") under the full trace and the duty cycle again, then the
# GPU ctest programs, a sustained 4-thread sweep and a short long run.
set -u
B=.devbuild
nvidia-smi -L
R=$OUT/e; mkdir -p $R
OUT=$R/compile SECONDS_EACH=15 timeout 180 bash spec/gpu/torch_compile_graphs.sh $B > $R/compile.txt 2>&1
echo "torch_compile_graphs rc=$?"; cat $R/compile.txt
grep -h "CUDA graphs\|stays attached" $R/compile/*.txt | sort | uniq -c | head -5
THREADS=4 SECONDS_EACH=${SWEEP_S:-20} OUT=$R/sweep timeout 90 bash bench/thread_sweep.sh $B > $R/sweep.txt 2>&1
echo "thread_sweep rc=$?"; tail -n 8 $R/sweep.txt
timeout 90 ctest --test-dir $B -L gpu --output-on-failure > $R/ctest_gpu.txt 2>&1
echo "ctest -L gpu rc=$?"; grep -E "tests passed|Failed|\*\*\*" $R/ctest_gpu.txt | head -8
DURATION=${LONG_S:-60} OUT=$R/long timeout 100 bash bench/long_run.sh $B > $R/long.txt 2>&1
echo "long_run rc=$?"; tail -n 8 $R/long.txt
tar czf $OUT/e.tgz -C $OUT e && rm -rf $R
