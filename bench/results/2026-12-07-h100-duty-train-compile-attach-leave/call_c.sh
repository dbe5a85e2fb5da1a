#!/usr/bin/env bash
# Device call C: a training loop dormant 100 s, attached under the exporter's duty cycle for 300 s
# (scraped every 15 s), then 170 s after the monitor left (570 s, one device call's length), beside
# a never-attached control loop.
set -u
B=.devbuild
nvidia-smi -L
R=$OUT/c; mkdir -p $R
CONTROL=1 DORMANT_S=${D:-100} ATTACH_S=${A:-300} AFTER_S=${F:-170} PERIOD_MS=10000 CUPTIMON_AGENT_LOG=info \
  OUT=$R bash spec/gpu/attach_leave.sh $B > $R/attach_leave.txt 2>&1
echo "attach_leave rc=$?"
tail -n 40 $R/attach_leave.txt
grep -h "CUPTI" $R/train.err | tail -n 6
tar czf $OUT/c.tgz -C $OUT c && rm -rf $R
