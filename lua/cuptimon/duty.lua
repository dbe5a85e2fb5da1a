-- cuptimon.duty: duty cycles (cm.duty), short exact windows and nothing traced in between (live
-- processes); cuptimon re-exports cm.duty, cm.duty_offsets, cm.duty_lag_ms and cm.duty_overload.
--
-- Each live process gets its own schedule: period k (from the moment the duty cycle met the
-- process) holds one window of on_ms at an offset drawn uniformly from [0, period_ms - on_ms],
-- from a seeded generator (Park-Miller, one stream per process), so a periodic workload cannot
-- alias with the windows and a test can replay the same offsets. A window is a cm.window: exact
-- between its two fences. Between windows the duty cycle selects nothing, so a process that no
-- other observer traces has every kind off, and its agent idles its cadences and frees its free
-- buffers (engine/agent/tracing.c) as a detached one does. Before each window
-- the overload check runs (cm.duty_overload): a process the budget sheds kinds of, or whose lag
-- (cm.duty_lag_ms, the hook for the sustained-load issue's per-process lag) is over max_lag_ms,
-- is skipped for that period, and the skip is reported.
--
-- This module owns the active duty cycles and each one's per-process schedule. A window is
-- opened through cm.window and the overload check reads cuptimon.budget's state; cuptimon hands
-- it the argument checks and the reporting function (_setup), and calls _process_start and
-- _process_exit from its event function. Loop thread only.
local core = require "cuptimon.core"
local budget = require "cuptimon.budget"

local M = {}

-- What cuptimon shares (_setup); cm is the public module table, whose functions a script may
-- replace (cm.duty_lag_ms is meant to be), so calls to them go through it.
local cm, report, selection_text, check_ms, check_opts

-- Takes what the parts share from cuptimon (init.lua).
function M._setup(public, shared)
  cm = public
  report, selection_text = shared.report, shared.selection_text
  check_ms, check_opts = shared.check_ms, shared.check_opts
end

local uv -- luv, loaded on first use

local duties = {} -- active duty handles

local function pm_next(st)
  st.rng = st.rng * 16807 % 2147483647
  return st.rng / 2147483647
end

-- The generator's start for a duty cycle's seed and a process: one stream per process.
local function duty_seed(seed, pid) return (seed + pid * 7919) % 2147483646 + 1 end

--- The offsets (ms from each period's start) of the first n windows that cm.duty{ seed = seed }
--- opens in process pid with these on_ms and period_ms: the same seed and pid give the same
--- windows, which is what makes a duty-cycled test reproducible.
function M.duty_offsets(seed, pid, n, period_ms, on_ms)
  local st, out = { rng = duty_seed(seed, pid) }, {}
  for i = 1, n do out[i] = pm_next(st) * (period_ms - on_ms) end
  return out
end

--- The lag hook of the duty cycle: the lag of a process's records in ms, or nil when unknown.
--- It reads cm.stats(source).lag_s (how far behind the records the script's view runs: the
--- sustained-load issue's per-process lag), the same figure cm.budget{ lag_ms } sheds on; replace
--- this function (cm.duty_lag_ms = function(source) ... end) to use another measure.
function M.duty_lag_ms(source)
  local ok, st = pcall(cm.stats, source)
  if ok and type(st) == "table" and type(st.lag_s) == "number" then return st.lag_s * 1000 end
  return nil
end

--- Whether a process is too loaded for a duty window now: nil, or the reason as a sentence
--- fragment ("the record-rate budget sheds runtime", "its records lag 3200 ms (over 2000)").
function M.duty_overload(source, max_lag_ms)
  local st = budget._state(source)
  if st and #st.shed > 0 then
    return "the record-rate budget sheds " .. table.concat(st.shed, ",")
  end
  local ok, cs = pcall(cm.stats, source)
  if ok and type(cs) == "table" and cs.guard_shed and #cs.guard_shed > 0 then
    return ("CUPTI fell %.1f s behind and the agent's lag guard stopped tracing %s")
      :format(cs.guard_lag_s, table.concat(cs.guard_shed, ","))
  end
  local lag = cm.duty_lag_ms(source)
  if lag and max_lag_ms and lag > max_lag_ms then
    return ("its records lag %.0f ms (over %d)"):format(lag, max_lag_ms)
  end
  return nil
end

local Duty = {}
Duty.__index = Duty

-- Schedules process st's next window: the one of period st.k, never in the past.
local function duty_schedule(d, st)
  if d.closed or st.gone then return end
  -- Periods that have ended already (a window or its fences overran, or the loop was held) get
  -- no window: the next one is in the current period, not crowded into the past.
  local now = uv.now()
  while st.t0 + (st.k + 1) * d.period_ms <= now do st.k = st.k + 1 end
  local offset = pm_next(st) * (d.period_ms - d.on_ms)
  st.offset = offset
  local at = st.t0 + st.k * d.period_ms + offset
  st.k = st.k + 1
  st.timer = cm.after(math.max(math.floor(at - now), 0), function()
    st.timer = nil
    d:_open(st)
  end)
end

local function duty_event(fn, ev)
  if not fn then return end
  local ok, err = xpcall(fn, debug.traceback, ev)
  if not ok then report("duty callback", err) end
end

function Duty:_open(st)
  if self.closed or st.gone then return end
  local reason = cm.duty_overload(st.source, self.max_lag_ms)
  local h, err
  if not reason then
    st.sheds0 = budget._sheds(st.source)
    h, err = cm.window { select = self.select, ms = self.on_ms, pid = st.pid, fn = self.fn,
      done = function(w) self:_done(st, w) end }
    if not h then
      if err:find("^ENOENT") or err:find("^ESTATE") then
        st.gone = true
        return
      end
      reason = err:find("^EBUSY") and "another window is open in it" or err
    end
  end
  if reason then
    st.skipped = st.skipped + 1
    st.skip_reason = reason
    duty_event(self.on_skip, { source = st.source, pid = st.pid, reason = reason,
      period = st.k })
    duty_schedule(self, st)
    return
  end
  st.window = h
end

function Duty:_done(st, w)
  st.window = nil
  w.period, w.offset_ms = st.k, st.offset
  local why
  if w.error then
    why = w.error
  elseif not w.traced_ms or w.traced_ms <= 0 then
    why = "the window never opened"
  elseif w.traced_by == "monitor" and st.agent_stamped then
    -- The agent stamped this process's earlier windows at their SELECTs; this one it did not,
    -- so the process ended during it, and its span (the monitor's, to the process's end) is not
    -- the time its launches were traced. A few ms of it skewed a phase test under TSan.
    why = "the process ended during it"
  elseif w.dropped > 0 then
    why = ("the process lost %d records during it"):format(w.dropped)
  elseif budget._sheds(st.source) ~= st.sheds0 then
    why = "the record-rate budget shed a kind during it"
  end
  w.ok, w.discarded = why == nil, why
  -- The process has gone (ENOENT, EIO), or is ending (ESTATE).
  local gone = w.error and (w.error:find("^ENOENT") or w.error:find("^EIO"))
  local ended = gone or (w.error and w.error:find("^ESTATE"))
  if w.traced_by == "agent" then st.agent_stamped = true end
  if w.ok then
    st.windows = st.windows + 1
    st.traced_ms = st.traced_ms + w.traced_ms
  else
    st.discarded = st.discarded + 1
    -- The window the process's end cut short says less than the failures before it.
    if not (ended and st.discard_reason) then st.discard_reason = why end
  end
  duty_event(self.on_window, w)
  if gone then st.gone = true end
  duty_schedule(self, st)
end

-- Starts the schedule of one live process (idempotent).
function Duty:_track(source, pid)
  if self.closed or self.procs[source] then return end
  if self.pid and pid ~= self.pid then return end
  local st = { source = source, pid = pid, t0 = uv.now(), k = 0, rng = duty_seed(self.seed, pid),
    windows = 0,
    skipped = 0, discarded = 0, traced_ms = 0 }
  self.procs[source] = st
  self.order[#self.order + 1] = source
  duty_schedule(self, st)
end

--- Stops the duty cycle: no further window; an open one still closes with its fence. Idempotent.
function Duty:close()
  if self.closed then return true end
  self.closed = true
  for _, st in pairs(self.procs) do
    if st.timer then st.timer:close() st.timer = nil end
  end
  for i, d in ipairs(duties) do if d == self then table.remove(duties, i) break end end
  return true
end

--- The duty cycle's counts: { duty = on_ms / period_ms, on_ms, period_ms, windows, skipped,
--- discarded, traced_ms, elapsed_ms, processes = { [source] = { pid, windows, skipped,
--- discarded, traced_ms, elapsed_ms, skip_reason, discard_reason (the last discarded window's
--- reason, before the process's end), started (uv.now() ms) } } } (sums over the processes in
--- the top level).
function Duty:stats()
  uv = uv or require "luv"
  local now = uv.now()
  local t = { duty = self.on_ms / self.period_ms, on_ms = self.on_ms, period_ms = self.period_ms,
    windows = 0, skipped = 0, discarded = 0, traced_ms = 0, elapsed_ms = 0, processes = {} }
  for _, source in ipairs(self.order) do
    local st = self.procs[source]
    local p = { pid = st.pid, windows = st.windows, skipped = st.skipped,
      discarded = st.discarded, traced_ms = st.traced_ms, elapsed_ms = (st.t_end or now) - st.t0,
      skip_reason = st.skip_reason, discard_reason = st.discard_reason, started = st.t0,
      gone = st.gone }
    t.processes[source] = p
    for _, k in ipairs { "windows", "skipped", "discarded", "traced_ms", "elapsed_ms" } do
      t[k] = t[k] + p[k]
    end
  end
  return t
end

function Duty:__tostring()
  return ("duty(%s, %d of every %d ms, %d processes)"):format(self.spec, self.on_ms,
    self.period_ms, #self.order)
end

--- Traces live processes in short windows and nothing in between. opts:
---   on_ms = n        each window's length (required)
---   period_ms = n    one window per period, at a random offset in it (required, > on_ms)
---   select = {...}   the kinds and fields of the windows, as for cm.observe (required)
---   pid = n          only this process (default: every live process, and new ones)
---   seed = n         the offsets' seed (default: from the clock); the same seed and pid give
---                    the same offsets
---   fn = f(b)        an observer of the windows' batches (b.source says whose)
---   window = f(w)    each closed window: the w of cm.window plus period, offset_ms (its planned
---                    offset in the period, cm.duty_offsets), ok (a usable sample)
---                    and discarded (why not: it failed, lost records, or a kind was shed)
---   skip = f(ev)     each skipped window: { source, pid, reason, period }
---   max_lag_ms = n   skip a process whose records lag more than this (default 2000; see
---                    cm.duty_lag_ms)
--- Returns a handle with :close() and :stats(), or nil, err under --replay or the in-process
--- engine (ESTATE). Between windows the duty cycle selects nothing.
function M.duty(opts)
  check_opts("cuptimon.duty", opts, "fn, max_lag_ms, on_ms, period_ms, pid, seed, select, skip, window")
  local spec = selection_text(opts.select)
  check_ms("cuptimon.duty", "on_ms", opts.on_ms)
  check_ms("cuptimon.duty", "period_ms", opts.period_ms)
  check_ms("cuptimon.duty", "max_lag_ms", opts.max_lag_ms, true)
  if opts.on_ms == 0 or opts.period_ms <= opts.on_ms then
    error(("cuptimon.duty: on_ms must be at least 1 and less than period_ms (got %s and %s)")
      :format(tostring(opts.on_ms), tostring(opts.period_ms)), 2)
  end
  for _, k in ipairs { "pid", "seed" } do
    if opts[k] ~= nil and (type(opts[k]) ~= "number" or opts[k] ~= math.floor(opts[k])) then
      error(("cuptimon.duty: %s must be an integer, got %s"):format(k, tostring(opts[k])), 2)
    end
  end
  for _, k in ipairs { "fn", "window", "skip" } do
    if opts[k] ~= nil and type(opts[k]) ~= "function" then
      error(("cuptimon.duty: %s must be a function, got a %s"):format(k, type(opts[k])), 2)
    end
  end
  uv = uv or require "luv"
  local d = setmetatable({ spec = spec, select = opts.select, on_ms = opts.on_ms,
    period_ms = opts.period_ms, pid = opts.pid, fn = opts.fn, on_window = opts.window,
    on_skip = opts.skip, max_lag_ms = opts.max_lag_ms or 2000,
    seed = opts.seed or (os.time() + math.floor(uv.hrtime() / 1000) % 1000003),
    procs = {}, order = {}, closed = false }, Duty)
  if core.check_mode() then return d end
  local list = core.sources()
  if not core.live_mode() then
    return nil, "ESTATE: cuptimon.duty: no live process (a duty cycle acts on the processes of "
      .. "`-- cmd` and --attach, not on a replay or the in-process engine)", "ESTATE"
  end
  duties[#duties + 1] = d
  for _, s in ipairs(list) do if s.kind == "agent" then d:_track(s.source, s.pid) end end
  return d
end

-- The host's process events: a process that connects joins every duty cycle; one that ends
-- leaves it.
function M._process_start(p)
  if #duties == 0 then return end
  for _, s in ipairs(core.sources()) do
    if s.source == p.source and s.kind == "agent" then
      for _, d in ipairs(duties) do d:_track(p.source, p.pid) end
    end
  end
end

function M._process_exit(p)
  if #duties == 0 then return end
  for _, d in ipairs(duties) do
    local st = d.procs[p.source]
    if st then
      st.gone = true
      st.t_end = st.t_end or (uv and uv.now())
      if st.timer then st.timer:close() st.timer = nil end
    end
  end
end

return M
