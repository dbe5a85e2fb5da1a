#!/usr/bin/env bash
# Device call B: a training loop dormant, attached under the exporter's duty cycle, then left,
# beside a never-attached control loop.
set -u
B=.devbuild
nvidia-smi -L
R=$OUT/b; mkdir -p $R
CONTROL=1 DORMANT_S=${D:-120} ATTACH_S=${A:-300} AFTER_S=${F:-120} PERIOD_MS=10000 CUPTIMON_AGENT_LOG=info \
  OUT=$R bash spec/gpu/attach_leave.sh $B > $R/attach_leave.txt 2>&1
echo "attach_leave rc=$?"
cat $R/attach_leave.txt | tail -n 40
grep -h "cupti_idle\|detach\|CUPTI" $R/train.err | tail -n 20
tar czf $OUT/b.tgz -C $OUT b && rm -rf $R
