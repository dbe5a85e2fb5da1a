-- Specs of the Lua API's external correlation (push/pop, chains, joins, metadata) and API
-- callbacks (cm.on_api), in-process on the fake CUPTI.
-- luacheck: std +busted
local ffi = require "ffi"
local cm = require "cuptimon"
local helpers = require "helpers"

ffi.cdef [[
uint32_t fake_launch_kernel(uint32_t cbid, const char *name);
int fake_callback_enabled(int domain, uint32_t cbid);
int fake_external_depth(int kind);
uint64_t fake_external_top(int kind);
]]

local function need_fake()
  local f, why = helpers.fake()
  if not f then pending(why) end
  return f
end

local RUNTIME = 2          -- CUPTI_CB_DOMAIN_RUNTIME_API
local LAUNCH = 211         -- cudaLaunchKernel
local MALLOC = 20          -- cudaMalloc
local KNAME = ffi.new("char[?]", 16, "corr_kernel") -- outlives the engine's decoding
local EXT_KIND = 3         -- CM_CORR_EXTERNAL_KIND

describe("cuptimon.corr_*", function()
  -- Ids reach CUPTI's stack only once an engine exists: an observer creates it.
  setup(function()
    if helpers.fake() then assert(cm.observe({ kernel = { "start" } }, function() end)):close() end
  end)
  -- A failed spec must not leave frames behind for the next one.
  after_each(function()
    while cm.corr_depth() > 0 do cm.corr_pop() end
  end)

  it("pushes and pops nested ids with their chains, on CUPTI's stack too", function()
    local f = need_fake()
    if not f then return end
    assert.are.equal(0, cm.corr_depth())
    assert.are.equal(0, cm.corr_current())
    local a = assert(cm.corr_push())
    local b = assert(cm.corr_push(777001))
    assert.are.equal(777001, b)
    local c = assert(cm.corr_push())
    assert.is_true(a > 0 and c > 0 and a ~= c)
    assert.are.equal(3, cm.corr_depth())
    assert.are.equal(c, cm.corr_current())
    assert.are.equal(3, f.fake_external_depth(EXT_KIND))
    assert.are.equal(c, tonumber(f.fake_external_top(EXT_KIND)))
    assert.are.same({ c, b, a }, cm.corr_chain(c))
    assert.are.same({ b, a }, cm.corr_chain(b))
    assert.are.same({}, cm.corr_chain(123456789))
    assert.are.equal(c, cm.corr_pop())
    assert.are.equal(b, cm.corr_pop())
    assert.are.equal(a, cm.corr_current())
    assert.are.equal(a, cm.corr_pop())
    assert.are.equal(0, cm.corr_depth())
    assert.are.equal(0, f.fake_external_depth(EXT_KIND))
    local v, err, name = cm.corr_pop()
    assert.is_nil(v)
    assert.are.equal("ENOENT", name)
    assert.matches("^ENOENT: .*nothing is pushed", err)
  end)

  it("fails past the deepest stack with ERANGE, and stays balanced", function()
    for _ = 1, 256 do assert(cm.corr_push()) end
    local v, err, name = cm.corr_push()
    assert.is_nil(v)
    assert.are.equal("ERANGE", name)
    assert.matches("^ERANGE: ", err)
    assert.are.same({ nil, err, name }, { cm.corr_push(5) })
    for _ = 1, 256 do assert(cm.corr_pop()) end
    assert.are.equal(0, cm.corr_depth())
  end)

  it("joins rows to their external ids and chains", function()
    local ec = { external_kind = { EXT_KIND, EXT_KIND, 0 }, external_id = { 41, 42, 43 },
      correlation = { 7, 8, 9 }, n = 3 }
    local a = assert(cm.corr_push(41))
    local b = assert(cm.corr_push(42))
    local rows = { correlation = { 8, 7, 9, 10 }, n = 4 }
    local ext = assert(cm.corr_join(ec, rows))
    assert.are.same({ 42, 41, 0, 0 },
      { tonumber(ext[0]), tonumber(ext[1]), tonumber(ext[2]), tonumber(ext[3]) })
    local chains = assert(cm.corr_join_chains(ec, rows))
    assert.are.same({ b, a }, chains[0])
    assert.are.same({ a }, chains[1])
    assert.are.same({}, chains[2])
    assert.are.same({}, chains[3])
    -- Without external_kind every row counts.
    ec.external_kind = nil
    assert.are.equal(43, tonumber(assert(cm.corr_join(ec, rows))[2]))
    -- cdata columns (a batch's shape) are read from index 0.
    local cc = ffi.new("uint32_t[2]", { 7, 8 })
    local ce = ffi.new("uint64_t[2]", { 41, 42 })
    local ext2 = assert(cm.corr_join({ external_id = ce, correlation = cc, n = 2 },
      { correlation = ffi.new("uint32_t[1]", { 8 }), n = 1 }))
    assert.are.equal(42, tonumber(ext2[0]))
    cm.corr_pop()
    cm.corr_pop()
  end)

  it("joins the records of a real launch: kernel correlation to the pushed id", function()
    if not need_fake() then return end
    local f = helpers.fake()
    local ec, k = nil, {}
    local o1 = assert(cm.observe({ external_correlation = "all" }, function(b)
      ec = { n = b.n, external_kind = {}, external_id = {}, correlation = {} }
      for i = 0, b.n - 1 do
        ec.external_kind[i + 1] = b.external_kind[i]
        ec.external_id[i + 1] = tonumber(b.external_id[i])
        ec.correlation[i + 1] = b.correlation[i]
      end
    end))
    local o2 = assert(cm.observe({ kernel = { "correlation" } }, function(b)
      for i = 0, b.n - 1 do k[#k + 1] = b.correlation[i] end
    end))
    local outer = assert(cm.corr_push())
    local inner = assert(cm.corr_push())
    f.fake_launch_kernel(LAUNCH, KNAME)
    cm.corr_pop()
    f.fake_launch_kernel(LAUNCH, KNAME)
    cm.corr_pop()
    assert(cm.flush({ sync = true }))
    o1:close()
    o2:close()
    assert.are.equal(2, #k)
    assert.is_not_nil(ec)
    local chains = assert(cm.corr_join_chains(ec, { correlation = k, n = 2 }))
    assert.are.same({ inner, outer }, chains[0])
    assert.are.same({ outer }, chains[1])
  end)

  it("merges metadata per id and takes it once", function()
    assert.are.equal("{}", assert(cm.corr_metadata_take()))
    local id = assert(cm.corr_push(9001))
    assert.is_true(cm.corr_metadata_put(nil, '{"step":1,"tags":{"a":1}}'))
    assert.is_true(cm.corr_metadata_put(id, '{"tags":{"b":2},"step":2}'))
    assert.is_true(cm.corr_metadata_put(12, '[1,2]'))
    local v, err, name = cm.corr_metadata_put(id, '{"bad":')
    assert.is_nil(v)
    assert.are.equal("EINVAL", name)
    assert.matches("byte %d+", err)
    assert.are.equal('{"12":[1,2],"9001":{"step":2,"tags":{"a":1,"b":2}}}',
      assert(cm.corr_metadata_take()))
    assert.are.equal("{}", assert(cm.corr_metadata_take()))
    cm.corr_pop()
    local v2, _, name2 = cm.corr_metadata_put(0, "{}")
    assert.is_nil(v2)
    assert.are.equal("ENOENT", name2)
  end)

  it("raises on misuse, naming what is valid", function()
    assert.has_error(function() cm.corr_push(0) end,
      "cuptimon.corr_push: the id must be a positive integer, got 0")
    assert.has_error(function() cm.corr_push(1.5) end,
      "cuptimon.corr_push: the id must be a positive integer, got 1.5")
    assert.has_error(function() cm.corr_chain("x") end,
      "cuptimon.corr_chain: the id must be a positive integer, got x")
    assert.has_error(function() cm.corr_metadata_put(1, {}) end,
      "cuptimon.corr_metadata_put: argument 2 must be a JSON string, got a table")
    assert.has_error(function() cm.corr_join({ n = 1 }, { n = 1, correlation = { 1 } }) end,
      "cuptimon.corr_join: external_id must be a column (a batch's cdata column or a Lua list), "
      .. "got nothing")
    assert.has_error(function() cm.corr_join(1, {}) end)
  end)
end)

describe("cuptimon.on_api", function()
  it("delivers one event per call of the subscribed function, on the loop thread", function()
    local f = need_fake()
    if not f then return end
    local evs, other = {}, 0
    local h = assert(cm.on_api("cudaLaunchKernel", function(ev) evs[#evs + 1] = ev end))
    local hm = assert(cm.on_api("cudaMalloc", function() other = other + 1 end, { site = "both" }))
    assert.are.equal(1, f.fake_callback_enabled(RUNTIME, LAUNCH))
    local corr = {}
    for i = 1, 10 do corr[i] = f.fake_launch_kernel(LAUNCH, KNAME) end
    assert.are.equal(0, #evs) -- queued: nothing runs inside the CUDA call
    f.fake_launch_kernel(MALLOC, KNAME)
    assert.is_true(helpers.run_until(function() return #evs == 10 and other == 2 end, 5000))
    helpers.sleep(20)
    assert.are.equal(10, #evs)
    assert.are.equal(2, other) -- enter and exit
    for i, ev in ipairs(evs) do
      assert.are.equal("cudaLaunchKernel", ev.name)
      assert.are.equal(LAUNCH, ev.cbid)
      assert.are.equal(RUNTIME, ev.domain)
      assert.are.equal("enter", ev.site)
      assert.are.equal(corr[i], ev.correlation)
      assert.is_true(ev.tid > 0 and ev.time > 0)
    end
    assert.is_true(h:close())
    assert.is_true(h:close())
    assert.is_true(hm:close())
    assert.are.equal(0, f.fake_callback_enabled(RUNTIME, LAUNCH))
    f.fake_launch_kernel(LAUNCH, KNAME)
    helpers.sleep(20)
    assert.are.equal(10, #evs)
  end)

  it("queues calls made on other threads and delivers them on the loop thread", function()
    local f = need_fake()
    if not f then return end
    local uv = require "luv"
    local tids, n = {}, 0
    local h = assert(cm.on_api("cudaLaunchKernel", function(ev)
      n = n + 1
      tids[ev.tid] = true
    end))
    -- Two threads with their own Lua states launch 1000 kernels each through the fake CUPTI
    -- (2000 events fit in the queue, so none may be dropped whatever the timing).
    local before = cm.api_stats()
    -- The kernel name is KNAME of this state (it outlives the threads' states), by address.
    local function launcher(path, count, name_addr)
      local ffi2 = require "ffi"
      ffi2.cdef "uint32_t fake_launch_kernel(uint32_t cbid, const char *name);"
      local lib = ffi2.load(path)
      local name = ffi2.cast("const char *", name_addr)
      for _ = 1, count do lib.fake_launch_kernel(211, name) end
    end
    local addr = tonumber(ffi.cast("uintptr_t", KNAME))
    local t1 = uv.new_thread(launcher, os.getenv("CUPTIMON_LIBCUPTI"), 1000, addr)
    local t2 = uv.new_thread(launcher, os.getenv("CUPTIMON_LIBCUPTI"), 1000, addr)
    t1:join()
    t2:join()
    assert.is_true(helpers.run_until(function() return n == 2000 end, 10000))
    local s = cm.api_stats()
    assert.are.equal(2000, n)
    assert.are.equal(0, s.dropped - before.dropped)
    local k = 0
    for _ in pairs(tids) do k = k + 1 end
    assert.are.equal(2, k)
    h:close()
  end)

  it("drops and counts what does not fit in the queue", function()
    local f = need_fake()
    if not f then return end
    local before = cm.api_stats()
    local n = 0
    local h = assert(cm.on_api(LAUNCH, function() n = n + 1 end, { site = "exit" }))
    for _ = 1, 5000 do f.fake_launch_kernel(LAUNCH, KNAME) end
    local s = cm.api_stats()
    assert.are.equal(4096, n)
    assert.are.equal(904, s.dropped - before.dropped)
    assert.are.equal(4096, s.queued - before.queued)
    assert.are.equal(4096, s.delivered - before.delivered)
    h:close()
  end)

  it("reports a failing callback and keeps delivering", function()
    local f = need_fake()
    if not f then return end
    helpers.expect_errors(1)
    local n = 0
    local h = assert(cm.on_api("cudaLaunchKernel", function()
      n = n + 1
      if n == 1 then error("deliberate on_api failure") end
    end))
    local errs = cm.errors()
    f.fake_launch_kernel(LAUNCH, KNAME)
    f.fake_launch_kernel(LAUNCH, KNAME)
    assert.is_true(helpers.run_until(function() return n == 2 end, 5000))
    assert.are.equal(errs + 1, cm.errors())
    h:close()
  end)

  it("raises on misuse, naming the valid choices", function()
    assert.has_error(function() cm.on_api("cudaLaunchKernal", function() end) end,
      'cuptimon.on_api: unknown CUDA runtime function "cudaLaunchKernal"; valid names are the '
      .. "runtime API names of cuptimon.cbid (cudaLaunchKernel, cudaMemcpyAsync, ...)")
    local ok, err = pcall(cm.on_api, "launchkernel", function() end)
    assert.is_false(ok)
    assert.matches("similar: .*cudaLaunchKernel,", err)
    assert.has_error(function() cm.on_api("cudaMalloc", function() end, { site = "middle" }) end,
      'cuptimon.on_api: unknown site "middle"; valid sites: both, enter, exit')
    assert.has_error(function() cm.on_api("cudaMalloc", function() end, { when = 1 }) end,
      'cuptimon.on_api: unknown option "when"; valid options: site')
    assert.has_error(function() cm.on_api("cudaMalloc", 1) end,
      "cuptimon.on_api: argument 2 must be a function(ev), got a number")
    assert.has_error(function() cm.on_api({}, print) end)
    assert.has_error(function() cm.on_api(-1, print) end)
  end)

  it("answers ENOTSUP on a replay, whose process is remote", function()
    local rc, out = helpers.sh(("%s --replay %s/examples/demo.cmcap %s/spec/fixtures/api_remote.lua")
      :format(helpers.binary(), helpers.root(), helpers.root()))
    assert.are.equal(0, rc, out)
    assert.matches("on_api: nil | ENOTSUP: API callbacks need the in%-process engine", out)
    assert.matches("| ENOTSUP\n", out, 1, true)
  end)
end)
