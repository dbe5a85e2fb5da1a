-- Specs of the cuptimon Lua API against the in-process engine on the fake CUPTI.
-- luacheck: std +busted
local cm = require "cuptimon"
local helpers = require "helpers"

local function need_fake()
  local f, why = helpers.fake()
  if not f then pending(why) end
  return f
end

describe("cuptimon.observe", function()
  it("delivers exactly the records of a workload, with exactly the selected fields", function()
    if not need_fake() then return end
    local n, batches, fields = 0, 0, nil
    local o = assert(cm.observe({ kernel = { "name", "start", "stop", "stream" } }, function(b)
      n = n + b.n
      batches = batches + 1
      local names = {}
      for k in pairs(b.cols) do names[#names + 1] = k end
      table.sort(names)
      fields = table.concat(names, ",")
      assert.are.equal("concurrent_kernel", b.kind)
      for i = 0, b.n - 1 do
        assert(b.stop[i] >= b.start[i], "stop before start")
        assert.is_string(b:str("name", i))
      end
    end))
    local written = helpers.workload(2, 2500, { helpers.KERNEL })
    assert.are.equal(5000, written)
    assert.are.same({ true }, { cm.flush({ sync = true }) })
    assert.are.equal(5000, n)
    assert.is_true(batches >= 1)
    assert.are.equal("name,start,stop,stream", fields)
    assert.are.same({ true }, { o:close() })
    assert.are.same({ true }, { o:close() })
  end)

  it("gives each observer only its own fields and kinds", function()
    if not need_fake() then return end
    local seen = {}
    local a = assert(cm.observe({ kernel = "start" }, function(b)
      seen.a = (seen.a or 0) + b.n
      assert.is_nil(b:col("stop"))
    end))
    local m = assert(cm.observe({ memcpy = "all", kernel = { "stop" } }, function(b)
      seen[b.kind] = (seen[b.kind] or 0) + b.n
      if b.kind == "concurrent_kernel" then assert.is_nil(b:col("start")) end
    end))
    helpers.workload(1, 1000, { helpers.KERNEL, helpers.MEMCPY })
    cm.flush({ sync = true })
    assert.are.same({ a = 1000, concurrent_kernel = 1000, memcpy = 1000 }, seen)
    a:close()
    m:close()
  end)

  it("raises on an unknown field, naming the script line and the valid fields", function()
    local line
    local ok, err = pcall(function()
      line = debug.getinfo(1, "l").currentline + 1
      local o = cm.observe({ kernel = { "start", "ende" } }, function() end) -- the reported line
      return o
    end)
    assert.is_false(ok)
    assert.matches("api_spec.lua:" .. line .. ": cuptimon.observe: unknown field \"ende\" of kind \"kernel\"; "
      .. "valid fields: ", err)
    assert.matches("start, stop,", err, 1, true)
  end)

  it("raises on an unknown kind, listing the valid kinds", function()
    local ok, err = pcall(cm.observe, { kernal = "all" }, function() end)
    assert.is_false(ok)
    assert.matches("cuptimon.observe: unknown kind \"kernal\"; valid kinds: ", err, 1, true)
    assert.matches("concurrent_kernel", err, 1, true)
  end)

  it("raises on wrong argument types", function()
    assert.has_error(function() cm.observe("kernel", function() end) end)
    local ok1, err1 = pcall(cm.observe, { kernel = { 1 } }, function() end)
    assert.is_false(ok1)
    assert.matches("field 1 of kind \"kernel\" must be a string, got a number", err1, 1, true)
    local ok, err = pcall(cm.observe, { kernel = "all" }, 42)
    assert.is_false(ok)
    assert.matches("argument 2 must be a function%(batch%), got a number", err)
    local _, err2 = pcall(cm.observe, {}, function() end)
    assert.matches("the selection is empty", err2)
  end)

  it("reports an error in an observer with a traceback and keeps delivering", function()
    if not need_fake() then return end
    local errors, calls = {}, 0
    helpers.expect_errors(1)
    local before = cm.errors()
    cm.on("error", function(msg, where) errors[#errors + 1] = { msg = msg, where = where } end)
    local o = assert(cm.observe({ runtime = { "start" } }, function()
      calls = calls + 1
      if calls == 1 then error("boom in observer") end
    end))
    helpers.workload(1, 10, { helpers.RUNTIME })
    cm.flush({ sync = true })
    helpers.workload(1, 10, { helpers.RUNTIME })
    cm.flush({ sync = true })
    o:close()
    assert.are.equal(2, calls)
    assert.are.equal(1, #errors)
    assert.matches("api_spec.lua:%d+: boom in observer", errors[1].msg)
    assert.matches("stack traceback:", errors[1].msg, 1, true)
    assert.are.equal("observer callback", errors[1].where)
    -- Handled by a hook, the error still counts (and makes cuptimon-lua's exit status 1).
    assert.are.equal(before + 1, cm.errors())
  end)

  it("names a column that was not selected and says to select it", function()
    if not need_fake() then return end
    local results = {}
    local o = assert(cm.observe({ kernel = { "start" } }, function(b)
      if #results > 0 then return end
      results[1] = { pcall(function() return b.stop[0] end) }
      results[2] = { pcall(function() return b:str("name", 0) end) }
      results[3] = { pcall(function() return b:kernel_name(0) end) }
      results[4] = { pcall(function() return b.sttop end) }
    end))
    helpers.workload(1, 10, { helpers.KERNEL })
    cm.flush({ sync = true })
    o:close()
    assert.are.equal(4, #results)
    for i = 1, 4 do assert.is_false(results[i][1]) end
    assert.matches('api_spec.lua:%d+: batch: the column "stop" of kind "concurrent_kernel" was not '
      .. 'selected; add it to the observer\'s selection, e.g. cm.observe%({ concurrent_kernel = '
      .. '{ "start", "stop" } }, fn%)', results[1][2])
    assert.matches('batch:str: the column "name" of kind "concurrent_kernel" was not selected',
      results[2][2])
    assert.matches('batch:kernel_name: the column "name" of kind "concurrent_kernel" was not selected',
      results[3][2])
    assert.matches('batch: no column or method "sttop"; kind "concurrent_kernel" has the selected '
      .. 'columns: start', results[4][2])
  end)

  it("gives kernel names for tables, cached per source and form", function()
    if not need_fake() then return end
    local got = {}
    local o = assert(cm.observe({ kernel = { "name" } }, function(b)
      for i = 0, b.n - 1 do
        local raw = b:str("name", i)
        got[raw] = { b:kernel_name(i), b:kernel_name(i, "full"), b:kernel_name(i, "mangled"),
          b:kernel_name(i) }
      end
      assert.has_error(function() b:kernel_name(0, "long") end,
        'batch:kernel_name: form must be "short", "full" or "mangled", got "long"')
    end))
    helpers.workload(1, 10, { helpers.KERNEL })
    cm.flush({ sync = true })
    o:close()
    local n = 0
    for raw, names in pairs(got) do
      n = n + 1
      assert.are.same({ cm.kernel_name(raw), cm.kernel_name(raw, true), raw, cm.kernel_name(raw) },
        names)
    end
    assert.is_true(n > 0)
  end)

  it("defers observe, close and flush made inside a callback", function()
    if not need_fake() then return end
    local inner, outer_n = 0, 0
    local o2
    local o1
    o1 = assert(cm.observe({ kernel = { "start" } }, function(b)
      outer_n = outer_n + b.n
      if not o2 then
        o2 = cm.observe({ kernel = { "stop" } }, function(b2) inner = inner + b2.n end)
        assert.is_true(cm.flush({ sync = true }))
        o1:close()
      end
    end))
    helpers.workload(1, 100, { helpers.KERNEL })
    cm.flush({ sync = true })
    assert.are.equal(100, outer_n)
    assert.is_true(helpers.run_until(function() return o2:is_active() end, 2000))
    helpers.workload(1, 50, { helpers.KERNEL })
    cm.flush({ sync = true })
    assert.are.equal(100, outer_n)   -- o1 was closed inside its own callback
    assert.are.equal(50, inner)
    o2:close()
  end)
end)

describe("cuptimon cadences", function()
  it("delivers on the deliver_ms cadence without an explicit flush", function()
    if not need_fake() then return end
    local n = 0
    assert.are.same({ true }, { cm.configure({ flush_ms = 20, deliver_ms = 30 }) })
    local o = assert(cm.observe({ kernel = { "start" } }, function(b) n = n + b.n end))
    helpers.workload(1, 300, { helpers.KERNEL })
    assert.is_true(helpers.run_until(function() return n == 300 end, 3000))
    o:close()
    cm.configure({ flush_ms = 1000, deliver_ms = 1000 })
  end)

  it("runs cm.every on its period and cm.after once", function()
    local ticks, once = 0, 0
    local t = cm.every(10, function() ticks = ticks + 1 end)
    cm.after(5, function() once = once + 1 end)
    assert.is_true(helpers.run_until(function() return ticks >= 3 end, 2000))
    t:close()
    helpers.sleep(20)
    assert.are.equal(1, once)
  end)

  it("calls flush's done with ok", function()
    local got
    cm.flush({ sync = true, done = function(ok, err) got = { ok, err } end })
    assert.is_true(helpers.run_until(function() return got ~= nil end, 1000))
    assert.are.same({ true }, got)
  end)

  it("raises on bad options", function()
    local ok, err = pcall(cm.configure, { flush = 1 })
    assert.is_false(ok)
    assert.matches("unknown option \"flush\"; valid options: deliver_ms, flush_ms", err, 1, true)
    assert.has_error(function() cm.every(-1, function() end) end)
    local _, err3 = pcall(cm.on, "start", function() end)
    assert.matches("valid events: error, exit, process_exit, process_start", err3, 1, true)
  end)
end)

describe("cuptimon.stats and sources", function()
  it("counts delivered records per kind", function()
    if not need_fake() then return end
    local before = assert(cm.stats())
    local o = assert(cm.observe({ memcpy = { "bytes" } }, function() end))
    helpers.workload(1, 77, { helpers.MEMCPY })
    cm.flush({ sync = true })
    o:close()
    local after = assert(cm.stats())
    assert.are.equal(77, after.records_by_kind.memcpy - (before.records_by_kind.memcpy or 0))
    assert.are.same({ nil, "ENOENT: no such entry", "ENOENT" }, { cm.stats(99) })
  end)

  it("lists the in-process source and replays process_start for late hooks", function()
    if not need_fake() then return end
    local s = cm.sources()
    assert.are.equal(1, #s)
    assert.are.equal("inproc", s[1].kind)
    local got
    cm.on("process_start", function(p) got = p end)
    assert.are.equal(s[1].pid, got.pid)
  end)
end)
