#!/usr/bin/env bash
# Runs the ThreadSanitizer unit suite N times (default 20) under CPU load, to show it is
# deterministic on a busy machine. Not part of CI (one run takes about two to four minutes on a
# loaded 2-core machine); run it by hand after touching threads, timing or the tests:
#
#   .ci/tsan_stress.sh [N]          # default 20
#
# The load is one niced CPU hog per core: `stress-ng --cpu` when installed, otherwise a shell
# busy loop. LOAD=none runs without it. The script configures and builds build-tsan the way
# .ci/test does, runs `ctest -L unit -E cli_static_deps` with as many jobs as cores, keeps the
# output of every failing run in build-tsan/stress/, and exits non-zero if any run failed.
# TESTS=REGEX runs only the tests whose names match (ctest -R), for example
# `TESTS=lua_window_spec .ci/tsan_stress.sh 50` for one spec 50 times in a row.
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${1:-20}
jobs=$(nproc)
load=${LOAD:-auto}
select=()
if [ -n "${TESTS:-}" ]; then select=(-R "$TESTS"); fi

cmake -S . -B build-tsan -DCMAKE_BUILD_TYPE=Debug -DCUPTIMON_TSAN=ON -DCUPTIMON_GPU_TESTS=OFF >/dev/null
nice cmake --build build-tsan -j"$jobs" >/dev/null
mkdir -p build-tsan/stress

hogs=()
stop_load() {
  for pid in "${hogs[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${hogs[@]}"; do wait "$pid" 2>/dev/null || true; done
  hogs=()
}
trap stop_load EXIT
trap 'exit 130' INT TERM
if [ "$load" = auto ]; then
  if command -v stress-ng >/dev/null; then load=stress-ng; else load=busy; fi
fi
case "$load" in
  stress-ng)
    # stress-ng stops its workers when it gets SIGTERM; --timeout bounds it if this shell dies.
    nice -n 19 stress-ng --cpu "$jobs" --timeout 6h >/dev/null 2>&1 &
    hogs+=($!)
    ;;
  busy)
    for _ in $(seq "$jobs"); do
      nice -n 19 bash -c 'while :; do :; done' &
      hogs+=($!)
    done
    ;;
  none) ;;
  *)
    echo "tsan_stress: LOAD must be auto, stress-ng, busy or none (got '$load')" >&2
    exit 2
    ;;
esac
echo "tsan_stress: $runs runs of the TSan unit suite${TESTS:+ (tests matching $TESTS)}, -j$jobs, load: $load"

failed=0
t_all=$(date +%s)
for i in $(seq "$runs"); do
  t0=$(date +%s)
  log=build-tsan/stress/run$i.log
  if ctest --test-dir build-tsan --output-on-failure -j"$jobs" -L unit -E cli_static_deps "${select[@]}" \
    --no-tests=error >"$log" 2>&1; then
    echo "run $i/$runs: passed in $(($(date +%s) - t0)) s"
    rm -f "$log"
  else
    failed=$((failed + 1))
    echo "run $i/$runs: FAILED in $(($(date +%s) - t0)) s (output in $log):"
    grep -E "\*\*\*Failed|\*\*\*Timeout|\*\*\*Exception| FAIL: |WARNING: ThreadSanitizer" "$log" | head -20 || echo "  (no failure line; see the log)"
  fi
done
echo "tsan_stress: $failed of $runs runs failed, $(($(date +%s) - t_all)) s in all"
[ "$failed" -eq 0 ]
