-- bench/sum_durations.lua: the script of the thread sweep and the long run (bench/load.py).
-- Selects kernels (start, stop) and runtime API calls (cbid, start, stop), sums the kernels'
-- durations, counts the records delivered, and at exit prints what reached the script and what
-- was lost, by stage, from cm.stats():
--
--   SUM kernels K runtime R kernel_ns S
--   DELIVERED records N seconds T records_per_s X     (T: from the first batch to the last)
--   LOSS dropped D dropped_cupti C dropped_agent A dropped_exit E lost_wire W lost_frames F incomplete I
--
-- and, once a second while it runs, where the backlog is, stage by stage (cm.stats(); ms of lag
-- from a record's timestamp to CUPTI completing its buffer, to the agent's decoder, the decode
-- queue's and the send queue's waits, to the monitor; the agent's unsent records; records/s):
--
--   LAG t_s T cupti_ms C decode_ms D decode_wait_ms Q send_wait_ms S recv_ms R backlog B delivered_per_s N
--
-- Usage: cuptimon-lua bench/sum_durations.lua -- cmd args...
local cm = require "cuptimon"
local uv = require "luv"

local kernels, calls, kernel_ns = 0, 0, 0ULL
local first, last

cm.observe({ kernel = { "start", "stop" }, runtime = { "cbid", "start", "stop" } }, function(b)
  local now = uv.hrtime()
  first = first or now
  last = now
  if b.kind == "runtime" then
    calls = calls + b.n
  else
    local start, stop, sum = b.start, b.stop, 0ULL
    for i = 0, b.n - 1 do sum = sum + (stop[i] - start[i]) end
    kernel_ns = kernel_ns + sum
    kernels = kernels + b.n
  end
end)

local t0, last_n = uv.hrtime(), 0
cm.every(1000, function()
  local s = cm.stats()
  local n = kernels + calls
  print(("LAG t_s %.1f cupti_ms %.1f decode_ms %.1f decode_wait_ms %.1f send_wait_ms %.1f recv_ms %.1f "
    .. "backlog %d delivered_per_s %d"):format((uv.hrtime() - t0) / 1e9, s.lag_cupti_ns / 1e6,
    s.lag_decode_ns / 1e6, s.decode_wait_ns / 1e6, s.send_wait_ns / 1e6, s.lag_recv_ns / 1e6,
    s.backlog_records, n - last_n))
  last_n = n
end)

cm.on("exit", function()
  local n = kernels + calls
  local secs = first and (last - first) / 1e9 or 0
  print(("SUM kernels %d runtime %d kernel_ns %s"):format(kernels, calls,
    (tostring(kernel_ns):gsub("ULL$", ""))))
  print(("DELIVERED records %d seconds %.3f records_per_s %.0f"):format(n, secs,
    secs > 0 and n / secs or 0))
  local s = cm.stats()
  local function f(k) return tonumber(s[k]) or 0 end
  print(("LOSS dropped %d dropped_cupti %d dropped_agent %d dropped_exit %d lost_wire %d "
    .. "lost_frames %d incomplete %d"):format(f("dropped"), f("dropped_cupti"), f("dropped_agent"),
    f("dropped_exit"), f("lost_wire"), f("lost_frames"), f("incomplete")))
end)
