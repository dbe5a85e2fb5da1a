#!/usr/bin/env bash
# Device call C: a training loop 10 minutes long, dormant 120 s, attached under the exporter's
# duty cycle for 300 s (scraped every 15 s), then 180 s after the monitor left, beside a
# never-attached control loop. The run outlasts one call: it starts in its own session and call
# D collects it.
set -u
nvidia-smi -L
# The next call's copy of the working tree must not touch the running binaries: the run uses a
# copy of its own.
mkdir -p /tmp/al /tmp/alrepo
tar cf - --exclude=./bench/results . | tar xf - -C /tmp/alrepo
cd /tmp/alrepo
B=/tmp/alrepo/.devbuild
setsid nohup env CONTROL=1 DORMANT_S=120 ATTACH_S=300 AFTER_S=180 PERIOD_MS=10000 \
  CUPTIMON_AGENT_LOG=info OUT=/tmp/al bash spec/gpu/attach_leave.sh $B > /tmp/al/attach_leave.txt 2>&1 \
  < /dev/null &
echo started; date
sleep ${WAIT:-570}
cat /tmp/al/phases.txt
