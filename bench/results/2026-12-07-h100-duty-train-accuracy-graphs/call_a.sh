#!/usr/bin/env bash
# Device call A: the CUPTI benchmarks' shared loader; torch.compile(mode="reduce-overhead") under the full trace and the duty cycle,
# then the duty cycle's accuracy per step on the training loop (the default: CUPTI detached
# between windows), at the recipes' period.
set -u
B=.devbuild
nvidia-smi -L; nvidia-smi --query-gpu=driver_version,clocks.sm --format=csv,noheader
R=$OUT/a; mkdir -p $R
# The two CUPTI benchmarks on their shared loader (bench/cupti_dl.h): a short run of each.
timeout 120 $B/gpu/cupti_states --states 100000 2 > $R/cupti_states_short.txt 2>&1
echo "cupti_states rc=$?"; tail -n 14 $R/cupti_states_short.txt
timeout 120 $B/gpu/cupti_reattach --phases 100000 2 > $R/cupti_reattach_short.txt 2>&1
echo "cupti_reattach rc=$?"; tail -n 8 $R/cupti_reattach_short.txt
OUT=$R/compile SECONDS_EACH=15 bash spec/gpu/torch_compile_graphs.sh $B > $R/compile.txt 2>&1
echo "torch_compile_graphs rc=$?"; cat $R/compile.txt
mkdir -p $R/accuracy
OUT=$R/accuracy FULL_SECONDS=${FULL:-30} python3 spec/gpu/duty_accuracy.py $B ${ACC_S:-120} 0.05 10000 \
  > $R/accuracy.txt 2>&1
echo "duty_accuracy rc=$?"; tail -n 40 $R/accuracy.txt
tar czf $OUT/a.tgz -C $OUT a && rm -rf $R
