-- api_latency.lua: CUDA runtime API latency per function (cudaLaunchKernel, cudaMemcpy, ...).
--
-- Usage: cuptimon-lua scripts/api_latency.lua [--top N] [--driver] -- cmd args...
--        cuptimon-lua --replay run.cmcap scripts/api_latency.lua
--
-- Arguments:
--   --top N      how many functions to show, by total time (default 20; at least 1)
--   --driver     also count driver API calls (shown by cbid number)
--   --filter REGEX   only the functions whose name matches REGEX (POSIX extended)
--   --exclude REGEX  leave out the functions whose name matches REGEX
--
-- Function names come from cuptimon.cbid, generated from CUPTI's cupti_runtime_cbid.h; an id it
-- does not know is shown as "cbid N".
--
-- Example output:
--   api                                     calls    total_us      avg_us      min_us      max_us
--   cudaStreamCreateWithFlags                   2    133967.9     66983.9         6.2    133961.7
--   cudaLaunchKernel                          300      2143.7         7.1         4.6       141.6
local cm = require "cuptimon"
local args = require "cuptimon.args"
local cbid = require "cuptimon.cbid"
local tabulate = require "cuptimon.table"

local opts = args.parse(arg, args.with_filter({
  top = { 20, "how many functions to show", min = 1, integer = true },
  driver = { false, "also count driver API calls" },
}, "API functions"))
local names = args.filter(opts, "api_latency.lua")

local per = cm.stats_by { unit = "ns" } -- function name -> count, sum, min, max of durations in ns

local driver_names = setmetatable({}, { __index = function(t, c)
  local v = "driver cbid " .. c
  t[c] = v
  return v
end })

local function observer(name_of)
  return function(b)
    local id, start, stop = b.cbid, b.start, b.stop
    for i = 0, b.n - 1 do
      local name = name_of(tonumber(id[i]))
      if names:keep(name) then per:add(name, stop[i] - start[i]) end
    end
  end
end

cm.observe({ runtime = { "cbid", "start", "stop" } }, observer(cbid.name))
if opts.driver then
  cm.observe({ driver = { "cbid", "start", "stop" } }, observer(function(c) return driver_names[c] end))
end

cm.on("exit", function()
  local t = tabulate.new {
    { "api", width = 36 }, { "calls", "%d", width = 8 }, { "total_us", "%.1f", width = 11 },
    { "avg_us", "%.1f", width = 11 }, { "min_us", "%.1f", width = 11 },
    { "max_us", "%.1f", width = 11 },
  }
  for _, e in ipairs(per:sorted(opts.top)) do
    t:add(e.key, e.count, e.sum / 1e3, e.avg / 1e3, e.min / 1e3, e.max / 1e3)
  end
  t:print()
end)
