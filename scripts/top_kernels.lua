-- top_kernels.lua: the kernels that took the most GPU time, by total duration.
--
-- Usage: cuptimon-lua scripts/top_kernels.lua [--top N] [--interval MS] [--full-names]
--          [--mangled] -- cmd args...
--        cuptimon-lua --replay run.cmcap scripts/top_kernels.lua
--
-- Arguments:
--   --top N          how many kernels to show (default 10)
--   --interval MS    also print the table every MS milliseconds (default 0: only at the end)
--   --full-names     show whole demangled signatures (default: name and template arguments)
--   --mangled        show the names as CUPTI reports them, mangled
--
-- Times are in microseconds; "% gpu" is the kernel's share of the summed duration of all
-- kernels (concurrent kernels can make the sum exceed the wall time).
--
-- Example output:
--   kernel                                    count    total_us      avg_us      min_us      max_us  % gpu
--   _Z7kernelCv                               33333    26666400       800.0       500.0      1100.0   33.6
--   kernelA                                   33334    26665900       799.9       500.0      1100.0   33.3
local cm = require "cuptimon"
local args = require "cuptimon.args"

local opts = args.parse(arg, {
  top = { 10, "how many kernels to show" },
  interval = { 0, "print the table every this many milliseconds (0: only at exit)" },
  full_names = { false, "show whole demangled signatures" },
  mangled = { false, "show the names as CUPTI reports them, mangled" },
})

local by_name = {}  -- kernel name -> { count, total, min, max } in nanoseconds
local names = {}    -- source id -> { [string id] = name }

cm.observe({ kernel = { "name", "start", "stop" } }, function(b)
  local start, stop, ids = b.start, b.stop, b.name
  local cache = names[b.source]
  if not cache then
    cache = {}
    names[b.source] = cache
  end
  for i = 0, b.n - 1 do
    local id = tonumber(ids[i])
    local nm = cache[id]
    if not nm then
      nm = b:str("name", i) or ("string " .. id)
      if not opts.mangled then nm = cm.kernel_name(nm, opts.full_names) end
      cache[id] = nm
    end
    local d = tonumber(stop[i] - start[i])
    local s = by_name[nm]
    if not s then
      s = { count = 0, total = 0, min = math.huge, max = 0 }
      by_name[nm] = s
    end
    s.count = s.count + 1
    s.total = s.total + d
    if d < s.min then s.min = d end
    if d > s.max then s.max = d end
  end
end)

local function report()
  local list, all = {}, 0
  for nm, s in pairs(by_name) do
    list[#list + 1] = { name = nm, s = s }
    all = all + s.total
  end
  table.sort(list, function(a, b)
    if a.s.total ~= b.s.total then return a.s.total > b.s.total end
    return a.name < b.name
  end)
  print(("%-40s %8s %11s %11s %11s %11s %6s"):format("kernel", "count", "total_us", "avg_us",
    "min_us", "max_us", "% gpu"))
  for i = 1, math.min(opts.top, #list) do
    local e, s = list[i], list[i].s
    local nm = #e.name > 40 and (e.name:sub(1, 37) .. "...") or e.name
    print(("%-40s %8d %11.0f %11.1f %11.1f %11.1f %6.1f"):format(nm, s.count, s.total / 1e3,
      s.total / s.count / 1e3, s.min / 1e3, s.max / 1e3, all > 0 and 100 * s.total / all or 0))
  end
  print(("%d kernel names, %.0f us of kernel time"):format(#list, all / 1e3))
end

if opts.interval > 0 then cm.every(opts.interval, report) end
cm.on("exit", report)
