#!/usr/bin/env bash
# The CPU benchmarks (decode_bench, lua_vs_c) at the project's default build type and at -O3, from
# the repository root, on any machine (no GPU: the records come from the fake CUPTI):
#   bash bench/cpu_bench.sh [BUILD_TYPE...]      (default: RelWithDebInfo Release)
# RelWithDebInfo is the project's default (-O2 -g); Release is -O3. Each type is configured in
# build-bench-<type> (kept between runs) and only the benchmark targets are built. Each benchmark
# prints the build type, the compiler flags and the CPU model beside its figures; the output is
# also written to $OUT/cpu_bench.<type>.log when $OUT is set. CPU=N pins to core N (default 1).
set -euo pipefail
cd "$(dirname "$0")/.."
types=("$@")
[ ${#types[@]} -gt 0 ] || types=(RelWithDebInfo Release)
cpu=${CPU:-1}
for t in "${types[@]}"; do
  b=build-bench-$t
  echo "=== $t ($b)"
  mkdir -p "$b"
  cmake -S . -B "$b" -DCMAKE_BUILD_TYPE="$t" -DCUPTIMON_GPU_TESTS=OFF >"$b/configure.log" 2>&1 ||
    { cat "$b/configure.log"; exit 1; }
  nice cmake --build "$b" -j"${JOBS:-2}" --target decode_bench lua_vs_c cuptimon-lua fake_cupti >/dev/null
  f=$PWD/$b/engine/tests/libfake_cupti.so
  {
    taskset -c "$cpu" "$b/bench/decode_bench"
    echo
    CUPTIMON_LIBCUPTI=$f CUPTIMON_LIBCUDA=$f LUA_VS_C_LIB=$PWD/$b/lua/liblua_vs_c.so \
      taskset -c "$cpu" "$b/cuptimon-lua" bench/lua_vs_c.lua 2000000 20
  } | tee "${OUT:-/tmp}/cpu_bench.$t.log"
done
