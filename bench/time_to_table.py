#!/usr/bin/env python3
"""Time to a table, on a GPU machine: bench/time_to_table.sh BUILD_DIR.

The workload is spec/gpu/torch_nvtx.py STEPS, a fixed-seed training loop, run three ways in an
order shuffled per round:

  cuptimon    cuptimon-lua bench/time_to_table.lua -- python3 spec/gpu/torch_nvtx.py STEPS
              exit_to_hook: from the workload's last action (EXIT_REALTIME_NS) to the script's
              exit hook; exit_to_table: to the end of top's table; loop_end_to_table: from the
              loop's end (LOOP_END_REALTIME_NS) to the end of the table, torch.profiler's measure.
              The run must exit 0 with no LOST line (no record lost).
  profiler    python3 spec/gpu/torch_nvtx.py STEPS key_averages: loop_end_to_table is
              KEY_AVERAGES_MS, from the loop's end inside the profiler's context to
              key_averages().table() returned.
  untraced    python3 spec/gpu/torch_nvtx.py STEPS: exit_to_reaped, from EXIT_REALTIME_NS to
              this driver's wait returning, the interpreter's and CUDA's own teardown, which any
              tracer's exit measure includes.

ROUNDS_200 (default 5) rounds at 200 steps and ROUNDS_2000 (default 3) at 2000 steps (a run takes
seconds on a GPU). BUDGET_S (default none) bounds the whole: a round that would pass it, going by
the longest round so far, is not started, the rounds left out are said, and the table is printed
from the rounds run (a device call has a time limit, and the table must survive it). Medians
with bootstrap 95% intervals in milliseconds; every run in OUT/time_to_table.json, written after
each round. Exit status 1 when a run failed or lost records.
"""
import json
import os
import random
import re
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import benchstats as bs  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def stamp(name, text):
    m = re.search(r"^%s (\d+)" % name, text, re.M)
    return int(m.group(1)) if m else None


def run(build, config, steps, python):
    wl = [python, os.path.join(ROOT, "spec", "gpu", "torch_nvtx.py"), str(steps)]
    if config == "cuptimon":
        argv = [os.path.join(build, "cuptimon-lua"), os.path.join(ROOT, "bench", "time_to_table.lua"),
                "--"] + wl
    elif config == "profiler":
        argv = wl + ["key_averages"]
    else:
        argv = wl
    env = dict(os.environ)
    for k in ("CUPTIMON_LIBCUPTI", "CUPTIMON_LIBCUDA", "CUDA_INJECTION64_PATH"):
        env.pop(k, None)
    p = subprocess.run(argv, env=env, capture_output=True, text=True, errors="replace", timeout=300)
    reaped = time.time_ns()
    out = p.stdout + "\n" + p.stderr
    r = {"config": config, "steps": steps, "rc": p.returncode, "ok": p.returncode == 0}
    ex, le = stamp("EXIT_REALTIME_NS", out), stamp("LOOP_END_REALTIME_NS", out)
    if config == "cuptimon":
        hook, table = stamp("EXIT_HOOK_REALTIME_NS", out), stamp("TABLE_DONE_REALTIME_NS", out)
        pe = stamp("PROCESS_EXIT_HOOK_REALTIME_NS", out)
        if None in (ex, le, hook, table) or "LOST" in out:
            r["ok"] = False
        else:
            r["exit_to_process_exit_hook_ms"] = (pe - ex) / 1e6 if pe else None
            r["exit_to_hook_ms"] = (hook - ex) / 1e6
            r["exit_to_table_ms"] = (table - ex) / 1e6
            r["loop_end_to_table_ms"] = (table - le) / 1e6
    elif config == "profiler":
        m = re.search(r"^KEY_AVERAGES_MS ([\d.]+)", out, re.M)
        if not m:
            r["ok"] = False
        else:
            r["loop_end_to_table_ms"] = float(m.group(1))
    else:
        if ex is None:
            r["ok"] = False
        else:
            r["exit_to_reaped_ms"] = (reaped - ex) / 1e6
    if not r["ok"]:
        r["tail"] = out[-800:]
    return r


def main():
    if len(sys.argv) < 2:
        sys.exit("usage: time_to_table.py BUILD_DIR")
    build = os.path.abspath(sys.argv[1])
    out_dir = os.environ.get("OUT") or "/tmp/cuptimon-time-to-table"
    os.makedirs(out_dir, exist_ok=True)
    plan = [(200, int(os.environ.get("ROUNDS_200", "5"))),
            (2000, int(os.environ.get("ROUNDS_2000", "3")))]
    seed = int(os.environ.get("SEED", "0")) or int(time.time())
    python = os.environ.get("PYTHON", sys.executable)
    print("time_to_table: %s; seed %d. %s" % (
        ", ".join("%d rounds at %d steps" % (n, s) for s, n in plan), seed, bs.describe(build)),
        flush=True)
    budget = float(os.environ.get("BUDGET_S", "0") or 0)
    t_start, longest = time.monotonic(), {}
    rows, skipped = [], []
    for steps, rounds in plan:
        for rnd in range(rounds):
            t_round = time.monotonic()
            guess = longest.get(steps, longest.get(200, 0) * steps / 200)
            if budget and t_round - t_start + guess > budget:
                skipped.append("%d steps round %d" % (steps, rnd))
                continue
            order = ["cuptimon", "profiler", "untraced"]
            random.Random(seed * 100 + steps + rnd).shuffle(order)
            for c in order:
                r = run(build, c, steps, python)
                r["round"] = rnd
                rows.append(r)
                if not r["ok"]:
                    print("  %d steps round %d %s FAILED (status %d):\n%s" % (
                        steps, rnd, c, r["rc"], r["tail"]), flush=True)
            longest[steps] = max(longest.get(steps, 0), time.monotonic() - t_round)
            print("  %d steps, round %d done (%.0f s so far)" % (steps, rnd, time.monotonic() - t_start),
                  flush=True)
            with open(os.path.join(out_dir, "time_to_table.json"), "w") as f:
                json.dump({"seed": seed, "runs": rows}, f, indent=1)
    if skipped:
        print("time_to_table: not run, the budget of %.0f s (BUDGET_S) being reached: %s" % (
            budget, ", ".join(skipped)), flush=True)
    metrics = [("cuptimon", "exit_to_process_exit_hook_ms", "cuptimon: process exit -> process_exit hook"),
               ("cuptimon", "exit_to_hook_ms", "cuptimon: process exit -> script's exit hook"),
               ("cuptimon", "exit_to_table_ms", "cuptimon: process exit -> top's table printed"),
               ("cuptimon", "loop_end_to_table_ms", "cuptimon: loop end -> top's table printed"),
               ("profiler", "loop_end_to_table_ms", "torch.profiler: loop end -> key_averages table"),
               ("untraced", "exit_to_reaped_ms", "untraced: process exit -> reaped (teardown)")]
    print()
    print("| steps | measure | runs | ms, median [95% CI] | min – max |")
    print("|--:|---|--:|--:|--:|")
    for steps, _ in plan:
        for config, key, label in metrics:
            xs = [r[key] for r in rows if r["steps"] == steps and r["config"] == config and r["ok"]
                  and r.get(key) is not None]
            if not xs:
                continue
            s = bs.summary(xs)
            print("| %d | %s | %d | %.1f [%.1f, %.1f] | %.1f – %.1f |" % (
                steps, label, s["n"], s["median"], s["lo"], s["hi"], s["min"], s["max"]))
    with open(os.path.join(out_dir, "time_to_table.json"), "w") as f:
        json.dump({"seed": seed, "runs": rows}, f, indent=1)
    bad = [r for r in rows if not r["ok"]]
    print("RESULT: %s" % ("PASS (every cuptimon run exited 0 with no record lost)" if not bad
                          else "FAIL (%d run(s) failed)" % len(bad)))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
