#!/usr/bin/env bash
# Device call D: waits for call C's run to end, then brings its logs back.
set -u
for _ in $(seq 1 240); do
  grep -q "^attach_leave: " /tmp/al/attach_leave.txt 2>/dev/null && break
  sleep 1
done
date
cat /tmp/al/attach_leave.txt | tail -n 40
grep -h "CUPTI" /tmp/al/train.err | tail -n 8
tar czf $OUT/c.tgz -C /tmp al
