#!/usr/bin/env python3
"""Compares torch.profiler's kernel counts (EXPECT lines) with cuptimon's (GOT kernel lines).

Usage: compare_torch.py PROFILER_OUTPUT CUPTIMON_OUTPUT. Names are demangled with c++filt on
both sides, since torch.profiler reports demangled names and CUPTI mangled ones. Prints every
difference and exits non-zero when the two sets of (name, count) differ.
"""
import subprocess
import sys


def demangle(names):
    if not names:
        return {}
    out = subprocess.run(["c++filt"], input="\n".join(names), capture_output=True, text=True)
    lines = out.stdout.split("\n")
    return {n: (lines[i].strip() if i < len(lines) and out.returncode == 0 else n)
            for i, n in enumerate(names)}


def read(path, tag):
    counts = {}
    with open(path, errors="replace") as f:
        for line in f:
            if line.startswith(tag + " kernel "):
                name, count = line[len(tag) + 8:].rstrip("\n").rsplit(" ", 1)
                counts[name] = counts.get(name, 0) + int(count)
    dm = demangle(list(counts))
    merged = {}
    for name, c in counts.items():
        merged[dm[name]] = merged.get(dm[name], 0) + c
    return merged


want, got = read(sys.argv[1], "EXPECT"), read(sys.argv[2], "GOT")
fails = 0
for name in sorted(set(want) | set(got)):
    w, g = want.get(name, 0), got.get(name, 0)
    if w != g:
        fails += 1
        print("FAIL %s: torch.profiler %d, cuptimon %d" % (name[:100], w, g))
print("kernels: torch.profiler %d names / %d records, cuptimon %d names / %d records"
      % (len(want), sum(want.values()), len(got), sum(got.values())))
print("RESULT: %s" % ("PASS" if fails == 0 and want else "FAIL (%d)" % fails))
sys.exit(1 if fails or not want else 0)
