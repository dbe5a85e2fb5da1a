#!/usr/bin/env python3
"""The overhead harness: what tracing adds to a launch, against the floor and against
torch.profiler, with intervals. Run on a GPU machine through bench/overhead.sh BUILD_DIR.

Design. Every (configuration, workload) pair runs once per round, each in its own process, in an
order shuffled afresh every round (seeded: the seed is printed and stored), for --rounds rounds.
Each run prints its own figures: per launch (or per op) the wall time of the timed loop and the
CPU time of the thread that launched (CLOCK_THREAD_CPUTIME_ID; time.thread_time_ns), where the
cost CUPTI adds to a launch lands. Per configuration the report gives the median and a bootstrap
95% interval of the median, and the per-round ratios against the floor (paired: the same round's
floor run), their median and bootstrap interval. A ratio's interval that holds 1.0 means no
difference can be told apart at this number of rounds.

The floor is gpu/libcupti_floor.so (bench/cupti_floor.c), a CUPTI consumer that only counts
records: CUPTI's own cost, which no consumer of the same kinds can go below.

Workloads: "launch", gpu/launch_loop N (empty <<<1,1>>> kernels, ns per launch); "torch",
bench/torch_workload.py micro MODE N (in-place adds on a 1024-float tensor, one kernel and a few
runtime API calls each, us per op); "train", bench/torch_workload.py steps N (the training loop
of spec/gpu/duty_train.py, us per step). Every traced run's records are checked: the counts must match
what was launched (launch workload) and nothing may be dropped; a run that fails or loses records
makes the exit status 1 and is left out of the figures.

Output: the tables on stdout and in OUT/overhead.md, every run in OUT/overhead_runs.csv and
OUT/overhead_runs.json (OUT is --out, default $OUT, else /tmp/cuptimon-overhead).
"""
import argparse
import csv
import json
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import benchstats as bs  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# (name, label, workloads it applies to)
CONFIGS = [
    ("untraced", "untraced", ("launch", "torch", "train")),
    ("floor_k", "floor: CUPTI consumer counting records, kernels", ("launch", "torch")),
    ("floor_kr", "floor: CUPTI consumer counting records, kernels + runtime API", ("launch", "torch")),
    ("cm_count", "cuptimon live, scripts/count.lua --kinds kernel,runtime", ("launch", "torch", "train")),
    ("cm_top", "cuptimon live, scripts/top.lua", ("launch", "torch", "train")),
    ("cm_record", "cuptimon --record --select 'kernel;runtime'", ("launch", "torch")),
    ("dormant", "agent injected, dormant (CUPTIMON_LISTEN=1)", ("launch", "torch", "train")),
    ("duty05", "cuptimon live, scripts/count.lua --duty 0.05 --kinds kernel", ("launch", "torch", "train")),
    ("duty10", "cuptimon live, scripts/count.lua --duty 0.1 --kinds kernel", ("launch", "torch", "train")),
    ("duty05d", "duty05 with CUPTIMON_DETACH_IDLE=1 (CUPTI detached between windows, the default)", ("launch", "torch", "train")),
    ("duty10d", "duty10 with CUPTIMON_DETACH_IDLE=1 (CUPTI detached between windows, the default)", ("launch", "torch", "train")),
    ("duty05a", "duty05 with CUPTIMON_DETACH_IDLE=0 (CUPTI attached between windows)", ("launch", "torch", "train")),
    ("duty10a", "duty10 with CUPTIMON_DETACH_IDLE=0 (CUPTI attached between windows)", ("launch", "torch", "train")),
    ("prof_cuda", "torch.profiler, CUDA activities", ("torch",)),
    ("prof_cpu_cuda", "torch.profiler, CPU + CUDA activities", ("torch",)),
]
LABEL = {c[0]: c[1] for c in CONFIGS}
UNIT = {"launch": ("ns per launch", 1.0), "torch": ("us per op", 1e-3), "train": ("us per step", 1e-3)}

RESULT_LAUNCH = re.compile(r"^RESULT launch_loop launches (\d+) wall_ns ([\d.]+) cpu_ns ([\d.]+)", re.M)
RESULT_TORCH = re.compile(r"^RESULT (?:micro|steps) \S+ ns_per_op ([\d.]+) cpu_ns_per_op ([\d.]+)", re.M)
LAUNCHED = re.compile(r"^LAUNCHED (\d+)", re.M)
FLOOR = re.compile(r"cupti_floor: kernels (\d+) runtime (\d+) other \d+ dropped (\d+)")
COUNT_ROW = re.compile(r"^\s*(concurrent_kernel|runtime)\s+(\d+)\s*$", re.M)
RECORDED = re.compile(r"recorded (\S+): .* (\d+) records, (\d+) dropped")
ESTIMATED = re.compile(r"^estimated concurrent_kernel (\d+) ± (\S+) \(95%, (\d+) windows\)", re.M)
# The duty configurations' period (DUTY_PERIOD_MS): a run must hold many periods, so it is
# shorter than the recipes' default of 10 s; bench/duty_overhead.sh sets it with long runs.
# The configurations ending in "d" detach CUPTI between windows (CUPTIMON_DETACH_IDLE=1, as the
# default does), those ending in "a" keep it attached (CUPTIMON_DETACH_IDLE=0).
DUTY = {"duty05": "0.05", "duty10": "0.1", "duty05d": "0.05", "duty10d": "0.1", "duty05a": "0.05",
        "duty10a": "0.1"}


class Setup:
    def __init__(self, args):
        b = os.path.abspath(args.build)
        self.build = b
        self.lua = os.path.join(b, "cuptimon-lua")
        self.agent = os.path.join(b, "libcuptimon-agent.so")
        self.floor = os.path.join(b, "gpu", "libcupti_floor.so")
        self.loop = os.path.join(b, "gpu", "launch_loop")
        self.launches = args.launches
        self.ops = args.ops
        self.steps = args.steps
        self.python = args.python
        self.tmp = tempfile.mkdtemp(prefix="cm-overhead-")
        self.stub = args.stub

    def workload(self, wl, mode="none"):
        if self.stub:  # the harness's own smoke test: a shell printing plausible figures
            return [sys.executable, os.path.join(ROOT, "bench", "overhead_stub.py"), wl]
        if wl == "launch":
            return [self.loop, str(self.launches)]
        if wl == "train":
            return [self.python, os.path.join(ROOT, "bench", "torch_workload.py"), "steps",
                    str(self.steps)]
        return [self.python, os.path.join(ROOT, "bench", "torch_workload.py"), "micro", mode,
                str(self.ops)]

    def dormant_available(self):
        """The dormant mode exists when the agent knows CUPTIMON_LISTEN."""
        try:
            with open(self.agent, "rb") as f:
                return b"CUPTIMON_LISTEN" in f.read()
        except OSError:
            return False

    def command(self, config, wl):
        """(argv, extra environment) of one run."""
        env = {}
        if config == "untraced":
            return self.workload(wl), env
        if config in ("floor_k", "floor_kr"):
            env["CUDA_INJECTION64_PATH"] = self.floor
            env["CUPTI_FLOOR_RUNTIME"] = "1" if config == "floor_kr" else "0"
            return self.workload(wl), env
        if config == "cm_count":
            return [self.lua, os.path.join(ROOT, "scripts", "count.lua"), "--kinds", "kernel,runtime",
                    "--"] + self.workload(wl), env
        if config == "cm_top":
            return [self.lua, os.path.join(ROOT, "scripts", "top.lua"), "--"] + self.workload(wl), env
        if config == "cm_record":
            return [self.lua, "--record", os.path.join(self.tmp, "rec.%p.cmcap"), "--select",
                    "kernel;runtime", "--"] + self.workload(wl), env
        if config in DUTY:
            if config.endswith("d"):
                env["CUPTIMON_DETACH_IDLE"] = "1"
            elif config.endswith("a"):
                env["CUPTIMON_DETACH_IDLE"] = "0"
            return [self.lua, os.path.join(ROOT, "scripts", "count.lua"), "--duty", DUTY[config],
                    "--period-ms", os.environ.get("DUTY_PERIOD_MS", "1000"), "--kinds", "kernel",
                    "--"] + self.workload(wl), env
        if config == "dormant":
            env["CUDA_INJECTION64_PATH"] = self.agent
            env["CUPTIMON_LISTEN"] = "1"
            return self.workload(wl), env
        if config in ("prof_cuda", "prof_cpu_cuda"):
            mode = "profiler_cuda" if config == "prof_cuda" else "profiler_cpu_cuda"
            return self.workload(wl, mode), env
        raise ValueError(config)


def check(config, wl, rc, out, err):
    """(ok, note, records) for one run's output: the figures parsed and the records checked."""
    if rc != 0:
        return False, "exit status %d" % rc, None
    text = out + "\n" + err
    launched = LAUNCHED.search(out)
    launched = int(launched.group(1)) if launched else None
    if wl == "launch" and launched is None:
        return False, "no LAUNCHED line", None
    if config in ("floor_k", "floor_kr"):
        m = FLOOR.search(err)
        if not m:
            return False, "no cupti_floor line (was the floor injected?)", None
        k, r, d = int(m.group(1)), int(m.group(2)), int(m.group(3))
        if d:
            return False, "floor dropped %d records" % d, k + r
        if launched is not None and (k != launched or (config == "floor_kr" and r < launched)):
            return False, "floor counted kernels %d runtime %d of %d launches" % (k, r, launched), k + r
        if config == "floor_kr" and r == 0:
            return False, "floor counted no runtime records", k
        return True, "", k + r
    if config == "cm_count":
        rows = dict((k, int(v)) for k, v in COUNT_ROW.findall(out))
        k, r = rows.get("concurrent_kernel", 0), rows.get("runtime", 0)
        if launched is not None and (k != launched or r < launched):
            return False, "count.lua saw kernels %d runtime %d of %d launches" % (k, r, launched), k + r
        if k == 0 or r == 0:
            return False, "count.lua saw kernels %d runtime %d" % (k, r), k + r
        return True, "", k + r
    if config == "cm_record":
        m = RECORDED.search(err) or RECORDED.search(out)
        if not m:
            return False, "no 'recorded' summary line", None
        n, d = int(m.group(2)), int(m.group(3))
        if d:
            return False, "--record dropped %d records" % d, n
        if launched is not None and n < 2 * launched:
            return False, "--record wrote %d records for %d launches" % (n, launched), n
        return True, "", n
    if config in DUTY:
        if "LOST" in text:
            return False, "a LOST line", None
        m = ESTIMATED.search(out)
        if not m:
            return False, "no 'estimated concurrent_kernel' line (no window?)", None
        note = "estimated %s ± %s kernels in %s windows" % m.groups()
        if launched is not None:
            note += " (launched %d)" % launched
        return True, note, None
    if "LOST" in text:
        return False, "a LOST line", None
    return True, "", None


def parse_figures(wl, out):
    if wl == "launch":
        m = RESULT_LAUNCH.search(out)
        return (float(m.group(2)), float(m.group(3))) if m else None
    m = RESULT_TORCH.search(out)
    return (float(m.group(1)), float(m.group(2))) if m else None


def run_one(setup, config, wl, timeout):
    argv, extra = setup.command(config, wl)
    env = dict(os.environ)
    for k in ("CUPTIMON_LIBCUPTI", "CUPTIMON_LIBCUDA", "CUDA_INJECTION64_PATH", "CUPTIMON_LISTEN"):
        env.pop(k, None)
    env.update(extra)
    t0 = time.monotonic()
    try:
        p = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=timeout,
                           errors="replace")
        rc, out, err = p.returncode, p.stdout, p.stderr
    except subprocess.TimeoutExpired as e:
        rc, out, err = 124, str(e.stdout or ""), "timeout after %d s" % timeout
    took = time.monotonic() - t0
    if setup.stub:  # no CUDA in the stub: nothing is traced, so only the status is checked
        ok, note, records = rc == 0, "" if rc == 0 else "exit status %d" % rc, None
    else:
        ok, note, records = check(config, wl, rc, out, err)
    figs = parse_figures(wl, out) if ok else None
    if ok and figs is None:
        ok, note = False, "no RESULT line"
    for f in os.listdir(setup.tmp):
        os.unlink(os.path.join(setup.tmp, f))
    row = {"config": config, "workload": wl, "ok": ok, "note": note, "rc": rc,
           "wall_ns": figs[0] if figs else None, "cpu_ns": figs[1] if figs else None,
           "records": records, "run_s": round(took, 3)}
    if not ok:
        row["stderr_tail"] = err[-600:]
    return row


def fmt(v, scale):
    v *= scale
    return "%.0f" % v if v >= 100 else "%.2f" % v


def cell(s, scale=1.0, ratio=False):
    if ratio:
        return "%.3f [%.3f, %.3f]" % (s["median"], s["lo"], s["hi"])
    return "%s [%s, %s]" % (fmt(s["median"], scale), fmt(s["lo"], scale), fmt(s["hi"], scale))


# The floor each configuration is compared with: the one that records the same kinds (top.lua
# selects kernels only; the dormant agent records nothing, so its reference is the untraced run).
FLOOR_OF = {"untraced": "floor_k", "floor_kr": "floor_k", "cm_count": "floor_kr",
            "cm_top": "floor_k", "cm_record": "floor_kr", "dormant": "untraced",
            "duty05": "untraced", "duty10": "untraced", "duty05d": "untraced", "duty10d": "untraced",
            "duty05a": "untraced", "duty10a": "untraced",
            "prof_cuda": "floor_kr", "prof_cpu_cuda": "floor_kr"}
SHORT = {"untraced": "untraced", "floor_k": "floor (k)", "floor_kr": "floor (k+rt)",
         "prof_cuda": "torch.profiler CUDA"}
WORD = {"below": "below it", "above": "above it", "overlaps": "not told apart from it"}


def ratio_summary(by, c, ref, key):
    if c == ref or c not in by or ref not in by:
        return None
    a = dict((k, v[key]) for k, v in by[c].items())
    b = dict((k, v[key]) for k, v in by[ref].items())
    rat = bs.paired_ratios(a, b)
    return bs.summary(rat) if rat else None


def report(rows, configs, workloads, meta):
    lines = []
    add = lines.append
    add("Measured %s. %d rounds, each configuration in its own process, in a shuffled order per "
        "round (seed %d); launch workload %d launches, torch workload %d ops, train workload %d steps "
        "per run." % (meta["machine"], meta["rounds"], meta["seed"], meta["launches"], meta["ops"],
                      meta.get("steps", 0)))
    if meta["rounds"] < 10:
        add("**Only %d rounds (the time budget ran out): the intervals are wide.**" % meta["rounds"])
    add("Command: `%s`. Medians with bootstrap 95%% intervals of the median; ratios are per round "
        "(paired) against the reference run of the same round, median [95%% interval]."
        % meta["command"])
    verdicts = []
    applies = dict((x[0], x[2]) for x in CONFIGS)
    for wl in workloads:
        unit, scale = UNIT[wl]
        cfgs = [c for c in configs if wl in applies[c]]
        by = {}
        for r in rows:
            if r["workload"] == wl and r["ok"]:
                by.setdefault(r["config"], {})[r["round"]] = r
        prof = wl == "torch" and "prof_cuda" in by
        add("")
        title = {"launch": "Empty-kernel launch", "torch": "PyTorch small-op",
                 "train": "PyTorch training-loop"}[wl]
        add("#### %s workload (%s)" % (title, unit))
        add("")
        head = ["configuration", "runs", "wall", "launching thread CPU", "reference",
                "wall / reference", "CPU / reference"]
        if prof:
            head += ["wall / torch.profiler CUDA", "CPU / torch.profiler CUDA"]
        add("| " + " | ".join(head) + " |")
        add("|" + "|".join(["---"] + ["--:"] * (len(head) - 1)) + "|")
        for c in cfgs:
            if c not in by:
                add("| %s | 0 | every run failed |%s" % (LABEL[c], " |" * (len(head) - 2)))
                continue
            wall = [r["wall_ns"] for r in by[c].values()]
            cpu = [r["cpu_ns"] for r in by[c].values()]
            row = [LABEL[c], str(len(wall)), cell(bs.summary(wall), scale),
                   cell(bs.summary(cpu), scale)]
            refs = [FLOOR_OF.get(c)] + (["prof_cuda"] if prof else [])
            row.append(SHORT.get(refs[0], "–") if refs[0] in by else "–")
            for ref in refs:
                got = []
                for key in ("wall_ns", "cpu_ns"):
                    s = ratio_summary(by, c, ref, key)
                    row.append(cell(s, ratio=True) if s else "–")
                    if s:
                        got.append("%s %.3f [%.3f, %.3f], %s" % (
                            "wall" if key == "wall_ns" else "thread CPU", s["median"], s["lo"],
                            s["hi"], WORD[bs.interval_verdict(s["lo"], s["hi"])]))
                if got and (c.startswith("cm_") or c == "dormant" or c in DUTY):
                    verdicts.append("%s workload, %s against %s: %s" % (
                        wl, LABEL[c], SHORT[ref], "; ".join(got)))
            add("| " + " | ".join(row) + " |")
    add("")
    add("Against the reference (1.0 is the reference's cost; \"not told apart\" when the 95% "
        "interval holds 1.0):")
    add("")
    for v in verdicts:
        add("- " + v)
    return "\n".join(lines)


def save_runs(out, meta, rows):
    with open(os.path.join(out, "overhead_runs.json"), "w") as f:
        json.dump({"meta": meta, "runs": rows}, f, indent=1)
    keys = ["round", "position", "workload", "config", "ok", "wall_ns", "cpu_ns", "records", "rc",
            "run_s", "note"]
    with open(os.path.join(out, "overhead_runs.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=keys, extrasaction="ignore")
        w.writeheader()
        w.writerows(rows)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("build")
    ap.add_argument("--rounds", type=int, default=int(os.environ.get("ROUNDS", "10")))
    ap.add_argument("--launches", type=int, default=int(os.environ.get("LAUNCHES", "100000")))
    ap.add_argument("--ops", type=int, default=int(os.environ.get("OPS", "20000")))
    ap.add_argument("--steps", type=int, default=int(os.environ.get("STEPS", "4000")),
                    help="training steps a run of the train workload (default 4000)")
    ap.add_argument("--workloads", default=os.environ.get("WORKLOADS", "launch,torch"))
    ap.add_argument("--configs", default=os.environ.get("CONFIGS", ",".join(c[0] for c in CONFIGS)))
    ap.add_argument("--seed", type=int, default=int(os.environ.get("SEED", "0")) or int(time.time()))
    ap.add_argument("--timeout", type=int, default=180)
    ap.add_argument("--budget-s", type=float, default=float(os.environ.get("BUDGET_S", "540")),
                    help="start no round that would end past this many seconds (default 540, "
                    "so that a 10-minute device call always gets its report)")
    ap.add_argument("--python", default=sys.executable)
    ap.add_argument("--out", default=os.environ.get("OUT") or "/tmp/cuptimon-overhead")
    ap.add_argument("--stub", action="store_true", help="run bench/overhead_stub.py instead of "
                    "the workloads (a smoke test of the harness without a GPU)")
    args = ap.parse_args()
    if args.rounds < 1:
        ap.error("--rounds must be at least 1")
    setup = Setup(args)
    workloads = [w for w in args.workloads.split(",") if w]
    configs = [c for c in args.configs.split(",") if c]
    for w in workloads:
        if w not in UNIT:
            ap.error("unknown workload %s (launch, torch, train)" % w)
    for c in configs:
        if c not in LABEL:
            ap.error("unknown configuration %s (%s)" % (c, ", ".join(LABEL)))
    need = [setup.lua, setup.agent] + ([setup.floor] if not args.stub else [])
    if "launch" in workloads and not args.stub:
        need.append(setup.loop)
    missing = [p for p in need if not os.path.exists(p)]
    if missing:
        sys.exit("overhead.py: missing %s (build with nvcc and CUPTI: cmake --build BUILD_DIR)"
                 % ", ".join(missing))
    if "dormant" in configs and not setup.dormant_available():
        print("dormant agent: not available (this agent does not support CUPTIMON_LISTEN); "
              "the configuration is skipped")
        configs.remove("dormant")
    pairs = [(c, w) for w in workloads for c in configs
             if w in dict((x[0], x[2]) for x in CONFIGS)[c]]
    os.makedirs(args.out, exist_ok=True)
    meta = {"machine": bs.describe(setup.build), "rounds": args.rounds,
            "seed": args.seed, "launches": args.launches, "ops": args.ops, "steps": args.steps,
            "command": os.environ.get("OVERHEAD_COMMAND") or
            "bash bench/overhead.sh BUILD_DIR" + (" (ROUNDS=%d)" % args.rounds
                                                  if args.rounds != 10 else "")}
    print("overhead: %d runs per round (%s), %d rounds, seed %d"
          % (len(pairs), ", ".join("%s/%s" % p for p in pairs), args.rounds, args.seed), flush=True)
    rows = []
    t_start = time.monotonic()
    for rnd in range(args.rounds):
        elapsed = time.monotonic() - t_start
        if rnd and elapsed + elapsed / rnd > args.budget_s:
            print("overhead: stopping after %d rounds: another would pass the budget of %.0f s "
                  "(--budget-s, BUDGET_S)" % (rnd, args.budget_s), flush=True)
            meta["rounds"] = rnd
            break
        order = list(pairs)
        random.Random(args.seed * 1000 + rnd).shuffle(order)
        for pos, (c, w) in enumerate(order):
            row = run_one(setup, c, w, args.timeout)
            row.update({"round": rnd, "position": pos})
            rows.append(row)
            if not row["ok"]:
                print("  round %d %s/%s FAILED: %s\n%s" % (rnd, c, w, row["note"],
                                                          row.get("stderr_tail", "")), flush=True)
        done = [r for r in rows if r["round"] == rnd]
        so_far = time.monotonic() - t_start
        print("round %d done in %.0f s (%d of %d runs ok, %.0f s so far, about %.0f s for %d rounds)"
              % (rnd, sum(r["run_s"] for r in done), sum(r["ok"] for r in done), len(done),
                 so_far, so_far / (rnd + 1) * args.rounds, args.rounds), flush=True)
        save_runs(args.out, meta, rows)  # after every round, so a killed run still leaves data
    shutil.rmtree(setup.tmp, ignore_errors=True)
    md = report(rows, configs, workloads, meta)
    print()
    print(md)
    with open(os.path.join(args.out, "overhead.md"), "w") as f:
        f.write(md + "\n")
    failed = [r for r in rows if not r["ok"]]
    print("\noverhead: %d runs, %d failed; %.0f s in all; raw runs in %s"
          % (len(rows), len(failed), time.monotonic() - t_start, args.out))
    print("RESULT: %s" % ("PASS" if not failed else "FAIL (%d runs failed or lost records)" % len(failed)))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
