-- prometheus.lua: GPU activity as Prometheus metrics, served over HTTP at /metrics.
--
-- Usage: cuptimon-lua scripts/prometheus.lua [--listen HOST:PORT] [--port N] [--web-config FILE]
--          [--top-kernels K] [--linger MS] [--pm-devices LIST] [--pm-interval-us N] -- cmd args...
--        cuptimon-lua --replay run.cmcap scripts/prometheus.lua --linger 30000
--
-- Arguments:
--   --listen HOST:PORT  where to serve (default 127.0.0.1:9464; "[::1]:9464" for IPv6; port 0
--                       picks a free port). The bound address is printed on stderr:
--                       "prometheus.lua: serving http://127.0.0.1:9464/metrics"
--   --port N            the port, overriding --listen's
--   --web-config FILE   serve over TLS and/or with basic auth as FILE says (below); SIGHUP
--                       reloads it
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
-- HTTP (lua/cuptimon/httpd.lua). GET /metrics and GET / are answered, strictly: requests are
-- parsed by Debian's http-parser and judged against RFC 9112 (cuptimon.httpreq: 400, 405, 404,
-- 431 past 8 KiB of head); every response closes its connection. A connection that has not sent
-- its whole request head within 5 s of its accept is closed, TLS handshake included; at most 64
-- connections that have had time to send their request are kept, a new client taking the place
-- of the oldest incomplete one, and up to 448 more may wait through their first 50 ms, so a
-- scraper gets in while hundreds of idle or slowloris clients keep coming back
-- (spec/prometheus_spec.lua, with spec/http_attack.lua, plain and over TLS).
--   cuptimon_exporter_refused_requests_total{reason}   requests refused: wrong_password,
--                       no_credentials, auth_throttled, tls_handshake, client_cert,
--                       plain_http_on_tls, tls_too_large, evicted, timed_out
--
-- TLS and basic auth. --web-config FILE takes the file node_exporter takes with
-- --web.config.file (the Prometheus exporter toolkit's format): tls_server_config (cert_file,
-- key_file, client_auth_type, client_ca_file, min_version TLS12 or TLS13, cipher_suites,
-- curve_preferences), http_server_config (headers), basic_auth_users (bcrypt hashes). A key it
-- cannot honour is refused at start, naming it (docs/monitor.md, "Serving over TLS"). SIGHUP
-- reads the file again. Serving on an address other than loopback without it is warned about.
--   cuptimon-lua --attach all scripts/prometheus.lua --listen 0.0.0.0:9464 --web-config wc.yml
--   prometheus.lua: serving https://0.0.0.0:9464/metrics
--   prometheus.lua: TLS, client certificates: NoClientCert, basic auth: 1 user
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
local httpd = require "cuptimon.httpd"
local uv = require "luv"

local opts = args.parse(arg, args.with_duty {
  listen = { "127.0.0.1:9464", "where to serve, HOST:PORT" },
  port = { "", "the port, overriding --listen's" },
  top_kernels = { 20, "kernel names with their own label", min = 0, integer = true },
  linger = { -2, "serve the final metrics this long after the run (-1: until Control-C)", min = -2,
    integer = true },
  pm_devices = { "", "devices to sample GPU utilization on with PM sampling (default none)" },
  pm_interval_us = { 100000, "PM sampling interval in microseconds", min = 20, integer = true },
  web_config = { "", "serve TLS and basic auth as this web configuration file says (the Prometheus "
    .. "exporter toolkit's format; SIGHUP reloads it)" },
})
local srv -- the HTTP server (cuptimon.httpd), started once the metrics are defined

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
  if srv then
    family("cuptimon_exporter_refused_requests_total", "counter",
      "Requests the exporter refused or dropped, per reason (wrong password, TLS handshake...).")
    local st = srv.stats()
    for _, reason in ipairs(httpd.REFUSALS) do
      w(('cuptimon_exporter_refused_requests_total{reason="%s"} %.0f\n'):format(reason, st[reason] or 0))
    end
  end
  return table.concat(out)
end

---------------------------------------------------------------------------------------------------
-- HTTP (cuptimon.httpd: the limits, TLS and basic auth)

if opts.web_config == "" and not host:match("^127%.") and host ~= "::1" and host ~= "localhost"
  and not cm.checking() then
  io.stderr:write(("prometheus.lua: warning: serving %s without --web-config: anyone who reaches "
    .. "the port reads every traced process's kernels, paths and pids in clear text, unauthenticated "
    .. "(examples/systemd/web-config.yml shows TLS and basic auth)\n"):format(opts.listen))
end
local err
srv, err = httpd.serve {
  host = host, port = port, name = "prometheus.lua",
  web_config = opts.web_config ~= "" and opts.web_config or nil,
  routes = {
    ["/metrics"] = function() return render(), "text/plain; version=0.0.4; charset=utf-8" end,
    ["/"] = function()
      return "cuptimon Prometheus exporter: the metrics are at /metrics\n", "text/plain; charset=utf-8"
    end,
  },
}
if not srv then
  io.stderr:write(("prometheus.lua: %s\n"):format(err))
  cm.exit(1)
elseif not cm.checking() then
  io.stderr:write(("prometheus.lua: serving %s://%s:%d/metrics\n"):format(srv.scheme, srv.host, srv.port))
  if opts.web_config ~= "" then io.stderr:write(("prometheus.lua: %s\n"):format(srv.describe())) end
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
  if not srv then return end
  local stop = srv.stop
  if srv.stopped() or linger == 0 then return stop() end
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
  while not srv.stopped() or srv.clients() > 0 do uv.run("once") end
  for _, h in ipairs(handles) do if not h:is_closing() then h:close() end end
  uv.run("nowait")
end)
