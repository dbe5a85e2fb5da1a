#!/usr/bin/env python3
"""Compares scripts/top.lua --full-names with torch.profiler on the same fixed-seed loop.

Usage: compare_top.py PROFILER_OUTPUT TOP_OUTPUT. PROFILER_OUTPUT has "EXPECT kernel NAME COUNT
TOTAL_NS" lines (spec/gpu/torch_nvtx.py profiler); TOP_OUTPUT is top's table. Per-kernel counts
must be equal (exit 1 otherwise). Total kernel time is compared too and reported as a ratio;
the two runs are separate processes, so per-kernel times differ by the run-to-run noise.
"""
import re
import sys

want = {}
with open(sys.argv[1], errors="replace") as f:
    for line in f:
        if line.startswith("EXPECT kernel "):
            name, count, total = line[14:].rstrip("\n").rsplit(" ", 2)
            c = want.setdefault(name.strip(), [0, 0.0])
            c[0] += int(count)
            c[1] += float(total) / 1000.0
row = re.compile(r"^\s*[\d.]+\s+(\d+)\s+(\d+)\s+[\d.]+\s+[\d.]+\s+[\d.]+\s+[\d.]+\s+[\d.]+\s+(.+)$")
got = {}
with open(sys.argv[2], errors="replace") as f:
    for line in f:
        m = row.match(line.rstrip("\n"))
        if m:
            c = got.setdefault(m.group(3).strip(), [0, 0.0])
            c[0] += int(m.group(2))
            c[1] += float(m.group(1))
fails = 0
for name in sorted(set(want) | set(got)):
    w, g = want.get(name, [0, 0.0]), got.get(name, [0, 0.0])
    if w[0] != g[0]:
        fails += 1
        print("FAIL %s: torch.profiler %d, top %d" % (name[:110], w[0], g[0]))
tw, tg = sum(v[1] for v in want.values()), sum(v[1] for v in got.values())
print("kernels: torch.profiler %d names / %d launches / %.0f us; top %d names / %d launches / %.0f us"
      % (len(want), sum(v[0] for v in want.values()), tw, len(got), sum(v[0] for v in got.values()), tg))
if tw > 0:
    print("total kernel time, top / torch.profiler: %.4f" % (tg / tw))
print("RESULT: %s" % ("PASS" if fails == 0 and want else "FAIL (%d)" % fails))
sys.exit(1 if fails or not want else 0)
