-- api_latency.lua: CUDA runtime API latency per function (cudaLaunchKernel, cudaMemcpy, ...).
--
-- Usage: cuptimon-lua scripts/api_latency.lua [--top N] [--driver] -- cmd args...
--        cuptimon-lua --replay run.cmcap scripts/api_latency.lua
--
-- Arguments:
--   --top N      how many functions to show, by total time (default 20)
--   --driver     also count driver API calls (shown by cbid number)
--
-- Function names come from cuptimon.cbid, generated from CUPTI's cupti_runtime_cbid.h; an id it
-- does not know is shown as "cbid N".
--
-- Example output:
--   api                                  calls    total_us      avg_us      min_us      max_us
--   cudaLaunchKernel                     50000    40000.0         0.8         0.5         1.1
local cm = require "cuptimon"
local args = require "cuptimon.args"
local cbid = require "cuptimon.cbid"

local opts = args.parse(arg, {
  top = { 20, "how many functions to show" },
  driver = { false, "also count driver API calls" },
})

local per = {} -- label -> { count, total, min, max }

local function observer(prefix, names)
  return function(b)
    local id, start, stop = b.cbid, b.start, b.stop
    for i = 0, b.n - 1 do
      local c = tonumber(id[i])
      local label = names and names[c] or (prefix .. c)
      local s = per[label]
      if not s then
        s = { count = 0, total = 0, min = math.huge, max = 0 }
        per[label] = s
      end
      local d = tonumber(stop[i] - start[i])
      s.count = s.count + 1
      s.total = s.total + d
      if d < s.min then s.min = d end
      if d > s.max then s.max = d end
    end
  end
end

cm.observe({ runtime = { "cbid", "start", "stop" } }, observer("cbid ", setmetatable({}, {
  __index = function(t, c)
    local v = cbid.name(c)
    rawset(t, c, v)
    return v
  end,
})))
if opts.driver then cm.observe({ driver = { "cbid", "start", "stop" } }, observer("driver cbid ")) end

cm.on("exit", function()
  local list = {}
  for label, s in pairs(per) do list[#list + 1] = { label = label, s = s } end
  table.sort(list, function(a, b)
    if a.s.total ~= b.s.total then return a.s.total > b.s.total end
    return a.label < b.label
  end)
  print(("%-36s %8s %11s %11s %11s %11s"):format("api", "calls", "total_us", "avg_us", "min_us",
    "max_us"))
  for i = 1, math.min(opts.top, #list) do
    local e, s = list[i], list[i].s
    print(("%-36s %8d %11.1f %11.1f %11.1f %11.1f"):format(e.label, s.count, s.total / 1e3,
      s.total / s.count / 1e3, s.min / 1e3, s.max / 1e3))
  end
end)
