#!/usr/bin/env bash
# The GPU verification batch, run on the device machine from the repository root with a build
# folder made on a Debian machine (static LuaJIT, libuv and luv, so nothing else is needed there):
#   bash spec/gpu/run_all.sh BUILD_DIR          (QUICK=1: the correctness steps 1-4 only)
# Logs and captures are written to $LOGS (default /tmp/cuptimon-gpu). When $OUT is set (the device
# tool's output folder) they are packed into $OUT/gpu_logs.tgz, and the demo capture is copied to
# $OUT/demo.cmcap. Each step prints its exit status and the end of its log; a summary closes the run.
set -u
B=$(cd "${1:-.devbuild}" && pwd)
RESULTS=${OUT:-}
OUT=${LOGS:-/tmp/cuptimon-gpu}
mkdir -p "$OUT"
LUA=$B/cuptimon-lua
AGENT=$B/libcuptimon-agent.so
G=$B/gpu
unset CUPTIMON_LIBCUPTI CUPTIMON_LIBCUDA
summary=()

step() {
  local name=$1
  shift
  echo "=== $name: $*"
  timeout "${STEP_TIMEOUT:-240}" "$@" >"$OUT/$name.log" 2>&1
  local rc=$?
  echo "rc=$rc"
  tail -n "${TAIL:-12}" "$OUT/$name.log"
  summary+=("$name rc=$rc")
  return $rc
}

nvidia-smi -L
# 1. The engine suites, embedded in CUDA programs.
step gpu_workload "$G/gpu_workload"
step gpu_correlation "$G/gpu_correlation"

# 2. The agent, live under cuptimon-lua and in capture mode, on the plain workload.
step plain_live "$LUA" spec/gpu/workload_counts.lua -- "$G/gpu_plain_workload"
step plain_live_cmp python3 spec/gpu/compare.py "$OUT/plain_live.log"
step plain_capture env CUDA_INJECTION64_PATH="$AGENT" CUPTIMON_CAPTURE="$OUT/plain.cmcap" "$G/gpu_plain_workload"
step plain_replay "$LUA" --replay "$OUT/plain.cmcap" spec/gpu/workload_counts.lua
step plain_replay_cmp python3 spec/gpu/compare.py "$OUT/plain_capture.log" "$OUT/plain_replay.log"

# 3. PyTorch: torch.profiler's kernel counts against cuptimon's, live and from a capture.
step torch_profiler python3 bench/torch_workload.py train profiler
step torch_live "$LUA" spec/gpu/workload_counts.lua -- python3 bench/torch_workload.py train
step torch_live_cmp python3 spec/gpu/compare_torch.py "$OUT/torch_profiler.log" "$OUT/torch_live.log"
step torch_capture env CUDA_INJECTION64_PATH="$AGENT" CUPTIMON_CAPTURE="$OUT/torch.cmcap" python3 bench/torch_workload.py train
step torch_replay "$LUA" --replay "$OUT/torch.cmcap" spec/gpu/workload_counts.lua
step torch_replay_cmp python3 spec/gpu/compare_torch.py "$OUT/torch_profiler.log" "$OUT/torch_replay.log"

# 4. The demo capture for examples/, and a recipe over it.
rm -f "$OUT"/demo.*.cmcap
step demo_record "$LUA" --record "$OUT/demo.%p.cmcap" -- "$G/cuptimon_demo_cuda" 30
step demo_top "$LUA" --replay "$(ls "$OUT"/demo.*.cmcap | head -n 1)" scripts/top.lua
ls -la "$OUT"/*.cmcap

# 5. Nothing hung, nothing changed: the GPU ctest programs (graph captures under sync
# flushes every 2 ms, in-process and through the agent; a kernel still spinning when main returns,
# untraced, in capture mode and live), then PyTorch's graph captures in global mode untraced and
# under a sync flush every 2 ms, torch.compile's CUDA graphs (mode="reduce-overhead") under the full
# trace and the duty cycle, and a second process's handshake while the script is busy.
step ctest_gpu ctest --test-dir "$B" -L gpu --output-on-failure
step torch_graphs_untraced python3 spec/gpu/torch_graphs.py 300
step torch_graphs_traced "$LUA" spec/gpu/flush_every_2ms.lua -- python3 spec/gpu/torch_graphs.py 300
step torch_compile_graphs env OUT="$OUT/torch_compile" bash spec/gpu/torch_compile_graphs.sh "$B"
rm -f "$OUT/slow.marker"
step handshake_busy env SLOW_MARKER="$OUT/slow.marker" CUPTIMON_AGENT_LOG=info "$LUA" \
  spec/fixtures/slow_observer.lua -- sh -c "'$G/gpu_plain_workload' >/dev/null &
    while [ ! -f '$OUT/slow.marker' ]; do sleep 0.01; done
    t0=\$(date +%s%3N); '$G/gpu_plain_workload' >/dev/null 2>'$OUT/second.log'; wait
    grep -m1 -i 'connected\|handshake' '$OUT/second.log'; echo second_process_done_ms=\$((\$(date +%s%3N) - t0))"

# 6. The recipes against torch.profiler on a fixed-seed training loop with NVTX ranges:
# per-kernel counts equal, total kernel time compared; nvtx's ranges; timeline's trace validated.
step nvtx_profiler python3 spec/gpu/torch_nvtx.py 200 profiler
step nvtx_top "$LUA" scripts/top.lua --full-names --top 100000 -- python3 spec/gpu/torch_nvtx.py 200
step nvtx_top_cmp python3 spec/gpu/compare_top.py "$OUT/nvtx_profiler.log" "$OUT/nvtx_top.log"
step nvtx_nvtx "$LUA" scripts/nvtx.lua -- python3 spec/gpu/torch_nvtx.py 200
step nvtx_timeline "$LUA" scripts/timeline.lua --force -o "$OUT/torch_trace.json" -- python3 spec/gpu/torch_nvtx.py 200
step nvtx_trace_check "$LUA" -e "package.path='spec/?.lua;'..package.path
  local r, e = require('trace_check').file('$OUT/torch_trace.json')
  if not r then print('trace invalid: ' .. tostring(e)); os.exit(1) end
  print('trace valid'); for k, v in pairs(r) do if type(v) ~= 'table' then print(k, v) end end"

# 7. On demand, PM sampling, windows, ranks and the SQLite export, and the
# pipeline's rate on the fake CUPTI with this machine's cores: each script checks its
# own results and exits non-zero when one fails.
mkdir -p "$OUT/dormant"
step dormant env OUT="$OUT/dormant" bash spec/gpu/dormant.sh "$B"
mkdir -p "$OUT/pm_sampling"
step pm_sampling env OUT="$OUT/pm_sampling" bash spec/gpu/pm_sampling.sh "$B"
mkdir -p "$OUT/windows"
step windows env OUT="$OUT/windows" bash spec/gpu/windows.sh "$B"
mkdir -p "$OUT/ranks_one_gpu"
step ranks_one_gpu env OUT="$OUT/ranks_one_gpu" bash spec/gpu/ranks_one_gpu.sh "$B"
mkdir -p "$OUT/sqlite_torch"
step sqlite_torch env OUT="$OUT/sqlite_torch" bash spec/gpu/sqlite_torch.sh "$B"
step pipeline_rate sh bench/pipeline_rate.sh "$B" 2 8

# The logs come back (without the captures and the trace, which are large) when $OUT was set.
save_logs() {
  if [ -n "$RESULTS" ]; then
    tar czf "$RESULTS/gpu_logs.tgz" --exclude='*.cmcap' --exclude='torch_trace.json' -C "$OUT" .
    cp "$OUT"/demo.*.cmcap "$RESULTS/" 2>/dev/null
  fi
}

if [ -n "${QUICK:-}" ]; then
  echo "=== summary (QUICK: correctness steps only)"
  printf '%s\n' "${summary[@]}"
  save_logs
  exit 0
fi

# 8. The CPU benchmarks on this machine's CPU, at the build's type (printed with the figures).
# The GPU benchmarks are separate commands, each within one device call (bench/RESULTS.md):
# bench/overhead.sh, bench/thread_sweep.sh, bench/time_to_table.sh, bench/long_run.sh.
F=$B/engine/tests/libfake_cupti.so
step decode_bench taskset -c 3 "$B/bench/decode_bench"
step lua_vs_c env CUPTIMON_LIBCUPTI="$F" CUPTIMON_LIBCUDA="$F" LUA_VS_C_LIB="$B/lua/liblua_vs_c.so" \
  taskset -c 3 "$LUA" bench/lua_vs_c.lua 2000000 20

echo "=== summary"
printf '%s\n' "${summary[@]}"
save_logs
