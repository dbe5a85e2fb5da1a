-- timeline.lua: per-stream busy and idle time, and the gaps between GPU operations.
--
-- Usage: cuptimon-lua scripts/timeline.lua [--gap-us N] -- cmd args...
--        cuptimon-lua --replay run.cmcap scripts/timeline.lua
--
-- Arguments:
--   --gap-us N    a gap of at least N microseconds between two operations of a stream counts as
--                 idle (default 10)
--
-- Kernels, copies and memsets are attributed to (pid, stream). Busy is the summed duration of the
-- stream's operations, span runs from its first start to its last stop, and idle is the rest.
-- Gaps are measured in arrival order: an operation that starts at least N us after every
-- operation seen before it on its stream ends opens a gap. Kernels, copies and memsets arrive in
-- separate batches, so an operation may arrive before an earlier one of another kind: it
-- then extends the span backwards and opens no gap.
--
-- Example output:
--   pid         stream     ops     span_us     busy_us  busy%    gaps  max_gap_us
--   601              7       4        93.2        33.5   35.9       2        29.1
--   601             13      30      4504.2       387.2    8.6      29       546.4
local cm = require "cuptimon"
local args = require "cuptimon.args"
local tabulate = require "cuptimon.table"
local ffi = require "ffi"

local opts = args.parse(arg, { gap_us = { 10, "minimum idle gap in microseconds", min = 0 } })
local gap_ns = opts.gap_us * 1e3

local int64 = ffi.typeof("int64_t")
-- Nanoseconds from timestamp `base` to timestamp `t` (both uint64), negative when t is earlier.
-- Subtracting two uint64 values wraps below zero, so the difference is read back as signed.
local function since(t, base) return tonumber(ffi.cast(int64, t - base)) end

local streams = {} -- "pid/stream" -> state
local order = {}

local function state(pid, stream)
  local key = pid .. "/" .. stream
  local s = streams[key]
  if not s then
    -- first, last: ns from base (the first start seen); busy: durations; gaps: idle gaps.
    s = { pid = pid, stream = stream, busy = cm.summary(), gaps = cm.summary() }
    streams[key] = s
    order[#order + 1] = s
  end
  return s
end

local function on_batch(b)
  local p = b:process()
  local pid = p and p.pid or 0
  local start, stop, stream = b.start, b.stop, b.stream
  for i = 0, b.n - 1 do
    local s = state(pid, tonumber(stream[i]))
    if not s.base then s.base = start[i] end
    local a = since(start[i], s.base)
    local e = a + since(stop[i], start[i])
    if s.last and a - s.last >= gap_ns then s.gaps:add(a - s.last) end
    if not s.last or e > s.last then s.last = e end
    if not s.first or a < s.first then s.first = a end
    s.busy:add(e - a)
  end
end

for _, kind in ipairs { "kernel", "memcpy", "memset" } do
  cm.observe({ [kind] = { "start", "stop", "stream" } }, on_batch)
end

cm.on("exit", function()
  table.sort(order, function(a, b)
    if a.pid ~= b.pid then return a.pid < b.pid end
    return a.stream < b.stream
  end)
  local t = tabulate.new {
    { "pid", "%d", width = 9 }, { "stream", "%d", width = 8 }, { "ops", "%d", width = 7 },
    { "span_us", "%.1f", width = 11 }, { "busy_us", "%.1f", width = 11 },
    { "busy%", "%.1f", width = 6 }, { "gaps", "%d", width = 7 },
    { "max_gap_us", "%.1f", width = 11 },
  }
  for _, s in ipairs(order) do
    local span, busy = s.last - s.first, s.busy.sum
    t:add(s.pid, s.stream, s.busy.count, span / 1e3, busy / 1e3,
      span > 0 and math.min(100, 100 * busy / span) or 0, s.gaps.count,
      (s.gaps.count > 0 and s.gaps.max or 0) / 1e3)
  end
  t:print()
end)
