"""Statistics for the benchmark harnesses (bench/overhead.py, bench/procsample.py, ...).

Only the standard library is used, so the unit test (bench/benchstats_test.py) runs in CI
without numpy. Every resampling takes an explicit seed, so a report is reproducible from its raw
rounds.

- median(xs)
- bootstrap_ci(xs, stat=median, reps=2000, seed=1, level=0.95): the percentile bootstrap
  interval of a statistic of one sample.
- paired_ratios(a, b): the per-round ratios a[i] / b[i] of two configurations measured in the
  same rounds (rounds where either is missing are left out).
- slope(ts, ys): the least-squares slope of ys over ts.

It also holds what every harness prints in its header: describe(build_dir), the date, the
machine (GPU, CPU model, cores) and the build type.
"""
import os
import random
import subprocess
import time


def median(xs):
    """The median of a non-empty sequence of numbers."""
    v = sorted(xs)
    n = len(v)
    if n == 0:
        raise ValueError("median of an empty sample")
    m = n // 2
    return float(v[m]) if n % 2 else (v[m - 1] + v[m]) / 2.0


def percentile(sorted_xs, q):
    """The q-quantile (0 <= q <= 1) of a sorted sample, linearly interpolated."""
    if not sorted_xs:
        raise ValueError("percentile of an empty sample")
    pos = q * (len(sorted_xs) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(sorted_xs) - 1)
    return sorted_xs[lo] + (sorted_xs[hi] - sorted_xs[lo]) * (pos - lo)


def bootstrap_ci(xs, stat=median, reps=2000, seed=1, level=0.95):
    """The percentile bootstrap interval (lo, hi) of stat over xs: xs is resampled with
    replacement reps times. A sample of one value gives (x, x)."""
    xs = list(xs)
    if not xs:
        raise ValueError("bootstrap of an empty sample")
    rng = random.Random(seed)
    n = len(xs)
    boot = sorted(stat([xs[rng.randrange(n)] for _ in range(n)]) for _ in range(reps))
    tail = (1.0 - level) / 2.0
    return percentile(boot, tail), percentile(boot, 1.0 - tail)


def paired_ratios(a, b):
    """Per-round ratios a[r] / b[r]; a and b map a round number to a value. Rounds missing on
    either side, or with b[r] == 0, are left out."""
    return [a[r] / b[r] for r in sorted(a) if r in b and b[r] != 0]


def summary(xs, reps=2000, seed=1):
    """{n, median, lo, hi, min, max} of a sample, lo and hi being the bootstrap 95% interval of
    the median."""
    lo, hi = bootstrap_ci(xs, reps=reps, seed=seed)
    return {"n": len(xs), "median": median(xs), "lo": lo, "hi": hi,
            "min": min(xs), "max": max(xs)}


def slope(ts, ys):
    """The least-squares slope of ys over ts (same length, at least two distinct ts)."""
    n = len(ts)
    if n != len(ys) or n < 2:
        raise ValueError("slope needs two samples or more of equal length")
    mt = sum(ts) / n
    my = sum(ys) / n
    sxx = sum((t - mt) ** 2 for t in ts)
    if sxx == 0:
        raise ValueError("slope over a single time")
    return sum((t - mt) * (y - my) for t, y in zip(ts, ys)) / sxx


def interval_verdict(lo, hi, ref=1.0):
    """How an interval of a ratio stands against ref: 'below', 'above' or 'overlaps'."""
    if hi < ref:
        return "below"
    if lo > ref:
        return "above"
    return "overlaps"


def describe(build_dir):
    """One line for a report's header: UTC date, GPU (nvidia-smi), CPU model, cores and the
    build type of build_dir (from its CMakeCache.txt)."""
    gpu = "no GPU found"
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30).stdout.strip()
        if out:
            gpu = "; ".join(l.replace(",", ", driver") for l in out.splitlines())
    except (OSError, subprocess.SubprocessError):
        pass
    cpu = "unknown CPU"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    build = "unknown build type"
    try:
        with open(os.path.join(build_dir, "CMakeCache.txt")) as f:
            for line in f:
                if line.startswith("CMAKE_BUILD_TYPE:"):
                    build = line.split("=", 1)[1].strip() + " build"
    except OSError:
        pass
    return "%s; %s; %s, %d cores; %s" % (time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), gpu,
                                          cpu, os.cpu_count() or 0, build)
