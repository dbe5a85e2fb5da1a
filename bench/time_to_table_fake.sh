#!/bin/sh
# time_to_table_fake.sh: the time from the traced process's exit() to the script's exit hook,
# with the fake CUPTI and fake_cuda_app (no GPU): the median and the range of RUNS runs.
#
# Usage: bench/time_to_table_fake.sh [BUILD_DIR] [RUNS] [RECORDS] [TEARDOWN_MS] [CUPTIMON_LUA]
#   BUILD_DIR     the build tree (default: build)
#   RUNS          runs (default 10)
#   RECORDS       records the app writes (default 100000: kernel, memcpy, runtime)
#   TEARDOWN_MS   how long the app's exit takes after the agent's exit handler, a stand-in for
#                 the CUDA runtime's and driver's teardown (default 200)
#   CUPTIMON_LUA  the cuptimon-lua to measure (default BUILD_DIR/cuptimon-lua); its agent is the
#                 libcuptimon-agent.so next to it
#
# Each run prints one line; the last line is
#   time_to_table_ms median=M min=A max=B runs=N records=R teardown_ms=T
# The script fails (status 1) when a run loses a record or exits with the wrong status.
set -eu
build=${1:-build}
runs=${2:-10}
records=${3:-100000}
teardown=${4:-200}
lua=${5:-$build/cuptimon-lua}
app=$build/engine/agent/fake_cuda_app
fake=$build/engine/tests/libfake_cupti.so
root=$(cd "$(dirname "$0")/.." && pwd)
for f in "$lua" "$app" "$fake"; do
  [ -e "$f" ] || { echo "time_to_table_fake.sh: $f is missing (build first)" >&2; exit 2; }
done
export CUPTIMON_LIBCUPTI="$fake" CUPTIMON_LIBCUDA="$fake"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
i=0
while [ "$i" -lt "$runs" ]; do
  i=$((i + 1))
  rc=0
  "$lua" "$root/spec/fixtures/time_to_table.lua" -- "$app" --records "$records" --stamp \
    --teardown-ms "$teardown" --exit-code 5 >"$tmp/out" 2>&1 || rc=$?
  exit_ns=$(sed -n 's/.*exit_mono_ns=\([0-9]*\).*/\1/p' "$tmp/out")
  hook_ns=$(sed -n 's/^exit_hook_ns=\([0-9]*\) .*/\1/p' "$tmp/out")
  got=$(sed -n 's/^exit_hook_ns=[0-9]* records=\([0-9]*\)$/\1/p' "$tmp/out")
  if [ "$rc" != 5 ] || [ -z "$exit_ns" ] || [ -z "$hook_ns" ] || [ "$got" != "$records" ]; then
    echo "time_to_table_fake.sh: run $i: status $rc (want 5), records ${got:-none} of $records" >&2
    cat "$tmp/out" >&2
    exit 1
  fi
  ms=$(awk -v a="$exit_ns" -v b="$hook_ns" 'BEGIN { printf "%.2f", (b - a) / 1e6 }')
  echo "run $i: ${ms} ms"
  echo "$ms" >>"$tmp/ms"
done
sort -n "$tmp/ms" | awk -v runs="$runs" -v rec="$records" -v td="$teardown" '
  { v[NR] = $1 }
  END { m = NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2
        printf "time_to_table_ms median=%.2f min=%.2f max=%.2f runs=%d records=%d teardown_ms=%d\n",
               m, v[1], v[NR], runs, rec, td }'
