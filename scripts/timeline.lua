-- timeline.lua: a Chrome trace event JSON file of the run, for ui.perfetto.dev and chrome://tracing.
--
-- Usage: cuptimon-lua scripts/timeline.lua -o FILE -- cmd args...
--        cuptimon-lua --replay run.cmcap scripts/timeline.lua -o trace.json
--
-- Arguments:
--   --output FILE, -o FILE   the trace file to write (required; created, never written through
--                            a symlink: an existing FILE is refused)
--   --force                  replace FILE when it exists and is a regular file
--   --window N               how many API calls and GPU operations per process wait for the
--                            partner of their flow arrow (default 65536; memory grows with it)
--   --pm-devices LIST        also sample GPU utilization with PM sampling on these devices
--                            ("0,1"; default none) and draw it as counter tracks
--   --pm-interval-us N       the PM sampling interval (default 1000)
--
-- What the trace holds, per process (pid = the process's pid, named by its executable, and by
-- its rank when its RANK environment variable is set: "python (rank 1)"):
--   - kernels, copies and memsets as complete ("X") slices on one track per device and stream,
--     named "GPU D stream S"; a process that drives several devices has the work of its first
--     device there, and that of each other device D (below 64) in a trace process of its own,
--     "EXE (pid P) GPU D" (its trace pid is P + (D + 1) * 2^22, above any Linux pid), so each
--     (process, device) pair is one process in the UI;
--   - CUDA runtime and driver API calls as slices on the track of the thread that made them;
--   - NVTX ranges (push/pop and start/end) as slices on the thread that opened them, NVTX marks
--     as instant events;
--   - a flow arrow from each API call to the GPU work it launched (same correlation id);
--   - PM samples, when the run or the capture has them (--pm-devices), as counter ("C") tracks
--     per device: "GPU D utilization %" (sm, tensor, dram) and "GPU D PCIe GB/s" (read, write),
--     one value per sample at its start.
-- Timestamps are microseconds with nanosecond precision (3 decimals) from 10 s before the first
-- record seen: records arrive in batches per kind, so a later batch may hold earlier records.
--
-- The trace is streamed: each batch is written out as it arrives, and what is kept in memory is
-- bounded whatever the length of the run: the API calls and GPU operations still waiting for
-- their partner of a flow arrow (the last --window of each per process), open NVTX ranges (as
-- many) and the names of the tracks already named (a track may be named twice after
-- 4096 others). An arrow whose partner left that window, or arrived after it, is not drawn; the
-- slices are always written.
--
-- Example output:
--   (the trace goes to FILE; on stdout:)
--   timeline.lua: wrote trace.json: 1088 slices (300 kernel, 66 memcpy, 61 memset, 629 runtime,
--     0 driver, 32 nvtx), 3 marks, 427 flows
local cm = require "cuptimon"
local args = require "cuptimon.args"
local cbid = require "cuptimon.cbid"
local pm = require "cuptimon.pm"
local ffi = require "ffi"

local opts = args.parse(arg, {
  output = { "", "the trace file to write (required)", short = "o" },
  force = { false, "replace FILE if it exists (a regular file only)" },
  window = { 65536, "API calls and GPU operations kept waiting for a flow partner", min = 16,
    integer = true },
  pm_devices = { "", "devices to sample GPU utilization on with PM sampling (default none)" },
  pm_interval_us = { 1000, "PM sampling interval in microseconds", min = 20, integer = true },
})
if opts.output == "" then args.usage_error("timeline.lua: -o FILE is required (see --help)") end

local WINDOW = opts.window -- entries kept per process (per generation) waiting for a partner
local NAMED = 4096   -- track names remembered (per generation)
local GPU_TRACK = 2 ^ 31 -- GPU tracks get tids above any Linux thread id
local PID_SPAN = 2 ^ 22  -- above Linux's largest pid: trace pids of a process's further devices
local SPLIT_DEVICES = 64 -- devices from this ordinal on stay in their process (bounds the split)
local MARGIN_NS = 10e9

local out, err = require("cuptimon.output").open(opts.output, opts.force)
if not out then error("timeline.lua: cannot write the trace: " .. tostring(err), 0) end
out:setvbuf("full", 1048576)
out:write('{"displayTimeUnit":"ns","traceEvents":[\n')
local written = 0
local counts = { kernel = 0, memcpy = 0, memset = 0, runtime = 0, driver = 0, nvtx = 0,
  marks = 0, flows = 0, counters = 0 }

local function emit(s)
  if written > 0 then out:write(",\n") end
  out:write(s)
  written = written + 1
end

-- A JSON string literal of s.
local escapes = { ['"'] = '\\"', ["\\"] = "\\\\", ["\n"] = "\\n", ["\r"] = "\\r", ["\t"] = "\\t" }
local function jstr(s)
  return '"' .. s:gsub('[%c"\\]', function(c)
    return escapes[c] or ("\\u%04x"):format(c:byte())
  end) .. '"'
end

-- A map of a key to two numbers that keeps at most 2 * cap keys: when the current generation is
-- full it becomes the old one and the older is dropped. get looks in both, so an entry lives for
-- cap to 2 * cap puts. The values are plain numbers in parallel tables: no table per entry.
local function window(cap) return { a = {}, b = {}, old_a = {}, old_b = {}, n = 0, cap = cap } end
local function wget(w, k)
  local v = w.a[k]
  if v ~= nil then return v, w.b[k] end
  return w.old_a[k], w.old_b[k]
end
local function wput(w, k, v1, v2)
  if w.n >= w.cap then w.old_a, w.old_b, w.a, w.b, w.n = w.a, w.b, {}, {}, 0 end
  w.a[k], w.b[k] = v1, v2
  w.n = w.n + 1
end
local function wdel(w, k)
  w.a[k], w.b[k], w.old_a[k], w.old_b[k] = nil, nil, nil, nil
end

-- Timestamps: microseconds from `base`, kept exact by subtracting in 64-bit integers first.
local int64 = ffi.typeof("int64_t")
local base
-- Nanoseconds from the base (a plain number, exact below 2^53 ns: 104 days).
local function ns(t)
  if not base then base = t - MARGIN_NS end
  return tonumber(ffi.cast(int64, t - base))
end
local function us(n) return ("%.3f"):format(n / 1e3) end
local function dur_us(stop, start)
  local d = tonumber(ffi.cast(int64, stop - start))
  return ("%.3f"):format(d > 0 and d / 1e3 or 0)
end

-- Per source: pid, the flow windows and the open NVTX ranges.
local procs = {}
local named = window(NAMED) -- "pid/tid" -> 1 once the track's name was written

local function name_track(pid, tid, name)
  local key = pid .. "/" .. tid
  if wget(named, key) then return end
  wput(named, key, 1)
  emit(('{"ph":"M","name":"thread_name","pid":%d,"tid":%d,"args":{"name":%s}}')
    :format(pid, tid, jstr(name)))
end

local function process(b)
  local pr = procs[b.source]
  if pr then return pr end
  local p = b:process() or {}
  local exe = p.exe and p.exe:match("([^/]*)$") or "process"
  local rank = p.env and p.env.RANK
  pr = { pid = p.pid or 0, api = window(WINDOW), gpu = window(WINDOW), ranges = window(WINDOW),
    exe = exe, devices = {} }
  -- ranges: id -> start ns, and a table { tid, name, domain }; devices: device -> trace pid
  procs[b.source] = pr
  emit(('{"ph":"M","name":"process_name","pid":%d,"tid":0,"args":{"name":%s}}')
    :format(pr.pid, jstr(rank and ("%s (rank %s)"):format(exe, rank) or exe)))
  return pr
end

-- The trace pid of the GPU work of process `pr` on device `dev` (see the header); GPU track tids
-- hold their device, so a waiting operation's tid finds its pid again (gpu_pid).
local function device_pid(pr, dev)
  local pid = pr.devices[dev]
  if pid then return pid end
  if dev >= SPLIT_DEVICES or dev < 0 then return pr.pid end
  if next(pr.devices) == nil then
    pid = pr.pid
  else
    pid = pr.pid + (dev + 1) * PID_SPAN
    emit(('{"ph":"M","name":"process_name","pid":%d,"tid":0,"args":{"name":%s}}')
      :format(pid, jstr(("%s (pid %d) GPU %d"):format(pr.exe, pr.pid, dev))))
  end
  pr.devices[dev] = pid
  return pid
end

local function gpu_pid(pr, tid) return device_pid(pr, math.floor((tid - GPU_TRACK) / 1048576)) end

-- Flow arrows: an API call (ts, tid) and a GPU operation (ts, tid) with the same correlation id
-- give one "s" and one "f" event with an id of their own (one call can launch several operations).
local next_flow = 0
local function flow(pr, api_ts, api_tid, gpu_ts, to_pid, gpu_tid)
  next_flow = next_flow + 1
  counts.flows = counts.flows + 1
  emit(('{"ph":"s","id":%d,"pid":%d,"tid":%d,"ts":%s,"name":"launch","cat":"flow"}')
    :format(next_flow, pr.pid, api_tid, us(api_ts)))
  emit(('{"ph":"f","bp":"e","id":%d,"pid":%d,"tid":%d,"ts":%s,"name":"launch","cat":"flow"}')
    :format(next_flow, to_pid, gpu_tid, us(gpu_ts)))
end

-- GPU operations: one X slice each, and the flow from its API call when that one is known (else
-- it waits in the process's gpu window for the call).
local memcpy_kinds = { [0] = "Memcpy", "Memcpy HtoD", "Memcpy DtoH", "Memcpy HtoA", "Memcpy AtoH",
  "Memcpy AtoA", "Memcpy AtoD", "Memcpy DtoA", "Memcpy DtoD", "Memcpy HtoH", "Memcpy PtoP" }

local function gpu_observer(kind)
  return function(b)
    local pr = process(b)
    local start, stop, device, stream, corr = b.start, b.stop, b.device, b.stream, b.correlation
    for j = 0, b.n - 1 do
      local dev, st = tonumber(device[j]), tonumber(stream[j])
      local tid, pid = GPU_TRACK + dev * 1048576 + st, device_pid(pr, dev)
      name_track(pid, tid, ("GPU %d stream %d"):format(dev, st))
      local name
      if kind == "kernel" then name = b:kernel_name(j)
      elseif kind == "memcpy" then name = memcpy_kinds[tonumber(b.copy_kind[j])] or "Memcpy"
      else name = "Memset" end
      local ts, c = ns(start[j]), tonumber(corr[j])
      emit(('{"ph":"X","cat":"%s","name":%s,"pid":%d,"tid":%d,"ts":%s,"dur":%s,'
        .. '"args":{"device":%d,"stream":%d,"correlation":%d}}')
        :format(kind, jstr(name), pid, tid, us(ts), dur_us(stop[j], start[j]), dev, st, c))
      counts[kind] = counts[kind] + 1
      if c ~= 0 then
        local api_ts, api_tid = wget(pr.api, c)
        if api_ts then flow(pr, api_ts, api_tid, ts, pid, tid)
        else wput(pr.gpu, c, ts, tid) end
      end
    end
  end
end
cm.observe({ kernel = { "name", "start", "stop", "device", "stream", "correlation" } },
  gpu_observer("kernel"))
cm.observe({ memcpy = { "copy_kind", "start", "stop", "device", "stream", "correlation" } },
  gpu_observer("memcpy"))
cm.observe({ memset = { "start", "stop", "device", "stream", "correlation" } },
  gpu_observer("memset"))

-- API calls: one X slice each on the thread's track; the flow to GPU work already seen, else the
-- call waits in the api window for its work.
-- API names as JSON strings, cached per cbid (real cbids are below 1024; larger ones are not cached,
-- so the cache stays bounded whatever the records hold).
local function api_name_cache(name_of)
  local cache = {}
  return function(c)
    local v = cache[c]
    if v then return v end
    v = jstr(name_of(c))
    if c >= 0 and c < 4096 then cache[c] = v end
    return v
  end
end
local api_names = { runtime = api_name_cache(cbid.name),
  driver = api_name_cache(function(c) return "driver cbid " .. c end) }

local function api_observer(kind)
  local name_of = api_names[kind]
  return function(b)
    local pr = process(b)
    local id, start, stop, tids, corr = b.cbid, b.start, b.stop, b.tid, b.correlation
    for j = 0, b.n - 1 do
      local tid, c = tonumber(tids[j]), tonumber(corr[j])
      name_track(pr.pid, tid, "thread " .. tid)
      local ts = ns(start[j])
      emit(('{"ph":"X","cat":"cuda_%s","name":%s,"pid":%d,"tid":%d,"ts":%s,"dur":%s,'
        .. '"args":{"correlation":%d}}')
        :format(kind, name_of(tonumber(id[j])), pr.pid, tid, us(ts), dur_us(stop[j], start[j]), c))
      counts[kind] = counts[kind] + 1
      if c ~= 0 then
        local gpu_ts, gpu_tid = wget(pr.gpu, c)
        if gpu_ts then
          -- Of the call's operations that arrived before it, the last one waits (one per key).
          wdel(pr.gpu, c)
          flow(pr, ts, tid, gpu_ts, gpu_pid(pr, gpu_tid), gpu_tid)
        end
        if not wget(pr.api, c) then wput(pr.api, c, ts, tid) end
      end
    end
  end
end
cm.observe({ runtime = { "cbid", "start", "stop", "tid", "correlation" } }, api_observer("runtime"))
cm.observe({ driver = { "cbid", "start", "stop", "tid", "correlation" } }, api_observer("driver"))

-- NVTX: a start record opens a range (named, on its thread), the end record with the same id
-- closes it and writes the slice; an instantaneous record is a mark.
local FLAG_INSTANT, FLAG_START, FLAG_END = 1, 2, 4
cm.observe({ marker = { "flags", "timestamp", "id", "tid", "name", "domain" } }, function(b)
  local pr = process(b)
  local flags, ts, ids, tids = b.flags, b.timestamp, b.id, b.tid
  for j = 0, b.n - 1 do
    local f, id = tonumber(flags[j]), tonumber(ids[j])
    if bit.band(f, FLAG_START) ~= 0 then
      wput(pr.ranges, id, ns(ts[j]),
        { tonumber(tids[j]), b:str("name", j) or "", b:str("domain", j) or "" })
    elseif bit.band(f, FLAG_END) ~= 0 then
      local t0, r = wget(pr.ranges, id)
      if t0 then
        wdel(pr.ranges, id)
        local t1 = ns(ts[j])
        name_track(pr.pid, r[1], "thread " .. r[1])
        emit(('{"ph":"X","cat":"nvtx","name":%s,"pid":%d,"tid":%d,"ts":%s,"dur":%s,'
          .. '"args":{"domain":%s}}')
          :format(jstr(r[2]), pr.pid, r[1], us(t0), us(math.max(0, t1 - t0)), jstr(r[3])))
        counts.nvtx = counts.nvtx + 1
      end
    elseif bit.band(f, FLAG_INSTANT) ~= 0 then
      local tid = tonumber(tids[j])
      name_track(pr.pid, tid, "thread " .. tid)
      emit(('{"ph":"i","s":"t","cat":"nvtx","name":%s,"pid":%d,"tid":%d,"ts":%s}')
        :format(jstr(b:str("name", j) or ""), pr.pid, tid, us(ns(ts[j]))))
      counts.marks = counts.marks + 1
    end
  end
end)

-- PM samples as counter tracks. Samples in a capture are drawn whether or not this run asks for
-- sampling; --pm-devices asks the live processes for them.
local U = pm.UTIL_METRICS
local PM_METRICS = { U.sm, U.tensor, U.dram, U.pcie_read, U.pcie_write }
if opts.pm_devices ~= "" then
  local devices, derr = pm.parse_devices(opts.pm_devices)
  if not devices then args.usage_error("timeline.lua: --pm-devices: " .. derr) end
  for _, d in ipairs(devices) do
    local r, perr = cm.pm_sample({ metrics = PM_METRICS, interval_us = opts.pm_interval_us, device = d })
    if not r then error("timeline.lua: " .. perr, 0) end
  end
end
local function num(v) return v == v and ("%.3f"):format(v) or "0" end
cm.observe({ pm_sample = "all" }, function(b)
  local pr = process(b)
  local rows = cm.pm_rows(b, PM_METRICS)
  for k = 0, rows.n - 1 do
    local ts, dev = us(ns(rows.start[k])), rows.device[k]
    emit(('{"ph":"C","name":"GPU %d utilization %%","pid":%d,"ts":%s,"args":{"sm":%s,"tensor":%s,'
      .. '"dram":%s}}'):format(dev, pr.pid, ts, num(rows[U.sm][k]), num(rows[U.tensor][k]),
      num(rows[U.dram][k])))
    emit(('{"ph":"C","name":"GPU %d PCIe GB/s","pid":%d,"ts":%s,"args":{"read":%s,"write":%s}}')
      :format(dev, pr.pid, ts, num(rows[U.pcie_read][k] / 1e9), num(rows[U.pcie_write][k] / 1e9)))
    counts.counters = counts.counters + 1
  end
end)

cm.on("exit", function()
  out:write("\n]}\n")
  out:close()
  print(("timeline.lua: wrote %s: %d slices (%d kernel, %d memcpy, %d memset, %d runtime, "
    .. "%d driver, %d nvtx), %d marks, %d flows"):format(opts.output,
    counts.kernel + counts.memcpy + counts.memset + counts.runtime + counts.driver + counts.nvtx,
    counts.kernel, counts.memcpy, counts.memset, counts.runtime, counts.driver, counts.nvtx,
    counts.marks, counts.flows)
    .. (counts.counters > 0 and (", %d counter samples"):format(counts.counters) or ""))
end)
