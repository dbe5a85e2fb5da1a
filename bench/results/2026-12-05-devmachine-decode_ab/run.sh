#!/bin/bash
# 12 interleaved rounds (ABBA order), each binary in its own process, pinned to CPU 1.
A=/tmp/ab/build/bench/decode_bench
B=/work/main/build-bench-RelWithDebInfo/bench/decode_bench
for r in $(seq 1 12); do
  if [ $((r % 2)) = 1 ]; then order="A B"; else order="B A"; fi
  for w in $order; do
    bin=$A; [ $w = B ] && bin=$B
    taskset -c 1 $bin --passes 9 --buffers 64 > /tmp/ab/$w.$r.txt
  done
done
