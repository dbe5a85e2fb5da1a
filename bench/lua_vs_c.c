/*
 * lua_vs_c.c: the C half of bench/lua_vs_c.lua, loaded with ffi.load. The same reduction the Lua
 * observer runs, sum of (stop - start) over a batch's kernel columns, written as plain C over
 * the same column memory. Compiled with the project's flags, so the ratio compares LuaJIT's
 * trace against what the C compiler makes of the same loop.
 */
#include <stdint.h>

#ifndef CM_BENCH_BUILD
#define CM_BENCH_BUILD "unknown build"
#endif

uint64_t cm_bench_sum_durations(const uint64_t *start, const uint64_t *stop, uint32_t n);
const char *cm_bench_build(void);

/* How this library was compiled, printed by lua_vs_c.lua beside its figures. */
const char *cm_bench_build(void) { return CM_BENCH_BUILD; }

uint64_t cm_bench_sum_durations(const uint64_t *start, const uint64_t *stop, uint32_t n) {
  uint64_t sum = 0;
  for (uint32_t i = 0; i < n; i++) sum += stop[i] - start[i];
  return sum;
}
