-- cuptimon.pm: PM sampling requests (cuptimon.pm_sample) and the pivot of pm_sample batches.
--
-- Design note. A request names a device, an interval and metrics. The module keeps the script's
-- open requests and hands the host their text form ("device:interval_us:metric,...;...", the
-- wire's PM frame) whenever one opens or closes; the host applies it to every source, the
-- in-process engine at once and live agents through the PM frame. The engine samples the union
-- of a device's requests, so samples arrive as pm_sample batches holding one record per (sample,
-- metric) of that union. rows() pivots such a batch into one row per sample with one double
-- column per metric asked for: what a request's callback receives. Names are checked here, so a
-- comma or a colon never reaches the wire; whether the GPU can sample a metric is known only
-- there, and its refusal names the metric and says what to do.
local ffi = require "ffi"

local M = {}

local MAX_METRICS = 64   -- CM_WIRE_PM_METRICS
local MAX_NAME = 256     -- CM_WIRE_PM_NAME
local MIN_US, MAX_US = 20, 10000000

--- The utilization metrics the recipes sample (gpu_util, prometheus, timeline), GH100 names:
--- SM active and tensor-pipe active in % of the elapsed cycles, DRAM throughput in % of its
--- peak, PCIe bytes per second each way.
M.UTIL_METRICS = {
  sm = "sm__cycles_active.avg.pct_of_peak_sustained_elapsed",
  tensor = "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_elapsed",
  dram = "dram__throughput.avg.pct_of_peak_sustained_elapsed",
  pcie_read = "pcie__read_bytes.sum.per_second",
  pcie_write = "pcie__write_bytes.sum.per_second",
}

--- The device ordinals of a comma-separated list ("0,1"), or nil and a message.
function M.parse_devices(text)
  local out = {}
  for d in tostring(text):gmatch("[^,]+") do
    local n = tonumber(d)
    if not n or n < 0 or n > 1023 or n ~= math.floor(n) then
      return nil, ("device list must hold CUDA device ordinals such as 0,1; got %q"):format(text)
    end
    out[#out + 1] = n
  end
  return out
end

local requests = {}      -- open requests, in opening order
local Request = {}
Request.__index = Request

local function check(opts)
  if type(opts) ~= "table" then
    error("cuptimon.pm_sample: expected a table { metrics = {...}, interval_us = n, device = n, "
      .. "fn = function(rows) }", 3)
  end
  for k in pairs(opts) do
    if k ~= "metrics" and k ~= "interval_us" and k ~= "device" and k ~= "fn" then
      error(("cuptimon.pm_sample: unknown option %q; valid options: device, fn, interval_us, "
        .. "metrics"):format(tostring(k)), 3)
    end
  end
  local m = opts.metrics
  if type(m) ~= "table" or #m == 0 or #m > MAX_METRICS then
    error(("cuptimon.pm_sample: metrics must be a list of 1 to %d metric names such as "
      .. "\"sm__cycles_active.avg\""):format(MAX_METRICS), 3)
  end
  for i, name in ipairs(m) do
    if type(name) ~= "string" or #name == 0 or #name > MAX_NAME or not name:match("^[%w_%.]+$") then
      error(("cuptimon.pm_sample: metric %d (%s) is not a metric name: letters, digits, '_' "
        .. "and '.' only, at most %d bytes, such as \"dram__throughput.avg.pct_of_peak_"
        .. "sustained_elapsed\""):format(i, tostring(name), MAX_NAME), 3)
    end
  end
  local iv = opts.interval_us or 1000
  if type(iv) ~= "number" or iv ~= math.floor(iv) or iv < MIN_US or iv > MAX_US then
    error(("cuptimon.pm_sample: interval_us must be an integer in [%d, %d], got %s")
      :format(MIN_US, MAX_US, tostring(opts.interval_us)), 3)
  end
  local dev = opts.device or 0
  if type(dev) ~= "number" or dev ~= math.floor(dev) or dev < 0 or dev > 1023 then
    error(("cuptimon.pm_sample: device must be a CUDA device ordinal (0..1023), got %s")
      :format(tostring(opts.device)), 3)
  end
  if opts.fn ~= nil and type(opts.fn) ~= "function" then
    error(("cuptimon.pm_sample: fn must be a function(rows), got a %s"):format(type(opts.fn)), 3)
  end
  return iv, dev
end

--- The text form of the open requests (the PM frame's payload).
function M.spec()
  local parts = {}
  for _, r in ipairs(requests) do
    parts[#parts + 1] = ("%d:%d:%s"):format(r.device, r.interval_us, table.concat(r.metrics, ","))
  end
  return table.concat(parts, ";")
end

--- Opens a request (cuptimon.pm_sample): opts.metrics, opts.interval_us (default 1000),
--- opts.device (default 0), opts.fn (optional: called with rows() of each batch, this request's
--- metrics and device only). Returns the request, or nil, err (the request is then not kept).
function M.open(opts)
  local apply, observe = M.apply, M.observe
  local iv, dev = check(opts)
  local r = setmetatable({ metrics = {}, interval_us = iv, device = dev, closed = false },
    Request)
  for i, name in ipairs(opts.metrics) do r.metrics[i] = name end
  requests[#requests + 1] = r
  local ok, err, name = apply(M.spec())
  if not ok then
    requests[#requests] = nil
    apply(M.spec())
    return nil, err, name
  end
  if opts.fn then
    local fn = opts.fn
    r.observer = observe({ pm_sample = "all" }, function(b)
      local rows = M.rows(b, r.metrics, r.device)
      if rows.n > 0 then fn(rows) end
    end)
  end
  return r
end

--- Closes the request: its metrics leave the device's union (the session restarts over the rest,
--- or stops after the last request of the device). Returns true, or nil, err.
function Request:close()
  if self.closed then return true end
  self.closed = true
  if self.observer then self.observer:close() end
  for i, r in ipairs(requests) do
    if r == self then
      table.remove(requests, i)
      break
    end
  end
  return M.apply(M.spec())
end

function Request:__tostring()
  return ("pm_sample(device %d, %d us, %s%s)"):format(self.device, self.interval_us,
    table.concat(self.metrics, ","), self.closed and ", closed" or "")
end

-- Set by cuptimon/init.lua: apply(spec) hands a spec to the host (true, or nil, err);
-- observe is cuptimon.observe.
M.apply, M.observe = nil, nil

--- Pivots a pm_sample batch into rows, one per sample of `device` (nil: every device): rows.n,
--- rows.device[i], rows.start[i] and rows.stop[i] (uint64_t, CLOCK_REALTIME ns), rows.sample[i],
--- and rows[metric][i] (double) for each name of `metrics` (nil: every metric of the batch), with
--- i from 0. A metric a sample lacks reads NaN. rows.source and rows.metrics (the names) too.
function M.rows(b, metrics, device)
  local n = b.n
  local dcol, scol, mcol, vcol = b.device, b.sample, b.metric, b.value
  -- Which string ids are wanted, resolved once per batch and id.
  local want, names, seen = {}, {}, {}
  if metrics then
    for _, m in ipairs(metrics) do
      want[m] = true
      names[#names + 1] = m
    end
  end
  local id_name = {}
  local count, last_dev, last_sample = 0, -1, -1
  for i = 0, n - 1 do
    local d, s = tonumber(dcol[i]), tonumber(scol[i])
    if (device == nil or d == device) and (d ~= last_dev or s ~= last_sample) then
      count = count + 1
      last_dev, last_sample = d, s
    end
    local id = tonumber(mcol[i])
    if id_name[id] == nil then
      local name = b:str("metric", i) or ("string " .. id)
      id_name[id] = name
      if not metrics and not seen[name] then
        seen[name] = true
        names[#names + 1] = name
        want[name] = true
      end
    end
  end
  local rows = { n = count, source = b.source, metrics = names,
    device = ffi.new("uint32_t[?]", count), start = ffi.new("uint64_t[?]", count),
    stop = ffi.new("uint64_t[?]", count), sample = ffi.new("uint64_t[?]", count) }
  for _, name in ipairs(names) do
    local col = ffi.new("double[?]", count)
    for i = 0, count - 1 do col[i] = 0 / 0 end
    rows[name] = col
  end
  local row, start, stop = -1, b.start, b.stop
  last_dev, last_sample = -1, -1
  for i = 0, n - 1 do
    local d, s = tonumber(dcol[i]), tonumber(scol[i])
    if device == nil or d == device then
      if d ~= last_dev or s ~= last_sample then
        row = row + 1
        last_dev, last_sample = d, s
        rows.device[row], rows.start[row], rows.stop[row], rows.sample[row] = d, start[i], stop[i], s
      end
      local name = id_name[tonumber(mcol[i])]
      if want[name] then rows[name][row] = vcol[i] end
    end
  end
  return rows
end

return M
