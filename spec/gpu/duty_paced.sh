#!/usr/bin/env bash
# Is the duty cycle's estimate right when tracing cannot change the workload's rate? When
# the estimates of a training loop come out low per step against a fully traced run of the same
# loop, either the windows' time base is off (the window counts from an instant when
# CUPTI was not yet, or no longer, tracing) or the windows ran slower than the time between them
# (tracing's own cost, which makes any sampled estimate low). A loop paced at a fixed rate that
# tracing cannot lower tells the two apart: its true launch count is known, and every window
# sees the same rate. The loop must not catch up in bursts after a stall (a window's opening
# stalls the launching thread), or the windows would see more than the rate (bench/launch_loop.cu,
# PACE_SLACK_NS). Results: bench/RESULTS.md, "Duty cycle". From the repository root on the device
# machine:
#   bash spec/gpu/duty_paced.sh BUILD_DIR     (about 3 min; RATE=20000 RUN_S=60 DUTY=0.1
#                                              PERIOD_MS=1000 ROUNDS=2)
#
# Each round runs launch_loop --threads 1 --seconds RUN_S --rate RATE untraced (to check that it
# keeps its pace) and under scripts/count.lua --duty DUTY --period-ms PERIOD_MS --kinds kernel,
# and prints the estimated kernel count, its 95% interval, the launches made (LAUNCHED) and their
# ratio. An estimate whose interval misses the launches made, consistently low, is the time base;
# one that holds it is not. Logs go to $OUT when set, else to /tmp/cuptimon-duty-paced. Exit status
# 0 when every run ran and printed its figures, 1 otherwise (the ratios are reported, not judged).
set -u
B=$(cd "${1:-build}" && pwd)
LOG=${OUT:-/tmp/cuptimon-duty-paced}
mkdir -p "$LOG"
LUA=$B/cuptimon-lua
LOOP=$B/gpu/launch_loop
RATE=${RATE:-20000}
RUN_S=${RUN_S:-60}
DUTY=${DUTY:-0.1}
PERIOD_MS=${PERIOD_MS:-1000}
ROUNDS=${ROUNDS:-2}
unset CUPTIMON_LIBCUPTI CUPTIMON_LIBCUDA
for f in "$LUA" "$LOOP"; do
  [ -e "$f" ] || { echo "duty_paced.sh: $f is missing (build with nvcc)"; exit 1; }
done
cd "$(dirname "$0")/../.."
status=0
echo "| round | untraced launches/s | duty launches/s | estimated kernels [95%] | windows | launched | estimate / launched | launched in the interval |"
echo "|--:|--:|--:|--:|--:|--:|--:|---|"
for r in $(seq 1 "$ROUNDS"); do
  "$LOOP" --threads 1 --seconds "$RUN_S" --rate "$RATE" >"$LOG/untraced_$r.txt" 2>&1
  rc_u=$?
  "$LUA" scripts/count.lua --duty "$DUTY" --period-ms "$PERIOD_MS" --kinds kernel -- \
    "$LOOP" --threads 1 --seconds "$RUN_S" --rate "$RATE" >"$LOG/duty_$r.txt" 2>&1
  rc_d=$?
  [ $rc_u = 77 ] && { echo "duty_paced.sh: SKIP: no CUDA device"; exit 77; }
  u=$(sed -n 's/^RESULT sweep .* launches_per_s \([0-9.]*\).*/\1/p' "$LOG/untraced_$r.txt")
  d=$(sed -n 's/^RESULT sweep .* launches_per_s \([0-9.]*\).*/\1/p' "$LOG/duty_$r.txt")
  launched=$(sed -n 's/^LAUNCHED \([0-9]*\)$/\1/p' "$LOG/duty_$r.txt")
  line=$(grep -m1 '^estimated concurrent_kernel' "$LOG/duty_$r.txt")
  est=$(echo "$line" | sed -n 's/^estimated concurrent_kernel \([0-9]*\) ± \([0-9?]*\) (95%, \([0-9]*\) windows).*/\1 \2 \3/p')
  if [ $rc_u != 0 ] || [ $rc_d != 0 ] || [ -z "$u" ] || [ -z "$d" ] || [ -z "$launched" ] || [ -z "$est" ]; then
    echo "duty_paced.sh: round $r failed (untraced status $rc_u, duty status $rc_d); see $LOG"
    status=1
    continue
  fi
  set -- $est
  python3 - "$r" "$u" "$d" "$1" "$2" "$3" "$launched" <<'PY'
import sys
r, u, d, n, h, w, launched = sys.argv[1:]
n, launched = float(n), float(launched)
h = float(h) if h != "?" else None
inside = "–" if h is None else ("yes" if n - h <= launched <= n + h else "no")
print("| %s | %.0f | %.0f | %.0f [%s, %s] | %s | %.0f | %.4f | %s |" % (
    r, float(u), float(d), n, "?" if h is None else "%.0f" % (n - h),
    "?" if h is None else "%.0f" % (n + h), w, launched, n / launched, inside))
PY
done
exit $status
