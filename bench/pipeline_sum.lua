-- bench/pipeline_sum.lua: the script of bench/pipeline_rate.sh. It sums the durations (stop -
-- start) of every kernel and runtime record, as a script that looks at each record does, and
-- prints the records it received, the run's losses and the time (luv's hrtime, CLOCK_MONOTONIC
-- in ns) at exit.
--
-- Usage: cuptimon-lua bench/pipeline_sum.lua [--count-only] -- cmd   (or --replay CAPTURE)
--   --count-only   count batches' records (b.n) without touching each record: the rate of the
--                  path up to the Lua call, without the per-record work
local cm = require "cuptimon"
local args = require "cuptimon.args"
local ffi = require "ffi"
local uv = require "luv"

local opts = args.parse(arg, {
  count_only = { false, "count records without reading them" },
})

-- lua_ns: the time spent in the observer, so the script's share of a run is known.
local records, sum, lua_ns = 0, ffi.new("uint64_t", 0), 0
local function observer(b)
  local t0 = uv.hrtime()
  records = records + b.n
  if not opts.count_only then
    local start, stop = b.start, b.stop
    local s = sum
    for i = 0, b.n - 1 do s = s + (stop[i] - start[i]) end
    sum = s
  end
  lua_ns = lua_ns + (uv.hrtime() - t0)
end
cm.observe({ kernel = { "start", "stop" }, runtime = { "start", "stop" } }, observer)

cm.on("exit", function()
  local st = cm.stats()
  local s = tostring(sum):gsub("ULL$", "")
  print(("pipeline_sum: records=%d dropped=%d sum=%s lua_ns=%d hook_ns=%d"):format(records,
    st.records_dropped or 0, s, lua_ns, uv.hrtime()))
end)
