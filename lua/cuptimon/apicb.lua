-- cuptimon.apicb: API callbacks, the in-process engine's subscriber callbacks
-- (engine/monitor/apicb.c); cuptimon re-exports cm.on_api and cm.api_stats.
--
-- Design note. A CUDA call never waits on Lua: apicb.c queues an event per callback, and the
-- host's "api" event (and cm.api_stats, and the run's end) drains the queue here, on the loop
-- thread, calling each subscription's function under xpcall. This module owns the subscriptions
-- (id -> function) and the counters; cuptimon hands it the reporting function (_setup) and calls
-- _drain and _finish from its event function.
local core = require "cuptimon.core"

local M = {}

local report -- cuptimon's reporting function (_setup)

-- Takes what the parts share from cuptimon (init.lua): here, its reporting function.
function M._setup(_, shared)
  report = shared.report
end

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

-- The host's "api" event: the queued events reach their functions.
M._drain = api_drain

-- The run's end: the last API callbacks reach the script before its exit hooks, and a loss is
-- said on stderr.
function M._finish()
  api_drain()
  if api_counts.dropped > 0 then
    io.stderr:write(("cuptimon: %d API callback events were dropped (the queue was full)\n")
      :format(api_counts.dropped))
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

return M
