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
--   --format FMT     text (an aligned table, the default), csv, or json (an object per row)
--   --sort BY        the order of the rows: total (time, the default), calls, avg, max, min, or
--                    name
--
-- The columns are nsys stats' cuda_api_sum, in microseconds: Time (%) is the function's share of
-- the time in all the functions shown, Med comes from a quantile sketch (cuptimon.agg.sketch,
-- within 1%), StdDev is the sample standard deviation. Function names come from cuptimon.cbid,
-- generated from CUPTI's cupti_runtime_cbid.h; an id it does not know is shown as "cbid N".
--
-- Example output:
--   Time (%) Total (us) Num Calls Avg (us) Med (us) Min (us) Max (us) StdDev (us) Name
--       95.1   133967.9         2  66983.9      6.2      6.2 133961.7     94720.8 cudaStreamCreateWithFlags
--        1.5     2143.7       300      7.1      6.1      4.6    141.6         8.2 cudaLaunchKernel
local cm = require "cuptimon"
local args = require "cuptimon.args"
local cbid = require "cuptimon.cbid"
local tabulate = require "cuptimon.table"

local opts = args.parse(arg, args.with_output(args.with_sort(args.with_filter({
  top = { 20, "how many functions to show", min = 1, integer = true },
  driver = { false, "also count driver API calls" },
}, "API functions"))))
args.output(opts, "api_latency.lua")
local names = args.filter(opts, "api_latency.lua")
local order = args.sort_order(opts, "api_latency.lua")

local agg = require "cuptimon.agg"

local per = cm.stats_by { unit = "ns" } -- function name -> count, sum, min, max of durations in ns
local sketches = {}                      -- function name -> quantile sketch of its durations
local squares = {}                       -- function name -> sum of squared durations (ns^2)

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
      if names:keep(name) then
        local d = tonumber(stop[i] - start[i])
        per:add(name, d)
        local s = sketches[name]
        if not s then
          s = agg.sketch()
          sketches[name] = s
        end
        s:add(d)
        squares[name] = (squares[name] or 0) + d * d
      end
    end
  end
end

cm.observe({ runtime = { "cbid", "start", "stop" } }, observer(cbid.name))
if opts.driver then
  cm.observe({ driver = { "cbid", "start", "stop" } }, observer(function(c) return driver_names[c] end))
end

cm.on("exit", function()
  if cm.command_failed() then return end -- the one-line error says it all
  -- nsys stats' cuda_api_sum columns, in microseconds; StdDev is the sample standard deviation.
  local t = tabulate.new {
    { "Time (%)", "%.1f", width = 8, align = "right" }, { "Total (us)", "%.1f", width = 10 },
    { "Num Calls", "%d", width = 9 }, { "Avg (us)", "%.1f", width = 8 },
    { "Med (us)", "%.1f", width = 8 }, { "Min (us)", "%.1f", width = 8 },
    { "Max (us)", "%.1f", width = 8 }, { "StdDev (us)", "%.1f", width = 11 },
    { "Name", align = "left" },
  }
  local all = per:total()
  for _, e in ipairs(per:sorted(opts.top, order)) do
    local n = e.count
    local var = n > 1 and (squares[e.key] - e.sum * e.sum / n) / (n - 1) or 0
    t:add(all > 0 and 100 * e.sum / all or 0, e.sum / 1e3, n, e.avg / 1e3,
      sketches[e.key]:quantile(0.5) / 1e3, e.min / 1e3, e.max / 1e3,
      math.sqrt(var > 0 and var or 0) / 1e3, e.key)
  end
  t:print()
end)
