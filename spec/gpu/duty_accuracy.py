#!/usr/bin/env python3
"""The duty cycle's accuracy on a GPU (issue 21): the same PyTorch training loop
(spec/gpu/duty_train.py, SECONDS long) run twice, under the full trace (scripts/top.lua) and under
a duty cycle (scripts/top.lua --duty DUTY --period-ms PERIOD). For the five kernels with the most
GPU time in the full trace, compares the estimated launches per second and GPU time per second
with the exact ones (the full trace's counts and summed durations over the timed loop), and says
whether each exact figure lies in the estimate's 95% interval. Goal: within 5%.

Usage: python3 spec/gpu/duty_accuracy.py BUILD_DIR [SECONDS=300] [DUTY=0.05] [PERIOD_MS=10000]
Exit status 0 when all ten figures are within 5%, 1 otherwise, 2 when a run failed.

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


def run(argv):
    p = subprocess.run(argv, capture_output=True, text=True, errors="replace")
    sys.stdout.write("$ %s\n-> status %d\n" % (" ".join(argv), p.returncode))
    if p.returncode != 0:
        sys.stdout.write(p.stdout[-3000:] + p.stderr[-3000:])
        sys.exit(2)
    return p.stdout


def main():
    b = os.path.abspath(sys.argv[1])
    seconds = sys.argv[2] if len(sys.argv) > 2 else "300"
    duty = sys.argv[3] if len(sys.argv) > 3 else "0.05"
    period = sys.argv[4] if len(sys.argv) > 4 else "10000"
    lua = os.path.join(b, "cuptimon-lua")
    train = [sys.executable, os.path.join(ROOT, "spec", "gpu", "duty_train.py"), seconds]
    full = run([lua, os.path.join(ROOT, "scripts", "top.lua"), "--top", "10", "--"] + train)
    loop_s = float(re.search(r"TRAIN steps \d+ seconds ([\d.]+)", full).group(1))
    exact = {}
    for line in full.splitlines():
        m = FULL_ROW.match(line)
        if m:
            exact[m.group(9)] = (float(m.group(3)) / loop_s, float(m.group(2)) / 1e3 / loop_s)
    top5 = sorted(exact, key=lambda k: -exact[k][1])[:5]
    est_out = run([lua, os.path.join(ROOT, "scripts", "top.lua"), "--duty", duty, "--period-ms",
                   period, "--top", "50", "--"] + train)
    est = {}
    for line in est_out.splitlines():
        m = DUTY_ROW.match(line)
        if m:
            est[m.group(8)] = [float(m.group(i)) for i in range(1, 5)] + [bool(m.group(9))]
    footer = [l for l in est_out.splitlines() if l.startswith("duty ") or l.startswith("note:")]
    print("\n".join(footer))
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
