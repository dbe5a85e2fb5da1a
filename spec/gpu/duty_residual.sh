#!/usr/bin/env bash
# What a launch costs before, during and after tracing, in one process, to tell the duty
# cycle's cost between windows apart from the cost of the windows' edges (bench/RESULTS.md, "Duty
# cycle"). From the repository root on the device machine:
#   bash spec/gpu/duty_residual.sh BUILD_DIR     (about 40 s; N=launches per request, REPS=requests)
#
# One launch_loop --control process with the agent injected and dormant (CUPTIMON_LISTEN=1) runs
# REPS requests of N empty launches in each phase, and acknowledges each with its ns per launch
# (wall and the launching thread's CPU time):
#   1. dormant, before any monitor attached;
#   2. scripts/count.lua attached (the full trace of kernels and runtime API);
#   3. detached again (the agent is back to dormant, but CUPTI was used);
#   4. scripts/count.lua --duty 0.05 --period-ms 10000 attached (mostly between windows);
#   5. detached again.
# It prints the median ns per launch of each phase and its ratio to phase 1. If phase 3 or 5 costs
# more than phase 1, what is left after tracing (CUPTI's state, the subscription, the pinned
# callbacks) is the cost between windows; if not, the cost is at the windows' edges.
# With DETACH=1 the agent runs with CUPTIMON_DETACH_IDLE=1: it detaches CUPTI (cuptiFinalize)
# whenever nothing is traced, so phases 3 and 5, and phase 4 between its windows, show whether a
# detach gives back what CUPTI costs once it has traced (the loop's log says each detach, and the
# counts of finalize calls are in the agent's STATS: cupti_detaches).
# Logs go to $OUT when set, else to /tmp/cuptimon-duty-residual. Exit status 0 when every phase
# ran, 1 otherwise (the ratios are reported, not enforced).
set -u
B=$(cd "${1:-build}" && pwd)
LOG=${OUT:-/tmp/cuptimon-duty-residual}
mkdir -p "$LOG"
LUA=$B/cuptimon-lua
AGENT=$B/libcuptimon-agent.so
LOOP=$B/gpu/launch_loop
N=${N:-200000}
REPS=${REPS:-5}
DETACH=${DETACH:-0}
unset CUPTIMON_LIBCUPTI CUPTIMON_LIBCUDA
RT=$(mktemp -d)
chmod 700 "$RT"
export XDG_RUNTIME_DIR=$RT
trap 'rm -rf "$RT"' EXIT
for f in "$LUA" "$AGENT" "$LOOP"; do
  [ -e "$f" ] || { echo "duty_residual.sh: $f is missing (build with nvcc)"; exit 1; }
done

ctl=$RT/ctl
env CUDA_INJECTION64_PATH="$AGENT" CUPTIMON_LISTEN=1 CUPTIMON_AGENT_LOG=info \
  CUPTIMON_DETACH_IDLE="$DETACH" "$LOOP" --control "$ctl" \
  >"$LOG/loop.out" 2>"$LOG/loop.err" &
loop=$!
ASK_TIMEOUT_S=120
# shellcheck source=spec/gpu/control.sh
. "$(dirname "$0")/control.sh"
fail=0
acks=$LOG/acks.txt
: >"$acks"
phase() { # phase NAME: REPS requests, each acknowledgement tagged with NAME
  for _ in $(seq 1 "$REPS"); do
    a=$(ask "$N") || { fail=1; return; }
    echo "$1 $a" | tee -a "$acks"
  done
}
attach() { # attach NAME ARGS...: a monitor attached to the loop; its pid in $mon
  local name=$1
  shift
  "$LUA" --attach "$loop" scripts/count.lua "$@" >"$LOG/$name.log" 2>&1 &
  mon=$!
  wait_for 30 grep -q "dormant: monitor pid $mon attached" "$LOG/loop.err" || { echo "no attach"; fail=1; }
}
detach() {
  kill -INT "$mon"
  wait "$mon" || echo "monitor rc=$?"
  wait_for 30 test "$(grep -c "the monitor detached" "$LOG/loop.err")" -ge "$1" || { echo "no detach"; fail=1; }
}

wait_for 30 test -S "$RT/cuptimon/$loop.sock" || { echo "the loop is not listening"; fail=1; }
phase 1-dormant
attach full --kinds kernel,runtime; phase 2-full-trace; detach 1
phase 3-after-full
attach duty --duty 0.05 --period-ms 10000 --kinds kernel; phase 4-duty-0.05; detach 2
phase 5-after-duty
printf 'quit\n' >"$ctl"
wait "$loop" || fail=1

python3 - "$acks" <<'PY' | tee "$LOG/residual.txt"
import statistics, sys
rows = {}
for line in open(sys.argv[1]):
    p = line.split()
    kv = dict(x.split("=", 1) for x in p[1:] if "=" in x)
    rows.setdefault(p[0], []).append((float(kv["wall_ns"]), float(kv["cpu_ns"])))
base = rows.get("1-dormant")
for name in sorted(rows):
    w = statistics.median(x[0] for x in rows[name])
    c = statistics.median(x[1] for x in rows[name])
    if base:
        bw = statistics.median(x[0] for x in base)
        bc = statistics.median(x[1] for x in base)
        print(f"{name:16s} ns/launch wall {w:8.1f} ({w / bw:.3f} of dormant), "
              f"launching thread CPU {c:8.1f} ({c / bc:.3f}), {len(rows[name])} requests")
PY
echo "duty_residual.sh: DETACH=$DETACH: $(grep -c "CUPTI detached" "$LOG/loop.err") detaches, $(grep -c "CUPTI attached again" "$LOG/loop.err") attaches in the loop's log"
echo "duty_residual.sh: $([ $fail = 0 ] && echo "done (ratios reported, not enforced)" || echo FAIL)"
exit $fail
