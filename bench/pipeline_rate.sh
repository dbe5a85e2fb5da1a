#!/bin/sh
# pipeline_rate.sh: how many records per second the agent -> monitor -> Lua path carries with no
# loss, with the fake CUPTI (no GPU limit), and which stage saturates first.
#
# Usage: bench/pipeline_rate.sh [BUILD_DIR] [SECONDS] [THREADS] [RATES]
#   BUILD_DIR  the build tree (default: build)
#   SECONDS    length of each offered-rate run (default 2)
#   THREADS    producer threads of fake_cuda_app (default 4)
#   RATES      offered rates to try, in millions of records per second (default
#              "1 2 4 6 8 10 12 16 20 24 32")
# On a 16-core machine: bench/pipeline_rate.sh build 2 8   (about 40 s). SECONDS may be a fraction
# (ctest -L bench runs a smoke of 0.25 s at 1 and 2 M records/s).
#
# The workload is half kernel, half runtime records; the script (bench/pipeline_sum.lua) sums
# stop - start over every record. Part 1 runs each stage alone at full speed, N records:
#   produce      fake_cuda_app's producers writing into the fake CUPTI's buffers (its workload_ms)
#   agent        the agent decoding, encoding and writing a capture to /dev/shm (capture mode):
#                records / (workload + the exit fence's wait for the decoder + the drain)
#   monitor      cuptimon-lua --replay of that capture (read, frame checks, batch decode, one Lua
#                call per batch), less the time spent in the script's observer
#   lua          the script's observer summing every record (timed inside it)
#   live         the whole path at full speed: cuptimon-lua bench/pipeline_sum.lua -- app
# Part 2 offers rates (fake_cuda_app --rate) for SECONDS each, live, and reports for each the
# rate offered, delivered records, loss, and the backlog at exit: how long after the app's exit()
# the exit hook ran, split into the agent's fence (the decoder was behind), its drain (the send
# queue was behind: the socket or the monitor) and the rest (the monitor and the script). A rate
# is carried when nothing is lost and the backlog is under 100 ms (the pipeline kept up).
# The script fails (status 1) when a stage loses a record or a count is wrong.
set -eu
build=${1:-build}
secs=${2:-2}
threads=${3:-4}
rates=${4:-"1 2 4 6 8 10 12 16 20 24 32"}
root=$(cd "$(dirname "$0")/.." && pwd)
lua=$build/cuptimon-lua
app=$build/engine/agent/fake_cuda_app
fake=$build/engine/tests/libfake_cupti.so
agent=$build/libcuptimon-agent.so
sum="$root/bench/pipeline_sum.lua"
for f in "$lua" "$app" "$fake" "$agent"; do
  [ -e "$f" ] || { echo "pipeline_rate.sh: $f is missing (build first)" >&2; exit 2; }
done
export CUPTIMON_LIBCUPTI="$fake" CUPTIMON_LIBCUDA="$fake"
# A backlog is measured, not cut off: the exit budget is out of the way. So is the lag guard's
# count of the buffers CUPTI holds: the fake CUPTI gives each producer thread a buffer of its
# own, so THREADS of them are out at once by design, and a guard that stopped tracing a kind would
# end the measure (the guard's time measure stays on).
export CUPTIMON_EXIT_BUDGET_MS=60000
export CUPTIMON_GUARD_BUFFERS=0
tmp=$(mktemp -d)
cap=/dev/shm/cuptimon-pipeline-$$.cmcap
[ -d /dev/shm ] || cap=$tmp/run.cmcap
trap 'rm -rf "$tmp" "$cap"' EXIT
kinds=kernel,runtime
select="kernel:start,stop;runtime:start,stop"

now_ns() { date +%s%N; }
# field NAME FILE: the number after NAME= in FILE (the first).
field() { sed -n "s/.*[ :]$1=\([0-9]*\).*/\1/p" "$2" | head -n 1; }
mrate() { awk -v n="$1" -v ns="$2" 'BEGIN { printf "%.2f", (ns > 0) ? n / (ns / 1e9) / 1e6 : 0 }'; }
fail() { echo "pipeline_rate.sh: $*" >&2; exit 1; }

cpu=$(sed -n 's/^model name[^:]*: //p' /proc/cpuinfo | head -n 1)
echo "pipeline_rate: $(nproc) cpus ($cpu), $threads producer threads, ${secs} s per rate, $(sed -n 's/^CMAKE_BUILD_TYPE:STRING=//p' "$build/CMakeCache.txt") build"

# ---- part 1: each stage alone, at full speed ------------------------------------------------
n=$(awk -v s="$secs" 'BEGIN { printf "%d", 4e6 * s }')
CUDA_INJECTION64_PATH="$agent" CUPTIMON_CAPTURE="$cap" CUPTIMON_SELECT="$select" CUPTIMON_AGENT_LOG=info \
  "$app" --records "$n" --kinds "$kinds" --threads "$threads" >"$tmp/cap.out" 2>&1 || fail "capture run failed: $(cat "$tmp/cap.out")"
wl=$(field workload_ms "$tmp/cap.out")
fence=$(sed -n 's/.*(fence \([0-9]*\) ms, drain \([0-9]*\) ms).*/\1/p' "$tmp/cap.out")
drain=$(sed -n 's/.*(fence \([0-9]*\) ms, drain \([0-9]*\) ms).*/\2/p' "$tmp/cap.out")
grep -q "($n records) sent, 0 batches dropped" "$tmp/cap.out" || fail "the capture lost records: $(cat "$tmp/cap.out")"
produce=$(mrate "$n" $((wl * 1000000)))
agent_r=$(mrate "$n" $(((wl + fence + drain) * 1000000)))

t0=$(now_ns); "$lua" --replay "$cap" "$sum" >"$tmp/rs.out" 2>&1 || fail "replay failed: $(cat "$tmp/rs.out")"; t1=$(now_ns)
[ "$(field records "$tmp/rs.out")" = "$n" ] || fail "the replay counted $(field records "$tmp/rs.out") of $n"
lua_ns=$(field lua_ns "$tmp/rs.out")
monitor=$(mrate "$n" $((t1 - t0 - lua_ns)))
lua_only=$(mrate "$n" "$lua_ns")

t0=$(now_ns); rc=0
"$lua" "$sum" -- "$app" --records "$n" --kinds "$kinds" --threads "$threads" >"$tmp/live.out" 2>&1 || rc=$?
t1=$(now_ns)
[ "$rc" = 0 ] && [ "$(field records "$tmp/live.out")" = "$n" ] || fail "the live run lost records (status $rc): $(cat "$tmp/live.out")"
live=$(mrate "$n" $((t1 - t0)))
echo "stages, $n records each (M records/s):"
printf "  %-10s %8s\n" produce "$produce" agent "$agent_r" monitor "$monitor" lua "$lua_only" live "$live"
printf "%s\n" "produce $produce" "agent $agent_r" "monitor $monitor" "lua $lua_only" | sort -k2 -g | head -n 1 |
  awk '{ print "  slowest stage alone: " $1 " (" $2 " M records/s)" }'

# ---- part 2: offered rates, live ----------------------------------------------------------
printf "%-9s %-9s %-9s %-8s %-10s %-9s %-9s %s\n" offered_M achieved_M delivered lost backlog_ms fence_ms drain_ms verdict
best=0
for r in $rates; do
  n=$(awk -v r="$r" -v s="$secs" 'BEGIN { printf "%d", r * 1e6 * s }')
  rate=$(awk -v r="$r" 'BEGIN { printf "%d", r * 1e6 }')
  rc=0
  CUPTIMON_AGENT_LOG=info "$lua" "$sum" -- "$app" --records "$n" --kinds "$kinds" --threads "$threads" \
    --rate "$rate" --stamp >"$tmp/r.out" 2>&1 || rc=$?
  wl=$(field workload_ms "$tmp/r.out")
  got=$(field records "$tmp/r.out")
  dropped=$(field dropped "$tmp/r.out")
  ex=$(field exit_mono_ns "$tmp/r.out")
  hook_line=$(grep -n "^pipeline_sum:" "$tmp/r.out" | head -n 1)
  [ -n "$got" ] && [ -n "$ex" ] && [ -n "$hook_line" ] || fail "rate $r M: no result (status $rc): $(cat "$tmp/r.out")"
  fence=$(sed -n 's/.*(fence \([0-9]*\) ms, drain \([0-9]*\) ms).*/\1/p' "$tmp/r.out")
  drain=$(sed -n 's/.*(fence \([0-9]*\) ms, drain \([0-9]*\) ms).*/\2/p' "$tmp/r.out")
  hook=$(field hook_ns "$tmp/r.out")
  achieved=$(mrate "$n" $((wl * 1000000)))
  backlog=$(awk -v a="$ex" -v b="$hook" 'BEGIN { printf "%.0f", (b - a) / 1e6 }')
  lost=$((n - got))
  verdict=carried
  if [ "$lost" != 0 ] || [ "${dropped:-0}" != 0 ] || [ "$rc" != 0 ]; then verdict=LOSS
  elif [ "$backlog" -ge 100 ]; then verdict=behind
  fi
  if awk -v a="$achieved" -v r="$r" 'BEGIN { exit !(a < 0.9 * r) }'; then
    [ "$verdict" = carried ] && verdict="carried (producers fell short)"
  fi
  printf "%-9s %-9s %-9s %-8s %-10s %-9s %-9s %s\n" "$r" "$achieved" "$got" "$lost" "$backlog" "${fence:-?}" "${drain:-?}" "$verdict"
  case $verdict in
    carried) best=$r ;;
    "carried (producers fell short)")
      best=$(awk -v a="$achieved" -v b="$best" 'BEGIN { print (a > b) ? a : b }'); break ;;
    *) break ;;
  esac
done
echo "pipeline_rate: highest rate carried with no loss and no backlog: $best M records/s"
# The first rate not carried names the stage that saturated: the agent's decoder (the exit fence
# waited for it), the send queue (the drain waited for the socket: the monitor read too slowly),
# or the monitor and the script (what remained after the agent's exit).
case ${verdict:-carried} in
  LOSS|behind)
    rest=$((backlog - ${fence:-0} - ${drain:-0}))
    if [ "${fence:-0}" -ge "${drain:-0}" ] && [ "${fence:-0}" -ge "$rest" ]; then stage="agent decode"
    elif [ "${drain:-0}" -ge "$rest" ]; then stage="agent send queue (the monitor's reading)"
    else stage="monitor and script"; fi
    echo "pipeline_rate: first to saturate at $r M records/s: $stage (fence ${fence:-?} ms, drain ${drain:-?} ms, rest $rest ms)"
    sed -n "/LOST/p" "$tmp/r.out" ;;
esac
