#!/usr/bin/env bash
# Device call B: the training loop side by side: untraced, full trace, duty 0.05 and 0.1 (the
# default: CUPTI detached between windows), 10 interleaved rounds, each run in its own process.
set -u
B=.devbuild
nvidia-smi -L
R=$OUT/b; mkdir -p $R
WORKLOADS=train CONFIGS=untraced,cm_top,duty05,duty10 ROUNDS=10 STEPS=${STEPS:-3000} \
  BUDGET_S=${BUDGET:-470} OUT=$R bash bench/duty_overhead.sh $B > $R/overhead.txt 2>&1
echo "overhead rc=$?"
tail -n 45 $R/overhead.txt
tar czf $OUT/b.tgz -C $OUT b && rm -rf $R
