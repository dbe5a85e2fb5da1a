#!/usr/bin/env bash
# Does the duty-cycled training loop run slower than the fully traced one? A duty cycle traces
# 5% of the time, so it should cost less than the full trace, not more; separate runs of
# spec/gpu/duty_accuracy.py can suggest otherwise (bench/RESULTS.md, "Duty cycle").
# This runs spec/gpu/duty_train.py for RUN_S seconds in four configurations, one after the other:
# untraced, the full trace (scripts/top.lua), the duty cycle of spec/gpu/duty_slowdown.lua (500 ms
# in every 10 s, kernels), and the same with CUPTIMON_DETACH_IDLE=1. The loop prints its steps per
# second once a second, the duty script each window's end on the same wall clock; the summary
# gives each configuration's steps/s over the whole loop, the median of its one-second rates, and
# the median of the seconds that overlap a window against those that do not. A slowdown in the
# seconds of the windows and their edges points at enabling and disabling CUPTI's kinds (or at
# the detach and the attach), one spread over every second at CUPTI's state between windows, and
# one that grows with time at the run's length. From the repository root on the device machine:
#   bash spec/gpu/duty_slowdown.sh BUILD_DIR     (RUN_S=60: about 5 min)
# Logs go to $OUT when set, else to /tmp/cuptimon-duty-slowdown. Exit status 0 when every
# configuration ran and printed its figures, 1 otherwise (the rates are reported, not judged).
set -u
B=$(cd "${1:-build}" && pwd)
LOG=${OUT:-/tmp/cuptimon-duty-slowdown}
mkdir -p "$LOG"
S=${RUN_S:-60}
cd "$(dirname "$0")/../.."
unset CUPTIMON_LIBCUPTI CUPTIMON_LIBCUDA
TRAIN=(python3 spec/gpu/duty_train.py "$S")
export DUTY_TRAIN_PROGRESS=1
status=0
run() {
  local name=$1; shift
  echo "== $name: $*"
  timeout $((S + 90)) "$@" > "$LOG/$name.txt" 2>&1
  local rc=$?
  [ $rc = 0 ] || { echo "duty_slowdown.sh: $name exited $rc; see $LOG/$name.txt"; status=1; }
}
run untraced "${TRAIN[@]}"
run full "$B/cuptimon-lua" scripts/top.lua --top 5 -- "${TRAIN[@]}"
run duty "$B/cuptimon-lua" spec/gpu/duty_slowdown.lua -- "${TRAIN[@]}"
CUPTIMON_DETACH_IDLE=1 CUPTIMON_AGENT_LOG=info run duty_detach "$B/cuptimon-lua" spec/gpu/duty_slowdown.lua -- "${TRAIN[@]}"
python3 - "$LOG" <<'PY' || status=1
import re, statistics, sys
log = sys.argv[1]
print("| configuration | steps/s (loop) | median of 1 s rates | seconds with a window: median (n) | without: median (n) | windows |")
print("|---|--:|--:|--:|--:|--:|")
ok = True
for name in ("untraced", "full", "duty", "duty_detach"):
    try:
        text = open("%s/%s.txt" % (log, name), errors="replace").read()
    except OSError:
        ok = False
        continue
    m = re.search(r"TRAIN steps (\d+) seconds ([\d.]+)", text)
    prog = [(float(a), float(b)) for a, b in re.findall(r"PROGRESS wall ([\d.]+) steps_per_s ([\d.]+)", text)]
    wins = [(float(e) - int(ms) / 1000.0, float(e)) for e, ms in re.findall(r"W wall_end=([\d.]+) ms=(-?\d+)", text)]
    if not m or not prog:
        print("| %s | no figures | | | | |" % name)
        ok = False
        continue
    rates = [r for _, r in prog]
    # A progress line covers the second before it; it overlaps a window (with a second of margin
    # for the edges) when the two intervals meet.
    near = lambda t: any(a - 1.0 <= t and t - 1.0 <= b + 1.0 for a, b in wins)
    w_in = [r for t, r in prog if near(t)]
    w_out = [r for t, r in prog if not near(t)]
    med = lambda xs: "%.1f (%d)" % (statistics.median(xs), len(xs)) if xs else "– (0)"
    print("| %s | %.1f | %.1f | %s | %s | %d |" % (name, int(m.group(1)) / float(m.group(2)),
          statistics.median(rates), med(w_in) if wins else "–", med(w_out) if wins else "–", len(wins)))
for name in ("duty", "duty_detach"):
    try:
        lines = [l for l in open("%s/%s.txt" % (log, name), errors="replace") if re.search(r"^W |attached again|detached \(|stays attached|LOST", l)]
    except OSError:
        continue
    print("-- %s: windows and CUPTI's attach and detach" % name)
    sys.stdout.write("".join(lines[:40]))
sys.exit(0 if ok else 1)
PY
exit $status
