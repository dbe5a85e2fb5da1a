#!/usr/bin/env bash
# Memory under sustained load: N traced PyTorch ops (default 600000, about 3 million runtime API
# records and 600 thousand kernel records) under cuptimon-lua, with the resident set of the
# monitor and of the traced process (the monitor's child) sampled every half second.
#   bash spec/gpu/sustained.sh BUILD_DIR [N]
B=$(cd "${1:-.devbuild}" && pwd)
N=${2:-600000}
"$B/cuptimon-lua" spec/gpu/kernels_runtime.lua -- python3 bench/torch_workload.py micro none "$N" &
mon=$!
while kill -0 $mon 2>/dev/null; do
  t=$(pgrep -P $mon | head -1)
  echo "t=$(date +%s.%N | cut -c7-14) monitor_rss_kb=$(ps -o rss= -p $mon | tr -d ' ') target_rss_kb=$([ -n "$t" ] && ps -o rss= -p "$t" | tr -d ' ')"
  sleep 0.5
done
wait $mon
echo "sustained rc=$?"
