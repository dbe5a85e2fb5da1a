#!/usr/bin/env bash
# torch.compile(mode="reduce-overhead") (CUDA graphs) under the monitor, on a GPU machine, from
# the repository root:
#   bash spec/gpu/torch_compile_graphs.sh BUILD_DIR     (SECONDS=15)
# spec/gpu/torch_compile_graphs.py runs three times, each run compiling afresh:
#   1. under the full trace (scripts/top.lua);
#   2. under a duty cycle of 100 ms in every 1,000 ms with CUPTI detached between windows (the
#      default), through spec/gpu/graph_windows.lua, which checks that in every window the
#      graph's kernels have even counts (one replay launches each once);
#   3. under scripts/count.lua --duty 0.1 --period-ms 1000 (a recipe's --duty).
# Each must exit 0 with "mismatch 0" (the compiled graph's output equals the eager model's), and
# with no LOST line. In the duty runs the agent must have detached CUPTI between windows while the
# model compiled, and then, once the process used a graph, logged that CUPTI stays attached for
# good (a detach would break the graph's launches: engine/core/callbacks.c).
# Logs go to $OUT when set, else /tmp/cuptimon-torch-compile. Exit status 0 when all hold.
set -u
B=$(cd "${1:-build}" && pwd)
LOG=${OUT:-/tmp/cuptimon-torch-compile}
mkdir -p "$LOG"
cd "$(dirname "$0")/../.."
unset CUPTIMON_LIBCUPTI CUPTIMON_LIBCUDA
S=${SECONDS_EACH:-15}
W="python3 spec/gpu/torch_compile_graphs.py $S"
status=0
run() {  # name, then the command
  local name=$1; shift
  CUPTIMON_AGENT_LOG=info "$@" > "$LOG/$name.txt" 2>&1
  local rc=$?
  local res; res=$(grep -m1 '^RESULT compile' "$LOG/$name.txt")
  local det; det=$(grep -c 'CUPTI detached (cuptiFinalize)' "$LOG/$name.txt")
  local att; att=$(grep -c 'CUPTI attached again' "$LOG/$name.txt")
  echo "$name: exit $rc; ${res:-no RESULT line}; detaches $det, attaches $att"
  grep -m1 '^GRAPHWIN' "$LOG/$name.txt"
  grep -m3 'estimated\|LOST' "$LOG/$name.txt"
  [ "$rc" = 0 ] || status=1
  case "$res" in *"mismatch 0 "*) ;; *) status=1 ;; esac
  ! grep -q 'LOST' "$LOG/$name.txt" || status=1
  if [ "$name" != full ] && [ "$det" = 0 ]; then
    echo "$name: the agent's log shows no detach"; status=1
  fi
  if [ "$name" != full ] && ! grep -q 'stays attached .* uses CUDA graphs' "$LOG/$name.txt"; then
    echo "$name: the agent never said that CUPTI stays attached for the CUDA graphs"; status=1
  fi
}
run full "$B/cuptimon-lua" scripts/top.lua --top 8 -- $W
run duty_windows "$B/cuptimon-lua" spec/gpu/graph_windows.lua -- $W
run duty_count "$B/cuptimon-lua" scripts/count.lua --duty 0.1 --period-ms 1000 --kinds kernel -- $W
echo "torch_compile_graphs: $([ $status = 0 ] && echo PASS || echo FAIL)"
exit $status
