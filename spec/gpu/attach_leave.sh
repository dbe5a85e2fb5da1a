#!/usr/bin/env bash
# Does a training job go back to its dormant speed once a monitor has attached and left? From the
# repository root on the device machine:
#   bash spec/gpu/attach_leave.sh BUILD_DIR     (DORMANT_S=60 ATTACH_S=60 AFTER_S=60 PERIOD_MS=2000)
# spec/gpu/duty_train.py runs with the agent dormant (CUPTIMON_LISTEN=1) for DORMANT_S seconds;
# then `cuptimon-lua --attach PID scripts/prometheus.lua --duty 0.05` (PERIOD_MS) joins it for
# ATTACH_S seconds and is scraped every 15 s; then the monitor leaves and the loop runs AFTER_S
# seconds more. The loop prints its steps per second once a second; the summary gives, per phase,
# the median of those one-second rates with a bootstrap 95% interval and its ratio to the dormant
# phase (the first 5 s of each phase left out), the process's resident set at each phase's end
# and its slope in each phase (sampled every 5 s),
# and the exporter's estimates. With CONTROL=1 a second, identical loop runs beside it with the
# agent dormant and is never attached: the machine's own drift over the run (clocks, other
# tenants) moves both, so each phase is also given as the ratio of the two loops' rates in the same
# second, against the same ratio in the dormant phase. The two loops share the GPU, so their own
# rates are lower than one loop's alone. Logs go to $OUT when set, else to /tmp/cuptimon-attach-leave.
# Exit status 0 when every phase ran and the exporter answered, 1 otherwise.
set -u
B=$(cd "${1:-build}" && pwd)
LOG=${OUT:-/tmp/cuptimon-attach-leave}
mkdir -p "$LOG"
cd "$(dirname "$0")/../.."
unset CUPTIMON_LIBCUPTI CUPTIMON_LIBCUDA
D=${DORMANT_S:-60}; A=${ATTACH_S:-60}; F=${AFTER_S:-60}; P=${PERIOD_MS:-2000}
status=0
export XDG_RUNTIME_DIR=${XDG_RUNTIME_DIR:-$(mktemp -d)}
DUTY_TRAIN_PROGRESS=1 CUDA_INJECTION64_PATH=$B/libcuptimon-agent.so CUPTIMON_LISTEN=1 \
  python3 spec/gpu/duty_train.py $((D + A + F)) > "$LOG/train.txt" 2> "$LOG/train.err" &
pid=$!
if [ "${CONTROL:-0}" = 1 ]; then
  DUTY_TRAIN_PROGRESS=1 CUDA_INJECTION64_PATH=$B/libcuptimon-agent.so CUPTIMON_LISTEN=1 \
    python3 spec/gpu/duty_train.py $((D + A + F)) > "$LOG/control.txt" 2> "$LOG/control.err" &
  cpid=$!
fi
rss() { awk '/VmRSS/ {print $2 / 1024 " MiB"}' /proc/$pid/status 2>/dev/null; }
# The resident set every 5 s, for its slope in each phase: "wall_s MiB" lines in rss.txt.
( while kill -0 "$pid" 2>/dev/null; do
    awk -v t="$(date +%s.%N)" '/VmRSS/ {print t, $2 / 1024}' /proc/$pid/status 2>/dev/null
    sleep 5
  done > "$LOG/rss.txt" ) &
sleep "$D"
t_attach=$(date +%s.%N)
echo "dormant phase over: rss $(rss)" | tee "$LOG/phases.txt"
timeout $((A + 60)) "$B/cuptimon-lua" --duration "$A" --attach "$pid" scripts/prometheus.lua \
  --listen 127.0.0.1:19464 --duty 0.05 --period-ms "$P" > "$LOG/monitor.txt" 2>&1 &
mon=$!
# The last scrape comes before the monitor's --duration ends, so that every one finds it serving.
for i in $(seq 1 $(((A - 1) / 15))); do
  sleep 15
  curl -s --max-time 5 http://127.0.0.1:19464/metrics > "$LOG/scrape_$i.txt" || echo "scrape $i failed" | tee -a "$LOG/phases.txt"
done
wait "$mon"; mrc=$?
t_leave=$(date +%s.%N)
echo "attached phase over (monitor exit $mrc): rss $(rss)" | tee -a "$LOG/phases.txt"
[ "$mrc" = 0 ] || status=1
wait "$pid"; trc=$?
echo "train exit $trc" | tee -a "$LOG/phases.txt"
[ "$trc" = 0 ] || status=1
if [ -n "${cpid:-}" ]; then
  wait "$cpid"; crc=$?
  echo "control exit $crc" | tee -a "$LOG/phases.txt"
  [ "$crc" = 0 ] || status=1
fi
last=$(ls -v "$LOG"/scrape_*.txt 2>/dev/null | tail -n 1)
[ -n "$last" ] && grep -E "^cuptimon_(estimated_kernel_gpu_seconds_per_second|duty|cupti)" "$last" | sort -t' ' -k2 -gr | head -n 8
python3 - "$LOG/train.txt" "$t_attach" "$t_leave" "$LOG/control.txt" "$LOG/rss.txt" <<'PY' || status=1
import bisect
import os
import sys
sys.path.insert(0, "bench")
import benchstats
path, ta, tl, cpath, rpath = sys.argv[1], float(sys.argv[2]), float(sys.argv[3]), sys.argv[4], sys.argv[5]


def progress(p):
    out = []
    for line in open(p):
        if line.startswith("PROGRESS"):
            f = line.split()
            out.append((float(f[2]), float(f[4])))
    return out


pts = progress(path)
ctl = progress(cpath) if os.path.exists(cpath) else []
if not pts:
    print("attach_leave: no PROGRESS lines"); sys.exit(1)
t0 = pts[0][0]
phases = {"dormant": [r for t, r in pts if t0 + 5 <= t < ta],
          "attached": [r for t, r in pts if ta + 5 <= t < tl],
          "after": [r for t, r in pts if t >= tl + 5]}
base = benchstats.median(phases["dormant"]) if phases["dormant"] else None
for name, xs in phases.items():
    if len(xs) < 3:
        print("%-9s too few seconds (%d)" % (name, len(xs))); continue
    s = benchstats.summary(xs)
    ratio = benchstats.summary([x / base for x in xs]) if base else None
    print("%-9s steps/s median %.1f [%.1f, %.1f] over %d s; of dormant %.3f [%.3f, %.3f]" % (
        name, s["median"], s["lo"], s["hi"], s["n"], ratio["median"], ratio["lo"], ratio["hi"]))
# The resident set's slope in each phase: a least-squares line through its samples, MiB a minute.
rs = []
if os.path.exists(rpath):
    for line in open(rpath):
        f = line.split()
        if len(f) == 2:
            rs.append((float(f[0]), float(f[1])))
for name, lo, hi in (("dormant", 0, ta), ("attached", ta, tl), ("after", tl, float("inf"))):
    xs = [(t, m) for t, m in rs if lo <= t < hi]
    if len(xs) >= 3:
        mt = sum(t for t, _ in xs) / len(xs)
        mm = sum(m for _, m in xs) / len(xs)
        den = sum((t - mt) ** 2 for t, _ in xs)
        slope = sum((t - mt) * (m - mm) for t, m in xs) / den * 60 if den else 0.0
        print("%-9s resident set %.1f to %.1f MiB, slope %+.2f MiB/min over %d samples" % (
            name, xs[0][1], xs[-1][1], slope, len(xs)))
if ctl:
    # Each second of the monitored loop against the control's line nearest in time (within 1 s).
    ct = [t for t, _ in ctl]

    def rel(t, r):
        i = bisect.bisect_left(ct, t)
        best = min((j for j in (i - 1, i) if 0 <= j < len(ct)), key=lambda j: abs(ct[j] - t), default=None)
        if best is None or abs(ct[best] - t) > 1.0 or ctl[best][1] <= 0:
            return None
        return r / ctl[best][1]

    rels = {"dormant": [], "attached": [], "after": []}
    for t, r in pts:
        name = "dormant" if t0 + 5 <= t < ta else "attached" if ta + 5 <= t < tl else "after" if t >= tl + 5 else None
        x = rel(t, r) if name else None
        if x is not None:
            rels[name].append(x)
    cs = benchstats.summary([r for _, r in ctl])
    print("control   steps/s median %.1f [%.1f, %.1f] over %d s (never attached)" % (
        cs["median"], cs["lo"], cs["hi"], cs["n"]))
    if len(rels["dormant"]) >= 3:
        cbase = benchstats.median(rels["dormant"])
        for name, xs in rels.items():
            if len(xs) < 3:
                continue
            r = benchstats.summary([x / cbase for x in xs])
            print("%-9s against the control, of dormant %.3f [%.3f, %.3f] over %d s" % (
                name, r["median"], r["lo"], r["hi"], r["n"]))
PY
echo "attach_leave: $([ $status = 0 ] && echo DONE || echo FAIL) (logs in $LOG)"
exit $status
