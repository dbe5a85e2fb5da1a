-- cuptimon.window: trigger windows (cm.window), a live process traced wider for a while;
-- cuptimon re-exports cm.window.
--
-- Design note. A window changes what a running agent traces by the same path as an observer does:
-- the per-process union selection, sent as a SELECT frame and applied by the agent as a minimal
-- diff (enable the new kinds and fields, disable the ones no longer wanted). A window is an
-- observer bound to one process (core.observe(spec, source)) between two sync flushes
-- (core.window_begin/window_end: engine/monitor/window.c counts, and may record, exactly the frames
-- between the two fences). This module owns the open windows (token -> one process's part);
-- cuptimon hands it its observer class and table, the argument checks and the reporting and
-- deferral functions (_setup), and calls _done from its event function when a window's closing
-- fence arrives. Loop thread only.
local core = require "cuptimon.core"
local registry = require "cuptimon.registry"

local M = {}

-- What cuptimon shares (_setup); cm is the public module table, whose functions a script may
-- replace, so calls to them go through it.
local cm, report, run_hooks, hooks, later, now_or_later, selection_text, check_ms, check_opts
local Observer, observers

-- Takes what the parts share from cuptimon (init.lua).
function M._setup(public, shared)
  cm = public
  report, run_hooks, hooks, later = shared.report, shared.run_hooks, shared.hooks, shared.later
  now_or_later, selection_text = shared.now_or_later, shared.selection_text
  check_ms, check_opts = shared.check_ms, shared.check_opts
  Observer, observers = shared.Observer, shared.observers
end

local uv -- luv, loaded on first use

local windows = {}  -- token -> window part
local next_window = 0

-- The live agents to act on: every one, or the one of `pid`. nil, err, name when none.
local function live_sources(fname, pid)
  local list = {}
  for _, s in ipairs(core.sources()) do
    if s.kind == "agent" and (pid == nil or s.pid == pid) then list[#list + 1] = s end
  end
  if #list == 0 then
    if pid then
      return nil, ("ENOENT: %s: no live process with pid %d"):format(fname, pid), "ENOENT"
    end
    return nil, ("ESTATE: %s: no live process (windows and budgets act on the processes of "
      .. "`-- cmd`, not on a replay or the in-process engine)"):format(fname), "ESTATE"
  end
  return list
end

local Window = {}
Window.__index = Window

-- Ends one process's part of a window: the observer leaves the selection (a narrowing SELECT,
-- which the agent applies by delivering every record of the kinds it turns off) but keeps
-- receiving batches until the closing fence, so `fn` sees the window's tail; the "window_done"
-- event then closes it.
local function window_end(part)
  if part.ending then return end
  part.ending = true
  if part.timer then part.timer:close() end
  local function finish()
    if part.obs and part.obs.id and not part.obs.closed then core.retire(part.obs.id) end
    local ok, err = core.window_end(part.source)
    -- The process may have ended first: its window completes (or completed) without this call.
    if not ok and part.obs then part.obs:close() end
    if not ok and not err:find("^ENOENT") and not err:find("^ESTATE") then report("window", err) end
  end
  if core.in_dispatch() then later(finish) else finish() end
end

--- Ends the window now, before its ms have elapsed. Idempotent.
function Window:close()
  for _, part in ipairs(self.parts) do window_end(part) end
  return true
end

function Window:__tostring()
  return ("window(%s, %d ms, %d of %d closed)"):format(self.spec, self.ms, #self.results,
    #self.parts)
end

-- The host's "window_done" event: the closing fence of window `token` arrived with its result
-- `r` (window.c); the window's observer closes, and its done function and the "window" hooks run.
function M._done(token, r)
  local part = windows[token]
  if not part then return end
  windows[token] = nil
  if part.timer then part.timer:close() end
  if part.obs and not part.obs.closed then part.obs:close() end
  local h = part.handle
  local by_kind = {}
  for id, n in pairs(r.by_kind) do
    local k = registry.kind_by_id(id)
    by_kind[k and k.name or tostring(id)] = n
  end
  uv = uv or require "luv"
  local w = { source = part.source, pid = part.pid, file = r.file, records = r.records,
    batches = r.batches, dropped = r.dropped, by_kind = by_kind, error = r.error,
    ms = uv.now() - part.t0, traced_ms = r.agent_ms or r.monitor_ms,
    traced_by = r.agent_ms and "agent" or r.monitor_ms and "monitor" or nil, select = h.spec }
  h.results[#h.results + 1] = w
  if h.done then
    local ok, err = xpcall(h.done, debug.traceback, w)
    if not ok then report("window done callback", err) end
  end
  run_hooks(hooks.window, "window hook", w)
end

--- Widens what a live process traces for a while, then narrows it back. opts:
---   select = { kind = { "field", ... } | "all", ... }  the extra kinds and fields (required)
---   ms = n        how long the window lasts (required; handle:close() ends it sooner)
---   pid = n       the process (default: every live process, one window each)
---   record = "f"  also write the window's records to a new capture per process ("%p" is the
---                 pid; without it the pid goes before the extension, as each window writes a
---                 file of its own; created new, mode 0600, never through a link)
---   force = true  replace an existing regular file
---   fn = f(b)     an observer of the window's extra selection, called for its batches
---   done = f(w)   called when a process's window closes (also the "window" event)
--- w: source, pid, file, records, batches, dropped, by_kind (kind name -> records), ms, select,
--- error (when a fence failed or the process ended first). The window holds exactly the records
--- that arrived between two sync flushes, at its start and at its end. Returns a handle with
--- :close() and results (the w of each process once closed), or nil, err, name.
function M.window(opts)
  check_opts("cuptimon.window", opts, "done, fn, force, ms, pid, record, select")
  local spec = selection_text(opts.select)
  check_ms("cuptimon.window", "ms", opts.ms)
  if opts.ms == 0 then error("cuptimon.window: ms must be at least 1", 2) end
  if opts.pid ~= nil and (type(opts.pid) ~= "number" or opts.pid ~= math.floor(opts.pid)) then
    error(("cuptimon.window: pid must be an integer, got %s"):format(tostring(opts.pid)), 2)
  end
  if opts.record ~= nil and (type(opts.record) ~= "string" or opts.record == "") then
    error("cuptimon.window: record must be a file name such as \"spike.%p.cmcap\"", 2)
  end
  for _, k in ipairs { "fn", "done" } do
    if opts[k] ~= nil and type(opts[k]) ~= "function" then
      error(("cuptimon.window: %s must be a function, got a %s"):format(k, type(opts[k])), 2)
    end
  end
  local h = setmetatable({ spec = spec, ms = opts.ms, parts = {}, results = {}, done = opts.done },
    Window)
  if core.check_mode() then return h end
  local list, lerr, lname = live_sources("cuptimon.window", opts.pid)
  if not list then return nil, lerr, lname end
  uv = uv or require "luv"
  local function start()
    for _, s in ipairs(list) do
      next_window = next_window + 1
      local token = next_window
      local ok, err, name = core.window_begin(s.source, opts.record, opts.force and true or false,
        token)
      if not ok then
        h:close()
        return nil, err, name
      end
      local part = { handle = h, source = s.source, pid = s.pid, t0 = uv.now() }
      windows[token] = part
      h.parts[#h.parts + 1] = part
      local o = setmetatable({ spec = spec, fn = opts.fn or function() end, closed = false,
        batches = 0 }, Observer)
      local id
      id, err, name = core.observe(spec, s.source)
      if not id then
        h:close()
        return nil, err, name
      end
      o.id = id
      observers[id] = o
      part.obs = o
      part.timer = cm.after(opts.ms, function() window_end(part) end)
    end
    return h
  end
  return now_or_later("deferred window", h, start)
end

return M
