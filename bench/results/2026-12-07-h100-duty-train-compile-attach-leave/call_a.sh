#!/usr/bin/env bash
# Device call A: torch.compile(mode="reduce-overhead") under the full trace and the duty cycle,
# then the duty cycle's accuracy per step on the training loop (the default: CUPTI detached
# between windows), at the recipes' period.
set -u
B=.devbuild
nvidia-smi -L; nvidia-smi --query-gpu=driver_version,clocks.sm --format=csv,noheader
R=$OUT/a; mkdir -p $R
OUT=$R/compile SECONDS_EACH=15 bash spec/gpu/torch_compile_graphs.sh $B > $R/compile.txt 2>&1
echo "torch_compile_graphs rc=$?"; cat $R/compile.txt
mkdir -p $R/accuracy
OUT=$R/accuracy FULL_SECONDS=${FULL:-30} python3 spec/gpu/duty_accuracy.py $B ${ACC_S:-120} 0.05 10000 \
  > $R/accuracy.txt 2>&1
echo "duty_accuracy rc=$?"; tail -n 40 $R/accuracy.txt
tar czf $OUT/a.tgz -C $OUT a && rm -rf $R
