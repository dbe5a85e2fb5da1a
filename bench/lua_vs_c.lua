-- bench/lua_vs_c.lua: a Lua observer summing kernel durations (stop - start) over the columns
-- of each batch, against the same loop in C over the same batches, in one run.
--
--   CUPTIMON_LIBCUPTI=libfake_cupti.so CUPTIMON_LIBCUDA=libfake_cupti.so \
--   LUA_VS_C_LIB=build/lua/liblua_vs_c.so cuptimon-lua bench/lua_vs_c.lua [records] [repeats]
--
-- Design note. Both loops run inside the same observer callback, on the same column memory,
-- back to back, `repeats` times each, timed with CLOCK_MONOTONIC; the sums must agree exactly
-- (the Lua loop accumulates in uint64 cdata, as the C loop does). The ratio is C time / Lua time:
-- 1.0 means the Lua loop is as fast as C; the goal is at least 0.8. The records come from the
-- fake CUPTI's generator, so the run needs no GPU. Prints a Markdown table.
local cm = require "cuptimon"
local ffi = require "ffi"

local records = tonumber(arg[1]) or 2000000
local repeats = tonumber(arg[2]) or 20

ffi.cdef [[
uint64_t cm_bench_sum_durations(const uint64_t *start, const uint64_t *stop, uint32_t n);
const char *cm_bench_build(void);
int64_t fake_run_workload(int nthreads, uint64_t per_thread, const int *kinds, int nkinds);
typedef struct { long tv_sec; long tv_nsec; } lua_vs_c_timespec;
int clock_gettime(int clk, lua_vs_c_timespec *ts);
]]

local lib = ffi.load(assert(os.getenv("LUA_VS_C_LIB"), "set LUA_VS_C_LIB to liblua_vs_c.so"))
local fake = ffi.load(assert(os.getenv("CUPTIMON_LIBCUPTI"), "set CUPTIMON_LIBCUPTI to the fake"))
local ts = ffi.new("lua_vs_c_timespec")
local function now()
  ffi.C.clock_gettime(1, ts)
  return tonumber(ts.tv_sec) * 1e9 + tonumber(ts.tv_nsec)
end

-- The Lua loop under test: what a script writes.
local function lua_sum(start, stop, n)
  local sum = ffi.new("uint64_t", 0)
  for i = 0, n - 1 do sum = sum + (stop[i] - start[i]) end
  return sum
end

local t_lua, t_c, n_total, batches, mismatch = 0, 0, 0, 0, 0
local o = assert(cm.observe({ kernel = { "start", "stop" } }, function(b)
  local start, stop, n = b.start, b.stop, b.n
  local s_lua, s_c
  -- Warm-up, so the Lua loop is compiled before it is timed.
  lua_sum(start, stop, n)
  local t0 = now()
  for _ = 1, repeats do s_lua = lua_sum(start, stop, n) end
  local t1 = now()
  for _ = 1, repeats do s_c = lib.cm_bench_sum_durations(start, stop, n) end
  local t2 = now()
  if s_lua ~= s_c then mismatch = mismatch + 1 end
  t_lua, t_c = t_lua + (t1 - t0), t_c + (t2 - t1)
  n_total, batches = n_total + n, batches + 1
end))

local kinds = ffi.new("int[1]", 10)
local written = tonumber(fake.fake_run_workload(2, records / 2, kinds, 1))
cm.flush({ sync = true })
o:close()

-- The CPU model, from /proc/cpuinfo where there is one.
local function cpu_model()
  local f = io.open("/proc/cpuinfo")
  if not f then return "unknown CPU" end
  local text = f:read("*a")
  f:close()
  return text:match("model name%s*:%s*([^\n]+)") or "unknown CPU"
end

local per = n_total * repeats
print(("CPU: %s; C loop: %s"):format(cpu_model(), ffi.string(lib.cm_bench_build())))
local ratio = t_c / t_lua
print(("| loop | records x repeats | ns/record | Mrecords/s |"))
print(("|------|------------------:|----------:|-----------:|"))
print(("| Lua (LuaJIT trace) | %d x %d | %.3f | %.1f |"):format(n_total, repeats, t_lua / per,
  per / t_lua * 1e3))
print(("| C (same build flags) | %d x %d | %.3f | %.1f |"):format(n_total, repeats, t_c / per,
  per / t_c * 1e3))
print()
print(("Lua/C speed ratio (C time / Lua time): %.2f (goal >= 0.8); %d batches, %d records written")
  :format(ratio, batches, written))
if mismatch > 0 or n_total ~= written then
  io.stderr:write(("lua_vs_c: FAILED: %d sum mismatches, %d of %d records observed\n")
    :format(mismatch, n_total, written))
  os.exit(1)
end
