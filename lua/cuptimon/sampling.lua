-- cuptimon.sampling: a duty cycle (cuptimon.duty) feeding estimates (cuptimon.estimate), the part
-- the --duty recipes (top, count, prometheus) share.
--
-- It traces kernels (per device and name), copies (per device and direction) and, for count,
-- records per kind, in windows of duty * period_ms every period_ms, and keeps one estimator for
-- all: the unit is the process (its source), the key "kernel\tDEVICE\tNAME",
-- "memcpy\tDEVICE\tDIRECTION" or "kind\tKIND", with the measures n (launches or records),
-- t (GPU seconds) and b (bytes). Every batch of a window is added to its process's open window,
-- which the window's close commits (a usable window) or discards (a failed one, one that lost
-- records or had a kind shed); skipped windows are counted with their reason.
local cm = require "cuptimon"
local estimate = require "cuptimon.estimate"

local M = {}

-- CUpti_ActivityMemcpyKind names, as memcpy_bw.lua prints them.
M.copy_names = { [0] = "unknown", "HtoD", "DtoH", "HtoA", "AtoH", "AtoA", "AtoD", "DtoA", "DtoD",
  "HtoH", "PtoP" }

local S = {}
S.__index = S

--- Starts the duty cycle. opts:
---   duty = F (0 < F < 1), period_ms = P (each window lasts F * P ms, one per period)
---   seed, pid: as for cuptimon.duty
---   kernels = true, copies = true: trace and estimate them
---   kinds = { "kernel", "memcpy", ... }: also estimate the records of each kind
---   form = "short" | "full" | "mangled": kernel names (b:kernel_name)
---   window = f(w), skip = f(ev): cuptimon.duty's callbacks, called after the estimator's update
--- Returns the sampler, or nil, err (under --replay: ESTATE).
function M.start(opts)
  local on_ms = math.floor(opts.duty * opts.period_ms + 0.5)
  if on_ms < 1 or on_ms >= opts.period_ms then
    return nil, ("EINVAL: a duty of %g in a period of %d ms gives windows of %d ms; it needs at "
      .. "least 1 ms and less than the period"):format(opts.duty, opts.period_ms, on_ms), "EINVAL"
  end
  local s = setmetatable({ est = estimate.new(), info = {}, procs = {}, opts = opts,
    on_ms = on_ms, form = opts.form or "short" }, S)
  local sel, kind_of = {}, {}
  if opts.kernels then sel.kernel = { "name", "start", "stop", "device" } end
  if opts.copies then sel.memcpy = { "copy_kind", "bytes", "start", "stop", "device" } end
  for _, name in ipairs(opts.kinds or {}) do
    local k = cm.registry.kind(name)
    if not k then
      return nil, ("EINVAL: unknown kind %q; valid kinds: %s"):format(name,
        table.concat(cm.registry.kind_names(), ", ")), "EINVAL"
    end
    if not sel[k.name] then sel[k.name] = { k.by_name.start and "start" or k.fields[0].name } end
    kind_of[k.name] = true
  end
  s.counted = kind_of
  local d, err, ename = cm.duty { on_ms = on_ms, period_ms = opts.period_ms, seed = opts.seed,
    pid = opts.pid, select = sel,
    fn = function(b) s:_batch(b) end,
    window = function(w)
      s:_started(w.source, w.pid)
      if w.ok then s.est:commit(w.source, w.traced_ms / 1000) else s.est:discard(w.source) end
      if opts.window then opts.window(w) end
    end,
    skip = function(ev)
      s:_started(ev.source, ev.pid)
      s.est:skip(ev.source, ev.reason)
      if opts.skip then opts.skip(ev) end
    end }
  if not d then return nil, err, ename end
  s.duty = d
  return s
end

function S:_started(source, pid)
  if self.procs[source] then return end
  local st = self.duty:stats().processes[source]
  local p = cm.process(source)
  self.procs[source] = { pid = pid, exe = p and p.exe or "?",
    rank = p and p.env and p.env.RANK or nil }
  self.est:start(source, (st and st.started or 0) / 1000, { pid = pid })
end

function S:_key(key, what, device, name)
  if not self.info[key] then self.info[key] = { what = what, device = device, name = name } end
  return key
end

function S:_batch(b)
  local est, source = self.est, b.source
  if self.counted[b.kind] then
    est:add(source, self:_key("kind\t" .. b.kind, "kind", nil, b.kind), b.n)
  end
  if b.kind == "concurrent_kernel" and self.opts.kernels then
    local start, stop, device = b.start, b.stop, b.device
    for i = 0, b.n - 1 do
      local dev, name = tonumber(device[i]), b:kernel_name(i, self.form)
      local key = self:_key("kernel\t" .. dev .. "\t" .. name, "kernel", dev, name)
      est:add(source, key, 1, tonumber(stop[i] - start[i]) / 1e9)
    end
  elseif b.kind == "memcpy" and self.opts.copies then
    local ck, nbytes, start, stop, device = b.copy_kind, b.bytes, b.start, b.stop, b.device
    for i = 0, b.n - 1 do
      local dev, dir = tonumber(device[i]), M.copy_names[tonumber(ck[i])] or tostring(ck[i])
      local key = self:_key("memcpy\t" .. dev .. "\t" .. dir, "memcpy", dev, dir)
      est:add(source, key, 1, tonumber(stop[i] - start[i]) / 1e9, tonumber(nbytes[i]))
    end
  end
end

--- The clock (seconds) at which unit `source`'s estimates are taken: now, or when it ended.
function S:now(source)
  local st = self.duty:stats().processes[source]
  if not st then return nil end
  return (st.started + st.elapsed_ms) / 1000
end

--- The estimate of `key` in process `source` for measure m (cuptimon.estimate's estimate).
function S:estimate(source, key, m)
  return self.est:estimate(source, key, self:now(source), m)
end

--- The processes seen so far, in order: { source, pid, exe, rank }.
function S:processes()
  local out = {}
  for _, source in ipairs(self.est:unit_list()) do
    local p = self.procs[source]
    if p then out[#out + 1] = { source = source, pid = p.pid, exe = p.exe, rank = p.rank } end
  end
  return out
end

--- The keys of process `source` of one sort ("kernel", "memcpy" or "kind").
function S:keys(source, what)
  local out = {}
  for _, key in ipairs(self.est:keys(source)) do
    if self.info[key] and self.info[key].what == what then out[#out + 1] = key end
  end
  return out
end

--- The sum over every process of `key` (estimate's sum, each process at its own clock).
function S:sum(key, m)
  return self.est:sum(key, function(u) return self:now(u) end, m)
end

--- The footer lines: the duty, the windows so far, traced against elapsed time, the skipped and
--- discarded windows with their reasons, the detection limit of what no window saw, and how
--- often the agents detached CUPTI between windows.
function S:footer()
  local st = self.duty:stats()
  local lines = {}
  lines[1] = ("duty %.3f (%d of every %d ms): %d windows so far, traced %.1f s of %.1f s "
    .. "elapsed (%.3f)"):format(st.duty, st.on_ms, st.period_ms, st.windows, st.traced_ms / 1000,
    st.elapsed_ms / 1000, st.elapsed_ms > 0 and st.traced_ms / st.elapsed_ms or 0)
  for _, source in ipairs(self.duty.order) do
    local p = st.processes[source]
    if p.skipped > 0 then
      lines[#lines + 1] = ("note: skipped %d windows of pid %d: %s"):format(p.skipped, p.pid,
        p.skip_reason or "?")
    end
    if p.discarded > 0 then
      lines[#lines + 1] = ("note: discarded %d windows of pid %d (failed, lost records or shed); "
        .. "the last: %s"):format(p.discarded, p.pid, p.discard_reason or "?")
    end
  end
  local limit
  for _, p in pairs(st.processes) do
    if p.traced_ms > 0 then limit = math.max(limit or 0, 3000 / p.traced_ms) end
  end
  if limit then
    lines[#lines + 1] = ("a kernel not listed was seen in no window: below the detection limit "
      .. "of %.3g launches/s per process (3 / traced seconds)"):format(limit)
  end
  local all = cm.stats()
  -- What opening and closing the windows cost inside CUPTI: enabling a kind can hold the
  -- application's launching threads while it runs.
  if all and (all.kind_changes or 0) > 0 then
    lines[#lines + 1] = ("CUPTI's kinds were enabled or disabled %d times: %.1f ms in all, the "
      .. "longest %.1f ms"):format(all.kind_changes, all.kind_change_ns / 1e6,
      all.kind_change_max_ns / 1e6)
  end
  -- Agents detach CUPTI between windows unless a process cannot afford it (docs/agent.md,
  -- "Detaching CUPTI while idle"): each process that stayed attached says why, since a launch
  -- costs more there between windows.
  if all and (all.cupti_detaches or 0) > 0 then
    lines[#lines + 1] = ("CUPTI detached %d times between windows (CUPTIMON_DETACH_IDLE): %.1f ms "
      .. "detaching and %.1f ms attaching again, in all"):format(all.cupti_detaches,
      all.cupti_detach_ns / 1e6, all.cupti_attach_ns / 1e6)
  end
  for _, source in ipairs(self.duty.order) do
    local ps = cm.stats(source)
    local mode = ps and ps.cupti_idle_mode or 0
    if mode >= 2 then
      lines[#lines + 1] = ("note: pid %d: CUPTI %s"):format(st.processes[source].pid,
        cm.idle_mode_text(mode) or ("in mode " .. mode))
    end
  end
  return lines
end

--- When a process's windows were all discarded, the duty cycle estimated nothing for it: the
--- message that says so, naming it, with the last reason (the recipes report it as an error, so
--- a status of 0 becomes 1); else nil. A process whose threads keep CUPTI from attaching after a
--- detach has its windows refused until it can. A run that lost records has the LOST line and
--- status 3 already, and a process that ended before any window is not a failure.
function S:nothing_estimated()
  local st = self.duty:stats()
  local all = cm.stats()
  if all and (all.dropped or 0) > 0 then return nil end
  -- A process without an estimate is a failure unless no window of it was ever due: one whose
  -- every window was discarded names itself, with the last reason.
  local blind = {}
  for _, source in ipairs(self.duty.order) do
    local p = st.processes[source]
    if p.windows == 0 and p.discarded > 0 then blind[#blind + 1] = p end
  end
  if #blind == 0 then return nil end
  local reason = blind[#blind].discard_reason
  -- A window the agent refused carries the engine's error code only; the agent's log line (on
  -- the command's stderr) has its message.
  local tail = tostring(reason):find("^E%u+:") and "; the agent's error lines say why" or ""
  if st.windows == 0 then
    return ("the duty cycle estimated nothing: none of its %d windows completed (the last was "
      .. "discarded: %s)%s"):format(st.discarded, reason or "?", tail)
  end
  local pids = {}
  for i, p in ipairs(blind) do pids[i] = tostring(p.pid) end
  return ("the duty cycle estimated nothing for pid %s: none of %s windows completed (the "
    .. "last was discarded: %s)%s"):format(table.concat(pids, ", "),
    #blind == 1 and "its " .. blind[1].discarded or "their", reason or "?", tail)
end

---------------------------------------------------------------------------------------------------
-- the recipes' --duty paths (count.lua, top.lua, prometheus.lua): separate from their full-trace
-- paths, which they leave untouched

--- count.lua --duty: one line per kind at exit, "estimated KIND N ± M (95%, W windows)" (the
--- totals since each process's start, summed over processes), then the footer.
function M.count_main(opts, kinds)
  local s, err = M.start { duty = opts.duty, period_ms = opts.period_ms,
    seed = opts.seed > 0 and opts.seed or nil, kinds = kinds }
  if not s then error(err, 0) end
  cm.on("exit", function()
    if cm.command_failed() then return end -- the one-line error says it all
    for _, name in ipairs(kinds) do
      local k = cm.registry.kind(name).name
      local e = s:sum("kind\t" .. k, "n")
      if e.windows == 0 then
        print(("estimated %s: no estimate, no window completed"):format(k))
      elseif e.below then
        print(("estimated %s below the detection limit of %.3g records/s (%d windows)")
          :format(k, e.limit or 0, e.windows))
      else
        print(("estimated %s %.0f ± %s (95%%, %d windows)%s"):format(k, e.total,
          e.total_half and ("%.0f"):format(e.total_half) or "?", e.windows,
          e.phase and " (phase change: the windows disagree)" or ""))
      end
    end
    for _, l in ipairs(s:footer()) do print(l) end
    cm.print_shed_notes()
    local none = s:nothing_estimated()
    if none then error(none, 0) end
  end)
  return s
end

--- top.lua --duty: per process and device, the kernels by estimated GPU time per second, with
--- launches/s, GPU ms/s and the estimated totals, each with its ± (95%); at exit and every
--- opts.interval ms (when set); then the footer.
function M.top_main(opts, form)
  local tabulate = require "cuptimon.table"
  local s, err = M.start { duty = opts.duty, period_ms = opts.period_ms,
    seed = opts.seed > 0 and opts.seed or nil, kernels = true, form = form }
  if not s then error(err, 0) end
  local function report()
    local any = false
    for _, p in ipairs(s:processes()) do
      local by_dev = {}
      for _, key in ipairs(s:keys(p.source, "kernel")) do
        local info = s.info[key]
        by_dev[info.device] = by_dev[info.device] or {}
        local list = by_dev[info.device]
        list[#list + 1] = { key = key, name = info.name, t = s:estimate(p.source, key, "t"),
          n = s:estimate(p.source, key, "n") }
      end
      local devs = {}
      for d in pairs(by_dev) do devs[#devs + 1] = d end
      table.sort(devs)
      for _, d in ipairs(devs) do
        local list = by_dev[d]
        table.sort(list, function(a, b)
          if a.t.rate ~= b.t.rate then return a.t.rate > b.t.rate end
          return a.name < b.name
        end)
        if any then print() end
        any = true
        print(("pid %d (%s)%s, device %d, estimated from %d windows"):format(p.pid, p.exe,
          p.rank and ", rank " .. p.rank or "", d, list[1].n.windows))
        local t = tabulate.new { { "Launches/s", "%.1f", width = 10, align = "right" },
          { "±", "%.1f", width = 8 },
          { "GPU ms/s", "%.3f", width = 9 }, { "±", "%.3f", width = 8 },
          { "Launches", "%.0f", width = 10 }, { "±", "%.0f", width = 8 },
          { "Avg (us)", "%.1f", width = 8 }, { "Name", align = "left" } }
        for i = 1, math.min(#list, opts.top) do
          local e = list[i]
          t:add(e.n.rate, e.n.half or 0 / 0, e.t.rate * 1e3, e.t.half and e.t.half * 1e3 or 0 / 0,
            e.n.total, e.n.total_half or 0 / 0, e.n.rate > 0 and e.t.rate / e.n.rate * 1e6 or 0,
            e.name .. ((e.n.phase or e.t.phase) and "  (phase change)" or ""))
        end
        t:print()
      end
    end
    if not any then print("no kernels seen in any window yet") end
    for _, l in ipairs(s:footer()) do print(l) end
    cm.print_shed_notes()
  end
  if opts.interval > 0 then
    cm.every(opts.interval, function()
      print(("== %s, every %d ms"):format(os.date("!%Y-%m-%dT%H:%M:%SZ"), opts.interval))
      report()
      print()
      io.stdout:flush()
    end)
  end
  cm.on("exit", function()
    if cm.command_failed() then return end
    if opts.interval > 0 then print("== at exit") end
    report()
    local none = s:nothing_estimated()
    if none then error(none, 0) end
  end)
  return s
end

-- The gauges of one estimate: the value and its interval's bounds, as three families.
local function gauge3(w, family, name, unit, help, rows)
  local names = { name .. unit, name .. "_lower_bound" .. unit, name .. "_upper_bound" .. unit }
  local helps = { help .. " (estimate).", help .. ": lower bound of the 95% interval.",
    help .. ": upper bound of the 95% interval." }
  for j = 1, 3 do
    family(names[j], "gauge", helps[j])
    for _, r in ipairs(rows) do
      local v
      if j == 1 then
        v = r.v
      elseif r.h then
        v = j == 2 and math.max(r.v - r.h, 0) or r.v + r.h
      end
      if v then w(("%s{%s} %.9g\n"):format(names[j], r.labels, v)) end
    end
  end
end

--- prometheus.lua --duty: the estimated rates as gauges with their 95% bounds as families of
--- their own, the phase-change flags, and the duty cycle's own state. proc_labels(source) gives
--- the process labels, escape a label value; top is how many kernels per process and device
--- are exported (by estimated GPU time).
function M.prometheus_render(s, w, family, proc_labels, escape, top)
  local krows = { n = {}, t = {}, total = {}, phase = {} }
  local crows = { n = {}, b = {}, t = {} }
  for _, p in ipairs(s:processes()) do
    local pl = proc_labels(p.source)
    local by_dev = {}
    for _, key in ipairs(s:keys(p.source, "kernel")) do
      local info = s.info[key]
      local t = s:estimate(p.source, key, "t")
      by_dev[info.device] = by_dev[info.device] or {}
      table.insert(by_dev[info.device], { key = key, info = info, t = t })
    end
    for dev, list in pairs(by_dev) do
      table.sort(list, function(a, b)
        if a.t.rate ~= b.t.rate then return a.t.rate > b.t.rate end
        return a.info.name < b.info.name
      end)
      for i = 1, math.min(#list, top) do
        local e = list[i]
        local n = s:estimate(p.source, e.key, "n")
        local l = ('%s,device="%d",kernel="%s"'):format(pl, dev, escape(e.info.name))
        table.insert(krows.n, { labels = l, e = n, v = n.rate, h = n.half })
        table.insert(krows.t, { labels = l, e = e.t, v = e.t.rate, h = e.t.half })
        table.insert(krows.total, { labels = l, e = n, v = n.total, h = n.total_half })
        table.insert(krows.phase, { labels = l, v = (n.phase or e.t.phase) and 1 or 0 })
      end
    end
    for _, key in ipairs(s:keys(p.source, "memcpy")) do
      local info = s.info[key]
      local l = ('%s,device="%d",copy_kind="%s"'):format(pl, info.device, escape(info.name))
      for _, m in ipairs { "n", "b", "t" } do
        local e = s:estimate(p.source, key, m)
        table.insert(crows[m], { labels = l, e = e, v = e.rate, h = e.half })
      end
    end
  end
  local from = ", estimated from the duty cycle's windows"
  for _, g in ipairs {
    { "kernel_launches", "_per_second", "Kernel launches per second" .. from, krows.n },
    { "kernel_duration", "_seconds_per_second", "GPU time of the kernel per second" .. from, krows.t },
    { "kernel_launches_since_start", "", "Kernel launches since the duty cycle met the process"
      .. from, krows.total },
    { "memcpy_copies", "_per_second", "Memory copies per second" .. from, crows.n },
    { "memcpy", "_bytes_per_second", "Bytes copied per second" .. from, crows.b },
    { "memcpy_duration", "_seconds_per_second", "Time spent copying per second" .. from, crows.t },
  } do
    gauge3(w, family, "cuptimon_estimated_" .. g[1], g[2], g[3], g[4])
  end
  family("cuptimon_estimated_kernel_phase_change", "gauge",
    "1 when the first and second halves of the windows disagree beyond sampling (a phase change).")
  for _, r in ipairs(krows.phase) do
    w(("cuptimon_estimated_kernel_phase_change{%s} %d\n"):format(r.labels, r.v))
  end
  local st = s.duty:stats()
  family("cuptimon_duty_target_ratio", "gauge", "The duty cycle asked for: window length over period.")
  w(("cuptimon_duty_target_ratio %.9g\n"):format(st.duty))
  family("cuptimon_duty_ratio", "gauge", "Time traced over time elapsed since the duty cycle met the process.")
  local per = {}
  for _, source in ipairs(s.duty.order) do
    local p = st.processes[source]
    per[#per + 1] = { l = proc_labels(source), p = p }
    w(("cuptimon_duty_ratio{%s} %.9g\n"):format(proc_labels(source),
      p.elapsed_ms > 0 and p.traced_ms / p.elapsed_ms or 0))
  end
  for _, c in ipairs { { "windows", "Windows traced and used for the estimates." },
    { "skipped", "Windows skipped because the process was overloaded (budget or lag)." },
    { "discarded", "Windows discarded: they failed, lost records or had a kind shed." } } do
    local name = c[1] == "windows" and "cuptimon_duty_windows_total"
      or ("cuptimon_duty_windows_%s_total"):format(c[1])
    family(name, "counter", c[2])
    for _, e in ipairs(per) do w(("%s{%s} %d\n"):format(name, e.l, e.p[c[1]])) end
  end
  family("cuptimon_duty_detection_limit_launches_per_second", "gauge",
    "A kernel seen in no window runs below this rate (3 over the seconds traced).")
  for _, e in ipairs(per) do
    if e.p.traced_ms > 0 then
      w(("cuptimon_duty_detection_limit_launches_per_second{%s} %.9g\n"):format(e.l,
        3000 / e.p.traced_ms))
    end
  end
end

return M
