-- cuptimon.budget: the record-rate budget (cm.budget), kinds shed from a live process while its
-- records arrive too fast or too late; cuptimon re-exports cm.budget, cm.budget_from,
-- cm.shed_notes and cm.print_shed_notes.
--
-- Design note. A budget changes what a running agent traces by the same path as an observer
-- does (the per-process union selection, sent as a SELECT frame): it removes kinds from the union
-- of one process (core.shed) whatever the observers select. A timer measures each live process's
-- rate and lag and sheds or restores one kind at a time. This module owns the active budget, its
-- per-process state, the counts and the log of what was shed (for cm.stats, cm.shed_notes and the
-- duty cycle's overload check); cuptimon hands it the argument checks and the reporting functions
-- (_setup). Loop thread only.
local bit = require "bit"
local core = require "cuptimon.core"
local registry = require "cuptimon.registry"

local M = {}

-- What cuptimon shares (_setup); cm is the public module table, whose functions a script may
-- replace, so calls to them go through it.
local cm, report, run_hooks, hooks, check_ms, check_opts, valid_kinds

-- Takes what the parts share from cuptimon (init.lua).
function M._setup(public, shared)
  cm = public
  report, run_hooks, hooks = shared.report, shared.run_hooks, shared.hooks
  check_ms, check_opts, valid_kinds = shared.check_ms, shared.check_opts, shared.valid_kinds
end

local uv -- luv, loaded on first use

local budget          -- the active budget's options, or nil
local budget_timer
local budget_state = {} -- source -> { pid, samples, since, under_since, shed = { kind, ... } }
local shed_log = {}     -- { pid =, source =, kind =, from =, to = } (uv.now() ms), in order
local shed_counts = {}  -- source -> { sheds =, restores = }

local function kind_mask(list)
  local lo, hi = 0, 0
  for _, name in ipairs(list) do
    local id = registry.kind(name).id
    if id < 32 then lo = bit.bor(lo, bit.lshift(1, id)) else hi = bit.bor(hi, bit.lshift(1, id - 32)) end
  end
  return lo, hi
end

local function budget_event(what, st, source, kind, rate)
  local c = shed_counts[source] or { sheds = 0, restores = 0 }
  shed_counts[source] = c
  c[what == "shed" and "sheds" or "restores"] = c[what == "shed" and "sheds" or "restores"] + 1
  local now = uv.now()
  if what == "shed" then
    shed_log[#shed_log + 1] = { pid = st.pid, source = source, kind = kind, from = now }
  else
    for i = #shed_log, 1, -1 do
      local e = shed_log[i]
      if e.source == source and e.kind == kind and not e.to then e.to = now break end
    end
  end
  local list = {}
  for i, k in ipairs(st.shed) do list[i] = k end
  run_hooks(hooks[what], what .. " hook", { source = source, pid = st.pid, kind = kind,
    rate = rate, records_per_s = budget.records_per_s, lag_s = st.lag_s, lag_ms = budget.lag_ms,
    shed = list })
end

local function apply_shed(source, st)
  local lo, hi = kind_mask(st.shed)
  local ok, err = core.shed(source, lo, hi)
  if not ok and not err:find("^ENOENT") and not err:find("^ESTATE") then report("budget", err) end
  st.samples, st.since, st.under_since = {}, uv.now(), nil
end

-- One evaluation of every live process: the rate over the last window_ms; above the budget the
-- next kind of the list is shed, and after hold_ms under it the last one shed comes back. After
-- each change the rate is measured afresh over a whole window before the next decision.
local function budget_tick()
  local now = uv.now()
  for _, s in ipairs(core.sources()) do
    if s.kind == "agent" then
      local st = budget_state[s.source]
      if not st then
        st = { pid = s.pid, samples = {}, since = now, shed = {} }
        budget_state[s.source] = st
      end
      local loss = core.loss(s.source)
      local n = loss and loss.received or 0
      local smp = st.samples
      smp[#smp + 1] = { t = now, n = n }
      while #smp > 2 and smp[2].t <= now - budget.window_ms do table.remove(smp, 1) end
      if now - st.since >= budget.window_ms and now > smp[1].t then
        local rate = (n - smp[1].n) * 1000 / (now - smp[1].t)
        local cs = budget.lag_ms and cm.stats(s.source)
        st.lag_s = cs and cs.lag_s or 0
        if (budget.records_per_s and rate > budget.records_per_s)
          or (budget.lag_ms and st.lag_s * 1000 > budget.lag_ms) then
          st.under_since = nil
          local nxt = budget.shed[#st.shed + 1]
          if nxt then
            st.shed[#st.shed + 1] = nxt
            apply_shed(s.source, st)
            budget_event("shed", st, s.source, nxt, rate)
          end
        else
          st.under_since = st.under_since or now
          if #st.shed > 0 and now - st.under_since >= budget.hold_ms then
            local k = table.remove(st.shed)
            apply_shed(s.source, st)
            st.under_since = now
            budget_event("restore", st, s.source, k, rate)
          end
        end
      end
    end
  end
end

local Budget = {}
Budget.__index = Budget

--- Stops the budget and restores every kind it shed. Idempotent.
function Budget:close()
  if budget ~= self.opts then return true end
  budget = nil
  if budget_timer then budget_timer:close() end
  budget_timer = nil
  for source, st in pairs(budget_state) do
    if #st.shed > 0 then
      local ks = st.shed
      st.shed = {}
      apply_shed(source, st)
      for i = #ks, 1, -1 do budget_event("restore", st, source, ks[i], 0) end
    end
  end
  budget_state = {}
  return true
end

--- A record-rate budget for every live process. opts:
---   records_per_s = n  the sustained rate (records received per second) a process may reach
---   lag_ms = n         and (or instead) how late its records may reach the script (cm.stats()
---                      lag_s): "shed runtime when the lag passes 1 s" is lag_ms = 1000
---   shed = { "runtime", "driver", ... }  the kinds disabled, in order, one at a time, while a
---                      process's rate stays above the budget
---   hold_ms = n        how long the rate must stay under the budget before the last kind shed
---                      is traced again (default 5000)
---   window_ms = n      the span the rate is measured over (default 1000)
--- Each shed and restore fires the "shed" or "restore" event with { source, pid, kind, rate,
--- records_per_s, lag_s, lag_ms, shed = { kinds shed now } }, is counted in cm.stats() (shed, sheds, restores)
--- and listed by cm.shed_notes(). One budget at a time: a new one replaces the previous. The
--- rate is that of the records arriving: set a flush cadence (cm.configure{ flush_ms = 250 }) so
--- that they arrive steadily rather than when CUPTI's buffers fill.
--- Returns a handle with :close() (which restores every shed kind).
function M.budget(opts)
  check_opts("cuptimon.budget", opts, "hold_ms, lag_ms, records_per_s, shed, window_ms")
  if opts.records_per_s == nil and opts.lag_ms == nil then
    error("cuptimon.budget: give records_per_s, lag_ms or both", 2)
  end
  if opts.records_per_s ~= nil and (type(opts.records_per_s) ~= "number" or opts.records_per_s <= 0) then
    error(("cuptimon.budget: records_per_s must be a positive number, got %s")
      :format(tostring(opts.records_per_s)), 2)
  end
  if opts.lag_ms ~= nil and (type(opts.lag_ms) ~= "number" or opts.lag_ms <= 0) then
    error(("cuptimon.budget: lag_ms must be a positive number of ms, got %s")
      :format(tostring(opts.lag_ms)), 2)
  end
  if type(opts.shed) ~= "table" or #opts.shed == 0 then
    error("cuptimon.budget: shed must be a non-empty list of kind names such as "
      .. "{ \"runtime\", \"driver\" }", 2)
  end
  local shed = {}
  for i, k in ipairs(opts.shed) do
    if type(k) ~= "string" or not registry.kind(k) then
      error(("cuptimon.budget: shed[%d]: unknown kind %s; valid kinds: %s")
        :format(i, tostring(k), valid_kinds()), 2)
    end
    shed[i] = k
  end
  check_ms("cuptimon.budget", "hold_ms", opts.hold_ms, true)
  check_ms("cuptimon.budget", "window_ms", opts.window_ms, true)
  if opts.window_ms == 0 then error("cuptimon.budget: window_ms must be at least 1", 2) end
  local b = { records_per_s = opts.records_per_s, lag_ms = opts.lag_ms, shed = shed,
    hold_ms = opts.hold_ms or 5000, window_ms = opts.window_ms or 1000 }
  local h = setmetatable({ opts = b }, Budget)
  if core.check_mode() then return h end
  if budget then setmetatable({ opts = budget }, Budget):close() end
  budget = b
  uv = uv or require "luv"
  budget_timer = cm.every(math.max(10, math.min(250, math.floor(b.window_ms / 4))), budget_tick)
  return h
end

-- The budget's state of process `source` ({ pid, samples, since, under_since, shed = { kind, ... }
-- }), or nil: the duty cycle skips a process whose kinds are shed.
function M._state(source) return budget_state[source] end

-- How many times the budget shed a kind of process `source`: a duty window during which this
-- changed is discarded.
function M._sheds(source)
  local c = shed_counts[source]
  return c and c.sheds or 0
end

-- Adds the budget's fields to a cm.stats() table: shed (the kinds shed now, in order; for all
-- sources, each kind once), sheds and restores (how many times).
function M._stats(t, source)
  t.shed, t.sheds, t.restores = {}, 0, 0
  local seen = {}
  for src, st in pairs(budget_state) do
    if not source or source == 0 or src == source then
      for _, k in ipairs(st.shed) do
        if not seen[k] then t.shed[#t.shed + 1] = k seen[k] = true end
      end
    end
  end
  for src, c in pairs(shed_counts) do
    if not source or source == 0 or src == source then
      t.sheds, t.restores = t.sheds + c.sheds, t.restores + c.restores
    end
  end
end

--- Lines saying which kinds a budget shed, in which process and for how long, so that a table
--- printed next to them is never taken for complete data: {} when nothing was shed.
function M.shed_notes()
  local out = {}
  uv = uv or require "luv"
  for _, e in ipairs(shed_log) do
    out[#out + 1] = ("note: the record-rate budget shed %s records of pid %d for %.1f s%s: "
      .. "totals that include %s mix full and shed data"):format(e.kind, e.pid,
      ((e.to or uv.now()) - e.from) / 1000, e.to and "" or " (still shed)", e.kind)
  end
  return out
end

--- Prints cm.shed_notes() (to io.stdout, or `out`), if any.
function M.print_shed_notes(out)
  out = out or io.stdout
  for _, line in ipairs(cm.shed_notes()) do out:write(line, "\n") end
end

--- Starts the budget a recipe's options ask for (cuptimon.args.with_budget): nothing when
--- opts.budget is 0. The rate is measured as records arrive, so the agents are also asked to
--- flush CUPTI's buffers every 250 ms (without a cadence, records come when buffers fill).
function M.budget_from(opts)
  local rate = opts.budget and opts.budget > 0 and opts.budget or nil
  local lag = opts.lag_ms and opts.lag_ms > 0 and opts.lag_ms or nil
  if not rate and not lag then return nil end
  cm.configure { flush_ms = 250, deliver_ms = 250 }
  local list = {}
  for k in tostring(opts.shed):gmatch("[^,%s]+") do list[#list + 1] = k end
  return cm.budget { records_per_s = rate, lag_ms = lag, shed = list, hold_ms = opts.hold_ms }
end

return M
