"""The duty cycle's cost and its estimate at many launching threads, on a GPU machine.

  python3 bench/duty_threads.py BUILD_DIR [--threads 16] [--seconds 6] [--rounds 10]

Each round runs gpu/launch_loop --threads T --seconds S once in each configuration, in a
shuffled order, each in its own process: untraced; the full trace of kernels (scripts/top.lua);
the default duty cycle (scripts/count.lua --duty 0.05 and 0.1 --period-ms 1000 --kinds kernel).
The loop reports its launches per second over all threads (wall time); the report gives, per
configuration, the median of its per-round ratio to the untraced run of the same round (a
throughput ratio: 1.00 costs nothing, 0.95 costs 5%) with a bootstrap 95% interval, and for the
duty runs the estimate of the kernels launched against the loop's own count, and what the agent
did with CUPTI between windows (the footer's note). Output: the table on stdout, every run in
$OUT/duty_threads_runs.json (OUT defaults to /tmp/cuptimon-duty-threads).
"""
import argparse
import json
import os
import random
import re
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import benchstats  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SWEEP = re.compile(r"^RESULT sweep threads \d+ launches (\d+) seconds ([\d.]+) launches_per_s ([\d.]+)", re.M)
ESTIMATED = re.compile(r"^estimated concurrent_kernel (\d+) ± (\S+) \(95%, (\d+) windows\)", re.M)
NOTE = re.compile(r"^note: pid \d+: CUPTI (.*)$", re.M)
DETACHED = re.compile(r"^CUPTI detached (\d+) times between windows", re.M)
CONFIGS = ["untraced", "full", "duty05", "duty10"]


def command(b, config, threads, seconds):
    loop = [os.path.join(b, "gpu", "launch_loop"), "--threads", str(threads), "--seconds", str(seconds)]
    lua = os.path.join(b, "cuptimon-lua")
    if config == "untraced":
        return loop
    if config == "full":
        return [lua, os.path.join(ROOT, "scripts", "top.lua"), "--"] + loop
    duty = {"duty05": "0.05", "duty10": "0.1"}[config]
    return [lua, os.path.join(ROOT, "scripts", "count.lua"), "--duty", duty, "--period-ms", "1000",
            "--kinds", "kernel", "--"] + loop


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("build")
    ap.add_argument("--threads", type=int, default=16)
    ap.add_argument("--seconds", type=float, default=6)
    ap.add_argument("--rounds", type=int, default=10)
    args = ap.parse_args()
    out_dir = os.environ.get("OUT", "/tmp/cuptimon-duty-threads")
    os.makedirs(out_dir, exist_ok=True)
    b = os.path.abspath(args.build)
    print(benchstats.describe(b))
    print("launch_loop --threads %d --seconds %g, %d rounds" % (args.threads, args.seconds, args.rounds))
    rng = random.Random(7)
    runs, rate = [], {c: {} for c in CONFIGS}
    for r in range(args.rounds):
        order = CONFIGS[:]
        rng.shuffle(order)
        for c in order:
            p = subprocess.run(command(b, c, args.threads, args.seconds), capture_output=True, text=True,
                               timeout=args.seconds + 120)
            text = p.stdout + "\n" + p.stderr
            m = SWEEP.search(text)
            run = {"round": r, "config": c, "rc": p.returncode}
            if m:
                run["launches"], run["per_s"] = int(m.group(1)), float(m.group(3))
                rate[c][r] = run["per_s"]
            e = ESTIMATED.search(text)
            if e:
                run["estimate"], run["half"], run["windows"] = int(e.group(1)), e.group(2), int(e.group(3))
            run["notes"] = NOTE.findall(text)
            d = DETACHED.search(text)
            run["detaches"] = int(d.group(1)) if d else 0
            if p.returncode != 0 or not m:
                run["tail"] = text[-2000:]
            runs.append(run)
            print("round %d %-8s rc %d launches/s %s%s%s" % (
                r, c, p.returncode, run.get("per_s", "?"),
                " estimate %s ± %s of %s (%s windows, %d detaches)" % (
                    run.get("estimate"), run.get("half"), run.get("launches"), run.get("windows"),
                    run["detaches"]) if c.startswith("duty") else "",
                "; " + "; ".join(run["notes"]) if run["notes"] else ""), flush=True)
    with open(os.path.join(out_dir, "duty_threads_runs.json"), "w") as f:
        json.dump(runs, f, indent=1)
    print("\nthroughput against untraced, per round (1.000 = no cost), median [95% bootstrap]:")
    for c in CONFIGS[1:]:
        ratios = benchstats.paired_ratios(rate[c], rate["untraced"])
        if not ratios:
            print("  %-8s no paired rounds" % c)
            continue
        s = benchstats.summary(ratios)
        print("  %-8s %.3f [%.3f, %.3f] (%d rounds, min %.3f max %.3f)" % (
            c, s["median"], s["lo"], s["hi"], s["n"], s["min"], s["max"]))
    for c in ("duty05", "duty10"):
        est = [x["estimate"] / x["launches"] for x in runs if x["config"] == c and "estimate" in x and x.get("launches")]
        if est:
            s = benchstats.summary(est)
            print("  %s estimate / launched: median %.3f [%.3f, %.3f] (%d runs)" % (c, s["median"], s["lo"], s["hi"], s["n"]))
        else:
            print("  %s: no estimate in any run" % c)
    bad = [x for x in runs if x["rc"] != 0 or "per_s" not in x]
    print("RESULT: %s (%d runs, %d failed)" % ("PASS" if not bad else "FAIL", len(runs), len(bad)))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
