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
-- Gaps assume a stream's operations arrive in start order (they do within a process's batches).
--
-- Example output:
--   pid       stream    ops     span_us     busy_us  busy%    gaps  max_gap_us
--   4242          7   50000    50000.0     40000.0   80.0   10000       500.0
local cm = require "cuptimon"
local args = require "cuptimon.args"

local opts = args.parse(arg, { gap_us = { 10, "minimum idle gap in microseconds" } })
local gap_ns = opts.gap_us * 1e3

local streams = {} -- "pid/stream" -> state
local order = {}

local function state(pid, stream)
  local key = pid .. "/" .. stream
  local s = streams[key]
  if not s then
    s = { pid = pid, stream = stream, ops = 0, busy = 0, gaps = 0, max_gap = 0 }
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
    -- Nanoseconds since the first operation seen on the stream, as Lua numbers (exact below 2^53).
    local a = s.base and tonumber(start[i] - s.base) or 0
    if not s.base then s.base = start[i] end
    local e = a + tonumber(stop[i] - start[i])
    if s.last then
      local g = a - s.last
      if g >= gap_ns then
        s.gaps = s.gaps + 1
        if g > s.max_gap then s.max_gap = g end
      end
    end
    if not s.last or e > s.last then s.last = e end
    s.first = s.first and math.min(s.first, a) or a
    s.ops = s.ops + 1
    s.busy = s.busy + (e - a)
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
  print(("%-9s %8s %7s %11s %11s %6s %7s %11s"):format("pid", "stream", "ops", "span_us",
    "busy_us", "busy%", "gaps", "max_gap_us"))
  for _, s in ipairs(order) do
    local span = (s.last or 0) - (s.first or 0)
    print(("%-9d %8d %7d %11.1f %11.1f %6.1f %7d %11.1f"):format(s.pid, s.stream, s.ops, span / 1e3,
      s.busy / 1e3, span > 0 and math.min(100, 100 * s.busy / span) or 0, s.gaps, s.max_gap / 1e3))
  end
end)
