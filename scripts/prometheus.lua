-- prometheus.lua: GPU activity as Prometheus metrics, served over HTTP at /metrics.
--
-- Usage: cuptimon-lua scripts/prometheus.lua [--listen HOST:PORT] [--port N] [--top-kernels K]
--          [--linger MS] [--pm-devices LIST] [--pm-interval-us N] -- cmd args...
--        cuptimon-lua --replay run.cmcap scripts/prometheus.lua --linger 30000
--
-- Arguments:
--   --listen HOST:PORT  where to serve (default 127.0.0.1:9464; "[::1]:9464" for IPv6; port 0
--                       picks a free port). The bound address is printed on stderr:
--                       "prometheus.lua: serving http://127.0.0.1:9464/metrics"
--   --port N            the port, overriding --listen's
--   --top-kernels K     how many kernel names get their own "kernel" label (default 20); the
--                       others are summed under kernel="other"
--   --linger MS         once the run has ended (the command exited, the captures are read), keep
--                       serving the final metrics MS milliseconds, then exit; -1: until Control-C
--                       (default: -1 on --replay, 0 with a command)
--   --pm-devices LIST   also sample GPU utilization with PM sampling on these devices ("0,1";
--                       default none: PM sampling costs nothing unless asked for)
--   --pm-interval-us N  the PM sampling interval (default 100000)
--   --duty F            trace only a window of F x --period-ms (default 10000 ms) in each
--                       period, at a seeded random offset (--seed), and export estimates with
--                       their 95% bounds instead of exact counters (below); the documented way
--                       to run a node: cuptimon-lua --attach all scripts/prometheus.lua --duty 0.05
--                       (examples/systemd/ has the unit, the scrape configuration and the jobs'
--                       environment)
--
-- Metrics (text exposition format 0.0.4; base units; labels host, pid, executable (the
-- executable's base name) and device on every GPU series; device is one the process's HELLO
-- listed, else "other"; label values are valid UTF-8, see cm_host_text):
--   cuptimon_kernel_launches_total{...,kernel}          kernels run
--   cuptimon_kernel_duration_seconds{...,kernel}        histogram of kernel durations
--   cuptimon_memcpy_bytes_total{...,copy_kind}          bytes copied (HtoD, DtoH, DtoD...)
--   cuptimon_memcpy_duration_seconds_total{...,copy_kind}  time spent copying
--   cuptimon_records_total{host,pid,executable,kind}    records decoded, per activity kind
--   cuptimon_records_dropped_total{host,pid,executable,cause}  records lost (cm.stats(): cupti,
--                                                       agent, exit, wire)
--   cuptimon_lag_seconds{host,pid,executable}           how late the newest records reached the
--                                                       exporter (cm.stats() lag_s: the view is
--                                                       that far behind the application)
--   cuptimon_lag_peak_seconds{host,pid,executable}      the largest lag seen
--   cuptimon_backlog_records{host,pid,executable}       records the agent had not yet sent
--   cuptimon_cupti_held_seconds{host,pid,executable}    how long CUPTI held records back before
--                                                       writing them (cm.stats() lag_held_ns: the
--                                                       agent's lag guard sheds kinds past
--                                                       CUPTIMON_GUARD_LAG_MS)
--   cuptimon_kind_shed{host,pid,executable,kind}        1 for each kind the lag guard stopped
--                                                       tracing (its counts end there)
-- With --pm-devices, gauges of the mean over the PM samples since the previous scrape (the last
-- value when none arrived), and a counter of the samples:
--   cuptimon_gpu_sm_active_ratio{...}                   SM active cycles over elapsed, 0..1
--   cuptimon_gpu_tensor_active_ratio{...}               tensor-pipe active cycles, 0..1
--   cuptimon_gpu_dram_throughput_ratio{...}             DRAM throughput over its peak, 0..1
--   cuptimon_gpu_pcie_read_bytes_per_second{...}        PCIe reads
--   cuptimon_gpu_pcie_write_bytes_per_second{...}       PCIe writes
--   cuptimon_gpu_pm_samples_total{...}                  PM samples received
--
-- With --duty, gauges estimated from the windows (cuptimon.estimate: ratio estimator over the
-- windows, Student-t 95% interval), each with _lower_bound_ and _upper_bound_ families of its own
-- (the top --top-kernels kernels by estimated GPU time per process and device):
--   cuptimon_estimated_kernel_launches_per_second{...,kernel}      (and _lower_bound_/_upper_bound_)
--   cuptimon_estimated_kernel_duration_seconds_per_second{...,kernel}  GPU time per second
--   cuptimon_estimated_kernel_launches_since_start{...,kernel}     launches since attach
--   cuptimon_estimated_kernel_phase_change{...,kernel}             1: the windows' halves disagree
--   cuptimon_estimated_memcpy_copies_per_second{...,copy_kind}, ..._memcpy_bytes_per_second,
--   cuptimon_estimated_memcpy_duration_seconds_per_second
--   cuptimon_duty_target_ratio, cuptimon_duty_ratio{host,pid,executable} (traced / elapsed),
--   cuptimon_duty_windows_total, cuptimon_duty_windows_skipped_total,
--   cuptimon_duty_windows_discarded_total, cuptimon_duty_detection_limit_launches_per_second
--
-- Bounded labels. A kernel name gets its own label only among the first K admitted: names seen
-- since the last decision wait (per process and device) until the next scrape, which admits the
-- ones with the most GPU time while slots are free and folds the rest into "other". A name once
-- exported keeps its label for the whole run, and a name's time counted in "other" stays there,
-- so no counter ever goes backwards and at most K + 1 kernel values exist per process and
-- device, however long the run. A kernel literally named "other" is counted under "other".
--
-- HTTP. Requests are parsed by Debian's http-parser (libhttp-parser-dev: nodejs/http-parser
-- 2.9.4, the parser Node.js used for years, small, fuzzed and still patched by Debian for
-- security), linked statically into cuptimon-lua and called through ffi.C; its successor llhttp
-- is not among Debian's stable C libraries. On top of it the script checks: HTTP/1.0 or 1.1,
-- header names RFC 9112 tokens, no obsolete line folding, no control characters, request line and
-- header fields within 8 KiB (else 431 and the connection closes), Host required on HTTP/1.1, no
-- request body (Content-Length other than 0 or Transfer-Encoding: 400). GET /metrics and GET / are
-- answered; other targets get 404, other methods http-parser knows 405 (one it does not know is
-- malformed), anything malformed 400. Every response
-- closes its connection; a connection that has not sent its whole request head within 5 s is
-- closed. At most 64 connections that have had time to send their request are kept: a new client
-- takes the place of the oldest one whose request is still incomplete (idle or slowloris clients;
-- TCP has no uid check, so any local user can open them), and up to 448 more may wait through
-- their first 50 ms, so a scraper gets in and is answered while hundreds of such clients keep
-- coming back (spec/prometheus_spec.lua, with spec/http_attack.lua).
--
-- Example output (curl http://127.0.0.1:9464/metrics on examples/demo.cmcap, abridged):
--   # HELP cuptimon_kernel_launches_total Kernels run.
--   # TYPE cuptimon_kernel_launches_total counter
--   cuptimon_kernel_launches_total{host="vm",pid="601",executable="cuptimon_demo_cuda",device="0",kernel="cm_demo_matmul<16>"} 150
--   # TYPE cuptimon_kernel_duration_seconds histogram
--   cuptimon_kernel_duration_seconds_bucket{host="vm",pid="601",executable="cuptimon_demo_cuda",device="0",kernel="cm_demo_matmul<16>",le="2.5e-05"} 90
--   cuptimon_kernel_duration_seconds_bucket{host="vm",pid="601",executable="cuptimon_demo_cuda",device="0",kernel="cm_demo_matmul<16>",le="+Inf"} 150
--   cuptimon_kernel_duration_seconds_sum{host="vm",pid="601",executable="cuptimon_demo_cuda",device="0",kernel="cm_demo_matmul<16>"} 0.002862989
--   cuptimon_kernel_duration_seconds_count{host="vm",pid="601",executable="cuptimon_demo_cuda",device="0",kernel="cm_demo_matmul<16>"} 150
--   cuptimon_memcpy_bytes_total{host="vm",pid="601",executable="cuptimon_demo_cuda",device="0",copy_kind="HtoD"} 16973824
--   cuptimon_records_total{host="vm",pid="601",executable="cuptimon_demo_cuda",kind="concurrent_kernel"} 300
--   cuptimon_records_dropped_total{host="vm",pid="601",executable="cuptimon_demo_cuda",cause="cupti"} 0
local cm = require "cuptimon"
local args = require "cuptimon.args"
local pm = require "cuptimon.pm"
local uv = require "luv"

local opts = args.parse(arg, args.with_duty {
  listen = { "127.0.0.1:9464", "where to serve, HOST:PORT" },
  port = { "", "the port, overriding --listen's" },
  top_kernels = { 20, "kernel names with their own label", min = 0, integer = true },
  linger = { -2, "serve the final metrics this long after the run (-1: until Control-C)", min = -2,
    integer = true },
  pm_devices = { "", "devices to sample GPU utilization on with PM sampling (default none)" },
  pm_interval_us = { 100000, "PM sampling interval in microseconds", min = 20, integer = true },
})

local MAX_HEAD = 8192          -- bytes of request line and headers
local REQUEST_TIMEOUT_MS = 5000  -- to a complete request head, from the accept
local MAX_CLIENTS = 64          -- connections that have had a loop turn to send their request
local MAX_NEW = 448             -- more, still new (a burst of accepts; NEW_MS, two loop turns)
local NEW_MS = 50               -- a client this young may not have sent its request yet
local MAX_PENDING_NAMES = 1024 -- undecided kernel names that force a decision before a scrape

local host, port = opts.listen:match("^%[([^%]]+)%]:(%d+)$")
if not host then host, port = opts.listen:match("^([^:]+):(%d+)$") end
if not host then args.usage_error("prometheus.lua: --listen must be HOST:PORT, got " .. opts.listen) end
if opts.port ~= "" then port = opts.port end
port = tonumber(port)
if not port or port ~= math.floor(port) or port < 0 or port > 65535 then
  args.usage_error("prometheus.lua: the port must be an integer from 0 to 65535, got "
    .. tostring(opts.port ~= "" and opts.port or port))
end

---------------------------------------------------------------------------------------------------
-- metrics

-- Upper bounds of the duration histogram's buckets, in ns (1 us to 10 s), and their `le` text.
local BOUNDS = { 1e3, 2.5e3, 5e3, 1e4, 2.5e4, 5e4, 1e5, 2.5e5, 5e5, 1e6, 2.5e6, 5e6, 1e7, 2.5e7,
  5e7, 1e8, 2.5e8, 5e8, 1e9, 2.5e9, 5e9, 1e10 }
local LE = {}
for i, b in ipairs(BOUNDS) do LE[i] = ("%g"):format(b / 1e9) end
local NB = #BOUNDS

-- CUpti_ActivityMemcpyKind.
local COPY_KINDS = { [0] = "unknown", "HtoD", "DtoH", "HtoA", "AtoH", "AtoA", "AtoD", "DtoA",
  "DtoD", "HtoH", "PtoP" }

local function escape(v)
  return (tostring(v):gsub("[\\\"\n]", { ["\\"] = "\\\\", ['"'] = '\\"', ["\n"] = "\\n" }))
end

-- Seconds from integral nanoseconds, exactly ("%d.%09d").
local function seconds(ns)
  local s = math.floor(ns / 1e9)
  return ("%.0f.%09.0f"):format(s, ns - s * 1e9)
end

local procs = {}      -- source -> process table (kept after exit: its series stay)
local groups = {}     -- "source:device" -> { labels =, series = { kernel label -> S }, pending = { name -> S } }
local group_list = {} -- in creation order, for a stable output
local copies = {}     -- "source:device:copy_kind" -> { labels =, bytes =, ns = }
local copy_list = {}
local admitted = {}   -- kernel name -> true once it has its own label
local nadmitted = 0
local pending_ns = {} -- undecided kernel name -> ns summed over groups
local npending = 0

local function proc_labels(source)
  local p = procs[source] or cm.process(source) or {}
  local exe = tostring(p.exe or "?"):match("([^/]*)$")
  return ('host="%s",pid="%s",executable="%s"'):format(escape(p.host or "?"), escape(p.pid or 0),
    escape(exe))
end

local function new_series() return { count = 0, ns = 0, buckets = {} } end

-- The device label of a record, bounded like the kernel label: a process's devices are the ones
-- its HELLO listed (the process table's devices); a device number outside that list is "other".
-- A process whose HELLO listed none gets its first MAX_DEVICES numbers, then "other". So a
-- process that makes up device numbers (a hostile agent, a damaged capture) cannot grow the page.
local MAX_DEVICES = 64
local device_sets = {} -- source -> { listed = bool, n = distinct labels, [number] = label }
local function device_label(source, d)
  d = tonumber(d)
  local set = device_sets[source]
  if not set then
    set = { n = 0 }
    local p = procs[source] or cm.process(source) or {}
    for _, dev in ipairs(p.devices or {}) do
      if not set[dev.index] then set[dev.index], set.n = tostring(dev.index), set.n + 1 end
    end
    set.listed = set.n > 0
    device_sets[source] = set
  end
  local label = set[d]
  if label then return label end
  if set.listed or set.n >= MAX_DEVICES then return "other" end
  set[d], set.n = tostring(d), set.n + 1
  return set[d]
end

local function group_of(source, device)
  device = device_label(source, device)
  local key = source .. ":" .. device
  local g = groups[key]
  if not g then
    g = { labels = ('%s,device="%s"'):format(proc_labels(source), device), series = {},
      pending = {}, order = {} }
    groups[key] = g
    group_list[#group_list + 1] = g
  end
  return g
end

local function merge(into, from)
  into.count = into.count + from.count
  into.ns = into.ns + from.ns
  for i = 1, NB + 1 do
    local n = from.buckets[i]
    if n then into.buckets[i] = (into.buckets[i] or 0) + n end
  end
end

local function series(g, label)
  local s = g.series[label]
  if not s then
    s = new_series()
    g.series[label] = s
    g.order[#g.order + 1] = label
  end
  return s
end

-- Admits the undecided names with the most time while slots are free; folds the rest into
-- "other". Series only ever gain counts, so no exported counter goes backwards.
local function decide()
  if npending == 0 then return end
  local names = {}
  for name in pairs(pending_ns) do names[#names + 1] = name end
  table.sort(names, function(a, b)
    if pending_ns[a] ~= pending_ns[b] then return pending_ns[a] > pending_ns[b] end
    return a < b
  end)
  for _, name in ipairs(names) do
    if nadmitted < opts.top_kernels and name ~= "other" then
      admitted[name] = true
      nadmitted = nadmitted + 1
    end
  end
  for _, g in ipairs(group_list) do
    for _, name in ipairs(names) do
      local s = g.pending[name]
      if s then merge(series(g, admitted[name] and name or "other"), s) end
    end
    g.pending = {}
  end
  pending_ns, npending = {}, 0
end

cm.on("process_start", function(p) procs[p.source] = p end)

-- --duty: windows and estimates (cuptimon.sampling) instead of these full-trace observers.
local sampler
local observe = cm.observe
if opts.duty > 0 then
  local err
  sampler, err = require("cuptimon.sampling").start { duty = opts.duty, period_ms = opts.period_ms,
    seed = opts.seed > 0 and opts.seed or nil, kernels = true, copies = true }
  if not sampler then error(err, 0) end
  observe = function() end
end

observe({ kernel = { "name", "start", "stop", "device" } }, function(b)
  local start, stop, device = b.start, b.stop, b.device
  local g, gdev
  local full = nadmitted >= opts.top_kernels
  for i = 0, b.n - 1 do
    local d = device[i]
    if d ~= gdev then g, gdev = group_of(b.source, d), d end
    local name, dur = b:kernel_name(i), tonumber(stop[i] - start[i])
    if dur < 0 then dur = 0 end
    local s
    if admitted[name] then
      s = series(g, name)
    elseif full then
      s = series(g, "other")
    else
      s = g.pending[name]
      if not s then
        s = new_series()
        g.pending[name] = s
      end
      local t = pending_ns[name]
      if not t then npending, t = npending + 1, 0 end
      pending_ns[name] = t + dur
    end
    s.count = s.count + 1
    s.ns = s.ns + dur
    local k = 1
    while k <= NB and dur > BOUNDS[k] do k = k + 1 end
    s.buckets[k] = (s.buckets[k] or 0) + 1
  end
  if npending > MAX_PENDING_NAMES then decide() end
end)

observe({ memcpy = { "copy_kind", "bytes", "start", "stop", "device" } }, function(b)
  local ck, nbytes, start, stop, device = b.copy_kind, b.bytes, b.start, b.stop, b.device
  for i = 0, b.n - 1 do
    local kind, d = tonumber(ck[i]), device_label(b.source, device[i])
    local key = b.source .. ":" .. d .. ":" .. kind
    local c = copies[key]
    if not c then
      c = { labels = ('%s,device="%s",copy_kind="%s"'):format(proc_labels(b.source), d,
        escape(COPY_KINDS[kind] or tostring(kind))), bytes = 0, ns = 0 }
      copies[key] = c
      copy_list[#copy_list + 1] = c
    end
    local dur = tonumber(stop[i] - start[i])
    c.bytes = c.bytes + tonumber(nbytes[i])
    c.ns = c.ns + (dur > 0 and dur or 0)
  end
end)

-- The last counters of each source, never lower than the ones exported before.
local source_counts = {} -- source -> { kinds = { name -> n }, lost = { cause -> n }, lag = {...},
                         --   shed = { kind, ... } }
local LOSS = { { "cupti", "dropped_cupti" }, { "agent", "dropped_agent" }, { "exit", "dropped_exit" },
  { "wire", "lost_wire" } }

local function update_counts()
  local sources = {}
  for source in pairs(procs) do sources[#sources + 1] = source end
  table.sort(sources)
  for _, source in ipairs(sources) do
    local c = source_counts[source]
    if not c then
      c = { kinds = {}, lost = {} }
      source_counts[source] = c
    end
    local st = cm.stats(source)
    if st then
      c.lag = { st.lag_s, st.lag_peak_s, st.backlog_records, st.lag_held_ns / 1e9 }
      c.shed = st.guard_shed
      for k, n in pairs(st.records_by_kind) do
        if n > (c.kinds[k] or 0) then c.kinds[k] = n end
      end
      for _, l in ipairs(LOSS) do
        local n = st[l[2]] or 0
        if n > (c.lost[l[1]] or 0) then c.lost[l[1]] = n end
      end
    end
  end
  return sources
end

-- PM sampling (--pm-devices): per process and device, the sums since the last scrape and the
-- last gauge values. Nothing here runs unless the option names devices.
local PM_GAUGES = {
  { "cuptimon_gpu_sm_active_ratio", pm.UTIL_METRICS.sm, 0.01, "SM active cycles over elapsed cycles." },
  { "cuptimon_gpu_tensor_active_ratio", pm.UTIL_METRICS.tensor, 0.01,
    "Tensor-pipe active cycles over elapsed cycles." },
  { "cuptimon_gpu_dram_throughput_ratio", pm.UTIL_METRICS.dram, 0.01, "DRAM throughput over its peak." },
  { "cuptimon_gpu_pcie_read_bytes_per_second", pm.UTIL_METRICS.pcie_read, 1, "PCIe read bytes per second." },
  { "cuptimon_gpu_pcie_write_bytes_per_second", pm.UTIL_METRICS.pcie_write, 1,
    "PCIe write bytes per second." },
}
local pm_groups, pm_list = {}, {}
if opts.pm_devices ~= "" then
  local devices, derr = pm.parse_devices(opts.pm_devices)
  if not devices then args.usage_error("prometheus.lua: --pm-devices: " .. derr) end
  local metrics = {}
  for i, g in ipairs(PM_GAUGES) do metrics[i] = g[2] end
  for _, d in ipairs(devices) do
    local r, err = cm.pm_sample({ metrics = metrics, interval_us = opts.pm_interval_us, device = d })
    if not r then error("prometheus.lua: " .. err, 0) end
  end
  cm.observe({ pm_sample = "all" }, function(b)
    local rows = cm.pm_rows(b, metrics)
    for i = 0, rows.n - 1 do
      local dl = device_label(b.source, rows.device[i])
      local key = b.source .. ":" .. dl
      local g = pm_groups[key]
      if not g then
        g = { labels = ('%s,device="%s"'):format(proc_labels(b.source), dl), samples = 0,
          sum = {}, cnt = {}, last = {} }
        pm_groups[key] = g
        pm_list[#pm_list + 1] = g
      end
      g.samples = g.samples + 1
      for m, name in ipairs(metrics) do
        local v = rows[name][i]
        if v == v then
          g.sum[m] = (g.sum[m] or 0) + v
          g.cnt[m] = (g.cnt[m] or 0) + 1
        end
      end
    end
  end)
end

local function render_pm(w, family)
  if #pm_list == 0 then return end
  for _, g in ipairs(pm_list) do
    for m in ipairs(PM_GAUGES) do
      if (g.cnt[m] or 0) > 0 then g.last[m] = g.sum[m] / g.cnt[m] end
      g.sum[m], g.cnt[m] = 0, 0
    end
  end
  for m, gauge in ipairs(PM_GAUGES) do
    family(gauge[1], "gauge", gauge[4])
    for _, g in ipairs(pm_list) do
      if g.last[m] then w(("%s{%s} %.6g\n"):format(gauge[1], g.labels, g.last[m] * gauge[3])) end
    end
  end
  family("cuptimon_gpu_pm_samples_total", "counter", "PM samples received.")
  for _, g in ipairs(pm_list) do w(("cuptimon_gpu_pm_samples_total{%s} %.0f\n"):format(g.labels, g.samples)) end
end

local function render()
  decide()
  local out = {}
  local function w(s) out[#out + 1] = s end
  local function family(name, typ, help)
    w(("# HELP %s %s\n# TYPE %s %s\n"):format(name, help, name, typ))
  end
  if sampler then
    require("cuptimon.sampling").prometheus_render(sampler, w, family, proc_labels, escape,
      opts.top_kernels)
    render_pm(w, family)
    return table.concat(out)
  end
  local function kernel_series(fn)
    for _, g in ipairs(group_list) do
      for _, label in ipairs(g.order) do
        fn(('%s,kernel="%s"'):format(g.labels, escape(label)), g.series[label])
      end
    end
  end

  family("cuptimon_kernel_launches_total", "counter", "Kernels run.")
  kernel_series(function(l, s) w(("cuptimon_kernel_launches_total{%s} %.0f\n"):format(l, s.count)) end)

  family("cuptimon_kernel_duration_seconds", "histogram", "Kernel durations.")
  kernel_series(function(l, s)
    local cum = 0
    for i = 1, NB do
      cum = cum + (s.buckets[i] or 0)
      w(('cuptimon_kernel_duration_seconds_bucket{%s,le="%s"} %.0f\n'):format(l, LE[i], cum))
    end
    w(('cuptimon_kernel_duration_seconds_bucket{%s,le="+Inf"} %.0f\n'):format(l, s.count))
    w(("cuptimon_kernel_duration_seconds_sum{%s} %s\n"):format(l, seconds(s.ns)))
    w(("cuptimon_kernel_duration_seconds_count{%s} %.0f\n"):format(l, s.count))
  end)

  family("cuptimon_memcpy_bytes_total", "counter", "Bytes copied by memory copies.")
  for _, c in ipairs(copy_list) do w(("cuptimon_memcpy_bytes_total{%s} %.0f\n"):format(c.labels, c.bytes)) end
  family("cuptimon_memcpy_duration_seconds_total", "counter", "Time spent in memory copies.")
  for _, c in ipairs(copy_list) do
    w(("cuptimon_memcpy_duration_seconds_total{%s} %s\n"):format(c.labels, seconds(c.ns)))
  end

  local sources = update_counts()
  family("cuptimon_records_total", "counter", "Activity records decoded, per kind.")
  for _, source in ipairs(sources) do
    local c, l = source_counts[source], proc_labels(source)
    local kinds = {}
    for k in pairs(c.kinds) do kinds[#kinds + 1] = k end
    table.sort(kinds)
    for _, k in ipairs(kinds) do
      w(('cuptimon_records_total{%s,kind="%s"} %.0f\n'):format(l, escape(k), c.kinds[k]))
    end
  end
  family("cuptimon_records_dropped_total", "counter", "Activity records lost, per cause.")
  for _, source in ipairs(sources) do
    local c, l = source_counts[source], proc_labels(source)
    for _, loss in ipairs(LOSS) do
      w(('cuptimon_records_dropped_total{%s,cause="%s"} %.0f\n'):format(l, loss[1], c.lost[loss[1]] or 0))
    end
  end
  for i, m in ipairs { { "cuptimon_lag_seconds", "How late the newest records reached the exporter." },
    { "cuptimon_lag_peak_seconds", "The largest lag of the records reaching the exporter." },
    { "cuptimon_backlog_records", "Records the agent had decoded but not yet sent." },
    { "cuptimon_cupti_held_seconds", "How long CUPTI held records back before writing them." } } do
    family(m[1], "gauge", m[2])
    for _, source in ipairs(sources) do
      local c = source_counts[source]
      local v = c.lag and c.lag[i] or 0
      w(("%s{%s} %s\n"):format(m[1], proc_labels(source), i == 3 and ("%.0f"):format(v) or ("%.6f"):format(v)))
    end
  end
  local any = false
  for _, source in ipairs(sources) do
    local c = source_counts[source]
    if c.shed and #c.shed > 0 then
      if not any then
        family("cuptimon_kind_shed", "gauge",
          "1 for each activity kind the agent's lag guard stopped tracing because CUPTI fell behind.")
        any = true
      end
      for _, k in ipairs(c.shed) do
        w(('cuptimon_kind_shed{%s,kind="%s"} 1\n'):format(proc_labels(source), escape(k)))
      end
    end
  end
  render_pm(w, family)
  return table.concat(out)
end

---------------------------------------------------------------------------------------------------
-- HTTP

local REASONS = { [200] = "OK", [400] = "Bad Request", [404] = "Not Found",
  [405] = "Method Not Allowed", [431] = "Request Header Fields Too Large" }
local TOKEN = "^[!#$%%&'*+%.^_`|~%w%-]+$"

-- http-parser 2.9.4 (http_parser.h), bound through ffi.C: cuptimon-lua links libhttp_parser.a
-- whole. LuaJIT's cdef takes no copy of the header's bitfields as they are laid out, so the two
-- bitfield words are plain uint32_t here: `method` is bits 16-23 and `http_errno` bits 24-30 of
-- `_word2` (x86-64 GCC layout). spec/prometheus_spec.lua compares this cdef's size and offsets
-- and these shifts with the C compiler's (spec/http_parser_layout.c). Enums are int.
local HTTP_PARSER_CDEF = [[
typedef struct http_parser {
  uint32_t _word1;         /* type:2 flags:8 state:7 header_state:7 index:5 and 3 flags */
  uint32_t nread;
  uint64_t content_length;
  unsigned short http_major;
  unsigned short http_minor;
  uint32_t _word2;         /* status_code:16 method:8 http_errno:7 upgrade:1 */
  void *data;
} http_parser;
typedef int (*http_data_cb)(http_parser *, const char *at, size_t length);
typedef int (*http_cb)(http_parser *);
typedef struct http_parser_settings {
  http_cb on_message_begin;
  http_data_cb on_url;
  http_data_cb on_status;
  http_data_cb on_header_field;
  http_data_cb on_header_value;
  http_cb on_headers_complete;
  http_data_cb on_body;
  http_cb on_message_complete;
  http_cb on_chunk_header;
  http_cb on_chunk_complete;
} http_parser_settings;
unsigned long http_parser_version(void);
void http_parser_init(http_parser *parser, int type);
size_t http_parser_execute(http_parser *parser, const http_parser_settings *settings,
  const char *data, size_t len);
int http_should_keep_alive(const http_parser *parser);
const char *http_method_str(int m);
const char *http_errno_name(int err);
]]
local METHOD_SHIFT, ERRNO_SHIFT = 16, 24
local HTTP_REQUEST = 0
local ffi = require "ffi"
local bit = require "bit"
ffi.cdef(HTTP_PARSER_CDEF)
local C = ffi.C
do
  local v = tonumber(C.http_parser_version())
  if bit.rshift(v, 16) ~= 2 or bit.band(bit.rshift(v, 8), 0xff) < 9 then
    error(("prometheus.lua: http-parser 2.9 or later 2.x expected, found %d.%d.%d"):format(
      bit.rshift(v, 16), bit.band(bit.rshift(v, 8), 0xff), bit.band(v, 0xff)))
  end
end

-- The request being parsed: http_parser_execute runs the callbacks synchronously, so they fill
-- the table `cur` that feed() sets around the call. Header fields arrive in pieces; a field after
-- a value starts a new one. All pieces together are bounded by MAX_HEAD (feed() gives the parser
-- no more), so no bound is needed here.
local cur
local function piece(list, at, len) list[#list + 1] = ffi.string(at, len) end
local function on_url(_, at, len) piece(cur.url, at, len); return 0 end
local function on_header_field(_, at, len)
  local h = cur.headers
  if cur.in_value or #h == 0 then
    h[#h + 1] = { name = {}, value = {} }
    cur.in_value = false
  end
  piece(h[#h].name, at, len)
  return 0
end
local function on_header_value(_, at, len)
  local h = cur.headers
  cur.in_value = true
  piece(h[#h].value, at, len)
  return 0
end
local function on_headers_complete(p)
  cur.method = ffi.string(C.http_method_str(bit.band(bit.rshift(p._word2, METHOD_SHIFT), 0xff)))
  cur.major, cur.minor = p.http_major, p.http_minor
  return 1 -- no body: any would make the request a 400 anyway
end
local function on_message_complete()
  cur.complete = true
  return 1 -- one request per connection: stop here (pipelined bytes after it are not parsed)
end
-- Created once: LuaJIT has a limited number of callback slots.
local settings = ffi.new("http_parser_settings")
settings.on_url = ffi.cast("http_data_cb", on_url)
settings.on_header_field = ffi.cast("http_data_cb", on_header_field)
settings.on_header_value = ffi.cast("http_data_cb", on_header_value)
settings.on_headers_complete = ffi.cast("http_cb", on_headers_complete)
settings.on_message_complete = ffi.cast("http_cb", on_message_complete)

local function new_request()
  local p = ffi.new("http_parser")
  C.http_parser_init(p, HTTP_REQUEST)
  return { parser = p, url = {}, headers = {}, in_value = false, fed = 0, raw = {} }
end

-- Feeds `chunk` to the request's parser, at most up to MAX_HEAD bytes in all. Returns nil while
-- the request is incomplete, else the status to answer ("complete" when the request is whole and
-- valid as HTTP, for answer() to judge).
local function feed(r, chunk)
  local room = MAX_HEAD - r.fed
  if #chunk > room then chunk = chunk:sub(1, room) end
  r.fed = r.fed + #chunk
  r.raw[#r.raw + 1] = chunk
  cur = r
  local n = C.http_parser_execute(r.parser, settings, chunk, #chunk)
  cur = nil
  if r.complete then return "complete" end
  local errno = bit.band(bit.rshift(r.parser._word2, ERRNO_SHIFT), 0x7f)
  if errno ~= 0 or n ~= #chunk then
    r.error = ffi.string(C.http_errno_name(errno))
    return 400
  end
  if r.fed >= MAX_HEAD then return 431 end
  return nil
end
-- The callbacks must not be entered from JIT-compiled code.
jit.off(feed)

-- Judges a request http-parser has read whole: HTTP/1.0 or 1.1, header names tokens, values free
-- of control characters, no obsolete line folding (http-parser accepts it; RFC 9112 forbids it in
-- requests), Host required on 1.1 and not repeated, no body. Returns the status to answer and,
-- for 200, the body and its content type.
local function answer(r)
  if r.major ~= 1 or r.minor > 1 then return 400 end
  if table.concat(r.raw):find("\n[ \t]") then return 400 end
  local fields = {}
  for _, h in ipairs(r.headers) do
    local name, value = table.concat(h.name), table.concat(h.value):match("^[ \t]*(.-)[ \t]*$")
    if not name:match(TOKEN) or value:find("[%z\1-\8\10-\31\127]") then return 400 end
    name = name:lower()
    if fields[name] and (name == "host" or name == "content-length") then return 400 end
    fields[name] = value
  end
  if r.minor == 1 and not fields.host then return 400 end
  if fields["transfer-encoding"] or (fields["content-length"] and fields["content-length"] ~= "0") then
    return 400
  end
  local target = table.concat(r.url)
  if target:sub(1, 1) ~= "/" then return 400 end
  if r.method ~= "GET" then return 405 end
  local path = target:match("^[^?#]*")
  if path == "/metrics" then return 200, render(), "text/plain; version=0.0.4; charset=utf-8" end
  if path == "/" then
    return 200, "cuptimon Prometheus exporter: the metrics are at /metrics\n", "text/plain; charset=utf-8"
  end
  return 404
end

local server = uv.new_tcp()
local clients = {} -- tcp handle -> { close = fn, serial = accept order, answered = bool }
local nclients, serial = 0, 0
local stopped = false

-- Loop turns, counted before each poll: a client accepted in this turn or the one before may not
-- have had its bytes read yet (libuv accepts a whole burst before it reads), nor one accepted less
-- than NEW_MS ago (its own process may be busy), so neither is evicted.
local turn = 0
local turns = uv.new_prepare()
turns:start(function() turn = turn + 1 end)
turns:unref()
-- A client that closes before its answer is written must not kill the exporter with SIGPIPE (a
-- replay does not ignore it the way a live run does): the write just fails and the client goes.
local sigpipe = uv.new_signal()
sigpipe:start("sigpipe", function() end)
sigpipe:unref()

local function stop()
  if stopped then return end
  stopped = true
  if not server:is_closing() then server:close() end
  if not turns:is_closing() then turns:close() end
  if not sigpipe:is_closing() then sigpipe:close() end
  local list = {}
  for _, cl in pairs(clients) do list[#list + 1] = cl.close end
  for _, close in ipairs(list) do close() end
end

-- Makes room for a new client when all slots are taken: closes the oldest client whose request
-- is still incomplete and that has had a loop turn to send it. Returns false when there is none
-- (every slot is answering, or new): the new client then takes one of MAX_NEW further slots, or
-- is refused when those are full too.
local function evict_oldest_incomplete()
  local oldest
  for _, cl in pairs(clients) do
    if not cl.answered and cl.turn < turn - 1 and uv.now() - cl.since >= NEW_MS
      and (not oldest or cl.serial < oldest.serial) then
      oldest = cl
    end
  end
  if not oldest then return false end
  oldest.close()
  return true
end

local function serve(c)
  local timer = uv.new_timer()
  local request = new_request()
  local function close()
    if clients[c] == nil then return end
    clients[c] = nil
    nclients = nclients - 1
    if not timer:is_closing() then timer:close() end
    if not c:is_closing() then c:close() end
  end
  serial = serial + 1
  local cl = { close = close, serial = serial, answered = false, turn = turn, since = uv.now() }
  clients[c] = cl
  nclients = nclients + 1
  timer:start(REQUEST_TIMEOUT_MS, 0, close)
  local function respond(status, body, ctype)
    cl.answered = true
    c:read_stop()
    body = body or (REASONS[status] .. "\n")
    local head = { ("HTTP/1.1 %d %s"):format(status, REASONS[status]),
      "Content-Type: " .. (ctype or "text/plain; charset=utf-8"),
      "Content-Length: " .. #body, "Connection: close" }
    if status == 405 then head[#head + 1] = "Allow: GET" end
    c:write(table.concat(head, "\r\n") .. "\r\n\r\n" .. body, function() close() end)
  end
  c:read_start(function(err, chunk)
    if cl.answered then return end
    if err or not chunk then return close() end
    local got = feed(request, chunk)
    if got == nil then return end
    if got ~= "complete" then return respond(got) end
    local ok, status, body, ctype = xpcall(answer, debug.traceback, request)
    if not ok then
      close()
      error(status, 0)
    end
    respond(status, body, ctype)
  end)
end

local ok, err = server:bind(host, port)
if ok then ok, err = server:listen(1024, function(lerr)
  if lerr or stopped then return end
  local c = uv.new_tcp()
  if not server:accept(c) or (nclients >= MAX_CLIENTS and not evict_oldest_incomplete()
                                and nclients >= MAX_CLIENTS + MAX_NEW) then
    c:close()
    return
  end
  serve(c)
end) end
if not ok then
  io.stderr:write(("prometheus.lua: cannot serve on %s port %d: %s\n"):format(host, port, tostring(err)))
  if not server:is_closing() then server:close() end
  cm.exit(1)
elseif not cm.checking() then
  local addr = server:getsockname()
  local shown = addr.family == "inet6" and "[" .. addr.ip .. "]" or addr.ip
  io.stderr:write(("prometheus.lua: serving http://%s:%d/metrics\n"):format(shown, addr.port))
end

-- The host ends its loop when the command has exited or the captures are read; the final flush
-- and the exit hooks follow. --linger serves the final metrics from this exit hook, on the same
-- loop, until the time is up or Control-C (our own signal handlers: the host's are gone by then).
cm.on("exit", function()
  local linger = opts.linger
  if linger == -2 then -- the default: -1 after a replay, 0 after a command
    linger = 0
    for _, p in pairs(procs) do if p.kind == "replay" then linger = -1 end end
  end
  if stopped or linger == 0 then return stop() end
  io.stderr:write(linger > 0 and ("prometheus.lua: the run ended; serving the final metrics for %d ms\n"):format(linger)
    or "prometheus.lua: the run ended; serving the final metrics until Control-C\n")
  local handles = {}
  for _, signum in ipairs { "sigint", "sigterm" } do
    local sig = uv.new_signal()
    sig:start(signum, stop)
    handles[#handles + 1] = sig
  end
  if linger > 0 then
    local t = uv.new_timer()
    t:start(linger, 0, stop)
    handles[#handles + 1] = t
  end
  while not stopped or nclients > 0 do uv.run("once") end
  for _, h in ipairs(handles) do if not h:is_closing() then h:close() end end
  uv.run("nowait")
end)
