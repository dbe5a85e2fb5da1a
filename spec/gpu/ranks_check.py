#!/usr/bin/env python3
"""Checks the output of scripts/ranks.lua for spec/gpu/ranks_one_gpu.sh and ranks_two_gpu.sh.

Usage: ranks_check.py LOG --ranks N --straggler R [--within K] [--expect PROFILE_LOG]
                      [--same-as OTHER_LOG]

LOG is what `cuptimon-lua scripts/ranks.lua ...` printed. Passes (exit 0) when the final table
(after "== at exit", or the whole log) has one row per rank 0..N-1, a straggler line names rank R
and no line names another rank, and, when given:
  --within K      the first straggler line of rank R ends its run of slow steps by step K;
  --expect LOG    the kernels column of each rank equals the "EXPECT rank R kernels N" lines of
                  a torch.profiler run of the same job (spec/gpu/ranks_train.py --profile);
  --same-as LOG   the final table and the stragglers' ranks equal those of another ranks.lua
                  output (a replay of the same run's captures).
Prints the table it read and each check's result; exits 1 naming the first failed check.
"""
import argparse
import re
import sys

HEADER = re.compile(r"^rank\s+local\s+pid\s+device\s+steps\s+kernels\s")
STRAGGLER = re.compile(r"^straggler: rank (\S+) \(pid \d+, device \S+\) steps (\d+)-(\d+): (.*)$")


def parse(path):
    text = open(path, errors="replace").read()
    tail = text.rsplit("== at exit\n", 1)[-1]
    rows, header = {}, None
    for line in tail.splitlines():
        if HEADER.match(line):
            header = line.split()
            continue
        if header and line and not line.startswith(("straggler", "stragglers", "no straggler")):
            cells = line.split()
            if len(cells) == len(header) and cells[0] != "-":
                rows[int(cells[0])] = dict(zip(header, cells))
    stragglers = []
    for line in text.splitlines():
        m = STRAGGLER.match(line)
        if m:
            stragglers.append((m.group(1), int(m.group(2)), int(m.group(3)), line))
    return rows, stragglers


def fail(msg):
    print("FAIL: " + msg)
    sys.exit(1)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("log")
    p.add_argument("--ranks", type=int, required=True)
    p.add_argument("--straggler", required=True)
    p.add_argument("--within", type=int)
    p.add_argument("--expect")
    p.add_argument("--same-as")
    a = p.parse_args()
    rows, stragglers = parse(a.log)
    for r in sorted(rows):
        print("row", " ".join("%s=%s" % kv for kv in rows[r].items()))
    for s in stragglers:
        print("line", s[3])
    if sorted(rows) != list(range(a.ranks)):
        fail("ranks %s in the final table, want 0..%d" % (sorted(rows), a.ranks - 1))
    print("ok: one row per rank")
    named = sorted(set(s[0] for s in stragglers))
    if named != [a.straggler]:
        fail("straggler lines name ranks %s, want only %s" % (named, a.straggler))
    print("ok: the straggler lines name rank %s only" % a.straggler)
    if a.within is not None:
        first = stragglers[0]
        if first[2] > a.within:
            fail("rank %s was first flagged at step %d, want by step %d" % (
                a.straggler, first[2], a.within))
        print("ok: flagged at step %d (steps %d-%d)" % (first[2], first[1], first[2]))
    if a.expect:
        want = {}
        for line in open(a.expect, errors="replace"):
            m = re.match(r"^EXPECT rank (\d+) kernels (\d+) nccl (\d+)", line)
            if m:
                want[int(m.group(1))] = (int(m.group(2)), int(m.group(3)))
        if sorted(want) != list(range(a.ranks)):
            fail("the profiler log has ranks %s, want 0..%d" % (sorted(want), a.ranks - 1))
        for r in range(a.ranks):
            got = int(rows[r]["kernels"])
            if got != want[r][0]:
                fail("rank %d: %d kernels, torch.profiler saw %d" % (r, got, want[r][0]))
            print("ok: rank %d kernels %d = torch.profiler's (of them NCCL: %d)" % (
                r, got, want[r][1]))
    if a.same_as:
        other_rows, other_str = parse(a.same_as)
        if other_rows != rows:
            fail("the final tables differ:\n%s\n%s" % (rows, other_rows))
        if sorted(set(s[0] for s in other_str)) != named:
            fail("the other output names stragglers %s" % sorted(set(s[0] for s in other_str)))
        print("ok: the same table and straggler as %s" % a.same_as)
    print("PASS")


if __name__ == "__main__":
    main()
