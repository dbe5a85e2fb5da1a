#!/usr/bin/env bash
# The dormant agent on a real GPU, from the repository root on the device machine:
#   bash spec/gpu/dormant.sh BUILD_DIR        (about 60 s; N=launches ROUNDS=rounds to change)
#
# (a) What a dormant agent costs: launch_loop N (empty kernels, bench/launch_loop.cu) with no agent and
#     with the agent injected and CUPTIMON_LISTEN=1, each run in its own process, in ROUNDS
#     interleaved rounds (the order alternates). It reports ns per launch (wall, and the launching
#     thread's CPU time), the medians, and the median of the per-round ratios dormant/none with a
#     bootstrap 95% interval. The goal is a ratio of at most 1.01.
# (b) Attach windows: scripts/top.lua is attached to a running launch_loop --control, the loop
#     launches a known number of kernels, the monitor is stopped with Control-C (detach), and so on
#     for three windows, with launches made while dormant in between (nobody sees those). For each
#     window it prints the kernels top.lua counted against the launches made in the window.
# Logs go to $OUT when set (the device tool's output folder), else to $LOGS or /tmp/cuptimon-dormant.
# Exit status: 0 when every run worked and every window's count is exact, 1 otherwise (the ratio
# is reported, not enforced: the machine is shared).
set -u
B=$(cd "${1:-build}" && pwd)
LOG=${OUT:-${LOGS:-/tmp/cuptimon-dormant}}
mkdir -p "$LOG"
LUA=$B/cuptimon-lua
AGENT=$B/libcuptimon-agent.so
LOOP=$B/gpu/launch_loop
N=${N:-100000}
KERNEL=${KERNEL:-cm_loop_empty} # the kernel top.lua counts in (b)
ROUNDS=${ROUNDS:-10}
unset CUPTIMON_LIBCUPTI CUPTIMON_LIBCUDA
RT=$(mktemp -d)
chmod 700 "$RT"
export XDG_RUNTIME_DIR=$RT
fail=0
trap 'rm -rf "$RT"' EXIT

for f in "$LUA" "$AGENT" "$LOOP"; do
  [ -e "$f" ] || { echo "dormant.sh: $f is missing (build with nvcc)"; exit 1; }
done

# ---- (a) ---------------------------------------------------------------------------------------
runs=$LOG/dormant_bench.txt
: >"$runs"
run_one() { # run_one ROUND CONFIG
  local out rc err=$LOG/bench_$1_$2.err
  if [ "$2" = none ]; then
    out=$(timeout 60 "$LOOP" "$N" 2>"$err")
    rc=$?
  else
    out=$(env CUDA_INJECTION64_PATH="$AGENT" CUPTIMON_LISTEN=1 CUPTIMON_AGENT_LOG=info \
      timeout 60 "$LOOP" "$N" 2>"$err")
    rc=$?
    # It must really have been dormant: listening, never attached.
    if ! grep -q "dormant: listening on" "$err"; then echo "round $1: the agent did not listen"; fail=1; fi
  fi
  local line
  if [ "$rc" != 0 ] || ! line=$(printf '%s\n' "$out" | grep '^RESULT'); then
    echo "round $1 $2: no result (rc=$rc)"; tail -n 3 "$err"; fail=1; return
  fi
  echo "$1 $2 $line" >>"$runs"
}
echo "=== (a) $ROUNDS interleaved rounds of $N empty-kernel launches: none vs dormant"
for r in $(seq 1 "$ROUNDS"); do
  if [ $((r % 2)) = 1 ]; then run_one "$r" none; run_one "$r" dormant
  else run_one "$r" dormant; run_one "$r" none; fi
done
ls "$RT"/cuptimon/*.sock >/dev/null 2>&1 && { echo "sockets left behind after exit:"; ls "$RT/cuptimon"; fail=1; }
python3 - "$runs" <<'PY' | tee "$LOG/dormant_ratio.txt"
import random, statistics, sys
rows = {}
for line in open(sys.argv[1]):
    p = line.split()
    # "ROUND CONFIG RESULT launch_loop launches N wall_ns X cpu_ns Y"
    kv = dict(zip(p[4::2], p[5::2]))
    rows.setdefault(int(p[0]), {})[p[1]] = (float(kv["wall_ns"]), float(kv["cpu_ns"]))
rounds = [r for r in sorted(rows) if len(rows[r]) == 2]
if not rounds:
    print("no complete round"); sys.exit(1)
for what, i in (("wall", 0), ("cpu", 1)):
    none = [rows[r]["none"][i] for r in rounds]
    dorm = [rows[r]["dormant"][i] for r in rounds]
    ratios = [d / n for d, n in zip(dorm, none)]
    random.seed(11)
    boot = sorted(statistics.median(random.choices(ratios, k=len(ratios))) for _ in range(10000))
    lo, hi = boot[249], boot[9749]
    med = statistics.median(ratios)
    print(f"{what:4s} ns/launch: none median {statistics.median(none):8.1f}, dormant median "
          f"{statistics.median(dorm):8.1f}; paired ratio dormant/none median {med:.4f}, "
          f"95% bootstrap interval [{lo:.4f}, {hi:.4f}] over {len(rounds)} rounds; goal <= 1.01: "
          f"{'met' if med <= 1.01 else 'NOT met'}")
PY
[ "${PIPESTATUS[0]}" = 0 ] || fail=1

# ---- (b) ---------------------------------------------------------------------------------------
echo "=== (b) attach scripts/top.lua to a running launch loop, detach, attach again"
ctl=$RT/ctl
env CUDA_INJECTION64_PATH="$AGENT" CUPTIMON_LISTEN=1 CUPTIMON_AGENT_LOG=info "$LOOP" --control "$ctl" \
  >"$LOG/loop.out" 2>"$LOG/loop.err" &
loop=$!
# shellcheck source=spec/gpu/control.sh
. "$(dirname "$0")/control.sh"
wait_for 30 test -S "$RT/cuptimon/$loop.sock" || { echo "the loop is not listening"; fail=1; }
for w in 1 2 3; do
  echo "dormant launches before window $w: $(ask 5000)"
  "$LUA" --attach "$loop" scripts/top.lua --top 5 >"$LOG/top_w$w.log" 2>&1 &
  mon=$!
  wait_for 30 grep -q "dormant: monitor pid $mon attached" "$LOG/loop.err" || { echo "window $w: no attach"; fail=1; }
  n=$((20000 * w))
  ack=$(ask "$n")
  kill -INT "$mon"
  wait "$mon"
  rc=$?
  seen=$(awk -v k="$KERNEL" '$NF == k { print $3; exit }' "$LOG/top_w$w.log")
  verdict=exact
  if [ "$rc" != 0 ] || [ "${seen:-0}" != "$n" ]; then verdict=MISMATCH; fail=1; fi
  echo "window $w: launches in the window=$n ($ack), kernels top.lua counted=${seen:-none}, monitor rc=$rc: $verdict"
  tail -n 4 "$LOG/top_w$w.log"
done
printf 'quit\n' >"$ctl"
wait "$loop"
echo "loop rc=$?; $(cat "$LOG/loop.out")"
grep -c "dormant: the monitor detached; tracing is off" "$LOG/loop.err" | sed 's/^/detaches seen by the agent: /'
echo "dormant.sh: $([ $fail = 0 ] && echo PASS || echo FAIL)"
exit $fail
