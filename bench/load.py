#!/usr/bin/env python3
"""Throughput and memory under load: bench/thread_sweep.sh and
bench/long_run.sh call this.

  load.py sweep BUILD_DIR [--threads 1,2,4,8,16] [--seconds S]
      For each thread count T, gpu/launch_loop --threads T --seconds S runs under
      cuptimon-lua bench/sum_durations.lua (kernels and runtime API). Reports the launch rate,
      the records per second delivered to the script, the records lost by stage (cm.stats(), the
      LOST line, the exit status), and the CPU and peak RSS of the agent (the traced process) and
      of the monitor (cuptimon-lua).
  load.py long BUILD_DIR [--threads T] [--seconds S]
      One run as above, the resident sets sampled every --interval (1 s): peak and the
      least-squares slope of the second half (after the first minute), in KiB per minute.
  load.py floor BUILD_DIR [--threads T] [--seconds S]
      The same load under the minimal CUPTI consumer (BUILD_DIR/gpu/libcupti_floor.so, kernels and
      runtime API) instead of cuptimon, sampled the same way: what CUPTI itself costs and holds.
      FLOOR_PER_THREAD (default 0, as the engine sets it) and FLOOR_FLUSH_MS (default 0: none;
      the engine's decode worker flushes at the monitor's flush cadence) set the floor's switches.

Every run also samples the CPU of the traced process's threads by name: cm-launch (the launching
threads), cm-decode, cm-send and cm-control (the agent's), and the rest under their own names
(CUPTI's threads and the main thread keep the program's name, launch_loop). The samples have a
column cpu_<name> for each, and the report gives each name's share of a core over the first and
the last minute, so a thread whose cost grows with the run's length shows.

Design. The monitor is this script's child and the traced process the monitor's child. Both are
sampled from /proc (VmRSS; utime + stime) every --interval. CPU: the traced process prints its own
getrusage at the end of main (PROCESS_CPU); the monitor's is the wait4 usage of cuptimon-lua, which
includes its reaped child, less the traced process's. The share of the traced process's CPU spent
outside its launching threads (named cm-launch), that is in CUPTI's and the agent's threads, is
taken from the per-thread samples. Every sample is written to OUT/<name>_samples.csv, each run's
output to OUT/<name>.log, the results to OUT/<name>.json, a markdown table to stdout. Exit status 1
when a run failed or lost records.
"""
import argparse
import csv
import json
import os
import re
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import benchstats as bs  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TICK = os.sysconf("SC_CLK_TCK")
PAGE_KIB = os.sysconf("SC_PAGE_SIZE") // 1024


def proc_stat(path):
    """(comm, ppid, cpu seconds) of /proc/PID/stat or /proc/PID/task/TID/stat, or None."""
    try:
        with open(path) as f:
            s = f.read()
    except OSError:
        return None
    comm = s[s.index("(") + 1:s.rindex(")")]
    rest = s[s.rindex(")") + 2:].split()
    return comm, int(rest[1]), (int(rest[11]) + int(rest[12])) / TICK


def rss_kib(pid):
    try:
        with open("/proc/%d/statm" % pid) as f:
            return int(f.read().split()[1]) * PAGE_KIB
    except OSError:
        return None


def children(pid):
    """The child processes of pid: from /proc/PID/task/PID/children where the kernel has it,
    else by scanning every process's parent."""
    try:
        with open("/proc/%d/task/%d/children" % (pid, pid)) as f:
            return [int(x) for x in f.read().split()]
    except OSError:
        pass
    kids = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            st = proc_stat("/proc/%s/stat" % name)
            if st and st[1] == pid:
                kids.append(int(name))
    return sorted(kids)


def threads_cpu(pid):
    """{thread name: CPU s of the process's threads of that name}, or None when it is gone. A
    thread that has exited is no longer in the sum; the launching threads live as long as the
    workload, and the agent's threads as long as the process."""
    by_name = {}
    try:
        tids = os.listdir("/proc/%d/task" % pid)
    except OSError:
        return None
    for tid in tids:
        st = proc_stat("/proc/%d/task/%s/stat" % (pid, tid))
        if st:
            by_name[st[0]] = by_name.get(st[0], 0.0) + st[2]
    return by_name


def thread_shares(samples, window=60.0):
    """{name: (share of a core over the first `window` s, over the last `window` s)} from the
    samples' cpu_<name> columns, for every name seen at both ends."""
    rows = [x for x in samples if x.get("agent_pid")]
    if len(rows) < 2:
        return {}
    t0, t1 = rows[0]["t"], rows[-1]["t"]
    window = min(window, (t1 - t0) / 2)
    if window <= 0:
        return {}
    first_end = next(x for x in rows if x["t"] >= t0 + window)
    last_start = next(x for x in rows if x["t"] >= t1 - window)
    out = {}
    for k in rows[-1]:
        if not k.startswith("cpu_"):
            continue
        vals = [(x["t"], x.get(k)) for x in (rows[0], first_end, last_start, rows[-1])]
        if any(v is None for _, v in vals):
            continue
        (a0, v0), (a1, v1), (b0, w0), (b1, w1) = vals
        if a1 > a0 and b1 > b0:
            out[k[4:]] = ((v1 - v0) / (a1 - a0), (w1 - w0) / (b1 - b0))
    return out


def print_thread_shares(r):
    sh = r.get("thread_shares") or {}
    if not sh:
        return
    print("CPU by thread name (share of a core), first minute -> last minute: " + "; ".join(
        "%s %.2f -> %.2f" % (k, a, b) for k, (a, b) in sorted(sh.items())))


def run_sampled(argv, interval, log_path, env=None, direct=False):
    """Runs argv (the monitor), sampling it and its first child (the traced process); with
    `direct`, argv is the traced process itself (the floor: no monitor). Returns (status, output,
    samples, monitor+children CPU s from wait4, when the traced process ended)."""
    t0 = time.monotonic()
    with open(log_path, "w") as log:
        p = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env)
        samples = []
        status = None
        agent_seen, gone_mono = None, None
        while status is None:
            t = time.monotonic() - t0
            kids = [p.pid] if direct else children(p.pid)
            agent = kids[0] if kids else None
            mon = None if direct else proc_stat("/proc/%d/stat" % p.pid)
            row = {"t": round(t, 3), "monitor_rss_kib": None if direct else rss_kib(p.pid),
                   "monitor_cpu_s": mon[2] if mon else None, "agent_pid": agent,
                   "agent_rss_kib": rss_kib(agent) if agent else None}
            tc = threads_cpu(agent) if agent else None
            if tc:
                row["agent_launch_cpu_s"] = tc.get("cm-launch", 0.0)
                row["agent_other_cpu_s"] = sum(v for k, v in tc.items() if k != "cm-launch")
                for k, v in tc.items():
                    if k != "cm-launch":
                        row["cpu_" + re.sub(r"[^A-Za-z0-9_.-]", "_", k)] = v
            else:
                row["agent_launch_cpu_s"] = row["agent_other_cpu_s"] = None
            samples.append(row)
            agent_seen = agent_seen or agent
            deadline = time.monotonic() + interval
            while time.monotonic() < deadline:
                # The traced process's end (gone, or a zombie waiting for the monitor's reap),
                # to 50 ms: the exit's length is measured from main's return to it.
                if agent_seen and gone_mono is None and not direct:
                    st_agent = proc_state(agent_seen)
                    if st_agent is None or st_agent == "Z":
                        gone_mono = time.monotonic()
                pid, st, ru = os.wait4(p.pid, os.WNOHANG)
                if pid:
                    if direct:
                        gone_mono = time.monotonic()
                    status = os.waitstatus_to_exitcode(st)
                    total_cpu = ru.ru_utime + ru.ru_stime
                    break
                time.sleep(min(0.05, interval))
    with open(log_path, errors="replace") as f:
        out = f.read()
    return status, out, samples, total_cpu, gone_mono


def proc_state(pid):
    """The state letter of /proc/PID/stat (R, S, Z, ...), or None when the process is gone."""
    try:
        with open("/proc/%d/stat" % pid) as f:
            s = f.read()
    except OSError:
        return None
    return s[s.rindex(")") + 2:].split()[0]


def num(pattern, text, group=1, conv=float):
    m = re.search(pattern, text, re.M)
    return conv(m.group(group)) if m else None


def one_run(a, threads, seconds, name, floor=False):
    loop = [a.loop, "--threads", str(threads), "--seconds", str(seconds)]
    env = None
    if floor:
        argv = loop
        env = dict(os.environ, CUDA_INJECTION64_PATH=os.path.join(a.build, "gpu", "libcupti_floor.so"),
                   CUPTI_FLOOR_RUNTIME="1", CUPTI_FLOOR_LAG="1",
                   CUPTI_FLOOR_PER_THREAD=os.environ.get("FLOOR_PER_THREAD", "0"),
                   CUPTI_FLOOR_FLUSH_MS=os.environ.get("FLOOR_FLUSH_MS", "0"))
    else:
        argv = [os.path.join(a.build, "cuptimon-lua"),
                os.path.join(ROOT, "bench", "sum_durations.lua"), "--"] + loop
    status, out, samples, total_cpu, gone_mono = run_sampled(argv, a.interval,
                                                             os.path.join(a.out, name + ".log"),
                                                             env=env, direct=floor)
    r = {"threads": threads, "seconds": seconds, "status": status}
    # launch_loop's main return, or the fake CUDA app's exit() call (bench/long_run_fake.sh).
    main_ns = (num(r"^MAIN_RETURN_MONO_NS (\d+)", out, conv=int) or
               num(r"^fake_cuda_app: exit_mono_ns=(\d+)", out, conv=int))
    r["exit_ms"] = (1000 * gone_mono - main_ns / 1e6) if main_ns and gone_mono else None
    r["launches"] = num(r"^RESULT sweep threads \d+ launches (\d+)", out, conv=int)
    r["launch_seconds"] = num(r"^RESULT sweep .* seconds ([\d.]+)", out)
    r["launches_per_s"] = num(r"launches_per_s ([\d.]+)", out)
    r["launched_total"] = num(r"^LAUNCHED (\d+)", out, conv=int)
    r["kernels"] = num(r"^SUM kernels (\d+)", out, conv=int)
    r["runtime"] = num(r"^SUM kernels \d+ runtime (\d+)", out, conv=int)
    r["delivered"] = num(r"^DELIVERED records (\d+)", out, conv=int)
    r["script_records_per_s"] = num(r"^DELIVERED .* records_per_s ([\d.]+)", out)
    for k in ("dropped", "dropped_cupti", "dropped_agent", "dropped_exit", "lost_wire",
              "lost_frames", "incomplete"):
        r[k] = num(r"^LOSS .*\b%s (\d+)" % k, out, conv=int)
    r["lost_line"] = next((l for l in out.splitlines() if "LOST" in l), "")
    # The monitor's warnings when the agent's lag guard had CUPTI stop writing kinds.
    r["guard_lines"] = [l for l in out.splitlines() if "its agent stopped tracing" in l and "warning" in l]
    if floor:
        r["kernels"] = num(r"^cupti_floor: kernels (\d+)", out, conv=int)
        r["runtime"] = num(r"^cupti_floor: kernels \d+ runtime (\d+)", out, conv=int)
        r["dropped_cupti"] = num(r"^cupti_floor: .* dropped (\d+)", out, conv=int)
    u, s = num(r"^PROCESS_CPU user_s ([\d.]+)", out), num(r"^PROCESS_CPU .* sys_s ([\d.]+)", out)
    r["agent_cpu_s"] = u + s if u is not None and s is not None else None
    r["monitor_cpu_s"] = (total_cpu - r["agent_cpu_s"]) if r["agent_cpu_s"] is not None and not floor else None
    if r["launches"] and r["launch_seconds"] and r["delivered"] is not None:
        r["delivered_per_launch_s"] = r["delivered"] / r["launch_seconds"]
    # CPU of CUPTI's and the agent's threads over the sampled window.
    tracer = [x for x in samples if x["agent_other_cpu_s"] is not None]
    if len(tracer) >= 2 and tracer[-1]["t"] > tracer[0]["t"]:
        r["tracer_threads_core_pct"] = 100 * (tracer[-1]["agent_other_cpu_s"] -
                                              tracer[0]["agent_other_cpu_s"]) / (
                                                  tracer[-1]["t"] - tracer[0]["t"])
    for role in ("agent", "monitor"):
        xs = [(x["t"], x[role + "_rss_kib"]) for x in samples if x[role + "_rss_kib"]]
        r[role + "_rss_peak_kib"] = max((v for _, v in xs), default=None)
        # The slope is over the second half, and never over the first minute, while CUPTI's
        # and the pool's memory grows to its working size.
        # A run shorter than two minutes has no such slope.
        t_first = xs[0][0] if xs else 0
        half = [x for x in xs[len(xs) // 2:] if x[0] - t_first >= 60]
        if len(half) >= 2 and half[-1][0] - half[0][0] >= 60:
            r[role + "_rss_slope_kib_per_min"] = 60 * bs.slope([t for t, _ in half],
                                                               [v for _, v in half])
    r["thread_shares"] = thread_shares(samples)
    fields = []
    for x in samples:
        fields += [k for k in x if k not in fields]
    with open(os.path.join(a.out, name + "_samples.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields)
        w.writeheader()
        w.writerows(samples)
    expected = 2 * r["launched_total"] if r["launched_total"] else None
    # The exit may add at most the agent's exit budget (2 s by default) plus 100 ms.
    budget = int(os.environ.get("CUPTIMON_EXIT_BUDGET_MS", "2000"))
    r["exit_ok"] = r["exit_ms"] is None or r["exit_ms"] <= budget + 100
    if floor:
        # The floor has no exit budget: its exit is reported, not judged.
        r["ok"] = (status == 0 and r["dropped_cupti"] == 0
                   and r["kernels"] == r["launched_total"] and r["runtime"] is not None
                   and r["runtime"] >= r["launched_total"])
        return r
    # The kinds the agent's lag guard had CUPTI stop writing (the monitor's warnings name them):
    # the launches after a shed have no record of that kind, by design, so that kind is judged by
    # its loss counters alone; every kind not shed must still be exact.
    shed = set()
    for l in r["guard_lines"]:
        m = re.search(r"stopped tracing (.*?) for the rest of the run", l)
        if m:
            shed.update(x.strip() for x in m.group(1).split(","))
    r["guard_shed"] = sorted(shed)
    kernels_shed = bool(shed & {"kernel", "concurrent_kernel"})
    kernels_ok = r["kernels"] is not None and r["launched_total"] is not None and (
        r["kernels"] <= r["launched_total"] if kernels_shed else r["kernels"] == r["launched_total"])
    runtime_ok = "runtime" in shed or (expected is not None and (r["delivered"] or 0) >= expected)
    r["ok"] = (status == 0 and r["dropped"] == 0 and r["incomplete"] == 0 and not r["lost_line"]
               and r["exit_ok"] and kernels_ok and runtime_ok)
    return r


def g(v, f="%.0f"):
    return "–" if v is None else f % v


def sweep(a):
    rows = []
    print("| launching threads | launches/s | records/s to the script | records delivered | "
          "lost (cupti / agent / exit / wire) | agent CPU (% of a core; CUPTI + agent threads) | "
          "monitor CPU (% of a core) | agent RSS peak (MiB) | monitor RSS peak (MiB) | exit | "
          "main's return to the process's end (ms) |")
    print("|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|")
    for t in a.threads:
        r = one_run(a, t, a.seconds, "sweep_t%d" % t)
        rows.append(r)
        secs = r["launch_seconds"] or a.seconds
        print("| %d | %s | %s | %s | %s (%s / %s / %s / %s) | %s (%s) | %s | %s | %s | %s%s | %s |" % (
            t, g(r["launches_per_s"]), g(r.get("delivered_per_launch_s")), g(r["delivered"]),
            g(r["dropped"]), g(r["dropped_cupti"]), g(r["dropped_agent"]), g(r["dropped_exit"]),
            g(r["lost_wire"]),
            g(100 * r["agent_cpu_s"] / secs if r["agent_cpu_s"] is not None else None),
            g(r.get("tracer_threads_core_pct")),
            g(100 * r["monitor_cpu_s"] / secs if r["monitor_cpu_s"] is not None else None),
            g(r["agent_rss_peak_kib"] and r["agent_rss_peak_kib"] / 1024, "%.1f"),
            g(r["monitor_rss_peak_kib"] and r["monitor_rss_peak_kib"] / 1024, "%.1f"),
            r["status"], "" if r["ok"] else " FAILED", g(r["exit_ms"])), flush=True)
        if r["lost_line"]:
            print("    " + r["lost_line"])
    return rows


def long_run(a, floor=False):
    r = one_run(a, a.threads[0], a.seconds, "floor_run" if floor else "long_run", floor=floor)
    # Memory stays flat: each resident set grows by less than 1 MiB/min over the second
    # half of the run.
    for key in ("agent",) if floor else ("agent", "monitor"):
        slope = r.get(key + "_rss_slope_kib_per_min")
        if slope is not None and slope >= 1024:
            r["ok"] = False
            print("%s: the resident set grew %.0f KiB/min over the second half (the bound is "
                  "1024)" % (key, slope))
    print("| process | RSS peak (MiB) | RSS slope, second half (KiB/min) | CPU (% of a core) |")
    print("|---|--:|--:|--:|")
    secs = r["launch_seconds"] or a.seconds
    roles = [("traced process, floor" if floor else "agent (traced process)", "agent", r["agent_cpu_s"])]
    if not floor:
        roles.append(("monitor", "monitor", r["monitor_cpu_s"]))
    for role, key, cpu in roles:
        print("| %s | %s | %s | %s |" % (role, g(r[key + "_rss_peak_kib"] and r[key + "_rss_peak_kib"] / 1024, "%.1f"),
                                         g(r.get(key + "_rss_slope_kib_per_min"), "%.1f"),
                                         g(cpu and 100 * cpu / secs)))
    print("launch_loop --threads %d: %s launches in %s s (%s/s); %s records delivered, %s lost; "
          "exit %s, %s ms from main's return to the process's end" % (
              r["threads"], g(r["launches"]), g(r["launch_seconds"], "%.1f"),
              g(r["launches_per_s"]), g(r["delivered"]), g(r["dropped"]), r["status"],
              g(r["exit_ms"])))
    if floor:
        print("floor: %s kernel records, %s runtime records, %s dropped by CUPTI" % (
            g(r["kernels"]), g(r["runtime"]), g(r["dropped_cupti"])))
    if r["lost_line"]:
        print(r["lost_line"])
    for l in r.get("guard_lines", []):
        print("lag guard: " + l)
    print_thread_shares(r)
    return [r]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("mode", choices=("sweep", "long", "floor"))
    ap.add_argument("build")
    ap.add_argument("--threads", default=None)
    ap.add_argument("--seconds", type=float, default=None)
    ap.add_argument("--interval", type=float, default=None)
    ap.add_argument("--out", default=os.environ.get("OUT") or "/tmp/cuptimon-load")
    ap.add_argument("--loop", default=None, help="the workload (default BUILD_DIR/gpu/launch_loop; "
                    "the smoke test passes bench/launch_loop_stub.sh)")
    a = ap.parse_args()
    a.build = os.path.abspath(a.build)
    a.loop = a.loop or os.path.join(a.build, "gpu", "launch_loop")
    if a.mode == "sweep":
        a.threads = [int(x) for x in (a.threads or os.environ.get("THREADS", "1,2,4,8,16")).split(",")]
        a.seconds = a.seconds or float(os.environ.get("SECONDS_EACH", "30"))
        a.interval = a.interval or 0.25
    else:
        a.threads = [int(a.threads or os.environ.get("THREADS", "1"))]
        a.seconds = a.seconds or float(os.environ.get("DURATION", "600"))
        a.interval = a.interval or 1.0
    for p in (os.path.join(a.build, "cuptimon-lua"), a.loop):
        if not os.path.exists(p):
            sys.exit("load.py: %s is missing (build with nvcc: cmake --build BUILD_DIR)" % p)
    os.makedirs(a.out, exist_ok=True)
    if not os.environ.get("CM_BENCH_KEEP_ENV"):  # set by the smoke test with the fake CUPTI
        for k in ("CUPTIMON_LIBCUPTI", "CUPTIMON_LIBCUDA"):
            os.environ.pop(k, None)
    print("%s: %s, %s s each, sampled every %s s. %s" % (
        a.mode, "threads " + ",".join(map(str, a.threads)), a.seconds, a.interval,
        bs.describe(a.build)), flush=True)
    rows = sweep(a) if a.mode == "sweep" else long_run(a, floor=a.mode == "floor")
    name = {"sweep": "thread_sweep", "long": "long_run", "floor": "floor_run"}[a.mode]
    with open(os.path.join(a.out, name + ".json"), "w") as f:
        json.dump(rows, f, indent=1)
    bad = [r for r in rows if not r["ok"]]
    shed = sorted({k for r in rows for k in r.get("guard_shed", [])})
    print("RESULT: %s" % (("PASS (no record lost%s)" % (
        "; the lag guard stopped tracing " + ", ".join(shed) if shed else "")) if not bad else
                          "FAIL (%d run(s) failed or lost records)" % len(bad)))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
