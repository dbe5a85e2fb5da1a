-- cuptimon: the Lua API of the cuptimon monitor.
--
--   local cm = require "cuptimon"
--   local h = cm.hist()
--   cm.observe({ kernel = { "start", "stop" } }, function(b)
--     local start, stop = b.start, b.stop
--     for i = 0, b.n - 1 do h:add(tonumber(stop[i] - start[i])) end
--   end)
--   cm.on("exit", function() print(h) end)
--
-- Design note. This module is the Lua half of the host (engine/host). The host calls two
-- functions registered here: the dispatcher, once per batch with (batch pointer, source id,
-- observer id), and the event function for everything else (exit, process_start, process_exit,
-- flush_done, deferred, error, and api: subscriber callbacks queued by engine/host/apicb.c).
-- Requests that would deliver batches (observe, close, flush) go through the cuptimon.core
-- lua_CFunctions, never the FFI; made from inside an observer callback they are deferred to the
-- next loop iteration, because the engine is mid-delivery then.
--
-- The correlation functions, API callbacks, trigger windows, the record-rate budget, the lag notes
-- and duty cycles are modules of their own (cuptimon.corr, .apicb, .window, .budget, .lag,
-- .duty), re-exported here: this module keeps the public surface, the observers, the hooks and the
-- host's two entry points ("the parts", below).
--
-- Errors follow luv: misuse (an unknown kind or field, a wrong type) raises error(msg, 2) naming
-- the valid choices; a failure at run time returns nil, "ENAME: detail", "ENAME".
local ffi = require "ffi"
local bit = require "bit"
local core = require "cuptimon.core"
local cdef = require "cuptimon.cdef"
local registry = require "cuptimon.registry"
local batch = require "cuptimon.batch"
local agg = require "cuptimon.agg"
local pm = require "cuptimon.pm"
local corr = require "cuptimon.corr"
local apicb = require "cuptimon.apicb"
local window = require "cuptimon.window"
local budget = require "cuptimon.budget"
local lag = require "cuptimon.lag"
local duty = require "cuptimon.duty"

local C = ffi.C

local M = {}

local host = ffi.cast("cm_host *", core.host())
batch.init(host, function(name, full) return M.kernel_name(name, full) end)

M.version = ffi.string(C.cm_version())
M.registry = registry
M.cdef = cdef

-- Aggregations, re-exported: cm.count(), cm.hist(), ...
for name, fn in pairs(agg.constructors) do M[name] = fn end
M.agg = agg

local observers = {}      -- observer id -> handle
local hooks = { process_start = {}, process_exit = {}, exit = {}, error = {}, window = {},
  shed = {}, restore = {} }
local flush_done = {}     -- token -> done function
local next_token = 0
local deferred = {}       -- functions to run on the next loop iteration

local function later(fn)
  deferred[#deferred + 1] = fn
  core.defer()
end

-- Every failure caught on the Lua side goes to the host's one reporting function
-- (cm__host_report, engine/host/host.c): counted, handed to the "error" hooks (or printed when
-- there are none), and making the exit status non-zero. Failures this module does not catch reach
-- the same function in C.
-- An exit request (cuptimon.args) goes as it is: the host prints its message and takes its status.
local function report(where, msg)
  local exit_request = type(msg) == "table" and type(rawget(msg, "exit_status")) == "number"
  core.report(exit_request and msg or tostring(msg), where)
end

-- Calls every hook of an event; one failing hook does not stop the others.
local function run_hooks(list, where, ...)
  for i = 1, #list do
    local ok, err = xpcall(list[i], debug.traceback, ...)
    if not ok then report(where, err) end
  end
end

---------------------------------------------------------------------------------------------------
-- observers

local Observer = {}
Observer.__index = Observer

--- Stops the observer. Its pending records are delivered to it first (unless it is closed from
--- inside a callback: then nothing more reaches it and the engine is told on the next iteration).
--- Idempotent. Returns true, or nil, err.
function Observer:close()
  if self.closed then return true end
  self.closed = true
  local id = self.id
  if not id then return true end -- a deferred observe that never registered
  if core.in_dispatch() then
    later(function()
      core.unobserve(id)
      observers[id] = nil
    end)
    return true
  end
  local ok, err, name = core.unobserve(id)
  observers[id] = nil
  if not ok then return nil, err, name end
  return true
end

function Observer:is_active() return not self.closed and self.id ~= nil end

function Observer:__tostring()
  return ("observer(%s%s)"):format(self.spec, self.closed and ", closed" or "")
end

local function valid_kinds()
  return table.concat(registry.kind_names(), ", ")
end

-- Validates a selection table and returns its text form. Raises (level 3: the caller of observe).
local function selection_text(sel)
  if type(sel) ~= "table" then
    error(("cuptimon.observe: the selection must be a table such as "
      .. "{ kernel = { \"name\", \"start\" }, memcpy = \"all\" }, got a %s"):format(type(sel)), 3)
  end
  local parts = {}
  for kname, fields in pairs(sel) do
    if type(kname) ~= "string" then
      error(("cuptimon.observe: selection keys must be kind names, got a %s key; valid kinds: %s")
        :format(type(kname), valid_kinds()), 3)
    end
    local kind = registry.kind(kname)
    if not kind then
      error(("cuptimon.observe: unknown kind %q; valid kinds: %s"):format(kname, valid_kinds()), 3)
    end
    local list
    if fields == "all" or fields == true then
      list = "all"
    else
      if type(fields) == "string" then fields = { fields } end
      if type(fields) ~= "table" or #fields == 0 then
        error(("cuptimon.observe: the fields of kind %q must be a non-empty list of names or "
          .. "\"all\", got %s"):format(kname, type(fields) == "table" and "an empty table"
          or "a " .. type(fields)), 3)
      end
      local names = {}
      for i = 1, #fields do
        local f = fields[i]
        if type(f) ~= "string" then
          error(("cuptimon.observe: field %d of kind %q must be a string, got a %s")
            :format(i, kname, type(f)), 3)
        end
        if not kind.by_name[f] then
          error(("cuptimon.observe: unknown field %q of kind %q; valid fields: %s")
            :format(f, kname, table.concat(registry.field_names(kind), ", ")), 3)
        end
        names[#names + 1] = f
      end
      list = table.concat(names, ",")
    end
    parts[#parts + 1] = kname .. ":" .. list
  end
  if #parts == 0 then
    error("cuptimon.observe: the selection is empty; name at least one kind: " .. valid_kinds(), 3)
  end
  table.sort(parts)
  return table.concat(parts, ";")
end

-- Runs fn() now and returns what it returns; inside an observer callback (the engine is
-- mid-delivery) runs it on the next loop iteration instead, reports its failure as `where`, and
-- returns `handle` at once.
local function now_or_later(where, handle, fn)
  if not core.in_dispatch() then return fn() end
  later(function()
    local ok, err = fn()
    if not ok then report(where, err) end
  end)
  return handle
end

--- Observes the kinds and fields of `sel` and calls fn(batch) once per batch.
--- sel: { kind = { "field", ... } | "all", ... }. Returns an observer handle, or nil, err.
function M.observe(sel, fn)
  local spec = selection_text(sel)
  if type(fn) ~= "function" then
    error(("cuptimon.observe: argument 2 must be a function(batch), got a %s"):format(type(fn)), 2)
  end
  local o = setmetatable({ spec = spec, fn = fn, closed = false, batches = 0 }, Observer)
  local function register()
    if o.closed then return true end
    local id, err, name = core.observe(spec)
    if not id then return nil, err, name end
    o.id = id
    observers[id] = o
    return o
  end
  return now_or_later("deferred observe", o, register)
end

-- The dispatcher: the host calls it once per batch, under pcall with a traceback.
local function dispatch(p, source, obs)
  local o = observers[obs]
  if o == nil or o.closed then return end
  o.batches = o.batches + 1
  o.fn(batch.wrap(p, source))
end

---------------------------------------------------------------------------------------------------
-- PM sampling (cuptimon.pm)

pm.apply = function(spec) return core.pm(spec) end
pm.observe = M.observe

--- Samples GPU performance counters: cm.pm_sample{ metrics = { "sm__cycles_active.avg", ... },
--- interval_us = 1000, device = 0, fn = function(rows) end }. Samples arrive as pm_sample
--- batches (alias "pm") for any observer of that kind; with fn, as rows of this request's
--- metrics (cuptimon.pm_rows). Returns a request with :close(), or nil, err. A metric the GPU
--- cannot sample, or a driver that restricts the counters to admin users, is reported with what
--- to do: at once for the in-process engine, through the run's errors for an agent.
M.pm_sample = pm.open
--- Pivots a pm_sample batch into one row per sample with a double column per metric.
M.pm_rows = pm.rows

---------------------------------------------------------------------------------------------------
-- cadences, flushes, hooks

local function check_ms(fname, what, v, optional)
  if v == nil and optional then return end
  if type(v) ~= "number" or v < 0 or v ~= math.floor(v) then
    error(("%s: %s must be a non-negative integer number of milliseconds, got %s")
      :format(fname, what, tostring(v)), 3)
  end
end

--- Sets the cadences: flush_ms (how often CUPTI buffers are flushed into the decoder) and
--- deliver_ms (how often decoded batches reach the observers). Returns true or nil, err.
function M.configure(opts)
  if type(opts) ~= "table" then
    error("cuptimon.configure: expected a table { flush_ms = n, deliver_ms = n }", 2)
  end
  for k in pairs(opts) do
    if k ~= "flush_ms" and k ~= "deliver_ms" then
      error(("cuptimon.configure: unknown option %q; valid options: deliver_ms, flush_ms")
        :format(tostring(k)), 2)
    end
  end
  check_ms("cuptimon.configure", "flush_ms", opts.flush_ms, true)
  check_ms("cuptimon.configure", "deliver_ms", opts.deliver_ms, true)
  return core.configure(opts.flush_ms or 0, opts.deliver_ms or 0)
end

-- Checks that an options table names only the options of `valid` (their names, ", "-separated,
-- in the error message too). Raises (level 3: the caller of the function that checks).
local function check_opts(fname, opts, valid)
  if type(opts) ~= "table" then
    error(("%s: expected a table of options (%s)"):format(fname, valid), 3)
  end
  for k in pairs(opts) do
    if type(k) ~= "string" or not (", " .. valid .. ","):find(", " .. k .. ",", 1, true) then
      error(("%s: unknown option %q; valid options: %s"):format(fname, tostring(k), valid), 3)
    end
  end
end

local uv -- luv, loaded on first use

--- Calls fn() every `ms` milliseconds (the first call after `ms`). Returns a handle with :close().
function M.every(ms, fn)
  check_ms("cuptimon.every", "the period", ms)
  if ms == 0 then error("cuptimon.every: the period must be at least 1 ms", 2) end
  if type(fn) ~= "function" then
    error(("cuptimon.every: argument 2 must be a function, got a %s"):format(type(fn)), 2)
  end
  uv = uv or require "luv"
  local t = uv.new_timer()
  t:start(ms, ms, fn)
  return setmetatable({ timer = t }, { __index = {
    close = function(self)
      if not self.timer:is_closing() then self.timer:close() end
      return true
    end,
  } })
end

--- Calls fn() once after `ms` milliseconds. Returns a handle with :close().
function M.after(ms, fn)
  check_ms("cuptimon.after", "the delay", ms)
  if type(fn) ~= "function" then
    error(("cuptimon.after: argument 2 must be a function, got a %s"):format(type(fn)), 2)
  end
  uv = uv or require "luv"
  local t = uv.new_timer()
  t:start(ms, 0, function()
    t:close()
    fn()
  end)
  return { close = function() if not t:is_closing() then t:close() end return true end }
end

--- Flushes every source. opts: sync (every record produced before the call is delivered),
--- timeout_ms, done(ok, err) called once the window is delivered. Returns true or nil, err.
--- For the in-process engine the batches are delivered before flush returns.
function M.flush(opts)
  opts = opts or {}
  if type(opts) ~= "table" then
    error("cuptimon.flush: expected a table { sync = bool, timeout_ms = n, done = fn }", 2)
  end
  check_ms("cuptimon.flush", "timeout_ms", opts.timeout_ms, true)
  if opts.done ~= nil and type(opts.done) ~= "function" then
    error(("cuptimon.flush: done must be a function, got a %s"):format(type(opts.done)), 2)
  end
  local token = 0
  if opts.done then
    next_token = next_token + 1
    token = next_token
    flush_done[token] = opts.done
  end
  if core.in_dispatch() then
    later(function()
      local ok, err = core.flush(opts.sync and true or false, opts.timeout_ms or 0, token)
      if not ok then report("deferred flush", err) end
    end)
    return true
  end
  return core.flush(opts.sync and true or false, opts.timeout_ms or 0, token)
end

--- Registers a hook: "process_start" fn(p) and "process_exit" fn(p), "exit" fn() when the
--- script ends (after the final flush), "error" fn(msg, where) when the script or one of its
--- callbacks fails (instead of printing it; the error still counts in cm.errors() and makes the
--- exit status non-zero), "window" fn(w) when a trigger window closes (cm.window), "shed" and
--- "restore" fn(ev) when a record-rate budget sheds or restores a kind (cm.budget). p: source,
--- pid, ppid, host, exe, argv, devices ({index=, name=}), env
--- ({ RANK = "1", ... }: a distributed job's RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE),
--- kind ("inproc", "agent", "replay"); at exit also status ("exit", "disconnected", "error", "timeout",
--- "detached"), exit_code (from the agent's BYE), message, stats (the agent's counters) and
--- what the process lost, in records: dropped (all of it) = dropped_cupti + dropped_agent +
--- dropped_exit + lost_wire; received, produced (received + dropped), lost_frames, incomplete
--- (1 when the final counts never arrived: the numbers are a lower bound), last_number,
--- skipped_bytes (bytes of a capture skipped as corrupt; any makes the process incomplete); and
--- lag_peak_s, lag_decode_peak_ns, guard_shed (the kinds the agent's lag guard stopped tracing,
--- by name) and guard_lag_s (cm.stats()).
function M.on(event, fn)
  local list = hooks[event]
  if not list then
    error(("cuptimon.on: unknown event %q; valid events: error, exit, process_exit, "
      .. "process_start, restore, shed, window"):format(tostring(event)), 2)
  end
  if type(fn) ~= "function" then
    error(("cuptimon.on: argument 2 must be a function, got a %s"):format(type(fn)), 2)
  end
  list[#list + 1] = fn
  if event == "process_start" then
    -- Sources attached before the hook: the hook sees them too.
    for _, s in ipairs(core.sources()) do
      local ok, err = xpcall(fn, debug.traceback, s)
      if not ok then report("process_start", err) end
    end
  end
  return fn
end

-- How long cm.exit() waits for the live processes to deliver what they hold (as a detach does).
local EXIT_FLUSH_MS = 5000
local exiting -- the status of a cm.exit() whose delivery flush is under way, else nil
local ending = false -- the exit hooks run: the final flush is done, nothing more is delivered

--- Ends the script: every live process (`-- cmd`, --attach) first delivers the records it holds
--- (a sync flush of at most 5 s: what the records produced before the call need to reach the
--- observers), then the final flush, the exit hooks, and the host exits with `status`. The loop
--- goes on meanwhile, so the observers see those records; a process that does not answer in time
--- has its loss counted as usual. Without live processes (a replay, the in-process engine, while
--- the script loads, or from an exit hook: the status of the run is then `status`) the exit
--- comes at once. A second call while the flush runs changes
--- nothing: the first status holds.
function M.exit(status)
  if status ~= nil and type(status) ~= "number" then
    error("cuptimon.exit: the status must be a number", 2)
  end
  status = status or 0
  if exiting ~= nil then return end
  local live = false
  if not core.check_mode() and not ending then
    for _, s in ipairs(core.sources()) do live = live or s.kind == "agent" end
  end
  if not live then return core.exit(status) end
  exiting = status
  local ok = M.flush { sync = true, timeout_ms = EXIT_FLUSH_MS, done = function()
    core.exit(status)
  end }
  if not ok then core.exit(status) end
end

local stats_cell = ffi.new("cm_stats")
local stat_names = {
  "buffers_allocated", "buffers_outstanding", "buffers_free", "buffers_decoded",
  "buffers_refused", "bytes_decoded", "records_decoded", "records_delivered", "records_dropped",
  "decode_queue_depth", "decode_queue_peak", "drains", "fences", "fence_timeouts", "sessions",
  "strings", "lag_cupti_ns", "lag_decode_ns", "lag_decode_peak_ns", "decode_wait_ns",
  "lag_recv_ns", "lag_recv_peak_ns", "backlog_records", "send_wait_ns", "send_wait_peak_ns",
  "lag_held_ns", "cupti_detaches", "cupti_detach_ns", "cupti_attach_ns", "kind_changes",
  "kind_change_ns", "kind_change_max_ns", "cupti_idle_mode",
}

--- The counters of one source, or of every source of the run summed (source omitted or 0; the
--- processes that already exited included), as a table of numbers with records_by_kind keyed by
--- kind name, and the losses in records: dropped (every record lost, also records_dropped) =
--- dropped_cupti + dropped_agent + dropped_exit + lost_wire, received, produced, lost_frames,
--- incomplete (sources whose final counts never arrived), last_number, skipped_bytes (corrupt
--- capture bytes skipped). The lag: lag_s and
--- lag_peak_s (how far behind the records the script's view is: a batch's arrival less its newest
--- record start, now and at its peak; the largest over sources for the sum), backlog_records (the
--- records the agent had decoded and not yet sent at its last STATS), and by stage, in ns:
--- lag_cupti_ns (the timestamp of the kind most behind in a buffer to CUPTI completing the
--- buffer), lag_decode_ns and
--- lag_decode_peak_ns (to the agent's decoder), decode_wait_ns, send_wait_ns and
--- send_wait_peak_ns (the agent's decode and send queues), lag_recv_ns and lag_recv_peak_ns (to
--- the monitor), lag_held_ns (the longest CUPTI held a record back before writing it, over the
--- buffers of the agent's last lag-guard check), and guard_shed (the kinds, by name, that the agent's lag guard had CUPTI stop
--- writing because CUPTI fell more than CUPTIMON_GUARD_LAG_MS behind; docs/agent.md) with
--- guard_lag_s (CUPTI's lag when it last did). cupti_detaches, cupti_detach_ns and
--- cupti_attach_ns: how often the agent detached CUPTI while nothing was traced
--- (CUPTIMON_DETACH_IDLE), and the time detaching and attaching again took, summed;
--- cupti_idle_mode, what the agent leaves CUPTI in while nothing is traced (1 detached, 2 and up
--- attached, for the reason cm.idle_mode_text gives; 0 unknown).
--- kind_changes, kind_change_ns and kind_change_max_ns: how often the kinds enabled in CUPTI
--- changed (a window's or duty window's opening and closing, an observer's kinds, the lag guard's
--- sheds), and the time CUPTI's enable and disable calls took, summed and the longest (the
--- largest over sources for the sum). Returns nil, err for an unknown source.
function M.stats(source)
  if source ~= nil and type(source) ~= "number" then
    error("cuptimon.stats: the source must be a number", 2)
  end
  local rc = C.cm_host_source_stats(host, source or 0, stats_cell)
  if rc ~= 0 then
    local name = ffi.string(C.cm_err_name(rc))
    return nil, name .. ": " .. ffi.string(C.cm_strerror(rc)), name
  end
  local t = { records_by_kind = {} }
  for _, k in ipairs(stat_names) do t[k] = tonumber(stats_cell[k]) end
  for k, v in pairs(core.loss(source or 0) or {}) do t[k] = v end
  t.lag_s, t.lag_peak_s = t.lag_recv_ns / 1e9, t.lag_recv_peak_ns / 1e9
  -- The kinds the agent's lag guard had CUPTI stop writing, by name, and CUPTI's lag then.
  t.guard_shed, t.guard_lag_s = {}, tonumber(stats_cell.guard_lag_ns) / 1e9
  local gs = stats_cell.guard_shed
  for _, name in ipairs(registry.kind_names()) do
    local id = registry.kind(name).id
    if id < 64 and bit.band(bit.rshift(gs, id), 1ULL) ~= 0ULL then t.guard_shed[#t.guard_shed + 1] = name end
  end
  for _, name in ipairs(registry.kind_names()) do
    local n = tonumber(stats_cell.records_by_kind[registry.kind(name).id])
    if n > 0 then t.records_by_kind[name] = n end
  end
  budget._stats(t, source)
  return t
end

local idle_modes = {
  [1] = "detached between windows",
  [2] = "stayed attached between windows: CUPTIMON_DETACH_IDLE=0",
  [3] = "stayed attached between windows: attaching CUPTI again after a detach outlasted its "
    .. "wait (the process's threads held CUPTI), so it is not detached again",
  [4] = "stayed attached between windows: NVTX calls enter CUPTI, which a detach would break",
  [5] = "stayed attached between windows: this libcupti cannot detach (no cuptiFinalize, or PM "
    .. "sampling used its profiler)",
  [6] = "stayed attached between windows: a cuptiFinalize outlasted its deadline",
  [7] = "stayed attached between windows: too many of its threads called CUDA at once for CUPTI "
    .. "to attach again after a detach",
  [8] = "stayed attached between windows: it uses CUDA graphs, whose launches a detach and a "
    .. "new subscription would break",
}

--- What a process's CUPTI did while nothing was traced, as a sentence fragment ("detached
--- between windows", "stayed attached between windows: REASON"), from cm.stats(source)'s
--- cupti_idle_mode; nil when unknown (0).
function M.idle_mode_text(mode)
  return idle_modes[mode]
end

--- The attached sources: { { source=, pid=, kind=, host=, exe=, argv=, devices= }, ... }.
function M.sources() return core.sources() end

--- The process table of source `id` (a batch's b.source), also after the process exited; nil
--- for an unknown source. live agents, captures and the in-process engine give the same shape.
function M.process(id)
  local p = batch.processes[id]
  if p then return p end
  for _, s in ipairs(core.sources()) do
    if s.source == id then
      batch.processes[id] = s
      return s
    end
  end
  return nil
end

--- The one line that names a process above a recipe's table: "pid 4242 (/usr/bin/python3)",
--- with ", rank 1" when its RANK environment variable is set. `p`: a process table (cm.process,
--- b:process()), or nil for an unknown one.
function M.process_title(p)
  p = p or {}
  return ("pid %d (%s)%s"):format(p.pid or 0, p.exe or "?",
    p.env and p.env.RANK and ", rank " .. p.env.RANK or "")
end

--- Whether the host only checks the script (cuptimon-lua --check).
function M.checking() return core.check_mode() end

--- Whether the run's command (`-- cmd`) could not be started (not found, or not executable):
--- cuptimon-lua has printed the one-line error and exits 127 or 126. A recipe's exit hook then
--- returns at once, so that no empty table or "no kernels" note follows the error. False for a
--- replay, --attach, an embedding host, and a command that ran (whatever its status).
function M.command_failed() return core.command_failed() end

--- The number of errors reported so far (the script's, its callbacks' and its hooks').
function M.errors() return (core.errors()) end

--- Reports a failure the script handled itself (an output it could not write, say) as the host
--- reports an uncaught one: counted in cm.errors(), which makes a run's status of 0 become 1,
--- and handed to the "error" hooks, or else printed on stderr as "cuptimon: error in WHERE: MSG".
function M.report(where, msg)
  if type(where) ~= "string" then error("cuptimon.report: where must be a string", 2) end
  report(where, msg)
end

--- The string `id` of a source's string table (the batch method b:str is the usual way).
M.string = batch.string

--- The demangled form of a C++ kernel name ("_Z9reduceSumPKfPfi" becomes
--- "reduceSum(float const*, float*, int)"); a name that is not mangled comes back unchanged.
function M.demangle(name)
  if type(name) ~= "string" then
    error(("cuptimon.demangle: expected a string, got %s"):format(type(name)), 2)
  end
  return core.demangle(name)
end

-- The index of the "(" that opens the trailing parameter list of a demangled name, or nil.
local function params_start(d)
  local i = #d
  if d:sub(i) ~= ")" then return nil end
  local depth = 0
  while i > 0 do
    local c = d:sub(i, i)
    if c == ")" then
      depth = depth + 1
    elseif c == "(" then
      depth = depth - 1
      if depth == 0 then return i end
    end
    i = i - 1
  end
  return nil
end

--- A kernel name for tables: demangled, without its parameter list and return type
--- ("_Z14cm_demo_matmulILi16EEvPKfS1_Pfiiibbf" becomes "cm_demo_matmul<16>"). With `full`, the
--- whole demangled signature. A name that is not mangled comes back unchanged. In an observer,
--- b:kernel_name(i) gives it for record i, cached per source and string id.
function M.kernel_name(name, full)
  local d = M.demangle(name)
  if full or d == name then return d end
  local p = params_start(d)
  if p then d = d:sub(1, p - 1) end
  -- A return type ends at the last space outside template brackets.
  local depth, cut = 0, nil
  for i = 1, #d do
    local c = d:sub(i, i)
    if c == "<" then
      depth = depth + 1
    elseif c == ">" then
      depth = depth - 1
    elseif c == " " and depth == 0 then
      cut = i
    end
  end
  if cut then d = d:sub(cut + 1) end
  return d
end

---------------------------------------------------------------------------------------------------
-- the parts: external correlation (cuptimon.corr), API callbacks (cuptimon.apicb), trigger
-- windows (cuptimon.window), the record-rate budget (cuptimon.budget), the lag notes
-- (cuptimon.lag) and duty cycles (cuptimon.duty)
--
-- Each is a module of its own that this one re-exports: every field of a part whose name does not
-- start with "_" becomes a field of cuptimon. A part never requires this module (that would be a
-- cycle): what it needs from it comes through its _setup, the public table (whose functions a
-- script may replace, so a part calls them through it) and `shared` below. This module calls the
-- parts' internal functions (_drain, _done, ...) from its event function.

-- What the parts share with this module.
local shared = { report = report, run_hooks = run_hooks, hooks = hooks, later = later,
  now_or_later = now_or_later, selection_text = selection_text, valid_kinds = valid_kinds,
  check_ms = check_ms, check_opts = check_opts, Observer = Observer, observers = observers }

for _, part in ipairs { corr, apicb, window, budget, lag, duty } do
  if part._setup then part._setup(M, shared) end
  for k, v in pairs(part) do
    if k:sub(1, 1) ~= "_" then M[k] = v end
  end
end

---------------------------------------------------------------------------------------------------
-- events from the host

local function event(name, a, b)
  if name == "deferred" then
    local list = deferred
    deferred = {}
    for i = 1, #list do
      local ok, err = xpcall(list[i], debug.traceback)
      if not ok then report("deferred call", err) end
    end
  elseif name == "flush_done" then
    local fn = flush_done[a]
    flush_done[a] = nil
    if fn then
      local ok, err = xpcall(fn, debug.traceback, b == nil, b)
      if not ok then report("flush done callback", err) end
    end
  elseif name == "error" then
    local list = hooks.error
    if #list == 0 then return false end
    run_hooks(list, "error hook", a, b)
    return true
  elseif name == "api" then
    apicb._drain()
  elseif name == "window_done" then
    window._done(a, b)
  elseif name == "exit" then
    apicb._finish() -- the last API callbacks reach the script before its exit hooks
    -- The run ended (the command exited) before a cm.exit()'s flush completed: its status holds.
    if exiting ~= nil then core.exit(exiting) end
    ending = true
    run_hooks(hooks.exit, "exit hook")
  elseif name == "process_start" then
    batch.processes[a.source] = a
    duty._process_start(a)
    run_hooks(hooks.process_start, "process_start hook", a)
  elseif name == "process_exit" then
    batch.forget(a.source)
    -- The peak lag of the process's life, next to its losses.
    lag._process_exit(a)
    -- The exit table carries the start fields too (describe fills both), so it replaces them.
    batch.processes[a.source] = a
    duty._process_exit(a)
    run_hooks(hooks.process_exit, "process_exit hook", a)
  end
end

core.register(dispatch, event)

return M
