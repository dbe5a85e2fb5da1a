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
--       buffers_out O buffers_alloc A kernels K runtime R recv_peak_ms P held_ms H guard_shed G
--
-- (H: how long CUPTI held records back before writing them, the agent's lag guard's measure; G:
-- the kinds the guard shed, or "-". O: the agent's activity buffers that CUPTI holds or that wait for the decoder; A: all that its
-- pool has allocated, free ones included; both from the agent's last STATS. K and R: the kernel
-- and runtime records that reached the script so far: with one launch API call per kernel, R - K
-- is how many kernel records CUPTI still holds behind the API records of the same launches.)
--
-- With CM_BENCH_GAP_AT_S=T (and CM_BENCH_GAP_MS=G, default 2000), tracing stops T seconds in for
-- G ms (the observer is closed, so every kind is disabled in the process, and opened again): an
-- experiment on whether CUPTI's cost per record, which grows with the run's length, starts over
-- once its kinds were off. The records launched in the gap are not traced, so such a run delivers
-- fewer records than were launched; it prints "GAP off_s A on_s B" when tracing went off and on.
--
-- With CM_BENCH_SHED_AT_S=T, runtime is shed for good T seconds in, by a record-rate budget that
-- every rate exceeds and whose hold never ends (cm.budget: kernels are never toggled, and the
-- runtime records written before the shed still reach this script's observer): does CUPTI's
-- worker recover when it has only kernel records to write? The budget's shed event prints
-- "SHED runtime at_s A"; the runtime records of the launches after it are not traced.
--
-- Usage: cuptimon-lua bench/sum_durations.lua -- cmd args...
local cm = require "cuptimon"
local uv = require "luv"

io.stdout:setvbuf("line")

local kernels, calls, kernel_ns = 0, 0, 0ULL
local first, last

local selection = { kernel = { "start", "stop" }, runtime = { "cbid", "start", "stop" } }
local function on_batch(b)
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
end
local observer = assert(cm.observe(selection, on_batch))

local t0, last_n = uv.hrtime(), 0

local shed_at = tonumber(os.getenv("CM_BENCH_SHED_AT_S") or "")
if shed_at then
  cm.after(math.floor(shed_at * 1000), function()
    cm.on("shed", function(ev)
      print(("SHED %s at_s %.1f"):format(ev.kind, (uv.hrtime() - t0) / 1e9))
    end)
    cm.budget { records_per_s = 1, shed = { "runtime" }, hold_ms = 2 ^ 31, window_ms = 1000 }
  end)
end

local gap_at = tonumber(os.getenv("CM_BENCH_GAP_AT_S") or "")
if gap_at then
  local gap_ms = tonumber(os.getenv("CM_BENCH_GAP_MS") or "") or 2000
  cm.after(math.floor(gap_at * 1000), function()
    observer:close()
    local off = (uv.hrtime() - t0) / 1e9
    cm.after(gap_ms, function()
      observer = assert(cm.observe(selection, on_batch))
      print(("GAP off_s %.1f on_s %.1f"):format(off, (uv.hrtime() - t0) / 1e9))
    end)
  end)
end
cm.every(1000, function()
  local s = cm.stats()
  local n = kernels + calls
  print(("LAG t_s %.1f cupti_ms %.1f decode_ms %.1f decode_wait_ms %.1f send_wait_ms %.1f recv_ms %.1f "
    .. "backlog %d delivered_per_s %d buffers_out %d buffers_alloc %d kernels %d runtime %d "
    .. "recv_peak_ms %.1f held_ms %.1f guard_shed %s"):format((uv.hrtime() - t0) / 1e9,
    s.lag_cupti_ns / 1e6, s.lag_decode_ns / 1e6, s.decode_wait_ns / 1e6, s.send_wait_ns / 1e6,
    s.lag_recv_ns / 1e6, s.backlog_records, n - last_n, s.buffers_outstanding, s.buffers_allocated,
    kernels, calls, s.lag_recv_peak_ns / 1e6, s.lag_held_ns / 1e6,
    #s.guard_shed > 0 and table.concat(s.guard_shed, ",") or "-"))
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
