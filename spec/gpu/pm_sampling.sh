#!/usr/bin/env bash
# PM sampling on the GPU machine, about a minute:
#   bash spec/gpu/pm_sampling.sh BUILD_DIR
# 1. Runs BUILD_DIR/gpu/gpu_pm_workload (idle, memory-bound and tensor-core phases) under
#    spec/gpu/pm_check.lua at a 1 ms interval: the memory-bound phase must show DRAM throughput
#    above 50 % of peak, the tensor-core phase SM active above 70 % and tensor pipe above 25 %,
#    the idle phase SM and DRAM below 5 % and tensor below 1 %. The metric names are GH100's; when
#    the GPU refuses one (the error names it), the next candidate for that column is tried.
# 2. Measures the overhead of sampling at 1 ms: 10 interleaved rounds of the workload's --bench
#    under pm_check.lua --mode trace (kernels and runtime traced) and --mode pm (the same plus PM
#    sampling), and prints the median of the per-round time ratios.
# When profiling counters are not permitted, it prints BLOCKED with CUPTI's exact error and exits
# 3. When the traced application crashes (a signal), it runs the same attempt once more with the
# PM call trace (CUPTIMON_PM_TRACE=1, CUPTIMON_AGENT_LOG=debug) and prints its tail, whose last
# "cuptimon pm" line is the CUPTI call that crashed; then once more with the application under
# gdb (else cuda-gdb-minimal), which prints the backtrace of the crash; then it fails, skipping
# step 2. All of it stays within about 120 s.
# Logs go to $OUT (the device tool's output folder) when set, else /tmp/cuptimon-pm.
# Exit status: 0 when the checks pass, 1 when one fails, 2 on a setup problem, 3 when blocked.
set -u
B=$(cd "${1:-build}" && pwd) || exit 2
LOGS=${OUT:-/tmp/cuptimon-pm}
mkdir -p "$LOGS"
LUA=$B/cuptimon-lua
APP=$B/gpu/gpu_pm_workload
CHECK=$(cd "$(dirname "$0")" && pwd)/pm_check.lua
unset CUPTIMON_LIBCUPTI CUPTIMON_LIBCUDA
[ -x "$LUA" ] || { echo "pm_sampling: no $LUA"; exit 2; }
[ -x "$APP" ] || { echo "pm_sampling: no $APP (the build needs nvcc)"; exit 2; }

roles=(sm tensor dram pcie-read pcie-write)
declare -A cand idx
cand[sm]="sm__cycles_active.avg.pct_of_peak_sustained_elapsed gr__cycles_active.avg.pct_of_peak_sustained_elapsed sm__throughput.avg.pct_of_peak_sustained_elapsed"
cand[tensor]="sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_elapsed sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_elapsed sm__inst_executed_pipe_tensor.avg.pct_of_peak_sustained_elapsed"
cand[dram]="dram__throughput.avg.pct_of_peak_sustained_elapsed dram__bytes.sum.pct_of_peak_sustained_elapsed"
cand[pcie-read]="pcie__read_bytes.sum.per_second pcie__rx_bytes.sum.per_second"
cand[pcie-write]="pcie__write_bytes.sum.per_second pcie__tx_bytes.sum.per_second"
for r in "${roles[@]}"; do idx[$r]=1; done
metric_args() {
  local r
  for r in "${roles[@]}"; do
    printf -- '--%s %s ' "$r" "$(echo "${cand[$r]}" | cut -d' ' -f"${idx[$r]}")"
  done
}

# A crash of the traced application: rc 128 + the signal from cuptimon-lua (124 is timeout's).
crashed() { [ "$1" -ge 128 ] && [ "$1" != 124 ]; }

# The application crashed under the metrics $1 (with pm_check.lua's extra options $2 and the
# application's arguments $3): the same run once more with the PM call trace, then under a
# debugger for the backtrace. Each is bounded.
crash_report() {
  local ma=$1 extra=$2 aa=$3 trc dbg
  echo "=== the traced application crashed: once more with the PM call trace"
  # shellcheck disable=SC2086
  CUPTIMON_PM_TRACE=1 CUPTIMON_AGENT_LOG=debug timeout -k 5 30 "$LUA" "$CHECK" $extra $ma -- "$APP" $aa \
    >"$LOGS/pm_trace.log" 2>&1
  trc=$?
  echo "rc=$trc; the last 50 lines of $LOGS/pm_trace.log:"
  tail -n 50 "$LOGS/pm_trace.log"
  echo "the last PM call traced: $(grep 'cuptimon pm' "$LOGS/pm_trace.log" | tail -n 1)"
  dbg=$(command -v gdb || { [ -x /usr/local/cuda/bin/cuda-gdb-minimal ] && echo /usr/local/cuda/bin/cuda-gdb-minimal; })
  if [ -z "$dbg" ]; then
    echo "no gdb nor cuda-gdb-minimal here: no backtrace"
    return
  fi
  # The debugger is the monitored command and runs the application itself: the agent loads in
  # the application only (CUDA_INJECTION64_PATH acts in cuInit), so the run is the same one.
  echo "=== the same run with the application under $dbg (at most 60 s)"
  # shellcheck disable=SC2086
  CUPTIMON_PM_TRACE=1 timeout -k 5 60 "$LUA" "$CHECK" $extra $ma -- "$dbg" -q -nx -batch \
    -ex "set pagination off" -ex "set confirm off" -ex "set follow-fork-mode child" \
    -ex "handle SIGPIPE nostop noprint pass" -ex run -ex "bt 40" -ex "info threads" \
    -ex "thread apply all bt 12" --args "$APP" $aa >"$LOGS/pm_gdb.log" 2>&1
  echo "rc=$?; from $LOGS/pm_gdb.log (the signal, then the backtraces):"
  if grep -q "received signal" "$LOGS/pm_gdb.log"; then
    sed -n '/received signal/,$p' "$LOGS/pm_gdb.log" | grep -v '^cuptimon pm' | head -n 160
  else
    echo "no signal under the debugger; its last 40 lines:"
    tail -n 40 "$LOGS/pm_gdb.log"
  fi
}

echo "=== 1. PM sampling against known load"
rc=1
for attempt in 1 2 3 4 5 6 7 8; do
  margs=$(metric_args)
  log=$LOGS/pm_check.$attempt.log
  # shellcheck disable=SC2086
  timeout 60 "$LUA" "$CHECK" $margs -- "$APP" >"$log" 2>&1
  rc=$?
  if grep -q "INSUFFICIENT_PRIVILEGES\|EPERM" "$log"; then
    echo "BLOCKED: profiling counters are not permitted on this machine. CUPTI said:"
    grep -m1 "INSUFFICIENT_PRIVILEGES\|EPERM" "$log"
    exit 3
  fi
  bad=$(grep -o 'metric "[^"]*" cannot be PM-sampled' "$log" | head -1 | cut -d'"' -f2)
  [ -n "$bad" ] || break
  echo "the GPU refused $bad; CUPTI and the chip's offer:"
  grep -m1 "cannot be PM-sampled" "$log"
  moved=0
  for r in "${roles[@]}"; do
    cur=$(echo "${cand[$r]}" | cut -d' ' -f"${idx[$r]}")
    if [ "$cur" = "$bad" ]; then
      idx[$r]=$((idx[$r] + 1))
      [ -n "$(echo "${cand[$r]}" | cut -d' ' -f"${idx[$r]}")" ] && moved=1
    fi
  done
  if [ $moved = 0 ]; then
    echo "pm_sampling: no candidate left for $bad"
    cat "$log"
    exit 1
  fi
done
cat "$log"
echo "check rc=$rc (metrics: $margs)"
if crashed $rc; then
  crash_report "$margs" "" ""
  echo "pm_sampling: FAIL (the traced application crashed, rc=$rc; step 2 skipped)"
  exit 1
fi

echo "=== 2. overhead of PM sampling at 1 ms (10 interleaved rounds)"
ratios=()
for round in 1 2 3 4 5 6 7 8 9 10; do
  # shellcheck disable=SC2086
  a=$(timeout 60 "$LUA" "$CHECK" --mode trace $margs -- "$APP" --bench 2>>"$LOGS/overhead.err" | sed -n 's/^bench_ms=//p')
  # shellcheck disable=SC2086
  timeout 60 "$LUA" "$CHECK" --mode pm --interval-us 1000 $margs -- "$APP" --bench \
    >"$LOGS/overhead.pm.out" 2>>"$LOGS/overhead.err"
  brc=$?
  b=$(sed -n 's/^bench_ms=//p' "$LOGS/overhead.pm.out")
  echo "round $round: traced ${a:-?} ms, traced + PM at 1 ms ${b:-?} ms" | tee -a "$LOGS/overhead.log"
  if crashed $brc; then
    echo "round $round: the application crashed with PM sampling (rc=$brc)"
    crash_report "$margs" "--mode pm --interval-us 1000" --bench
    echo "pm_sampling: FAIL (the traced application crashed in the overhead rounds)"
    exit 1
  fi
  [ -n "$a" ] && [ -n "$b" ] && ratios+=("$(awk -v a="$a" -v b="$b" 'BEGIN { printf "%.4f", b / a }')")
done
if [ ${#ratios[@]} -ge 5 ]; then
  med=$(printf '%s\n' "${ratios[@]}" | sort -n | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }')
  echo "overhead at 1 ms: median time ratio $med over ${#ratios[@]} rounds (${ratios[*]})" | tee -a "$LOGS/overhead.log"
else
  echo "overhead: only ${#ratios[@]} rounds measured; see $LOGS/overhead.err"
  [ $rc = 0 ] && rc=1
fi
[ $rc = 0 ] && echo "pm_sampling: PASS" || echo "pm_sampling: FAIL (rc=$rc)"
exit $rc
