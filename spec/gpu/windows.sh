#!/usr/bin/env bash
# Trigger windows and the record-rate budget on the GPU, about 30 s:
#   bash spec/gpu/windows.sh BUILD_DIR
# 1. spike.lua over spec/gpu/spike_torch.py, whose elementwise kernel turns 32 times slower for one
#    second: one "spike:" line naming that kernel, the pid and the capture, and the capture
#    replays (count.lua, status 0) with runtime records, which nothing traced outside the window.
# 2. count.lua --budget over the same loop: runtime is shed while the rate is above the budget
#    and a "note: the record-rate budget shed runtime records ..." line follows the table.
# Logs and captures go to $OUT (the device tool's folder) or /tmp/cuptimon-windows.
set -u
B=$(cd "${1:-build}" && pwd)
D=${OUT:-/tmp/cuptimon-windows}
mkdir -p "$D"
LUA=$B/cuptimon-lua
unset CUPTIMON_LIBCUPTI CUPTIMON_LIBCUDA
fail=0

echo "=== spike"
( cd "$D" && timeout 120 "$LUA" "$OLDPWD/scripts/spike.lua" --ms 1000 \
    --record "$D/spike.%p.cmcap" -- python3 "$OLDPWD/spec/gpu/spike_torch.py" ) >"$D/spike.log" 2>&1
echo "rc=$?"
cat "$D/spike.log"
n=$(grep -c '^spike: ' "$D/spike.log")
file=$(sed -n 's/^spike: .*; recorded \([^ ]*\) (.*/\1/p' "$D/spike.log" | head -1)
if [ "$n" -ne 1 ] || [ -z "$file" ]; then echo "FAIL: expected one spike line with a capture"; fail=1; fi
if [ -n "$file" ]; then
  "$LUA" --replay "$file" scripts/count.lua --kinds kernel,runtime >"$D/spike_replay.log" 2>&1
  rc=$?
  cat "$D/spike_replay.log"
  if [ "$rc" -ne 0 ] || ! grep -q '^runtime ' "$D/spike_replay.log"; then
    echo "FAIL: the spike capture does not replay with runtime records"; fail=1
  fi
fi

echo "=== budget"
timeout 120 "$LUA" scripts/count.lua --kinds kernel,runtime --budget 20000 --shed runtime \
  --hold-ms 1000 -- python3 spec/gpu/spike_torch.py >"$D/budget.log" 2>&1
echo "rc=$?"
cat "$D/budget.log"
if ! grep -q '^note: the record-rate budget shed runtime records of pid ' "$D/budget.log"; then
  echo "FAIL: no shed note"; fail=1
fi
[ "$fail" -eq 0 ] && echo "windows.sh: PASS" || echo "windows.sh: FAIL"
exit "$fail"
