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
  M._budget_stats(t, source)
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
-- external correlation and metadata (engine/include/cuptimon.h, "external correlation")
--
-- These act on THIS process's CUDA work only: the stacks are per thread of the process that
-- calls them (the monitor itself, or a program embedding the host with the in-process engine).
-- They do not reach the processes of `-- cmd` or a replay; a framework there calls the C API.

local u64_cell = ffi.new("uint64_t[1]")

local function fail(rc)
  local name = ffi.string(C.cm_err_name(rc))
  local msg = ffi.string(C.cm_errmsg())
  if msg == "" then msg = ffi.string(C.cm_strerror(rc)) end
  return nil, name .. ": " .. msg, name
end

-- Validates an id argument (a positive integer number, or a uint64 cdata); raises at level 3.
local function check_id(fname, id, zero_ok)
  if type(id) == "number" then
    if id == math.floor(id) and (id > 0 or (zero_ok and id == 0)) and id < 2 ^ 53 then return id end
  elseif type(id) == "cdata" and ffi.istype("uint64_t", id) and (zero_ok or id ~= 0) then
    return id
  end
  error(("%s: the id must be a positive integer%s, got %s"):format(fname,
    zero_ok and " (or 0 for the current id)" or "", tostring(id)), 3)
end

-- A 64-bit id as a Lua number (ids come from a counter, so they stay below 2^53).
local function id_number(v) return tonumber(v) end

--- Pushes an external correlation id on the calling thread: a new process-unique one, or `id`.
--- Returns the id, or nil, err, name (ERANGE past CM_CORR_MAX_DEPTH frames).
function M.corr_push(id)
  if id == nil then
    local v = C.cm_corr_push()
    if v == 0 then return fail(C.cm_corr_depth() >= 256 and C.CM_ERANGE or C.CM_ENOMEM) end
    return id_number(v)
  end
  id = check_id("cuptimon.corr_push", id)
  local rc = C.cm_corr_push_id(id)
  if rc ~= 0 then return fail(rc) end
  return id_number(id)
end

--- Pops the calling thread's innermost id and returns it; nil, "ENOENT: ...", "ENOENT" when
--- nothing is pushed.
function M.corr_pop()
  local rc = C.cm_corr_pop(u64_cell)
  if rc ~= 0 then return fail(rc) end
  return id_number(u64_cell[0])
end

--- The id the calling thread's work is tagged with now, or 0.
function M.corr_current() return id_number(C.cm_corr_current()) end

--- The number of ids pushed on the calling thread.
function M.corr_depth() return C.cm_corr_depth() end

local chain_buf = ffi.new("uint64_t[256]") -- CM_CORR_MAX_DEPTH

--- The chain of `id`, innermost first ({ id, enclosing, ..., outermost }); {} when the id is
--- unknown or retired (two drains after its pop).
function M.corr_chain(id)
  id = check_id("cuptimon.corr_chain", id)
  local n = C.cm_corr_chain(id, chain_buf, 256)
  local t = {}
  for i = 0, math.min(n, 256) - 1 do t[i + 1] = id_number(chain_buf[i]) end
  return t
end

-- A column argument of corr_join as a `ctype` array of n: a cdata array or pointer (a batch
-- column, read from index 0) or a Lua list (read from index 1).
local function as_array(fname, what, v, ctype, n)
  local arr = ffi.new(ctype .. "[?]", math.max(n, 1))
  if type(v) == "table" then
    for i = 0, n - 1 do arr[i] = v[i + 1] or 0 end
  elseif type(v) == "cdata" then
    for i = 0, n - 1 do arr[i] = v[i] end
  else
    error(("%s: %s must be a column (a batch's cdata column or a Lua list), got %s")
      :format(fname, what, type(v) == "nil" and "nothing" or "a " .. type(v)), 3)
  end
  return arr
end

-- The arguments of corr_join(ec, rows) as C arrays. `ec` has the columns of an
-- external_correlation batch (external_id and correlation; external_kind optional, and when
-- present only the engine's own kind counts), `rows` a correlation column; both carry n. A batch
-- has that shape; so does a plain table of Lua lists.
local function join_args(fname, ec, rows)
  for i, v in ipairs({ ec, rows }) do
    if type(v) ~= "table" then
      error(("%s: argument %d must be a batch or a table { correlation = col, n = n%s }, got a %s")
        :format(fname, i, i == 1 and ", external_id = col, external_kind = col (optional)" or "",
        type(v)), 3)
    end
    if type(rawget(v, "n")) ~= "number" then
      error(("%s: argument %d has no row count n"):format(fname, i), 3)
    end
  end
  local n_ec, n = rawget(ec, "n"), rawget(rows, "n")
  local kind = rawget(ec, "external_kind")
  return kind and as_array(fname, "external_kind", kind, "uint32_t", n_ec) or nil,
    as_array(fname, "external_id", rawget(ec, "external_id"), "uint64_t", n_ec),
    as_array(fname, "the external_correlation correlation", rawget(ec, "correlation"),
      "uint32_t", n_ec), n_ec,
    as_array(fname, "correlation", rawget(rows, "correlation"), "uint32_t", n), n
end

--- For each row of `rows` (a batch with a correlation column, or { correlation = list, n = n }),
--- the external id its API call was tagged with, or 0, from `ec` (an external_correlation batch
--- with external_id and correlation, or the same as a table of lists). Returns a uint64_t cdata
--- array indexed like the batch's columns (row i at [i], from 0), or nil, err, name.
function M.corr_join(ec, rows)
  local kind, ext, ecc, n_ec, corr, n = join_args("cuptimon.corr_join", ec, rows)
  local out = ffi.new("uint64_t[?]", math.max(n, 1))
  local rc = C.cm_corr_join(kind, ext, ecc, n_ec, corr, n, out)
  if rc ~= 0 then return fail(rc) end
  return out
end

--- Like corr_join, but each row's whole chain: returns a table t with t[i] (i from 0, as the
--- batch's rows) the list of ids innermost first ({} when untagged), or nil, err, name.
function M.corr_join_chains(ec, rows)
  local kind, ext, ecc, n_ec, corr, n = join_args("cuptimon.corr_join_chains", ec, rows)
  local offsets = ffi.new("uint32_t[?]", n + 1)
  local need = C.cm_corr_join_chains(kind, ext, ecc, n_ec, corr, n, offsets, nil, 0)
  if need < 0 then return fail(tonumber(need)) end
  local ids = ffi.new("uint64_t[?]", math.max(tonumber(need), 1))
  need = C.cm_corr_join_chains(kind, ext, ecc, n_ec, corr, n, offsets, ids, need)
  if need < 0 then return fail(tonumber(need)) end
  local t = {}
  for i = 0, n - 1 do
    local c = {}
    for j = offsets[i], offsets[i + 1] - 1 do c[#c + 1] = id_number(ids[j]) end
    t[i] = c
  end
  return t
end

--- Attaches a JSON blob to `id` (0 or nil: the current id); blobs on one id merge, objects key
--- by key. Returns true, or nil, err, name (EINVAL with the byte offset for invalid JSON,
--- ENOENT for id 0 with nothing pushed).
function M.corr_metadata_put(id, json)
  id = check_id("cuptimon.corr_metadata_put", id or 0, true)
  if type(json) ~= "string" then
    error(("cuptimon.corr_metadata_put: argument 2 must be a JSON string, got a %s")
      :format(type(json)), 2)
  end
  local rc = C.cm_corr_metadata_put(id, json, #json)
  if rc ~= 0 then return fail(rc) end
  return true
end

local take_ptr, take_len = ffi.new("char *[1]"), ffi.new("size_t[1]")

--- Moves out every blob put since the last take as one JSON object text, {"<id>": blob, ...}
--- ("{}" when none). Returns the text, or nil, err, name.
function M.corr_metadata_take()
  local rc = C.cm_corr_metadata_take(take_ptr, take_len)
  if rc ~= 0 then return fail(rc) end
  local s = ffi.string(take_ptr[0], take_len[0])
  C.cm_free(take_ptr[0])
  take_ptr[0] = nil
  return s
end

---------------------------------------------------------------------------------------------------
-- API callbacks (the in-process engine's subscriber callbacks, apicb.c)

local RUNTIME_DOMAIN = 2 -- CUPTI_CB_DOMAIN_RUNTIME_API
local api_subs = {}      -- subscription id -> { fn =, name =, handle = }
local api_counts = { queued = 0, dropped = 0, delivered = 0 }
local api_sites = { enter = 1, exit = 2, both = 3 }
local runtime_ids        -- runtime API name -> { cbid, ... }, built on first use
local api_used = false   -- whether on_api ever subscribed (else there is no queue to drain)

local function runtime_cbids(name)
  if not runtime_ids then
    runtime_ids = {}
    for id, n in pairs(require("cuptimon.cbid").runtime) do
      local list = runtime_ids[n] or {}
      list[#list + 1] = id
      table.sort(list)
      runtime_ids[n] = list
    end
  end
  return runtime_ids[name]
end

-- Takes the queued events and calls their functions, oldest first.
local function api_drain()
  if not api_used then return end
  local events, queued, dropped = core.api_take()
  if not events then return end
  api_counts.queued, api_counts.dropped = queued, dropped
  for i = 1, #events do
    local ev = events[i]
    local s = api_subs[ev.sub]
    if s and not s.handle.closed then
      ev.sub = nil
      ev.name = s.name
      api_counts.delivered = api_counts.delivered + 1
      local ok, err = xpcall(s.fn, debug.traceback, ev)
      if not ok then report("api callback", err) end
    end
  end
end

local ApiHandle = {}
ApiHandle.__index = ApiHandle

--- Stops the callback: no event queued after this reaches fn. Idempotent. Returns true or
--- nil, err, name.
function ApiHandle:close()
  if self.closed then return true end
  self.closed = true
  for _, id in ipairs(self.subs) do
    api_subs[id] = nil
    local ok, err, name = core.api_remove(id)
    if not ok then return nil, err, name end
  end
  return true
end

function ApiHandle:__tostring()
  return ("api_callback(%s%s)"):format(self.name, self.closed and ", closed" or "")
end

--- Calls fn(ev) for every call of the CUDA runtime function `name` ("cudaLaunchKernel", as in
--- cuptimon.cbid; or a runtime cbid number) made by THIS process (the in-process engine).
--- opts.site: "enter" (the default), "exit" or "both". ev: name, cbid, domain, site ("enter" or
--- "exit"), correlation (CUPTI's correlation id, as in the records' correlation column), tid
--- (the calling thread), time (CLOCK_REALTIME ns, as a double). The CUDA call never waits on
--- Lua: the event is queued (at most 4096 waiting; more are dropped and counted in
--- cm.api_stats()) and fn runs on the loop thread soon after. Returns a handle with :close(),
--- or nil, "ENOTSUP: ..." under `-- cmd` or --replay (the traced processes are remote).
function M.on_api(name, fn, opts)
  local cbids, label
  if type(name) == "number" then
    if name ~= math.floor(name) or name <= 0 then
      error(("cuptimon.on_api: a cbid must be a positive integer, got %s"):format(name), 2)
    end
    cbids, label = { name }, require("cuptimon.cbid").name(name)
  elseif type(name) == "string" then
    cbids, label = runtime_cbids(name), name
    if not cbids then
      local like = {}
      for n in pairs(runtime_ids) do
        if #like < 8 and n:lower():find(name:lower(), 1, true) then like[#like + 1] = n end
      end
      table.sort(like)
      error(("cuptimon.on_api: unknown CUDA runtime function %q; valid names are the runtime API "
        .. "names of cuptimon.cbid (cudaLaunchKernel, cudaMemcpyAsync, ...)%s"):format(name,
        #like > 0 and ("; similar: " .. table.concat(like, ", ")) or ""), 2)
    end
  else
    error(("cuptimon.on_api: argument 1 must be a CUDA runtime function name such as "
      .. "\"cudaLaunchKernel\", got a %s"):format(type(name)), 2)
  end
  if type(fn) ~= "function" then
    error(("cuptimon.on_api: argument 2 must be a function(ev), got a %s"):format(type(fn)), 2)
  end
  if opts ~= nil and type(opts) ~= "table" then
    error(("cuptimon.on_api: argument 3 must be a table { site = ... }, got a %s")
      :format(type(opts)), 2)
  end
  opts = opts or {}
  for k in pairs(opts) do
    if k ~= "site" then
      error(("cuptimon.on_api: unknown option %q; valid options: site"):format(tostring(k)), 2)
    end
  end
  local sites = api_sites[opts.site or "enter"]
  if not sites then
    error(("cuptimon.on_api: unknown site %q; valid sites: both, enter, exit")
      :format(tostring(opts.site)), 2)
  end
  local h = setmetatable({ name = label, subs = {}, closed = false }, ApiHandle)
  if core.check_mode() then return h end
  for _, cbid in ipairs(cbids) do
    local id, err, ename = core.api_add(RUNTIME_DOMAIN, cbid, sites)
    if not id then
      h:close()
      return nil, err, ename
    end
    api_used = true
    h.subs[#h.subs + 1] = id
    api_subs[id] = { fn = fn, name = label, handle = h }
  end
  return h
end

--- The API callback counters: queued (events queued by CUDA calls), dropped (lost because the
--- queue was full), delivered (calls of the scripts' functions).
function M.api_stats()
  api_drain()
  return { queued = api_counts.queued, dropped = api_counts.dropped,
    delivered = api_counts.delivered }
end

---------------------------------------------------------------------------------------------------
-- trigger windows and the record-rate budget (live processes: `-- cmd`)
--
-- Both change what a running agent traces by the same path as an observer does: the per-process
-- union selection, sent as a SELECT frame and applied by the agent as a minimal diff (enable the
-- new kinds and fields, disable the ones no longer wanted). A window is an observer bound to one
-- process (core.observe(spec, source)) between two sync flushes (core.window_begin/window_end:
-- hub.c counts, and may record, exactly the frames between the two fences); a budget removes
-- kinds from the union of one process (core.shed) whatever the observers select.

local windows = {}  -- token -> window part
local next_window = 0

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

local function window_done(token, r)
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
      part.timer = M.after(opts.ms, function() window_end(part) end)
    end
    return h
  end
  return now_or_later("deferred window", h, start)
end

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
        local cs = budget.lag_ms and M.stats(s.source)
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
  budget_timer = M.every(math.max(10, math.min(250, math.floor(b.window_ms / 4))), budget_tick)
  return h
end

-- Adds the budget's fields to a cm.stats() table: shed (the kinds shed now, in order; for all
-- sources, each kind once), sheds and restores (how many times).
function M._budget_stats(t, source)
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
  for _, line in ipairs(M.shed_notes()) do out:write(line, "\n") end
end

--- Starts the budget a recipe's options ask for (cuptimon.args.with_budget): nothing when
--- opts.budget is 0. The rate is measured as records arrive, so the agents are also asked to
--- flush CUPTI's buffers every 250 ms (without a cadence, records come when buffers fill).
function M.budget_from(opts)
  local rate = opts.budget and opts.budget > 0 and opts.budget or nil
  local lag = opts.lag_ms and opts.lag_ms > 0 and opts.lag_ms or nil
  if not rate and not lag then return nil end
  M.configure { flush_ms = 250, deliver_ms = 250 }
  local list = {}
  for k in tostring(opts.shed):gmatch("[^,%s]+") do list[#list + 1] = k end
  return M.budget { records_per_s = rate, lag_ms = lag, shed = list, hold_ms = opts.hold_ms }
end

local lag_gone = {} -- source -> { pid =, peak = } of processes that exited (process_exit)

--- Lines that say how far behind the script's view ran, for each process whose records reached
--- the script more than `min_s` seconds (default 1) late at some point: a view that is behind is
--- late, not incomplete (losses have their own LOST line). Now and at the peak, with the records
--- the agent still held (cm.stats(): lag_s, lag_peak_s, backlog_records); and one line for each
--- process whose agent's lag guard stopped tracing kinds because CUPTI fell behind (guard_shed).
function M.lag_notes(min_s)
  min_s = min_s or 1
  local out, seen = {}, {}
  local function guard_note(pid, shed, lag_s)
    if shed and #shed > 0 then
      out[#out + 1] = ("note: CUPTI fell %.1f s behind pid %d, so its agent stopped tracing %s "
        .. "(the lag guard, CUPTIMON_GUARD_LAG_MS): the counts of %s cover the run until then")
        :format(lag_s, pid, table.concat(shed, ", "), #shed > 1 and "those kinds" or "that kind")
    end
  end
  for _, s in ipairs(core.sources()) do
    seen[s.source] = true
    local st = M.stats(s.source)
    if st and st.lag_peak_s >= min_s then
      out[#out + 1] = ("note: the records of pid %d reached the script up to %.1f s late (now %.1f "
        .. "s behind, %d records not yet sent by its agent): the view is behind the application")
        :format(s.pid, st.lag_peak_s, st.lag_s, st.backlog_records)
    end
    if st then guard_note(s.pid, st.guard_shed, st.guard_lag_s) end
  end
  local gone = {}
  for source, g in pairs(lag_gone) do
    if not seen[source] then gone[#gone + 1] = g end
  end
  table.sort(gone, function(a, b) return a.pid < b.pid end)
  for _, g in ipairs(gone) do
    if g.peak >= min_s then
      out[#out + 1] = ("note: the records of pid %d reached the script up to %.1f s late: the view "
        .. "ran behind the application"):format(g.pid, g.peak)
    end
    guard_note(g.pid, g.guard_shed, g.guard_lag_s)
  end
  return out
end

--- Prints cm.lag_notes(min_s) (to io.stdout, or `out`), if any.
function M.print_lag_notes(out, min_s)
  out = out or io.stdout
  for _, line in ipairs(M.lag_notes(min_s)) do out:write(line, "\n") end
end

---------------------------------------------------------------------------------------------------
-- duty cycles (cm.duty): short exact windows, nothing traced in between (live processes)
--
-- Each live process gets its own schedule: period k (from the moment the duty cycle met the
-- process) holds one window of on_ms at an offset drawn uniformly from [0, period_ms - on_ms],
-- from a seeded generator (Park-Miller, one stream per process), so a periodic workload cannot
-- alias with the windows and a test can replay the same offsets. A window is a cm.window: exact
-- between its two fences. Between windows the duty cycle selects nothing, so a process that no
-- other observer traces has every kind off, and its agent idles its cadences and frees its free
-- buffers (agent.c, "selection and configuration") as a detached one does. Before each window
-- the overload check runs (M.duty_overload): a process the budget sheds kinds of, or whose lag
-- (M.duty_lag_ms, the hook for the sustained-load issue's per-process lag) is over max_lag_ms,
-- is skipped for that period, and the skip is reported.

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
  local ok, st = pcall(M.stats, source)
  if ok and type(st) == "table" and type(st.lag_s) == "number" then return st.lag_s * 1000 end
  return nil
end

--- Whether a process is too loaded for a duty window now: nil, or the reason as a sentence
--- fragment ("the record-rate budget sheds runtime", "its records lag 3200 ms (over 2000)").
function M.duty_overload(source, max_lag_ms)
  local st = budget_state[source]
  if st and #st.shed > 0 then
    return "the record-rate budget sheds " .. table.concat(st.shed, ",")
  end
  local ok, cs = pcall(M.stats, source)
  if ok and type(cs) == "table" and cs.guard_shed and #cs.guard_shed > 0 then
    return ("CUPTI fell %.1f s behind and the agent's lag guard stopped tracing %s")
      :format(cs.guard_lag_s, table.concat(cs.guard_shed, ","))
  end
  local lag = M.duty_lag_ms(source)
  if lag and max_lag_ms and lag > max_lag_ms then
    return ("its records lag %.0f ms (over %d)"):format(lag, max_lag_ms)
  end
  return nil
end

local Duty = {}
Duty.__index = Duty

local function sheds_of(source)
  local c = shed_counts[source]
  return c and c.sheds or 0
end

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
  st.timer = M.after(math.max(math.floor(at - now), 0), function()
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
  local reason = M.duty_overload(st.source, self.max_lag_ms)
  local h, err
  if not reason then
    st.sheds0 = sheds_of(st.source)
    h, err = M.window { select = self.select, ms = self.on_ms, pid = st.pid, fn = self.fn,
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
  elseif sheds_of(st.source) ~= st.sheds0 then
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

-- A process that connects joins every duty cycle; one that ends leaves it.
local function duty_process_start(p)
  for _, s in ipairs(core.sources()) do
    if s.source == p.source and s.kind == "agent" then
      for _, d in ipairs(duties) do d:_track(p.source, p.pid) end
    end
  end
end

local function duty_process_exit(p)
  for _, d in ipairs(duties) do
    local st = d.procs[p.source]
    if st then
      st.gone = true
      st.t_end = st.t_end or (uv and uv.now())
      if st.timer then st.timer:close() st.timer = nil end
    end
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
    api_drain()
  elseif name == "window_done" then
    window_done(a, b)
  elseif name == "exit" then
    api_drain() -- the last API callbacks reach the script before its exit hooks
    if api_counts.dropped > 0 then
      io.stderr:write(("cuptimon: %d API callback events were dropped (the queue was full)\n")
        :format(api_counts.dropped))
    end
    -- The run ended (the command exited) before a cm.exit()'s flush completed: its status holds.
    if exiting ~= nil then core.exit(exiting) end
    ending = true
    run_hooks(hooks.exit, "exit hook")
  elseif name == "process_start" then
    batch.processes[a.source] = a
    if #duties > 0 then duty_process_start(a) end
    run_hooks(hooks.process_start, "process_start hook", a)
  elseif name == "process_exit" then
    batch.forget(a.source)
    -- The peak lag of the process's life, next to its losses.
    local st = M.stats(a.source)
    if st then
      a.lag_peak_s, a.lag_decode_peak_ns = st.lag_peak_s, st.lag_decode_peak_ns
      a.guard_shed, a.guard_lag_s = st.guard_shed, st.guard_lag_s
      lag_gone[a.source] = { pid = a.pid, peak = st.lag_peak_s, guard_shed = st.guard_shed,
        guard_lag_s = st.guard_lag_s }
    end
    -- The exit table carries the start fields too (describe fills both), so it replaces them.
    batch.processes[a.source] = a
    if #duties > 0 then duty_process_exit(a) end
    run_hooks(hooks.process_exit, "process_exit hook", a)
  end
end

core.register(dispatch, event)

return M
