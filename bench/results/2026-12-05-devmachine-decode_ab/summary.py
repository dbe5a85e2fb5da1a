"""Summarizes the A/B rounds of decode_bench in this folder: A is commit 2f603b6's decoder (before
the per-kind lag's store and the exit watch's branch in the decode loop), B is commit e2f233b's.
Run from bench/: python3 results/2026-12-05-devmachine-decode_ab/summary.py"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)) + "/../..")
import benchstats as bs  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))


def parse(path):
    d = {}
    for line in open(path):
        if not line.startswith("| ") or line.startswith("| workload"):
            continue
        c = [x.strip() for x in line.strip().strip("|").split("|")]
        if len(c) < 9:
            continue
        d[(c[0].split(" (")[0], c[1].split(" (")[0])] = (float(c[4]), float(c[7]))
    return d


A = {r: parse("%s/A.%d.txt" % (HERE, r)) for r in range(1, 13)}
B = {r: parse("%s/B.%d.txt" % (HERE, r)) for r in range(1, 13)}
print("| workload | selection | decode/memcpy, A | decode/memcpy, B | B/A records/s: median [95%] |")
print("|---|---|--:|--:|--:|")
for k in A[1]:
    pm = [B[r][k][0] / A[r][k][0] for r in A]
    lo, hi = bs.bootstrap_ci(pm)
    print("| %s | %s | %.2f | %.2f | %.3f [%.3f, %.3f] |" % (
        k[0], k[1], bs.median([A[r][k][1] for r in A]), bs.median([B[r][k][1] for r in B]),
        bs.median(pm), lo, hi))
