#!/bin/sh
# sqlite_rate.sh: rows per second that scripts/sqlite.lua writes into SQLite on one core, against
# scripts/dump.lua's CSV on the same capture, with the fake CUPTI (no GPU).
#
# Usage: bench/sqlite_rate.sh [BUILD_DIR] [RECORDS] [RUNS] [CPU]
#   BUILD_DIR  the build tree (default: build)
#   RECORDS    records in the capture (default 2000000: kernel, runtime, memcpy, memset, a quarter
#              each), recorded once from fake_cuda_app with the real agent
#   RUNS       rounds (default 3); each round runs the three jobs below in turn
#   CPU        the core every job is pinned to with taskset (default 1; "" for none)
#
# Per round, on the same capture: `--replay CAP scripts/count.lua` (reading and decoding the
# capture alone), `--replay CAP scripts/sqlite.lua -o DB` (the whole export: rows, strings,
# indexes, the final commit) and `--replay CAP scripts/dump.lua -o DIR/` (CSV, every field of
# the same four kinds). It prints each time, wall and CPU, then the medians as rows per second:
# of the export as a whole, net of the replay (rows / (sqlite - count)), and per CPU second,
# beside dump.lua's. Every run must exit 0 and the database must hold every record (the script
# fails otherwise). The last line is
#   sqlite_rate rows=N sqlite_rows_per_s=A sqlite_net_rows_per_s=B csv_rows_per_s=C
#     sqlite_rows_per_cpu_s=D csv_rows_per_cpu_s=E  (the last two with GNU time)
set -eu
build=${1:-build}
records=${2:-2000000}
runs=${3:-3}
cpu=${4-1}
lua=$build/cuptimon-lua
app=$build/engine/agent/fake_cuda_app
fake=$build/engine/tests/libfake_cupti.so
root=$(cd "$(dirname "$0")/.." && pwd)
for f in "$lua" "$app" "$fake"; do
  [ -e "$f" ] || { echo "sqlite_rate.sh: $f is missing (build first)" >&2; exit 2; }
done
export CUPTIMON_LIBCUPTI="$fake" CUPTIMON_LIBCUDA="$fake"
pin=""
if [ -n "$cpu" ] && command -v taskset >/dev/null 2>&1; then pin="taskset -c $cpu"; fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

echo "sqlite_rate.sh: $(date -u +%Y-%m-%dT%H:%M:%SZ), $(uname -n), $(nproc) cores," \
  "$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -1)"
echo "build: $(sed -n 's/^CMAKE_BUILD_TYPE:STRING=//p' "$build/CMakeCache.txt" 2>/dev/null)," \
  "SQLite $("$lua" -e 'print((require("cuptimon.sqlite").version()))')," \
  "command: sh bench/sqlite_rate.sh $build $records $runs ${cpu:-none}"

# The capture: paced so that the agent's queue never fills; a lossy recording is tried again at
# half the rate (a loaded machine), three times at most.
rate=$((records < 1000000 ? records : 1000000))
rows=""
for attempt in 1 2 3; do
  rm -f "$tmp"/cap.*.cmcap
  "$lua" --record "$tmp/cap.%p.cmcap" -- "$app" --records "$records" --threads 2 --rate "$rate" \
    --kinds kernel,runtime,memcpy,memset >"$tmp/rec.out" 2>&1 || true
  rows=$(sed -n 's/.*recorded [^ ]*: [0-9]* frames, [0-9]* batches, \([0-9]*\) records, 0 dropped$/\1/p' \
    "$tmp/rec.out")
  [ -n "$rows" ] && break
  rate=$((rate / 2))
done
[ -n "$rows" ] || { echo "sqlite_rate.sh: the capture lost records 3 times" >&2; cat "$tmp/rec.out" >&2; exit 1; }
cap=$(ls "$tmp"/cap.*.cmcap)
echo "capture: $rows records, $(wc -c <"$cap") bytes"

now() { date +%s%N; }
# run NAME CMD...: runs CMD pinned, appends its wall seconds to $tmp/t_NAME and its CPU seconds
# (user + system, from GNU time when installed: on a shared machine the wall time also holds the
# time other jobs had the core) to $tmp/c_NAME; fails on a non-zero status.
gtime=""
[ -x /usr/bin/time ] && gtime="/usr/bin/time -o $tmp/cpu -f %U+%S"
run() {
  name=$1
  shift
  t0=$(now)
  $gtime $pin "$@" >"$tmp/$name.out" 2>&1 || {
    echo "sqlite_rate.sh: $name failed:" >&2; cat "$tmp/$name.out" >&2; exit 1; }
  t1=$(now)
  awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.3f\n", (b - a) / 1e9 }' >>"$tmp/t_$name"
  if [ -n "$gtime" ]; then tail -1 "$tmp/cpu" | awk -F+ '{ printf "%.3f\n", $1 + $2 }' >>"$tmp/c_$name"
  else echo 0 >>"$tmp/c_$name"; fi
}
i=0
while [ "$i" -lt "$runs" ]; do
  i=$((i + 1))
  rm -rf "$tmp/db.sqlite" "$tmp/csv"
  run count "$lua" --replay "$cap" "$root/scripts/count.lua"
  run sqlite "$lua" --replay "$cap" "$root/scripts/sqlite.lua" -o "$tmp/db.sqlite"
  run csv "$lua" --replay "$cap" "$root/scripts/dump.lua" -o "$tmp/csv/"
  grep -q "wrote $tmp/db.sqlite: $rows rows" "$tmp/sqlite.out" || {
    echo "sqlite_rate.sh: the database does not hold the $rows records:" >&2
    cat "$tmp/sqlite.out" >&2; exit 1; }
  echo "round $i: wall (CPU) seconds: count $(tail -1 "$tmp/t_count") ($(tail -1 "$tmp/c_count")), sqlite" \
    "$(tail -1 "$tmp/t_sqlite") ($(tail -1 "$tmp/c_sqlite")), csv $(tail -1 "$tmp/t_csv") ($(tail -1 "$tmp/c_csv"))"
done
median() { sort -n "$1" | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
c=$(median "$tmp/t_count")
s=$(median "$tmp/t_sqlite")
d=$(median "$tmp/t_csv")
cc=$(median "$tmp/c_count")
cs=$(median "$tmp/c_sqlite")
cd=$(median "$tmp/c_csv")
echo "medians of $runs, wall (CPU) seconds: count $c ($cc), sqlite $s ($cs), csv $d ($cd);" \
  "database $(wc -c <"$tmp/db.sqlite") bytes"
awk -v n="$rows" -v c="$c" -v s="$s" -v d="$d" -v cs="$cs" -v cd="$cd" 'BEGIN {
  net = (s > c) ? n / (s - c) : 0
  printf "sqlite_rate rows=%d sqlite_rows_per_s=%.0f sqlite_net_rows_per_s=%.0f csv_rows_per_s=%.0f", \
    n, n / s, net, n / d
  if (cs > 0 && cd > 0) printf " sqlite_rows_per_cpu_s=%.0f csv_rows_per_cpu_s=%.0f", n / cs, n / cd
  printf "\n" }'
