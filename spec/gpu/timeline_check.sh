#!/usr/bin/env bash
# scripts/timeline.lua on a real GPU: the demo application live under timeline.lua, then
# checks of its trace that the fake CUPTI cannot make, from the repository root on the device
# machine:
#   bash spec/gpu/timeline_check.sh BUILD_DIR        (about 10 s)
# Checked: every kernel slice has a launch configuration (grid and block of at least 1 in each
# dimension, registers per thread above 0, shared memory = static + dynamic) and the demo's
# cm_demo_matmul<16> has 2048 bytes of static shared memory; every copy has bytes and, when it
# lasted, a bandwidth between 0 and 5000 GB/s; ts 0 is the earliest event and otherData states
# origin_ns; with --filter matmul only cm_demo_matmul<16> kernels are left. It also prints the
# names of the tracks of the threads that made runtime calls (not checked: "thread TID" unless a
# NAME record names the thread), and the thread ids of any NAME records, to show whether they are
# in the same space as the runtime records' (pthread_self() values). Logs and the traces go to
# $OUT when set, else /tmp.
# Exit status: 0 when every check holds, 1 otherwise.
set -u
B=$(cd "${1:-build}" && pwd)
LOG=${OUT:-/tmp/cuptimon-timeline-check}
mkdir -p "$LOG"
LUA=$B/cuptimon-lua
DEMO=$B/gpu/cuptimon_demo_cuda
unset CUPTIMON_LIBCUPTI CUPTIMON_LIBCUDA
for f in "$LUA" "$DEMO"; do
  [ -e "$f" ] || { echo "timeline_check.sh: $f is missing (build with nvcc)"; exit 1; }
done
rm -f "$LOG/gpu_timeline.json" "$LOG/gpu_timeline_matmul.json"
"$LUA" scripts/timeline.lua -o "$LOG/gpu_timeline.json" -- "$DEMO" 30 || exit 1
"$LUA" scripts/timeline.lua -o "$LOG/gpu_timeline_matmul.json" --filter matmul -- "$DEMO" 30 || exit 1
python3 - "$LOG/gpu_timeline.json" "$LOG/gpu_timeline_matmul.json" <<'EOF'
import json, sys
bad = []
t = json.load(open(sys.argv[1]))
ev = t["traceEvents"]
kernels = [e for e in ev if e.get("ph") == "X" and e.get("cat") == "kernel"]
copies = [e for e in ev if e.get("ph") == "X" and e.get("cat") == "memcpy"]
for e in kernels:
    a = e["args"]
    if min(a["grid"]) < 1 or min(a["block"]) < 1 or a["registers per thread"] < 1:
        bad.append("kernel without a launch configuration: %r" % e)
    if a["shared memory"] != a["static shared memory"] + a["dynamic shared memory"]:
        bad.append("shared memory is not static + dynamic: %r" % e)
    if e["name"] == "cm_demo_matmul<16>" and a["static shared memory"] != 2048:
        bad.append("cm_demo_matmul<16> without its 2048 bytes of shared memory: %r" % e)
for e in copies:
    a = e["args"]
    bw = a.get("memory bandwidth (GB/s)")
    if a["bytes"] <= 0 or (e["dur"] > 0 and not (0 < bw < 5000)):
        bad.append("copy with odd bytes or bandwidth: %r" % e)
api_tids = {e["tid"] for e in ev if e.get("ph") == "X" and e.get("cat") == "cuda_runtime"}
names = {e["tid"]: e["args"]["name"] for e in ev if e.get("ph") == "M" and e["name"] == "thread_name"}
named = sorted((e["tid"], e["args"]["name"]) for e in ev if e.get("ph") == "M"
               and e["name"] == "thread_name" and e["tid"] < 2 ** 31 and e["tid"] not in api_tids)
print("timeline_check: tracks named without runtime calls on them (NAME records?): %r" % named[:10])
ts = [e["ts"] for e in ev if "ts" in e]
if min(ts) != 0:
    bad.append("the earliest ts is %r, not 0" % min(ts))
if not t.get("otherData", {}).get("origin_ns", "").isdigit():
    bad.append("no origin_ns in otherData: %r" % t.get("otherData"))
m = json.load(open(sys.argv[2]))["traceEvents"]
left = {e["name"] for e in m if e.get("ph") == "X" and e.get("cat") == "kernel"}
if left != {"cm_demo_matmul<16>"}:
    bad.append("--filter matmul left the kernels %r" % sorted(left))
print("timeline_check: %d kernels, %d copies, %d API threads %r, origin_ns %s" % (len(kernels),
      len(copies), len(api_tids), sorted(names.get(x) for x in api_tids), t["otherData"]["origin_ns"]))
for b in bad[:20]:
    print("timeline_check: FAIL " + b)
print("timeline_check: %s" % ("FAIL" if bad else "ok"))
sys.exit(1 if bad else 0)
EOF
