-- top_kernels.lua: the kernels that took the most GPU time, by total duration.
--
-- Usage: cuptimon-lua scripts/top_kernels.lua [--top N] [--interval MS] [--full-names]
--          [--mangled] -- cmd args...
--        cuptimon-lua --replay run.cmcap scripts/top_kernels.lua
--
-- Arguments:
--   --top N          how many kernels to show (default 10; at least 1)
--   --interval MS    also print the table every MS milliseconds (default 0: only at the end)
--   --full-names     show whole demangled signatures (default: name and template arguments)
--   --mangled        show the names as CUPTI reports them, mangled
--
-- Times are in microseconds; "% gpu" is the kernel's share of the summed duration of all
-- kernels (concurrent kernels can make the sum exceed the wall time).
--
-- Example output:
--   kernel                                      count    total_us      avg_us      min_us      max_us  % gpu
--   cm_demo_matmul<16>                            150        2863        19.1         5.2        30.1   93.3
--   cm_demo_sgd_update<float>                      60          78         1.3         1.0         1.7    2.5
--   5 kernel names, 3069 us of kernel time
local cm = require "cuptimon"
local args = require "cuptimon.args"
local tabulate = require "cuptimon.table"

local opts = args.parse(arg, {
  top = { 10, "how many kernels to show", min = 1, integer = true },
  interval = { 0, "print the table every this many milliseconds (0: only at exit)", min = 0,
    integer = true },
  full_names = { false, "show whole demangled signatures" },
  mangled = { false, "show the names as CUPTI reports them, mangled" },
})
local form = opts.mangled and "mangled" or opts.full_names and "full" or "short"

local by_name = cm.stats_by() -- kernel name -> count, sum, min, max of durations in ns

cm.observe({ kernel = { "name", "start", "stop" } }, function(b)
  local start, stop = b.start, b.stop
  for i = 0, b.n - 1 do by_name:add(b:kernel_name(i, form), stop[i] - start[i]) end
end)

local function report()
  local all = by_name:total()
  local t = tabulate.new {
    { "kernel", width = 40, max = 40 }, { "count", "%d", width = 8 },
    { "total_us", "%.0f", width = 11 }, { "avg_us", "%.1f", width = 11 },
    { "min_us", "%.1f", width = 11 }, { "max_us", "%.1f", width = 11 },
    { "% gpu", "%.1f", width = 6 },
  }
  for _, e in ipairs(by_name:sorted(opts.top)) do
    t:add(e.key, e.count, e.sum / 1e3, e.avg / 1e3, e.min / 1e3, e.max / 1e3,
      all > 0 and 100 * e.sum / all or 0)
  end
  t:print()
  print(("%d kernel names, %.0f us of kernel time"):format(by_name:len(), all / 1e3))
end

if opts.interval > 0 then cm.every(opts.interval, report) end
cm.on("exit", report)
