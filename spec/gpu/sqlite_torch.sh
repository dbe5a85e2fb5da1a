#!/usr/bin/env bash
# scripts/sqlite.lua on a PyTorch training loop on the GPU, about a minute:
#   bash spec/gpu/sqlite_torch.sh BUILD_DIR [STEPS]
# spec/gpu/torch_nvtx.py (a fixed-seed loop with NVTX ranges, STEPS steps, default 200) is
# 1. exported live: cuptimon-lua scripts/sqlite.lua -o live.sqlite -- python3 torch_nvtx.py;
# 2. recorded (--record), then exported from its capture (--replay ... scripts/sqlite.lua --driver)
#    and shown by top.lua --full-names --top 1000 and nvtx.lua on the same capture.
# Checks (each failure makes the exit status 1): both runs exit 0; both databases pass
# PRAGMA integrity_check and are complete; the kernel summary query of the capture's database
# equals top.lua's instances (and total us) per device and kernel; the live database has the
# same kernels with the same instances as the capture's (the loop is deterministic); the kernel
# rows equal count.lua's kernel records. NVIDIA's NVTX-to-kernel example is printed beside
# nvtx.lua's exclusive times for the note (informational). Export times and database sizes are
# printed. Logs and databases go to $OUT (the device tool's folder) or /tmp/cuptimon-sqlite.
set -u
B=$(cd "${1:-build}" && pwd)
STEPS=${2:-200}
D=${OUT:-/tmp/cuptimon-sqlite}
R=$(cd "$(dirname "$0")/../.." && pwd)
mkdir -p "$D"
LUA=$B/cuptimon-lua
CHECK="python3 $R/spec/gpu/sqlite_check.py"
unset CUPTIMON_LIBCUPTI CUPTIMON_LIBCUDA
fail=0
step() { echo "=== $*"; }
ms() { echo $(( ($(date +%s%N) - $1) / 1000000 )); }
rm -f "$D"/live.sqlite "$D"/replay.sqlite "$D"/torch.*.cmcap

# libsqlite3: the system's (Debian's libsqlite3-0), else the one python3's sqlite3 module uses.
if ! "$LUA" -e 'assert(require("cuptimon.sqlite").library())' >/dev/null 2>&1; then
  so=$(python3 -c "import _sqlite3; print(_sqlite3.__file__)" 2>/dev/null)
  lib=$(ldd "$so" 2>/dev/null | sed -n 's/.*libsqlite3[^ ]* => \([^ ]*\) .*/\1/p' | head -1)
  if [ -n "$lib" ]; then
    export CUPTIMON_LIBSQLITE3=$lib
    echo "no system libsqlite3.so.0: using python3's, $lib"
  fi
fi
"$LUA" -e 'print("SQLite " .. assert(require("cuptimon.sqlite").version()))' ||
  { echo "FAIL: no libsqlite3 (apt-get install libsqlite3-0)"; exit 1; }

step "live export"
t0=$(date +%s%N)
timeout 300 "$LUA" "$R/scripts/sqlite.lua" -o "$D/live.sqlite" -- \
  python3 "$R/spec/gpu/torch_nvtx.py" "$STEPS" >"$D/live.log" 2>&1
rc=$?
echo "rc=$rc, $(ms "$t0") ms"; cat "$D/live.log"
[ "$rc" -eq 0 ] || { echo "FAIL: the live export exited $rc"; fail=1; }

step "record"
timeout 300 "$LUA" --record "$D/torch.%p.cmcap" -- python3 "$R/spec/gpu/torch_nvtx.py" "$STEPS" \
  >"$D/record.log" 2>&1
rc=$?
echo "rc=$rc"; cat "$D/record.log"
CAPS=""
for c in "$D"/torch.*.cmcap; do [ -e "$c" ] && CAPS="$CAPS --replay $c"; done
if [ "$rc" -ne 0 ] || [ -z "$CAPS" ]; then echo "FAIL: recording failed"; fail=1; fi

if [ -n "$CAPS" ]; then
  step "export from the capture"
  t0=$(date +%s%N)
  # shellcheck disable=SC2086
  "$LUA" $CAPS "$R/scripts/sqlite.lua" -o "$D/replay.sqlite" --driver >"$D/replay.log" 2>&1
  rc=$?
  echo "rc=$rc, $(ms "$t0") ms"; cat "$D/replay.log"
  [ "$rc" -eq 0 ] || { echo "FAIL: the export from the capture exited $rc"; fail=1; }
  # shellcheck disable=SC2086
  "$LUA" $CAPS "$R/scripts/top.lua" --full-names --top 1000 >"$D/top.log" 2>&1 ||
    { echo "FAIL: top.lua"; fail=1; }
  # shellcheck disable=SC2086
  "$LUA" $CAPS "$R/scripts/nvtx.lua" >"$D/nvtx.log" 2>&1 || { echo "FAIL: nvtx.lua"; fail=1; }
  # shellcheck disable=SC2086
  "$LUA" $CAPS "$R/scripts/count.lua" --kinds kernel >"$D/count.log" 2>&1 || { echo "FAIL: count.lua"; fail=1; }
  cat "$D/top.log" "$D/nvtx.log" "$D/count.log"

  step "kernel summary against top.lua"
  $CHECK summary "$D/replay.sqlite" "$D/top.log" || { echo "FAIL: kernel summary != top.lua"; fail=1; }
  want=$(sed -n 's/^concurrent_kernel *\([0-9]*\)$/\1/p' "$D/count.log")
  got=$(python3 -c "import sqlite3, sys; print(sqlite3.connect(sys.argv[1]).execute('SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL').fetchone()[0])" "$D/replay.sqlite")
  echo "kernel rows $got, count.lua $want"
  [ -n "$want" ] && [ "$got" = "$want" ] || { echo "FAIL: kernel rows != count.lua"; fail=1; }
  step "NVTX-to-kernel example against nvtx.lua (informational)"
  $CHECK nvtx "$D/replay.sqlite" "$D/nvtx.log"
fi

step "integrity"
for db in "$D/live.sqlite" "$D/replay.sqlite"; do
  if [ -e "$db" ]; then
    $CHECK integrity "$db" || { echo "FAIL: $db"; fail=1; }
    ls -l "$db"
  else
    echo "FAIL: $db missing"; fail=1
  fi
done
step "live against the capture"
if [ -e "$D/live.sqlite" ] && [ -e "$D/replay.sqlite" ]; then
  $CHECK same "$D/live.sqlite" "$D/replay.sqlite" || { echo "FAIL: live != capture"; fail=1; }
fi
[ "$fail" -eq 0 ] && echo "sqlite_torch.sh: PASS" || echo "sqlite_torch.sh: FAIL"
exit "$fail"
