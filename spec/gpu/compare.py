#!/usr/bin/env python3
"""Compares a workload's EXPECT lines with a cuptimon script's GOT lines (spec/gpu).

Usage: compare.py OUTPUT_FILE...  Every EXPECT line must appear as the same GOT line, "GOT
bad_order 0" must be present, and no GOT kernel line may name a kernel the workload did not
expect. Prints one PASS/FAIL line per expectation and exits non-zero on any failure.
"""
import sys

lines = []
for path in sys.argv[1:]:
    with open(path, errors="replace") as f:
        lines += [l.strip() for l in f]
expect = [l[len("EXPECT "):] for l in lines if l.startswith("EXPECT ")]
got = {l[len("GOT "):] for l in lines if l.startswith("GOT ")}
fails = 0
if not expect:
    print("FAIL no EXPECT lines found")
    fails += 1
for e in expect:
    ok = e in got
    fails += not ok
    print(("PASS " if ok else "FAIL ") + e)
ok = "bad_order 0" in got
fails += not ok
print(("PASS " if ok else "FAIL ") + "bad_order 0 (start <= stop, start != 0)")
expected_kernels = {e.split()[1] for e in expect if e.startswith("kernel ")}
extra = [g for g in got if g.startswith("kernel ") and g.split()[1] not in expected_kernels]
for g in extra:
    print("FAIL unexpected " + g)
fails += len(extra)
print("RESULT: %s" % ("PASS" if fails == 0 else "FAIL (%d)" % fails))
sys.exit(1 if fails else 0)
