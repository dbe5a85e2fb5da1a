-- nvtx.lua: GPU time attributed to NVTX ranges, per process (what nsys' nvtx_gpu_proj reports).
--
-- Usage: cuptimon-lua scripts/nvtx.lua [--top N] [--filter REGEX] [--exclude REGEX] -- cmd args...
--        cuptimon-lua --replay run.cmcap scripts/nvtx.lua
--
-- Arguments:
--   --top N     how many range names to show per process (default 20; at least 1)
--   --format FMT  text (aligned tables, the default), csv, or json (an object per row, with pid)
--   --filter REGEX  charge only the kernels whose name (demangled, as top.lua shows it) matches
--               REGEX, a POSIX extended regular expression ("^cm_demo_(matmul|relu)"); the
--               kernels left out count nowhere (not in "% gpu" either), and the footer says how
--               many; copies and memsets are not kernels and are kept
--   --exclude REGEX  leave out the kernels whose name matches REGEX
--
-- A range is named by its path: the ranges open on its thread when it began, outermost first,
-- then its own name ("train/step" for a step inside train). Each kernel, copy and memset is
-- charged to the NVTX ranges (push/pop and start/end, nested, per thread) open on the thread that
-- launched it when the launching API call began: the GPU record's correlation id finds the
-- runtime or driver call (its thread and start time), and the innermost range of that thread open
-- at that time gets the exclusive time; it and every range around it get the inclusive time. Work launched outside any range is charged to "(no range)"; work whose API call
-- was never seen to "(no API record)". Times are the summed GPU durations in microseconds;
-- "% gpu" is the inclusive time's share of the process's GPU time.
--
-- Memory is bounded: an API call waits for its GPU work at most --horizon-ms of trace time after
-- the newest API call seen (calls without GPU work, such as cudaStreamSynchronize, are then
-- forgotten), and a closed range is forgotten once the newest API call is that far past its end.
--
-- Example output:
--   pid 601 (cuptimon_demo_cuda)
--   range                ranges    ops    incl_us    excl_us  % gpu
--   train                     1    423     3609.1        0.0   99.1
--   train/step               30    423     3609.1     3609.1   99.1
--   setup                     1      4       33.5       33.5    0.9
--   3 range paths, 3642.6 us of GPU time
local cm = require "cuptimon"
local args = require "cuptimon.args"
local tabulate = require "cuptimon.table"
local nvtx = require "cuptimon.nvtx"
local bit = require "bit"

local opts = args.parse(arg, args.with_output(args.with_filter({
  top = { 20, "how many range names to show per process", min = 1, integer = true },
  horizon_ms = { 10000, "how long (trace time) an API call waits for its GPU work", min = 1,
    integer = true },
}, "kernels")))
args.output(opts, "nvtx.lua")
local kernels = args.filter(opts, "nvtx.lua")
local horizon = opts.horizon_ms * 1e6

local START, END, THREAD = nvtx.START, nvtx.END, nvtx.THREAD

-- source id -> per-process state
local procs = {}
local function proc(b)
  local s = procs[b.source]
  if not s then
    local p = b:process()
    s = {
      title = cm.process_title(p),
      pid = p and p.pid or 0,
      ranges = nvtx.pairing(), -- marker id -> { name =, path =, tid =, start = }, a range
                               -- not yet ended, or its end time when its END came first
      closed = {},    -- tid -> list of { name =, start =, stop = }
      api = {},       -- correlation id -> { tid, start }, waiting for its GPU work
      gpu = {},       -- correlation id -> summed duration, waiting for its API record
      api_seen = 0,   -- the newest API start seen
      marker_seen = 0, -- the newest marker time seen
      waiting = {},   -- { tid, t, dur }: matched work launched after the newest marker seen
      stats = {},     -- range name -> { ranges =, ops =, incl =, excl = }
      total = 0,      -- GPU ns of every operation
      left_out = 0,   -- kernels --filter/--exclude left out
    }
    procs[b.source] = s
  end
  return s
end

-- The innermost range open on thread tid at time t, or nil.
local function enclosing(s, tid, t)
  local best
  for _, r in pairs(s.ranges.open) do
    if r.tid == tid and r.start <= t and (not best or r.start > best.start) then best = r end
  end
  return best
end

local function stat(s, name)
  local e = s.stats[name]
  if not e then
    e = { ranges = 0, ops = 0, incl = 0, excl = 0 }
    s.stats[name] = e
  end
  return e
end

-- Charges dur ns, launched by thread tid at time t, to the ranges open there.
local function attribute(s, tid, t, dur)
  local inner, inner_start, names = nil, -1, {}
  local function consider(r, stop)
    if r.start <= t and (stop == nil or t <= stop) then
      names[r.path] = true
      if r.start > inner_start then inner, inner_start = r.path, r.start end
    end
  end
  for _, r in ipairs(s.closed[tid] or {}) do consider(r, r.stop) end
  for _, r in pairs(s.ranges.open) do if r.tid == tid then consider(r, nil) end end
  if not inner then
    inner = "(no range)"
    names[inner] = true
  end
  for name in pairs(names) do
    local e = stat(s, name)
    e.incl = e.incl + dur
    e.ops = e.ops + 1
  end
  local e = stat(s, inner)
  e.excl = e.excl + dur
end

-- Markers arrive in their own batches, possibly after the work they enclose: work launched after
-- the newest marker seen waits (in a list bounded by that lag) until the markers catch up.
local function charge(s, tid, t, dur)
  if t <= s.marker_seen then
    attribute(s, tid, t, dur)
  else
    s.waiting[#s.waiting + 1] = { tid, t, dur }
  end
end

local function catch_up(s, all)
  local keep = {}
  for _, w in ipairs(s.waiting) do
    if all or w[2] <= s.marker_seen then attribute(s, w[1], w[2], w[3]) else keep[#keep + 1] = w end
  end
  s.waiting = keep
end

local function gpu_work(s, corr, dur)
  s.total = s.total + dur
  local a = s.api[corr]
  if a then
    charge(s, a[1], a[2], dur)
  else
    s.gpu[corr] = (s.gpu[corr] or 0) + dur
  end
end

-- Forgets API calls and closed ranges older than the horizon before the newest API call.
local function prune(s)
  local before = s.api_seen - horizon
  for corr, a in pairs(s.api) do if a[2] < before then s.api[corr] = nil end end
  for tid, list in pairs(s.closed) do
    local keep = {}
    for _, r in ipairs(list) do if r.stop >= before then keep[#keep + 1] = r end end
    s.closed[tid] = #keep > 0 and keep or nil
  end
end

cm.observe({ marker = { "flags", "timestamp", "id", "object_kind", "tid", "name" } }, function(b)
  local s = proc(b)
  local flags, ts, id, ok, tid = b.flags, b.timestamp, b.id, b.object_kind, b.tid
  for i = 0, b.n - 1 do
    local f, mid, t = tonumber(flags[i]), tonumber(id[i]), tonumber(ts[i])
    if bit.band(f, START) ~= 0 then
      local r = { name = b:str("name", i) or "?", start = t,
        tid = tonumber(ok[i]) == THREAD and tonumber(tid[i]) or 0 }
      local parent = enclosing(s, r.tid, t)
      r.path = parent and parent.path .. "/" .. r.name or r.name
      stat(s, r.path).ranges = stat(s, r.path).ranges + 1
      local stop = s.ranges:start(mid, r)
      if stop then
        r.stop = stop
        s.closed[r.tid] = s.closed[r.tid] or {}
        table.insert(s.closed[r.tid], r)
      end
    elseif bit.band(f, END) ~= 0 then
      local r = s.ranges:stop(mid, t)
      if r then
        r.stop = t
        s.closed[r.tid] = s.closed[r.tid] or {}
        table.insert(s.closed[r.tid], r)
      end
    end
    if t > s.marker_seen then s.marker_seen = t end
  end
  catch_up(s)
end)

local function api_batch(b)
  local s = proc(b)
  local start, tid, corr = b.start, b.tid, b.correlation
  for i = 0, b.n - 1 do
    local c, t, th = tonumber(corr[i]), tonumber(start[i]), tonumber(tid[i])
    local d = s.gpu[c]
    if d then
      s.gpu[c] = nil
      charge(s, th, t, d)
    end
    s.api[c] = { th, t }
    if t > s.api_seen then s.api_seen = t end
  end
  prune(s)
end
cm.observe({ runtime = { "start", "tid", "correlation" } }, api_batch)
cm.observe({ driver = { "start", "tid", "correlation" } }, api_batch)

-- GPU work; with --filter or --exclude, the kernels the filter leaves out are not charged
-- anywhere, nor counted in the process's GPU time.
local function gpu_batch(b)
  local s = proc(b)
  local start, stop, corr = b.start, b.stop, b.correlation
  local filtered = kernels.active and b.cols.name ~= nil
  for i = 0, b.n - 1 do
    if not filtered or kernels:keep(b:kernel_name(i)) then
      gpu_work(s, tonumber(corr[i]), tonumber(stop[i] - start[i]))
    else
      s.left_out = s.left_out + 1
    end
  end
end
cm.observe({ kernel = kernels.active and { "start", "stop", "correlation", "name" }
  or { "start", "stop", "correlation" } }, gpu_batch)
for _, k in ipairs { "memcpy", "memset" } do
  cm.observe({ [k] = { "start", "stop", "correlation" } }, gpu_batch)
end

cm.on("exit", function()
  if cm.command_failed() then return end -- the one-line error says it all
  local list = {}
  for _, s in pairs(procs) do list[#list + 1] = s end
  table.sort(list, function(a, b) return a.pid < b.pid end)
  if #list == 0 then tabulate.note("no records") end
  for n, s in ipairs(list) do
    catch_up(s, true)
    for _, d in pairs(s.gpu) do
      local e = stat(s, "(no API record)")
      e.incl, e.excl, e.ops = e.incl + d, e.excl + d, e.ops + 1
    end
    s.gpu = {}
    local rows = {}
    for name, e in pairs(s.stats) do
      if e.ops > 0 or e.ranges > 0 then rows[#rows + 1] = { name = name, e = e } end
    end
    table.sort(rows, function(a, b)
      if a.e.incl ~= b.e.incl then return a.e.incl > b.e.incl end
      return a.name < b.name
    end)
    local t = tabulate.new({ { "range", width = 20, max = 48 }, { "ranges", "%d", width = 6 },
      { "ops", "%d", width = 6 }, { "incl_us", "%.1f", width = 10 },
      { "excl_us", "%.1f", width = 10 }, { "% gpu", "%.1f", width = 6 } },
      { context = { pid = s.pid } })
    for i = 1, math.min(#rows, opts.top) do
      local r = rows[i]
      local ranges = r.e.ranges
      if r.name:sub(1, 1) == "(" then ranges = nil end -- not a range: printed "-"
      t:add(r.name, ranges, r.e.ops, r.e.incl / 1e3,
        r.e.excl / 1e3, s.total > 0 and 100 * r.e.incl / s.total or 0)
    end
    if n > 1 then tabulate.note("") end
    tabulate.note(s.title)
    t:print()
    tabulate.note(("%d range paths, %.1f us of GPU time"):format(#rows, s.total / 1e3)
      .. (s.left_out > 0 and ("; %d kernels left out by --filter/--exclude"):format(s.left_out)
        or ""))
  end
end)
