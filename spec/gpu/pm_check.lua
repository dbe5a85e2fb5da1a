-- spec/gpu/pm_check.lua: PM sampling on a real GPU, against the known phases of
-- engine/tests/gpu/gpu_pm_workload.cu (run by spec/gpu/pm_sampling.sh).
--
-- Usage: cuptimon-lua spec/gpu/pm_check.lua [--mode check|pm|trace] [--interval-us N]
--          [--sm M] [--tensor M] [--dram M] [--pcie-read M] [--pcie-write M] -- gpu_pm_workload
--
-- --mode check (the default): samples device 0 and traces kernels; at the end, averages the
-- samples that lie wholly inside each phase (idle: between the first two pm_marker kernels;
-- membw and tensor: from the first to the last kernel of the phase), prints one line per phase
-- and fails the run (an error, so a non-zero exit status) unless
--   membw:  DRAM throughput > 50 % of peak,
--   tensor: SM active > 70 % and tensor pipe active > 25 %,
--   idle:   SM active < 5 %, tensor pipe < 1 %, DRAM < 5 %,
-- and every phase has at least 20 samples. --mode pm samples and traces kernels and runtime
-- calls without checking, --mode trace only traces them: the two sides of the overhead
-- comparison.
local cm = require "cuptimon"
local args = require "cuptimon.args"
local pm = require "cuptimon.pm"

local U = pm.UTIL_METRICS
local opts = args.parse(arg, {
  mode = { "check", "check, pm or trace" },
  interval_us = { 1000, "PM sampling interval", min = 20, integer = true },
  sm = { U.sm, "SM active % metric" },
  tensor = { U.tensor, "tensor pipe active % metric" },
  dram = { U.dram, "DRAM throughput % metric" },
  pcie_read = { U.pcie_read, "PCIe read bytes/s metric" },
  pcie_write = { U.pcie_write, "PCIe write bytes/s metric" },
})
local metrics = { opts.sm, opts.tensor, opts.dram, opts.pcie_read, opts.pcie_write }

cm.configure({ deliver_ms = 100 })
if opts.mode ~= "check" and opts.mode ~= "pm" and opts.mode ~= "trace" then
  args.usage_error("pm_check.lua: --mode must be check, pm or trace")
end

-- Kernels of the workload: name -> list of { start, stop } (ns, plain numbers from a base).
local ffi = require "ffi"
local int64 = ffi.typeof("int64_t")
local base
local function rel(t)
  if not base then base = t - 60e9 end
  return tonumber(ffi.cast(int64, t - base))
end
local kernels = { pm_marker = {}, pm_membw = {}, pm_tensor = {} }
cm.observe({ kernel = { "name", "start", "stop" } }, function(b)
  if opts.mode ~= "check" then return end
  for i = 0, b.n - 1 do
    local list = kernels[b:kernel_name(i)]
    if list then list[#list + 1] = { rel(b.start[i]), rel(b.stop[i]) } end
  end
end)
cm.observe({ runtime = { "cbid", "start" } }, function() end)

local samples = {}
if opts.mode ~= "trace" then
  assert(cm.pm_sample({ metrics = metrics, interval_us = opts.interval_us, device = 0 }))
  cm.observe({ pm_sample = "all" }, function(b)
    if opts.mode ~= "check" then return end
    local rows = cm.pm_rows(b, metrics)
    for i = 0, rows.n - 1 do
      local s = { rel(rows.start[i]), rel(rows.stop[i]) }
      for m, name in ipairs(metrics) do s[m + 2] = rows[name][i] end
      samples[#samples + 1] = s
    end
  end)
end

local function span(list)
  local lo, hi = math.huge, -math.huge
  for _, k in ipairs(list) do
    lo = math.min(lo, k[1])
    hi = math.max(hi, k[2])
  end
  return lo, hi
end

-- The means of the samples inside [lo, hi]: n, then one mean per metric.
local function means(lo, hi)
  local n, sum = 0, { 0, 0, 0, 0, 0 }
  for _, s in ipairs(samples) do
    if s[1] >= lo and s[2] <= hi then
      n = n + 1
      for m = 1, 5 do sum[m] = sum[m] + (s[m + 2] == s[m + 2] and s[m + 2] or 0) end
    end
  end
  for m = 1, 5 do sum[m] = n > 0 and sum[m] / n or 0 / 0 end
  return n, sum
end

cm.on("exit", function()
  if opts.mode ~= "check" then return end
  table.sort(kernels.pm_marker, function(a, b) return a[1] < b[1] end)
  local mk = kernels.pm_marker
  if #mk < 2 or #kernels.pm_membw == 0 or #kernels.pm_tensor == 0 then
    error(("pm_check: FAIL: the workload's kernels were not all traced (%d markers, %d membw, %d "
      .. "tensor)"):format(#mk, #kernels.pm_membw, #kernels.pm_tensor), 0)
  end
  local phases = {
    { "idle", mk[1][2], mk[2][1] },
    { "membw", span(kernels.pm_membw) },
    { "tensor", span(kernels.pm_tensor) },
  }
  local fails, res = {}, {}
  print(("pm_check: %d samples; metrics: %s"):format(#samples, table.concat(metrics, ", ")))
  for _, p in ipairs(phases) do
    local n, v = means(p[2], p[3])
    res[p[1]] = v
    print(("pm_check: %-6s %6.0f ms samples=%4d sm=%.1f%% tensor=%.1f%% dram=%.1f%% "
      .. "pcie_rd=%.3f GB/s pcie_wr=%.3f GB/s"):format(p[1], (p[3] - p[2]) / 1e6, n, v[1], v[2],
      v[3], v[4] / 1e9, v[5] / 1e9))
    if n < 20 then fails[#fails + 1] = ("%s: only %d samples"):format(p[1], n) end
  end
  local function want(ok, what) if not ok then fails[#fails + 1] = what end end
  want(res.membw[3] > 50, ("membw: DRAM %.1f%% <= 50%%"):format(res.membw[3]))
  want(res.tensor[1] > 70, ("tensor: SM active %.1f%% <= 70%%"):format(res.tensor[1]))
  want(res.tensor[2] > 25, ("tensor: tensor pipe %.1f%% <= 25%%"):format(res.tensor[2]))
  want(res.idle[1] < 5, ("idle: SM active %.1f%% >= 5%%"):format(res.idle[1]))
  want(res.idle[2] < 1, ("idle: tensor pipe %.1f%% >= 1%%"):format(res.idle[2]))
  want(res.idle[3] < 5, ("idle: DRAM %.1f%% >= 5%%"):format(res.idle[3]))
  if #fails > 0 then error("pm_check: FAIL: " .. table.concat(fails, "; "), 0) end
  print("PM_SAMPLING PASS")
end)
