#!/usr/bin/env python3
"""Checks of scripts/sqlite.lua's databases for spec/gpu/sqlite_torch.sh.

Usage:
  sqlite_check.py summary DB TOP_OUT    the kernel summary query (per device and demangled name)
                                        equals top.lua --full-names --top 1000 (TOP_OUT) per
                                        kernel: instances and total us
  sqlite_check.py same DB1 DB2          both databases have the same kernels with the same
                                        instances (two runs of one fixed-seed loop)
  sqlite_check.py integrity DB          PRAGMA integrity_check is "ok", and the run is complete
  sqlite_check.py nvtx DB NVTX_OUT      NVIDIA's "Rename CUDA kernels with NVTX" example against
                                        nvtx.lua's exclusive times (informational: prints both)
Each prints what it compared and exits 1 on a mismatch.
"""
import re
import sqlite3
import sys

KERNEL_SUMMARY = """
SELECT k.deviceId, ids.value, count(*), sum(k.end - k.start)
FROM CUPTI_ACTIVITY_KIND_KERNEL AS k JOIN StringIds AS ids ON ids.id = k.demangledName
GROUP BY k.deviceId, k.demangledName ORDER BY 4 DESC"""


def top_tables(path):
    """top.lua's rows: {(device, name): (instances, total_us)}."""
    rows, dev = {}, None
    row = re.compile(r"^\s*[\d.]+\s+(\d+)\s+(\d+)\s+[\d.]+\s+[\d.]+\s+[\d.]+\s+[\d.]+\s+[\d.]+\s(.+)$")
    for line in open(path, encoding="utf-8", errors="replace"):
        line = line.rstrip("\n")
        m = re.match(r"^pid \d+ .*, device (\d+)$", line)
        if m:
            dev = int(m.group(1))
            continue
        m = row.match(line)
        if m and dev is not None:
            rows[(dev, m.group(3))] = (int(m.group(2)), int(m.group(1)))
    return rows


def summary(db, top_out):
    top = top_tables(top_out)
    got = {(d, n): (c, round(t / 1e3)) for d, n, c, t in sqlite3.connect(db).execute(KERNEL_SUMMARY)}
    bad = 0
    for key in sorted(set(top) | set(got), key=lambda k: (k[0], k[1])):
        if top.get(key) != got.get(key):
            # Totals are printed rounded to 1 us by top.lua: allow that rounding, nothing else.
            a, b = top.get(key), got.get(key)
            if a and b and a[0] == b[0] and abs(a[1] - b[1]) <= 1:
                continue
            print("MISMATCH device %d %s: top.lua %s, database %s" % (key[0], key[1][:100], a, b))
            bad += 1
    inst = sum(v[0] for v in got.values())
    print("summary: %d kernel names (device, name), %d instances; top.lua %d names, %d instances; "
          "%d mismatches" % (len(got), inst, len(top), sum(v[0] for v in top.values()), bad))
    return 1 if bad or not got else 0


def per_name(db):
    q = ("SELECT ids.value, count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL k JOIN StringIds ids "
         "ON ids.id = k.demangledName GROUP BY 1")
    return dict(sqlite3.connect(db).execute(q).fetchall())


def same(db1, db2):
    a, b = per_name(db1), per_name(db2)
    bad = [n for n in sorted(set(a) | set(b)) if a.get(n) != b.get(n)]
    for n in bad:
        print("MISMATCH %s: %s %s, %s %s" % (n[:100], db1, a.get(n), db2, b.get(n)))
    print("same: %d and %d kernel names, %d and %d instances, %d mismatches"
          % (len(a), len(b), sum(a.values()), sum(b.values()), len(bad)))
    return 1 if bad or not a else 0


def integrity(db):
    c = sqlite3.connect(db)
    ok = c.execute("PRAGMA integrity_check").fetchone()[0]
    complete = c.execute("SELECT value FROM CUPTIMON_META WHERE name = 'complete'").fetchone()[0]
    counts = {t: c.execute("SELECT count(*) FROM " + t).fetchone()[0] for t in (
        "CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_RUNTIME", "CUPTI_ACTIVITY_KIND_MEMCPY",
        "CUPTI_ACTIVITY_KIND_MEMSET", "CUPTI_ACTIVITY_KIND_SYNCHRONIZATION", "NVTX_EVENTS",
        "StringIds", "TARGET_INFO_GPU")}
    loss = c.execute("SELECT sum(dropped), sum(incomplete) FROM CUPTIMON_LOSS").fetchone()
    gpus = c.execute("SELECT id, name, smCount, computeMajor, computeMinor FROM TARGET_INFO_GPU").fetchall()
    print("integrity %s: %s, complete=%s, rows %s, lost %s, GPUs %s" % (db, ok, complete, counts, loss, gpus))
    return 0 if ok == "ok" and complete == "1" else 1


NVTX_RENAME = """
ALTER TABLE {t} ADD COLUMN nvtxRange TEXT;
UPDATE {t} SET nvtxRange = (
    SELECT NVTX_EVENTS.text
    FROM NVTX_EVENTS JOIN CUPTI_ACTIVITY_KIND_RUNTIME ON
        NVTX_EVENTS.eventType == 59 AND
        NVTX_EVENTS.globalTid == CUPTI_ACTIVITY_KIND_RUNTIME.globalTid AND
        NVTX_EVENTS.start <= CUPTI_ACTIVITY_KIND_RUNTIME.start AND
        NVTX_EVENTS.end >= CUPTI_ACTIVITY_KIND_RUNTIME.end
    WHERE
        {t}.correlationId == CUPTI_ACTIVITY_KIND_RUNTIME.correlationId
    ORDER BY NVTX_EVENTS.start DESC LIMIT 1
);
"""


def nvtx(db, nvtx_out):
    c = sqlite3.connect(":memory:")
    sqlite3.connect(db).backup(c)
    c.execute("CREATE INDEX nvtx_start ON NVTX_EVENTS (start)")
    for t in ("CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_MEMSET"):
        c.executescript(NVTX_RENAME.format(t=t))
    got = {n: round(d / 1e3, 1) for n, d in c.execute(
        "SELECT coalesce(nvtxRange, '(no range)'), sum(d) FROM (SELECT nvtxRange, end - start AS d "
        "FROM CUPTI_ACTIVITY_KIND_KERNEL UNION ALL SELECT nvtxRange, end - start FROM "
        "CUPTI_ACTIVITY_KIND_MEMCPY UNION ALL SELECT nvtxRange, end - start FROM "
        "CUPTI_ACTIVITY_KIND_MEMSET) GROUP BY 1")}
    want = {}
    for line in open(nvtx_out, encoding="utf-8", errors="replace"):
        m = re.match(r"^(.*\S)\s+(?:\d+|-)\s+\d+\s+[\d.]+\s+([\d.]+)\s+[\d.]+$", line.rstrip("\n"))
        if m and float(m.group(2)) > 0:
            want[m.group(1)] = float(m.group(2))
    for n in sorted(set(got) | set(want)):
        print("nvtx %-24s query %10s us   nvtx.lua exclusive %10s us" % (n, got.get(n), want.get(n)))
    return 0


def main():
    mode, rest = sys.argv[1], sys.argv[2:]
    fn = {"summary": summary, "same": same, "integrity": integrity, "nvtx": nvtx}[mode]
    sys.exit(fn(*rest))


if __name__ == "__main__":
    main()
