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
--   --filter REGEX           only the kernels whose name (as the slices show it) matches REGEX,
--                            a POSIX extended regular expression ("^cm_demo_(matmul|relu)");
--                            copies, memsets, API calls and NVTX ranges are not kernels and
--                            are kept
--   --exclude REGEX          leave out the kernels whose name matches REGEX
--
-- What the trace holds, per process (pid = the process's pid, named by its executable, and by
-- its rank when its RANK environment variable is set: "python (rank 1)"):
--   - kernels, copies and memsets as complete ("X") slices on one track per device and stream,
--     named "GPU D stream S", with their device, stream and correlation id in args, and a
--     kernel's launch configuration as torch.profiler writes it ("grid": [x, y, z], "block":
--     [x, y, z], "registers per thread", "shared memory": static + dynamic bytes per block, and
--     "static shared memory", "dynamic shared memory"), a copy's or memset's "bytes" and
--     "memory bandwidth (GB/s)" (bytes / duration; left out of a zero-length one); a process
--     that drives several devices has the work of its first device there, and that of each
--     other device D (below 64) in a trace process of its own,
--     "EXE (pid P) GPU D" (its trace pid is P + (D + 1) * 2^22, above any Linux pid), so each
--     (process, device) pair is one process in the UI;
--   - CUDA runtime and driver API calls as slices on the track of the thread that made them;
--     a thread's track is named by the latest NAME record (nvtxNameOsThread) of the run or
--     capture that names its thread id, else "thread TID". Whether CUPTI gives a NAME record
--     the thread id that its other records carry is not yet checked on a GPU. The monitor
--     cannot name threads from /proc/PID/task/TID/comm: CUPTI's thread ids are not the
--     kernel's (3446751232 in the demo capture, above any Linux thread id; they look like
--     pthread_self() cut to 32 bits), so /proc does not know them; that needs the agent to
--     report each thread's kernel id and name.
--   - NVTX ranges (push/pop and start/end) as slices on the thread that opened them, NVTX marks
--     as instant events;
--   - a flow arrow from each API call to the GPU work it launched (same correlation id);
--   - PM samples, when the run or the capture has them (--pm-devices), as counter ("C") tracks
--     per device: "GPU D utilization %" (sm, tensor, dram) and "GPU D PCIe GB/s" (read, write),
--     one value per sample at its start.
-- Timestamps are microseconds with nanosecond precision (3 decimals) from the trace's earliest
-- record: ts 0 is that record's start, and the trace's otherData states it as "origin_ns", its
-- CLOCK_REALTIME nanoseconds (a decimal string: exact), so that an event's absolute time is
-- origin_ns + 1000 * ts. Records arrive in batches per kind, so a later batch may hold earlier
-- records: the trace is written relative to the first record seen, and when an earlier one came
-- later, the file is rewritten once at exit, shifted (FILE.tmp.PID, then renamed over FILE;
-- a character device such as /dev/null is not, and its origin is the first record seen).
-- A write that fails (a full disk, a file-size limit) is reported at once with the path and the
-- system's reason; the trace is then left as far as it got, not rewritten, the events not
-- written are counted ("timeline.lua: LOST N of M events ..."), and the
-- run exits 1.
--
-- The trace is streamed: each batch is written out as it arrives, and what is kept in memory is
-- bounded whatever the length of the run: the API calls and GPU operations still waiting for
-- their partner of a flow arrow (the last --window of each per process), open NVTX ranges (as
-- many), the names NAME records gave (4096 to 8192 per process) and the tracks already named (a
-- track may be named twice after 4096 others). An arrow whose partner left that window, or
-- arrived after it, is not drawn; the slices are always written.
--
-- Example output:
--   (the trace goes to FILE; on stdout:)
--   timeline.lua: wrote trace.json: 1088 slices (300 kernel, 66 memcpy, 61 memset, 629 runtime,
--     0 driver, 32 nvtx), 3 marks, 427 flows
local cm = require "cuptimon"
local args = require "cuptimon.args"
local cbid = require "cuptimon.cbid"
local pm = require "cuptimon.pm"
local nvtx = require "cuptimon.nvtx"
local ffi = require "ffi"

local opts = args.parse(arg, args.with_filter({
  output = { "", "the trace file to write (required)", short = "o" },
  force = { false, "replace FILE if it exists (a regular file only)" },
  window = { 65536, "API calls and GPU operations kept waiting for a flow partner", min = 16,
    integer = true },
  pm_devices = { "", "devices to sample GPU utilization on with PM sampling (default none)" },
  pm_interval_us = { 1000, "PM sampling interval in microseconds", min = 20, integer = true },
}, "kernels"))
if opts.output == "" then args.usage_error("timeline.lua: -o FILE is required (see --help)") end
local names = args.filter(opts, "timeline.lua")

local WINDOW = opts.window -- entries kept per process (per generation) waiting for a partner
local NAMED = 4096   -- track names remembered (per generation)
local GPU_TRACK = 2 ^ 31 -- GPU tracks get tids above any Linux thread id
local PID_SPAN = 2 ^ 22  -- above Linux's largest pid: trace pids of a process's further devices
local SPLIT_DEVICES = 64 -- devices from this ordinal on stay in their process (bounds the split)

-- Readable too: a trace whose origin moved is read back at exit (shift, below).
local out, err = require("cuptimon.output").open(opts.output, opts.force, true, "timeline.lua")
if not out then error("timeline.lua: cannot write the trace: " .. tostring(err), 0) end
out:setvbuf("full", 1048576)
out:write('{"displayTimeUnit":"ns","traceEvents":[\n')
local written = 0
local counts = { kernel = 0, memcpy = 0, memset = 0, runtime = 0, driver = 0, nvtx = 0,
  marks = 0, flows = 0, counters = 0, filtered = 0 }
-- The events that reached the file: each batch's events are flushed after it (observe, below),
-- so a failed write is known at the batch it cut, and what it cost is written - kept.
local kept = 0

local function emit(s)
  if written > 0 then out:write(",\n") end
  out:write(s)
  written = written + 1
end

local function observe(sel, fn)
  return cm.observe(sel, function(b)
    fn(b)
    if out:flush() then kept = written end
  end)
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

-- Timestamps: microseconds from `base`, the first record seen, kept exact by subtracting in
-- 64-bit integers first. `lowest` is the smallest ts written, in ns (negative when a record
-- earlier than the first one seen came later; nil before the first): the exit's shift makes it 0.
local int64 = ffi.typeof("int64_t")
local base
local lowest
-- Nanoseconds from the base (a plain number, exact below 2^53 ns: 104 days).
local function ns(t)
  if not base then base = t + 0 end
  return tonumber(ffi.cast(int64, t - base))
end
-- A ts field's text: n ns from the base, in microseconds.
local function us(n)
  if not lowest or n < lowest then lowest = n end
  return ("%.3f"):format(n / 1e3)
end
local function dur_us(stop, start)
  local d = tonumber(ffi.cast(int64, stop - start))
  return ("%.3f"):format(d > 0 and d / 1e3 or 0)
end

-- Per source: pid, the flow windows and the open NVTX ranges.
local procs = {}
local named = window(NAMED) -- "pid/tid" -> 1 once the track's name was written

local function write_track_name(pid, tid, name)
  emit(('{"ph":"M","name":"thread_name","pid":%d,"tid":%d,"args":{"name":%s}}')
    :format(pid, tid, jstr(name)))
end

local function name_track(pid, tid, name)
  local key = pid .. "/" .. tid
  if wget(named, key) then return end
  wput(named, key, 1)
  write_track_name(pid, tid, name)
end

-- The name of CPU thread `tid` of process `pr`: the latest NAME record's, else "thread TID".
local function thread_name(pr, tid)
  return wget(pr.thread_names, tid) or "thread " .. tid
end

-- Names the track of CPU thread `tid` of process `pr` once (per generation of `named`).
local function cpu_track(pr, tid)
  if wget(named, pr.pid .. "/" .. tid) then return end
  name_track(pr.pid, tid, thread_name(pr, tid))
end

local function process(b)
  local pr = procs[b.source]
  if pr then return pr end
  local p = b:process() or {}
  local exe = p.exe and p.exe:match("([^/]*)$") or "process"
  local rank = p.env and p.env.RANK
  pr = { pid = p.pid or 0, api = window(WINDOW), gpu = window(WINDOW),
    ranges = nvtx.pairing { cap = WINDOW, pending = 0 },
    exe = exe, devices = {}, thread_names = window(NAMED) }
  -- ranges: the open NVTX ranges, id -> start ns and a table { tid, name, domain } (an END
  -- whose START is not open is dropped); devices: device -> trace pid; thread_names: tid -> the
  -- name its latest NAME record gave it
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

-- The args of GPU operation j of batch b beyond device, stream and correlation (the keys are
-- torch.profiler's): a kernel's launch configuration, a copy's or memset's bytes and bandwidth.
local function kernel_args(b, j)
  local ss, ds = tonumber(b.static_smem[j]), tonumber(b.dynamic_smem[j])
  return (',"grid":[%d,%d,%d],"block":[%d,%d,%d],"registers per thread":%d,"shared memory":%d,'
    .. '"static shared memory":%d,"dynamic shared memory":%d'):format(b.grid_x[j], b.grid_y[j],
    b.grid_z[j], b.block_x[j], b.block_y[j], b.block_z[j], b.registers[j], ss + ds, ss, ds)
end
local function bytes_args(b, j, dur_ns)
  local n = tonumber(b.bytes[j])
  if dur_ns <= 0 then return (',"bytes":%d'):format(n) end
  return (',"bytes":%d,"memory bandwidth (GB/s)":%.3f'):format(n, n / dur_ns) -- B/ns = GB/s
end

local function gpu_observer(kind)
  local more = kind == "kernel" and kernel_args or bytes_args
  return function(b)
    local pr = process(b)
    local start, stop, device, stream, corr = b.start, b.stop, b.device, b.stream, b.correlation
    for j = 0, b.n - 1 do
      local name
      if kind == "kernel" then name = b:kernel_name(j)
      elseif kind == "memcpy" then name = memcpy_kinds[tonumber(b.copy_kind[j])] or "Memcpy"
      else name = "Memset" end
      if kind ~= "kernel" or names:keep(name) then
        local dev, st = tonumber(device[j]), tonumber(stream[j])
        local tid, pid = GPU_TRACK + dev * 1048576 + st, device_pid(pr, dev)
        name_track(pid, tid, ("GPU %d stream %d"):format(dev, st))
        local ts, c = ns(start[j]), tonumber(corr[j])
        local dur = tonumber(ffi.cast(int64, stop[j] - start[j]))
        emit(('{"ph":"X","cat":"%s","name":%s,"pid":%d,"tid":%d,"ts":%s,"dur":%s,'
          .. '"args":{"device":%d,"stream":%d,"correlation":%d%s}}')
          :format(kind, jstr(name), pid, tid, us(ts), dur_us(stop[j], start[j]), dev, st, c,
            more(b, j, dur)))
        counts[kind] = counts[kind] + 1
        if c ~= 0 then
          local api_ts, api_tid = wget(pr.api, c)
          if api_ts then flow(pr, api_ts, api_tid, ts, pid, tid)
          else wput(pr.gpu, c, ts, tid) end
        end
      else
        counts.filtered = counts.filtered + 1
      end
    end
  end
end
local GPU_FIELDS = { "start", "stop", "device", "stream", "correlation" }
local function gpu_fields(...)
  local t = { ... }
  for _, f in ipairs(GPU_FIELDS) do t[#t + 1] = f end
  return t
end
observe({ kernel = gpu_fields("name", "grid_x", "grid_y", "grid_z", "block_x", "block_y",
  "block_z", "registers", "static_smem", "dynamic_smem") }, gpu_observer("kernel"))
observe({ memcpy = gpu_fields("copy_kind", "bytes") }, gpu_observer("memcpy"))
observe({ memset = gpu_fields("bytes") }, gpu_observer("memset"))

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
      cpu_track(pr, tid)
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
observe({ runtime = { "cbid", "start", "stop", "tid", "correlation" } }, api_observer("runtime"))
observe({ driver = { "cbid", "start", "stop", "tid", "correlation" } }, api_observer("driver"))

-- NAME records (nvtxNameOsThread): a thread's name, written at once (the latest metadata event
-- of a track wins in Perfetto and chrome://tracing) and remembered for its track's next naming.
local OBJECT_THREAD = nvtx.THREAD
observe({ name = { "object_kind", "tid", "name" } }, function(b)
  local pr = process(b)
  local kinds, tids = b.object_kind, b.tid
  for j = 0, b.n - 1 do
    local given = b:str("name", j)
    if tonumber(kinds[j]) == OBJECT_THREAD and given and given ~= "" then
      local tid = tonumber(tids[j])
      wput(pr.thread_names, tid, given)
      local key = pr.pid .. "/" .. tid
      if not wget(named, key) then wput(named, key, 1) end
      write_track_name(pr.pid, tid, given)
    end
  end
end)

-- NVTX: a start record opens a range (named, on its thread), the end record with the same id
-- closes it and writes the slice; an instantaneous record is a mark.
local FLAG_INSTANT, FLAG_START, FLAG_END = nvtx.INSTANT, nvtx.START, nvtx.END
observe({ marker = { "flags", "timestamp", "id", "tid", "name", "domain" } }, function(b)
  local pr = process(b)
  local flags, ts, ids, tids = b.flags, b.timestamp, b.id, b.tid
  for j = 0, b.n - 1 do
    local f, id = tonumber(flags[j]), tonumber(ids[j])
    if bit.band(f, FLAG_START) ~= 0 then
      pr.ranges:start(id, ns(ts[j]),
        { tonumber(tids[j]), b:str("name", j) or "", b:str("domain", j) or "" })
    elseif bit.band(f, FLAG_END) ~= 0 then
      local t0, r = pr.ranges:stop(id)
      if t0 then
        local t1 = ns(ts[j])
        cpu_track(pr, r[1])
        emit(('{"ph":"X","cat":"nvtx","name":%s,"pid":%d,"tid":%d,"ts":%s,"dur":%s,'
          .. '"args":{"domain":%s}}')
          :format(jstr(r[2]), pr.pid, r[1], us(t0), ("%.3f"):format(math.max(0, t1 - t0) / 1e3),
            jstr(r[3])))
        counts.nvtx = counts.nvtx + 1
      end
    elseif bit.band(f, FLAG_INSTANT) ~= 0 then
      local tid = tonumber(tids[j])
      cpu_track(pr, tid)
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
observe({ pm_sample = "all" }, function(b)
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

-- The end of the trace: otherData states the origin (ts 0) in CLOCK_REALTIME ns.
local function tail(origin)
  return ('\n],"otherData":{"clock":"CLOCK_REALTIME","origin_ns":"%s","ts_unit":"us",'
    .. '"note":"an event\'s time is origin_ns + 1000 * ts ns"}}\n')
    :format(origin and tostring(origin):gsub("U?LL$", "") or "")
end

-- Moves ts 0 to the earliest record: copies the events written so far (read back from `out`)
-- into FILE.tmp.PID with every ts `shift` ns earlier, then `last`, and renames that over FILE.
-- Returns true, or nil and a message (the trace is then left as written, relative to the first
-- record seen). The copy is a byte loop over 1 MiB chunks through the FFI, which the JIT compiles
-- (string.gsub with a function is not compiled and took three times as long): 1.4 s for a
-- 250 MB trace of 1.2 million events here, where writing it took 4.7 s. CUPTIMON_TIMELINE_CHUNK
-- sets another chunk size, for the specs (a few KiB: many chunk boundaries, some inside a ts).
local CHUNK = math.max(1024, tonumber(os.getenv("CUPTIMON_TIMELINE_CHUNK") or "") or 1048576)
local function digit(c) return c >= 48 and c <= 57 end

-- Writes v ns as microseconds with 3 decimals at obuf[o]; returns the new end.
local function write_ts(obuf, o, v, digits)
  if v < 0 then
    obuf[o] = 45
    o = o + 1
    v = -v
  end
  local frac = v % 1000
  local int, k = (v - frac) / 1000, 0
  repeat
    local d = int % 10
    digits[k] = 48 + d
    k = k + 1
    int = (int - d) / 10
  until int == 0 or k == 23 -- a ts of ours has at most 16 digits
  for j = k - 1, 0, -1 do
    obuf[o] = digits[j]
    o = o + 1
  end
  obuf[o] = 46
  obuf[o + 1] = 48 + math.floor(frac / 100)
  obuf[o + 2] = 48 + math.floor(frac / 10) % 10
  obuf[o + 3] = 48 + frac % 10
  return o + 4
end

local function shift_bytes(s, n, shift, obuf, digits)
  local p = ffi.cast("const uint8_t *", s)
  local o, i = 0, 0
  while i < n do
    local c = p[i]
    obuf[o] = c
    o = o + 1
    i = i + 1
    -- After "ts": comes a number written by us() (above): -?digits.ddd, within the chunk (p[i]
    -- at i = n is the NUL that ends a Lua string); anything else is copied as it is.
    if c == 58 and i >= 5 and p[i - 2] == 34 and p[i - 3] == 115 and p[i - 4] == 116
      and p[i - 5] == 34 then
      local neg = p[i] == 45
      local j = neg and i + 1 or i
      local first, v = j, 0
      while j < n and digit(p[j]) do
        v = v * 10 + (p[j] - 48)
        j = j + 1
      end
      if j > first and j + 3 < n and p[j] == 46 and digit(p[j + 1]) and digit(p[j + 2])
        and digit(p[j + 3]) then
        i = j + 4
        v = v * 1000 + (p[j + 1] - 48) * 100 + (p[j + 2] - 48) * 10 + (p[j + 3] - 48)
        if neg then v = -v end
        o = write_ts(obuf, o, v - shift, digits)
      end
    end
  end
  return o
end

local function shift_trace(shift, last)
  local tmp = ("%s.tmp.%d"):format(opts.output, require("luv").os_getpid())
  local f, ferr = require("cuptimon.output").open(tmp, false, false, "timeline.lua")
  if not f then return nil, ferr end
  -- A chunk is at most 2 CHUNK bytes (a partial line is carried over only when shorter than
  -- CHUNK), and a ts of 10 bytes or more grows to at most 30 (a sign, 24 digits, 4 more): the
  -- output of a chunk is less than 3 times as long.
  local obuf, digits = ffi.new("uint8_t[?]", 6 * CHUNK + 64), ffi.new("uint8_t[24]")
  out:flush()
  out:seek("set", 0)
  local ok, werr, rest = true, nil, ""
  while ok do
    local chunk = out:read(CHUNK)
    if not chunk then break end
    chunk = rest .. chunk
    -- Whole lines only: an event is one line, so no ts is cut.
    local p, cut = ffi.cast("const uint8_t *", chunk), #chunk
    while cut > 0 and p[cut - 1] ~= 10 do cut = cut - 1 end
    rest = chunk:sub(cut + 1)
    if #rest > CHUNK then rest, cut = "", #chunk end -- no newline in a whole chunk: not ours
    ok, werr = f:write(ffi.string(obuf, shift_bytes(chunk, cut, shift, obuf, digits)))
  end
  if ok then
    ok, werr = f:write(ffi.string(obuf, shift_bytes(rest, #rest, shift, obuf, digits)), last:sub(2))
  end
  local closed, cerr = f:close()
  if ok and not closed then ok, werr = nil, cerr end
  if ok then ok, werr = os.rename(tmp, opts.output) end
  if not ok then
    os.remove(tmp)
    return nil, werr
  end
  return true
end

cm.on("exit", function()
  -- The origin of the ts as written (the first record seen), and whether to shift: only a
  -- regular file can be read back (a character device such as /dev/null keeps its ts).
  local origin = base and ffi.cast(int64, base)
  local st = lowest and lowest ~= 0 and require("luv").fs_stat(opts.output)
  local shifted = false
  if out:flush() then kept = written end
  -- A trace that lost bytes is not rewritten: its failure is what the user must see.
  if st and st.type == "file" and not out:failure() then
    local serr
    shifted, serr = shift_trace(lowest, tail(origin + lowest))
    if not shifted then
      io.stderr:write(("timeline.lua: cannot move ts 0 to the earliest record (%s): %s keeps "
        .. "the first record seen as its origin\n"):format(serr, opts.output))
      out:seek("end")
    end
  end
  if not shifted then out:write(tail(origin)) end
  out:close()
  if cm.command_failed() then return end -- the one-line error says it all (FILE is an empty trace)
  if out:failure() then
    -- The failure was reported when it happened (and fails the run); this says what it cost.
    io.stderr:write(("timeline.lua: LOST %d of %d events (not written, or cut by the failed write):"
      .. " %s; the trace is cut short and is not valid JSON\n"):format(written - kept, written,
      out:failure()))
    return
  end
  print(("timeline.lua: wrote %s: %d slices (%d kernel, %d memcpy, %d memset, %d runtime, "
    .. "%d driver, %d nvtx), %d marks, %d flows"):format(opts.output,
    counts.kernel + counts.memcpy + counts.memset + counts.runtime + counts.driver + counts.nvtx,
    counts.kernel, counts.memcpy, counts.memset, counts.runtime, counts.driver, counts.nvtx,
    counts.marks, counts.flows)
    .. (counts.counters > 0 and (", %d counter samples"):format(counts.counters) or "")
    .. (counts.filtered > 0 and ("; %d kernels left out by --filter/--exclude")
      :format(counts.filtered) or ""))
end)
