-- gpu_util.lua (gpu-util): how busy each GPU was, from PM sampling, per device and time window:
-- SM active %, tensor-pipe active %, DRAM throughput % of peak, PCIe read and write GB/s, and the
-- kernels that ran in each window (the join of the samples with the kernel records).
--
-- Usage: cuptimon-lua scripts/gpu_util.lua [--devices 0,1] [--interval-us N] [--window-ms MS]
--                                          [--top N] [--sm M] [--tensor M] [--dram M]
--                                          [--pcie-read M] [--pcie-write M] [--format FMT]
--                                          -- cmd args...
--        cuptimon-lua --replay run.cmcap scripts/gpu_util.lua
--        cuptimon-lua --replay run.cmcap scripts/gpu_util.lua --format csv
--
-- Arguments:
--   --devices LIST   the CUDA devices to sample (default 0)
--   --interval-us N  the PM sampling interval in microseconds (default 10000)
--   --window-ms MS   one table row per device and MS milliseconds of samples (default 100)
--   --top N          how many kernels to name per row, by time in the window (default 2)
--   --format FMT     text (aligned columns, the default), csv, or json (an object per row,
--                    values unformatted: a metric with no value is empty in CSV, null in JSON)
--   --sm, --tensor, --dram, --pcie-read, --pcie-write   the metric of each column (defaults:
--                    GH100 names, below); a metric the GPU cannot sample stops the script with
--                    an error that names it
--
-- Default metrics: sm__cycles_active.avg.pct_of_peak_sustained_elapsed,
-- sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_elapsed,
-- dram__throughput.avg.pct_of_peak_sustained_elapsed, pcie__read_bytes.sum.per_second and
-- pcie__write_bytes.sum.per_second. PM sampling needs the driver to allow profiling counters:
-- with NVreg_RestrictProfilingToAdminUsers=1 run as root, else the error says what to do.
--
-- Windows count from the first sample of each process and device; a row is printed once a later
-- window has begun (its kernels have had time to arrive), the rest at the end. A value is the
-- mean over the window's samples; "-" when the process sent no value for it. A kernel counts in
-- the window where it starts, with its duration. Samples come from the in-process engine, live
-- agents or a capture alike. A run or capture without any sample (a capture recorded without PM
-- sampling, say) is not an empty table: one line says why, and the status is 1.
--
-- Example output (spec/fixtures/pm_fake.cmcap, samples of the fake CUPTI, abridged):
--     pid dev window_ms  sm% tensor% dram% pcie_rd_GB/s pcie_wr_GB/s samples                                    kernels
--   20636   0         0 13.3    23.4  53.4         0.00         0.00      20 pm_kernel_a (5.0 ms), pm_kernel_b (5.0 ms)
--   20636   0       300 13.4    23.4  53.4         0.00         0.00      20 pm_kernel_a (5.0 ms), pm_kernel_b (5.0 ms)
local cm = require "cuptimon"
local args = require "cuptimon.args"
local pm = require "cuptimon.pm"
local tabulate = require "cuptimon.table"
local ffi = require "ffi"

local opts = args.parse(arg, args.with_output {
  devices = { "0", "the CUDA devices to sample, comma-separated" },
  interval_us = { 10000, "PM sampling interval in microseconds", min = 20, integer = true },
  window_ms = { 100, "table row width in milliseconds", min = 1, integer = true },
  top = { 2, "kernels named per row", min = 0, integer = true },
  sm = { pm.UTIL_METRICS.sm, "SM active % metric" },
  tensor = { pm.UTIL_METRICS.tensor, "tensor pipe active % metric" },
  dram = { pm.UTIL_METRICS.dram, "DRAM throughput % metric" },
  pcie_read = { pm.UTIL_METRICS.pcie_read, "PCIe read bytes/s metric" },
  pcie_write = { pm.UTIL_METRICS.pcie_write, "PCIe write bytes/s metric" },
})
args.output(opts, "gpu_util.lua")

-- The columns: title, metric, scale of the mean.
local cols = {
  { "sm%", opts.sm, 1 }, { "tensor%", opts.tensor, 1 }, { "dram%", opts.dram, 1 },
  { "pcie_rd_GB/s", opts.pcie_read, 1e-9 }, { "pcie_wr_GB/s", opts.pcie_write, 1e-9 },
}
local metrics = {}
for i, c in ipairs(cols) do metrics[i] = c[2] end

local devices, derr = pm.parse_devices(opts.devices)
if not devices then args.usage_error("gpu_util: --devices: " .. derr) end

local window_ns = opts.window_ms * 1e6
local int64 = ffi.typeof("int64_t")
local function since(t, base) return tonumber(ffi.cast(int64, t - base)) end

local streams, order = {}, {} -- "source/device" -> state
local function state(source, device)
  local key = source .. "/" .. device
  local st = streams[key]
  if not st then
    local p = cm.process(source) or {}
    st = { pid = p.pid or 0, device = device, base = nil, windows = {}, printed = -1, last = -1,
      pending = {} }
    streams[key] = st
    order[#order + 1] = st
  end
  return st
end

local function window(st, w)
  local win = st.windows[w]
  if not win then
    win = { n = 0, sum = {}, cnt = {}, kernels = {} }
    st.windows[w] = win
  end
  return win
end

local function add_kernel(st, name, t0, dur)
  local w = math.floor(since(t0, st.base) / window_ns)
  if w < 0 or w <= st.printed then return end
  local k = window(st, w).kernels
  k[name] = (k[name] or 0) + dur
end

local out = tabulate.new({ { "pid", "%d", align = "right" }, { "dev", "%d" }, { "window_ms", "%d" },
  { "sm%", "%.1f" }, { "tensor%", "%.1f" }, { "dram%", "%.1f" }, { "pcie_rd_GB/s", "%.2f" },
  { "pcie_wr_GB/s", "%.2f" }, { "samples", "%d" }, { "kernels", "%s" } })

local function kernels_text(k)
  local list = {}
  for name, ns in pairs(k) do list[#list + 1] = { name, ns } end
  if #list == 0 or opts.top == 0 then return "-" end
  table.sort(list, function(a, b) return a[2] > b[2] or (a[2] == b[2] and a[1] < b[1]) end)
  local parts = {}
  for i = 1, math.min(opts.top, #list) do
    parts[i] = ("%s (%.1f ms)"):format(list[i][1], list[i][2] / 1e6)
  end
  if #list > opts.top then parts[#parts + 1] = ("+%d more"):format(#list - opts.top) end
  return table.concat(parts, ", ")
end

-- Prints the windows of `st` up to `upto` (inclusive) that have samples.
local function flush_rows(st, upto)
  for w = st.printed + 1, upto do
    local win = st.windows[w]
    if win and win.n > 0 then
      local v = {}
      for i, c in ipairs(cols) do
        local cnt = win.cnt[i] or 0
        v[i] = cnt > 0 and win.sum[i] / cnt * c[3] or nil
      end
      out:add(st.pid, st.device, w * opts.window_ms, v[1], v[2], v[3], v[4], v[5], win.n,
        kernels_text(win.kernels))
    end
    st.windows[w] = nil
    st.printed = w
  end
end

local function print_ready()
  for _, st in ipairs(order) do
    if st.last - 1 > st.printed then flush_rows(st, st.last - 1) end
  end
  if out:count() > 0 then
    out:print()
    out:clear()
  end
end

local requests = {}
for _, d in ipairs(devices) do
  local r, err = cm.pm_sample({ metrics = metrics, interval_us = opts.interval_us, device = d })
  if not r then
    io.stderr:write("gpu_util: ", err, "\n")
    cm.exit(1)
    return
  end
  requests[#requests + 1] = r
end

cm.observe({ pm_sample = "all" }, function(b)
  local rows = cm.pm_rows(b, metrics)
  for i = 0, rows.n - 1 do
    local st = state(b.source, rows.device[i])
    if not st.base then
      st.base = rows.start[i]
      for _, k in ipairs(st.pending) do add_kernel(st, k[1], k[2], k[3]) end
      st.pending = {}
    end
    local w = math.floor(since(rows.start[i], st.base) / window_ns)
    if w > st.printed then
      local win = window(st, w)
      win.n = win.n + 1
      for m, c in ipairs(cols) do
        local v = rows[c[2]][i]
        if v == v then -- not NaN: the sample has this metric
          win.sum[m] = (win.sum[m] or 0) + v
          win.cnt[m] = (win.cnt[m] or 0) + 1
        end
      end
      if w > st.last then st.last = w end
    end
  end
end)

local PENDING_MAX = 100000 -- kernels kept per device before its first sample arrives
cm.observe({ kernel = { "name", "start", "stop", "device" } }, function(b)
  local start, stop, dev = b.start, b.stop, b.device
  for i = 0, b.n - 1 do
    local st = state(b.source, tonumber(dev[i]))
    local name = b:kernel_name(i)
    local dur = since(stop[i], start[i])
    if st.base then
      add_kernel(st, name, start[i], dur)
    elseif #st.pending < PENDING_MAX then
      st.pending[#st.pending + 1] = { name, start[i], dur }
    end
  end
end)

cm.every(1000, print_ready)

local replayed = false
cm.on("process_start", function(p) replayed = replayed or p.kind == "replay" end)

-- Whether any process and device sent a sample (kernels alone make a state too).
local function sampled()
  for _, st in ipairs(order) do if st.base then return true end end
  return false
end

local function close_requests()
  for _, r in ipairs(requests) do r:close() end
end

cm.on("exit", function()
  -- A command that could not start: its one-line error says it all (status 127 or 126).
  if cm.command_failed() then return close_requests() end
  if not sampled() then
    -- No process sent a sample: say why instead of printing nothing with status 0.
    io.stderr:write(replayed and "gpu_util.lua: the capture holds no PM samples: it was recorded "
      .. "without PM sampling (record a run under gpu_util.lua, or timeline.lua --pm-devices)\n"
      or "gpu_util.lua: no PM samples arrived: no process sampled devices " .. opts.devices
      .. " before the run ended (a CUDA program must run under `-- cmd`, long enough for one "
      .. "interval)\n")
    close_requests()
    cm.exit(1)
    return
  end
  for _, st in ipairs(order) do
    local last = -1
    for w in pairs(st.windows) do if w > last then last = w end end
    flush_rows(st, last)
  end
  if out:count() > 0 then out:print() end
  close_requests()
end)
