#!/usr/bin/env bash
# Device call 1: the GPU batch on the split tree.
set -u
B=.devbuild
nvidia-smi -L
T0=$(date +%s)
R=$OUT
mkdir -p $R/batch
OUT=$R/batch LOGS=/tmp/cuptimon-gpu bash spec/gpu/run_all.sh $B > $R/batch/run_all.txt 2>&1
echo "run_all rc=$? in $(( $(date +%s) - T0 )) s"
sed -n '/=== summary/,$p' $R/batch/run_all.txt
grep -B1 -A0 "^rc=[1-9]" $R/batch/run_all.txt | head -20
cd $R && tar czf batch.tgz batch && rm -rf batch
