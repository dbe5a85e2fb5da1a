-- idle.lua: how busy each GPU stream was, over time and overall, and the largest idle gaps with
-- the last runtime API call before each one (what the GPU was waiting on).
--
-- Usage: cuptimon-lua scripts/idle.lua [--gap-us N] [--top N] [--interval MS] [--format FMT]
--          -- cmd args...
--        cuptimon-lua --replay run.cmcap scripts/idle.lua --interval 1
--        cuptimon-lua --replay run.cmcap scripts/idle.lua --format json --top 1
--
-- Arguments:
--   --gap-us N       a gap of at least N microseconds between two operations of a stream counts
--                    as idle (default 10)
--   --top N          how many of the largest gaps to show per process (default 5; 0: none)
--   --interval MS    also show busy % per stream in buckets of MS milliseconds (default 0: only
--                    the overall table)
--   --format FMT     text (aligned tables, the default), csv, or json (an object per row): the
--                    rows of the three tables, each carrying its pid; the buckets of --interval
--                    are one row per stream and bucket (device, stream, start_ms, busy%)
--
-- One set of tables per process, titled as every recipe titles a process (cm.process_title): pid
-- and executable, and rank when its RANK environment variable is set ("pid 4242
-- (/usr/bin/python3), rank 1"). Kernels, copies and memsets are
-- attributed to (device, stream). Busy is the summed duration of the stream's operations, span
-- runs from its first start to its last stop, and busy% is busy over span. Times are microseconds
-- from the first record of the process. Gaps are measured in arrival order: an operation that
-- starts at least N us after every operation seen before it on its stream ends opens a gap.
-- Kernels, copies and memsets arrive in separate batches, so an operation may arrive before an
-- earlier one of another kind: it then extends the span backwards and opens no gap. The API call
-- shown for a gap is the runtime call of that process, on any thread, that ended last before the
-- gap began, among the last 4096 calls that had arrived when the gap was seen and every call
-- that arrived after it.
--
-- Example output:
--   pid 601 (cuptimon_demo_cuda)
--   device stream     ops     span_us     busy_us  busy%    gaps  max_gap_us
--        0      7       4        93.2        33.5   35.9       2        29.1
--        0     13      30      4504.2       387.2    8.6      29       546.4
--        0     14     393      4748.9      3221.9   67.8      29       225.1
--   busy % per 1 ms (columns: device/stream)
--   start_ms    0/7   0/13   0/14
--          0    3.4    4.9   29.2
--          1    0.0    9.0   74.4
--   largest idle gaps
--   device stream    start_us      gap_us last_api_before                   api_end_us
--        0     13       185.7       546.4 cudaStreamWaitEvent                    180.6
--        0     14       668.3       225.1 cudaMemcpyAsync                        665.6
local cm = require "cuptimon"
local args = require "cuptimon.args"
local cbid = require "cuptimon.cbid"
local tabulate = require "cuptimon.table"
local ffi = require "ffi"

local opts = args.parse(arg, args.with_output {
  gap_us = { 10, "minimum idle gap in microseconds", min = 0 },
  top = { 5, "how many of the largest gaps to show per process", min = 0, integer = true },
  interval = { 0, "bucket width in milliseconds for busy % over time (0: none)", min = 0,
    integer = true },
})
args.output(opts, "idle.lua")
local gap_ns, bucket_ns = opts.gap_us * 1e3, opts.interval * 1e6
local RING = 4096 -- the recent API calls kept per process, to name the call before a new gap

local int64 = ffi.typeof("int64_t")
-- Nanoseconds from timestamp `base` to timestamp `t` (both uint64), negative when t is earlier.
-- Subtracting two uint64 values wraps below zero, so the difference is read back as signed.
local function since(t, base) return tonumber(ffi.cast(int64, t - base)) end

local procs = {} -- source id -> process state
local proc_order = {}

local function process(b, t0)
  local pr = procs[b.source]
  if not pr then
    local p = b:process() or {}
    pr = { pid = p.pid or 0, title = cm.process_title(p), base = t0,
      streams = {}, order = {}, gaps = {}, ring_stop = {}, ring_cbid = {}, ring_n = 0 }
    procs[b.source] = pr
    proc_order[#proc_order + 1] = pr
  end
  return pr
end

local function stream_state(pr, device, stream)
  local key = device * 2 ^ 32 + stream
  local s = pr.streams[key]
  if not s then
    -- first, last: ns from the process's base; busy: durations; gaps: idle gaps; buckets:
    -- bucket index -> busy ns in it.
    s = { device = device, stream = stream, busy = cm.summary(), gaps = cm.summary(), buckets = {} }
    pr.streams[key] = s
    pr.order[#pr.order + 1] = s
  end
  return s
end

-- The runtime call of `pr` that ended last at or before `t`, among the recent ones kept.
local function last_call_before(pr, t)
  local best, best_cbid
  for i = 1, math.min(pr.ring_n, RING) do
    local e = pr.ring_stop[i]
    if e <= t and (not best or e > best) then best, best_cbid = e, pr.ring_cbid[i] end
  end
  return best, best_cbid
end

-- Keeps the --top largest gaps of a process, sorted by length, largest first.
local function note_gap(pr, s, start, len)
  local list, n = pr.gaps, opts.top
  if n == 0 or (#list >= n and len <= list[#list].len) then return end
  local api_stop, api_cbid = last_call_before(pr, start)
  local g = { device = s.device, stream = s.stream, start = start, len = len, api_stop = api_stop,
    api_cbid = api_cbid }
  local i = #list + 1
  while i > 1 and list[i - 1].len < len do
    list[i] = list[i - 1]
    i = i - 1
  end
  list[i] = g
  list[n + 1] = nil
end

-- Adds busy time [a, e) (ns from the base) to the buckets it overlaps.
local function add_buckets(s, a, e)
  local k = math.floor(a / bucket_ns)
  while k * bucket_ns < e do
    local lo, hi = math.max(a, k * bucket_ns), math.min(e, (k + 1) * bucket_ns)
    if hi > lo then s.buckets[k] = (s.buckets[k] or 0) + (hi - lo) end
    k = k + 1
  end
end

local function on_gpu(b)
  if b.n == 0 then return end
  local start, stop, device, stream = b.start, b.stop, b.device, b.stream
  local pr = process(b, start[0])
  for i = 0, b.n - 1 do
    local s = stream_state(pr, tonumber(device[i]), tonumber(stream[i]))
    local a = since(start[i], pr.base)
    local e = a + since(stop[i], start[i])
    if s.last and a - s.last >= gap_ns then
      s.gaps:add(a - s.last)
      note_gap(pr, s, s.last, a - s.last)
    end
    if not s.last or e > s.last then s.last = e end
    if not s.first or a < s.first then s.first = a end
    s.busy:add(e - a)
    if bucket_ns > 0 then add_buckets(s, a, e) end
  end
end

for _, kind in ipairs { "kernel", "memcpy", "memset" } do
  cm.observe({ [kind] = { "start", "stop", "device", "stream" } }, on_gpu)
end

-- Runtime calls: kept in a ring per process, and offered to the gaps already kept.
cm.observe({ runtime = { "cbid", "stop" } }, function(b)
  if b.n == 0 then return end
  local id, stop = b.cbid, b.stop
  local pr = process(b, stop[0])
  local gaps = pr.gaps
  for i = 0, b.n - 1 do
    local e, c = since(stop[i], pr.base), tonumber(id[i])
    local slot = pr.ring_n % RING + 1
    pr.ring_n = pr.ring_n + 1
    pr.ring_stop[slot], pr.ring_cbid[slot] = e, c
    for j = 1, #gaps do
      local g = gaps[j]
      if e <= g.start and (not g.api_stop or e > g.api_stop) then g.api_stop, g.api_cbid = e, c end
    end
  end
end)

local function print_process(pr)
  table.sort(pr.order, function(a, b)
    if a.device ~= b.device then return a.device < b.device end
    return a.stream < b.stream
  end)
  -- Machine-readable rows say whose they are.
  local ctx = { context = { pid = pr.pid } }
  tabulate.note(pr.title)
  local t = tabulate.new({
    { "device", "%d", width = 6, align = "right" }, { "stream", "%d", width = 6 },
    { "ops", "%d", width = 7 }, { "span_us", "%.1f", width = 11 },
    { "busy_us", "%.1f", width = 11 }, { "busy%", "%.1f", width = 6 }, { "gaps", "%d", width = 7 },
    { "max_gap_us", "%.1f", width = 11 },
  }, ctx)
  for _, s in ipairs(pr.order) do
    local span, busy = s.last - s.first, s.busy.sum
    t:add(s.device, s.stream, s.busy.count, span / 1e3, busy / 1e3,
      span > 0 and math.min(100, 100 * busy / span) or 0, s.gaps.count,
      (s.gaps.count > 0 and s.gaps.max or 0) / 1e3)
  end
  t:print()
  if bucket_ns > 0 then
    local lo, hi = math.huge, -math.huge
    for _, s in ipairs(pr.order) do
      for k in pairs(s.buckets) do lo, hi = math.min(lo, k), math.max(hi, k) end
    end
    local function busy(s, k) return math.min(100, 100 * (s.buckets[k] or 0) / bucket_ns) end
    if tabulate.output() ~= "text" then
      -- One row per stream and bucket: the same columns whatever the streams.
      local bt = tabulate.new({ "device", "stream", "start_ms", "busy%" }, ctx)
      for _, s in ipairs(pr.order) do
        for k = lo, hi do bt:add(s.device, s.stream, k * opts.interval, busy(s, k)) end
      end
      bt:print()
    else
      print(("busy %% per %d ms (columns: device/stream)"):format(opts.interval))
      local cols = { { "start_ms", "%.0f", width = 8, align = "right" } }
      for _, s in ipairs(pr.order) do
        cols[#cols + 1] = { ("%d/%d"):format(s.device, s.stream), "%.1f", width = 6 }
      end
      local bt = tabulate.new(cols)
      for k = lo, hi do
        local row = {}
        for j, s in ipairs(pr.order) do row[j] = busy(s, k) end
        bt:add(k * opts.interval, unpack(row, 1, #pr.order))
      end
      bt:print()
    end
  end
  if opts.top > 0 then
    tabulate.note("largest idle gaps")
    local gt = tabulate.new({
      { "device", "%d", width = 6, align = "right" }, { "stream", "%d", width = 6 },
      { "start_us", "%.1f", width = 11 }, { "gap_us", "%.1f", width = 11 },
      { "last_api_before", width = 32, align = "left" }, { "api_end_us", "%.1f", width = 11 },
    }, ctx)
    for _, g in ipairs(pr.gaps) do
      gt:add(g.device, g.stream, g.start / 1e3, g.len / 1e3, g.api_cbid and cbid.name(g.api_cbid),
        g.api_stop and g.api_stop / 1e3)
    end
    gt:print()
  end
end

cm.on("exit", function()
  if cm.command_failed() then return end -- the one-line error says it all
  table.sort(proc_order, function(a, b) return a.pid < b.pid end)
  for i, pr in ipairs(proc_order) do
    if i > 1 then tabulate.note("") end
    print_process(pr)
  end
end)
