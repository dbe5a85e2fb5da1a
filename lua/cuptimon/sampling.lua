-- cuptimon.sampling: a duty cycle (cuptimon.duty) feeding estimates (cuptimon.estimate), the part
-- the --duty recipes (top, count, prometheus) share.
--
-- It traces kernels (per device and name), copies (per device and direction) and, for count,
-- records per kind, in windows of duty * period_ms every period_ms, and keeps one estimator for
-- all: the unit is the process (its source), the key "kernel\tDEVICE\tNAME",
-- "memcpy\tDEVICE\tDIRECTION" or "kind\tKIND", with the measures n (launches or records),
-- t (GPU seconds) and b (bytes). Every batch of a window is added to its process's open window,
-- which the window's close commits (a usable window) or discards (a failed one, one that lost
-- records or had a kind shed); skipped windows are counted with their reason.
local cm = require "cuptimon"
local estimate = require "cuptimon.estimate"

local M = {}

-- CUpti_ActivityMemcpyKind names, as memcpy_bw.lua prints them.
M.copy_names = { [0] = "unknown", "HtoD", "DtoH", "HtoA", "AtoH", "AtoA", "AtoD", "DtoA", "DtoD",
  "HtoH", "PtoP" }

local S = {}
S.__index = S

--- Starts the duty cycle. opts:
---   duty = F (0 < F < 1), period_ms = P (each window lasts F * P ms, one per period)
---   seed, pid: as for cuptimon.duty
---   kernels = true, copies = true: trace and estimate them
---   kinds = { "kernel", "memcpy", ... }: also estimate the records of each kind
---   form = "short" | "full" | "mangled": kernel names (b:kernel_name)
---   window = f(w), skip = f(ev): cuptimon.duty's callbacks, called after the estimator's update
--- Returns the sampler, or nil, err (under --replay: ESTATE).
function M.start(opts)
  local on_ms = math.floor(opts.duty * opts.period_ms + 0.5)
  if on_ms < 1 or on_ms >= opts.period_ms then
    return nil, ("EINVAL: a duty of %g in a period of %d ms gives windows of %d ms; it needs at "
      .. "least 1 ms and less than the period"):format(opts.duty, opts.period_ms, on_ms), "EINVAL"
  end
  local s = setmetatable({ est = estimate.new(), info = {}, procs = {}, opts = opts,
    on_ms = on_ms, form = opts.form or "short" }, S)
  local sel, kind_of = {}, {}
  if opts.kernels then sel.kernel = { "name", "start", "stop", "device" } end
  if opts.copies then sel.memcpy = { "copy_kind", "bytes", "start", "stop", "device" } end
  for _, name in ipairs(opts.kinds or {}) do
    local k = cm.registry.kind(name)
    if not sel[name] then sel[name] = { k.by_name.start and "start" or k.fields[0].name } end
    kind_of[name] = true
  end
  s.counted = kind_of
  local d, err, ename = cm.duty { on_ms = on_ms, period_ms = opts.period_ms, seed = opts.seed,
    pid = opts.pid, select = sel,
    fn = function(b) s:_batch(b) end,
    window = function(w)
      s:_started(w.source, w.pid)
      if w.ok then s.est:commit(w.source, w.traced_ms / 1000) else s.est:discard(w.source) end
      if opts.window then opts.window(w) end
    end,
    skip = function(ev)
      s:_started(ev.source, ev.pid)
      s.est:skip(ev.source, ev.reason)
      if opts.skip then opts.skip(ev) end
    end }
  if not d then return nil, err, ename end
  s.duty = d
  return s
end

function S:_started(source, pid)
  if self.procs[source] then return end
  local st = self.duty:stats().processes[source]
  local p = cm.process(source)
  self.procs[source] = { pid = pid, exe = p and p.exe or "?",
    rank = p and p.env and p.env.RANK or nil }
  self.est:start(source, (st and st.started or 0) / 1000, { pid = pid })
end

function S:_key(key, what, device, name)
  if not self.info[key] then self.info[key] = { what = what, device = device, name = name } end
  return key
end

function S:_batch(b)
  local est, source = self.est, b.source
  if self.counted[b.kind] then
    est:add(source, self:_key("kind\t" .. b.kind, "kind", nil, b.kind), b.n)
  end
  if b.kind == "concurrent_kernel" and self.opts.kernels then
    local start, stop, device = b.start, b.stop, b.device
    for i = 0, b.n - 1 do
      local dev, name = tonumber(device[i]), b:kernel_name(i, self.form)
      local key = self:_key("kernel\t" .. dev .. "\t" .. name, "kernel", dev, name)
      est:add(source, key, 1, tonumber(stop[i] - start[i]) / 1e9)
    end
  elseif b.kind == "memcpy" and self.opts.copies then
    local ck, nbytes, start, stop, device = b.copy_kind, b.bytes, b.start, b.stop, b.device
    for i = 0, b.n - 1 do
      local dev, dir = tonumber(device[i]), M.copy_names[tonumber(ck[i])] or tostring(ck[i])
      local key = self:_key("memcpy\t" .. dev .. "\t" .. dir, "memcpy", dev, dir)
      est:add(source, key, 1, tonumber(stop[i] - start[i]) / 1e9, tonumber(nbytes[i]))
    end
  end
end

--- The clock (seconds) at which unit `source`'s estimates are taken: now, or when it ended.
function S:now(source)
  local st = self.duty:stats().processes[source]
  if not st then return nil end
  return (st.started + st.elapsed_ms) / 1000
end

--- The estimate of `key` in process `source` for measure m (cuptimon.estimate's estimate).
function S:estimate(source, key, m)
  return self.est:estimate(source, key, self:now(source), m)
end

--- The processes seen so far, in order: { source, pid, exe, rank }.
function S:processes()
  local out = {}
  for _, source in ipairs(self.est:unit_list()) do
    local p = self.procs[source]
    if p then out[#out + 1] = { source = source, pid = p.pid, exe = p.exe, rank = p.rank } end
  end
  return out
end

--- The keys of process `source` of one sort ("kernel", "memcpy" or "kind").
function S:keys(source, what)
  local out = {}
  for _, key in ipairs(self.est:keys(source)) do
    if self.info[key] and self.info[key].what == what then out[#out + 1] = key end
  end
  return out
end

--- The sum over every process of `key` (estimate's sum, each process at its own clock).
function S:sum(key, m)
  return self.est:sum(key, function(u) return self:now(u) end, m)
end

--- The footer lines: the duty, the windows so far, traced against elapsed time, the skipped and
--- discarded windows with their reasons, and the detection limit of what no window saw.
function S:footer()
  local st = self.duty:stats()
  local lines = {}
  lines[1] = ("duty %.3f (%d of every %d ms): %d windows so far, traced %.1f s of %.1f s "
    .. "elapsed (%.3f)"):format(st.duty, st.on_ms, st.period_ms, st.windows, st.traced_ms / 1000,
    st.elapsed_ms / 1000, st.elapsed_ms > 0 and st.traced_ms / st.elapsed_ms or 0)
  for _, source in ipairs(self.duty.order) do
    local p = st.processes[source]
    if p.skipped > 0 then
      lines[#lines + 1] = ("note: skipped %d windows of pid %d: %s"):format(p.skipped, p.pid,
        p.skip_reason or "?")
    end
    if p.discarded > 0 then
      lines[#lines + 1] = ("note: discarded %d windows of pid %d (failed, lost records or shed)")
        :format(p.discarded, p.pid)
    end
  end
  local limit
  for _, p in pairs(st.processes) do
    if p.traced_ms > 0 then limit = math.max(limit or 0, 3000 / p.traced_ms) end
  end
  if limit then
    lines[#lines + 1] = ("a kernel not listed was seen in no window: below the detection limit "
      .. "of %.3g launches/s per process (3 / traced seconds)"):format(limit)
  end
  return lines
end

return M
