#!/usr/bin/env python3
"""The duty cycle's accuracy on a GPU: the same PyTorch training loop
(spec/gpu/duty_train.py, SECONDS long) run twice, under the full trace (scripts/top.lua) and under
a duty cycle (scripts/top.lua --duty DUTY --period-ms PERIOD). For the five kernels with the most
GPU time in the full trace, compares the estimated launches per second and GPU time per second
with the exact ones (the full trace's counts and summed durations over the timed loop), and says
whether each exact figure lies in the estimate's 95% interval. Goal: within 5%. The same figures
per step of the loop (each rate over its own run's steps per second), with the estimate's interval
over the steps, come first: they take out the difference in speed between the two runs.

Usage: python3 spec/gpu/duty_accuracy.py BUILD_DIR [SECONDS=300] [DUTY=0.05] [PERIOD_MS=10000]
(FULL_SECONDS=S runs the full trace for S seconds of the same loop instead of SECONDS.)
Exit status 0 when all ten figures are within 5%, 1 otherwise, 2 when a run failed. With OUT set,
each run's whole output goes to OUT/duty_accuracy_full.txt and OUT/duty_accuracy_duty.txt.

The duty run's rates are over the time since the agent connected (CUDA's initialization, then the
warm-up and the loop), the full trace's over the timed loop alone; with SECONDS = 300 the
difference is the warm-up's few seconds at most."""
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
NUM = r"\s*([\d.]+)"
FULL_ROW = re.compile(r"^" + NUM * 8 + r"\s+(\S.*)$")   # Time% Total Instances Avg Med P99 Min Max Name
DUTY_ROW = re.compile(r"^" + NUM * 7 + r"\s+(\S.*?)(  \(phase change\))?$")  # rate ± gpu ± total ± avg


def run(argv, name):
    p = subprocess.run(argv, capture_output=True, text=True, errors="replace")
    sys.stdout.write("$ %s\n-> status %d\n" % (" ".join(argv), p.returncode))
    # Each run's whole output (the script's tables and footer, the loop's lines, the agent's log)
    # goes to $OUT when it is set, for what the summary below leaves out.
    if os.environ.get("OUT"):
        with open(os.path.join(os.environ["OUT"], "duty_accuracy_%s.txt" % name), "w") as f:
            f.write(p.stdout + p.stderr)
    if p.returncode != 0:
        sys.stdout.write(p.stdout[-3000:] + p.stderr[-3000:])
        sys.exit(2)
    return p.stdout


def steps_of(out):
    """(steps, seconds) of the timed loop, from duty_train.py's TRAIN line."""
    m = re.search(r"TRAIN steps (\d+) seconds ([\d.]+)", out)
    return int(m.group(1)), float(m.group(2))


def main():
    b = os.path.abspath(sys.argv[1])
    seconds = sys.argv[2] if len(sys.argv) > 2 else "300"
    duty = sys.argv[3] if len(sys.argv) > 3 else "0.05"
    period = sys.argv[4] if len(sys.argv) > 4 else "10000"
    lua = os.path.join(b, "cuptimon-lua")
    train = [sys.executable, os.path.join(ROOT, "spec", "gpu", "duty_train.py"), seconds]
    # The exact rates are per second of the timed loop, so the full trace may run the same loop
    # for less time (FULL_SECONDS, default SECONDS) when the device time is short.
    full_train = train[:-1] + [os.environ.get("FULL_SECONDS", seconds)]
    full = run([lua, os.path.join(ROOT, "scripts", "top.lua"), "--top", "10", "--"] + full_train, "full")
    full_steps, loop_s = steps_of(full)
    exact = {}
    for line in full.splitlines():
        m = FULL_ROW.match(line)
        if m:
            # top's Total is in us: t is GPU seconds per second (printed as ms/s).
            exact[m.group(9)] = (float(m.group(3)) / loop_s, float(m.group(2)) / 1e6 / loop_s)
    top5 = sorted(exact, key=lambda k: -exact[k][1])[:5]
    est_out = run([lua, os.path.join(ROOT, "scripts", "top.lua"), "--duty", duty, "--period-ms",
                   period, "--top", "50", "--"] + train, "duty")
    est = {}
    for line in est_out.splitlines():
        m = DUTY_ROW.match(line)
        if m:
            est[m.group(8)] = [float(m.group(i)) for i in range(1, 5)] + [bool(m.group(9))]
    footer = [l for l in est_out.splitlines() if l.startswith("duty ") or l.startswith("note:")]
    print("\n".join(footer))
    # The full trace slows a launch-bound loop more than a duty cycle does, so the two runs need
    # not make the same steps per second. Each rate divided by its own run's steps per second
    # (launches and GPU time per step) separates the estimator's error from that difference.
    duty_steps, duty_s = steps_of(est_out)
    full_sps, duty_sps = full_steps / loop_s, duty_steps / duty_s
    print("steps/s: full trace %.1f, duty cycle %.1f (ratio %.3f)" % (full_sps, duty_sps,
                                                                      duty_sps / full_sps))
    # Per step, the estimate's 95% interval is its rate's interval over the duty run's steps per
    # second (the steps are counted exactly, so they add no sampling error of their own).
    print("| kernel | launches/step exact | estimate ± 95% | ratio | in interval | GPU us/step exact "
          "| estimate ± 95% | ratio | in interval |")
    print("|---|--:|--:|--:|:-:|--:|--:|--:|:-:|")
    for k in top5:
        if k in est:
            n, t = exact[k]
            r, rh, g, gh = est[k][0:4]
            cells = []
            for x, e, h in ((n / full_sps, r / duty_sps, rh / duty_sps),
                            (t * 1e6 / full_sps, g * 1e3 / duty_sps, gh * 1e3 / duty_sps)):
                cells.append("%.3f | %.3f ± %.3f | %.3f | %s" % (
                    x, e, h, e / x if x else float("nan"), "yes" if abs(e - x) <= h else "no"))
            print("| %s | %s |" % (k, " | ".join(cells)))
    print("| kernel | launches/s exact | estimate ± 95% | ratio | in interval | GPU ms/s exact | "
          "estimate ± 95% | ratio | in interval |")
    print("|---|--:|--:|--:|:-:|--:|--:|--:|:-:|")
    ok = True
    for k in top5:
        n, t = exact[k]
        if k not in est:
            print("| %s | %.1f | not estimated | | | %.3f | | | |" % (k, n, t * 1e3))
            ok = False
            continue
        r, rh, g, gh, phase = est[k]
        cells = []
        for x, e, h in ((n, r, rh), (t * 1e3, g, gh)):
            ratio = e / x if x else float("nan")
            ok &= abs(ratio - 1) <= 0.05
            cells.append("%.3f | %.3f ± %.3f | %.3f | %s" % (x, e, h, ratio, "yes" if abs(e - x) <= h else "no"))
        print("| %s%s | %s |" % (k, " (phase change)" if phase else "", " | ".join(cells)))
    print("RESULT: %s" % ("PASS (the five largest kernels within 5%)" if ok else
                          "MISS (a figure is more than 5% off)"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
