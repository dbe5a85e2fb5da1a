#!/usr/bin/env bash
# Device call A: the duty cycle's overhead, side by side, launch loop (1 thread) and torch op loop.
set -u
B=.devbuild
nvidia-smi -L; nvidia-smi --query-gpu=driver_version,clocks.sm --format=csv,noheader
git log -1 --format=%h 2>/dev/null || true
R=$OUT/a; mkdir -p $R
WORKLOADS=launch,torch CONFIGS=untraced,cm_top,duty05,duty10 ROUNDS=10 LAUNCHES=1000000 OPS=600000 \
  BUDGET_S=${BUDGET:-520} OUT=$R bash bench/duty_overhead.sh $B > $R/overhead.txt 2>&1
echo "overhead rc=$?"
tail -n 60 $R/overhead.txt
tar czf $OUT/a.tgz -C $OUT a && rm -rf $R
