-- Specs of what scripts/timeline.lua writes beside the slices ): a kernel's
-- launch configuration and a copy's bytes and bandwidth in args, compared with dump.lua's columns
-- of the same records (joined by correlation id) on the bundled capture; ts 0 at the earliest
-- record with its CLOCK_REALTIME origin in otherData (also across the exit's rewrite of a live
-- run's trace); CPU threads named by NAME records (a wire_gen capture).
-- luacheck: std +busted
local helpers = require "helpers"
local check = require "trace_check"
local ffi = require "ffi"

local bin = helpers.binary()
local root = helpers.root()
local gen = os.getenv("CUPTIMON_WIRE_GEN")
local demo = root .. "/examples/demo.cmcap"
local timeline = root .. "/scripts/timeline.lua"
local dump = root .. "/scripts/dump.lua"

-- An exact unsigned 64-bit value of a decimal string.
local function u64(s)
  local v = ffi.new("uint64_t", 0)
  for d in tostring(s):gmatch("%d") do v = v * 10 + tonumber(d) end
  return v
end
local function u64_text(v) return (tostring(v):gsub("U?LL$", "")) end

-- The rows of a dump.lua CSV file: a list of { column = text }.
local function csv_rows(path)
  local rows, header = {}, nil
  for line in assert(io.open(path)):lines() do
    if not line:match("^#") then
      local cells = {}
      for c in (line .. ","):gmatch("([^,]*),") do cells[#cells + 1] = c end
      if not header then
        header = cells
      else
        local r = {}
        for i, name in ipairs(header) do r[name] = cells[i] end
        rows[#rows + 1] = r
      end
    end
  end
  return rows
end

-- The trace at `path`, checked by trace_check, and its events.
local function trace_of(path)
  local r, err = check.file(path)
  assert.is_truthy(r, err)
  local trace = assert(check.json(assert(helpers.read(path))))
  return trace, trace.traceEvents
end

-- The thread_name events of a trace, in order: a list of { pid =, tid =, name = }.
local function thread_names(events)
  local out = {}
  for _, e in ipairs(events) do
    if e.ph == "M" and e.name == "thread_name" then
      out[#out + 1] = { pid = e.pid, tid = e.tid, name = e.args.name }
    end
  end
  return out
end

describe("timeline.lua on examples/demo.cmcap", function()
  local dir = helpers.tmpdir()
  local path = dir .. "/demo.json"
  local trace, events, by_corr = nil, nil, {}
  setup(function()
    local rc, out = helpers.sh(("%s --replay %s %s -o %s"):format(bin, demo, timeline, path))
    assert.are.equal(0, rc, out)
    trace, events = trace_of(path)
    rc, out = helpers.sh(("cd %s && %s --replay %s %s --kinds kernel,memcpy,memset,runtime,marker "
      .. "--fields correlation,start,stop,timestamp,grid_x,grid_y,grid_z,block_x,block_y,block_z,"
      .. "registers,static_smem,dynamic_smem,bytes -o out/"):format(dir, bin, demo, dump))
    assert.are.equal(0, rc, out)
    for _, kind in ipairs { "kernel", "memcpy", "memset" } do
      by_corr[kind] = {}
      for _, r in ipairs(csv_rows(dir .. "/out/" .. kind .. ".csv")) do
        by_corr[kind][tonumber(r.correlation)] = r
      end
    end
  end)
  teardown(function() os.execute("rm -rf " .. dir) end)

  it("gives each kernel slice its grid, block, registers and shared memory", function()
    local n, smem = 0, {}
    for _, e in ipairs(events) do
      if e.ph == "X" and e.cat == "kernel" then
        local r = assert(by_corr.kernel[e.args.correlation], "no dump row for " .. e.args.correlation)
        assert.are.same({ tonumber(r.grid_x), tonumber(r.grid_y), tonumber(r.grid_z) }, e.args.grid)
        assert.are.same({ tonumber(r.block_x), tonumber(r.block_y), tonumber(r.block_z) }, e.args.block)
        assert.are.equal(tonumber(r.registers), e.args["registers per thread"])
        assert.are.equal(tonumber(r.static_smem), e.args["static shared memory"])
        assert.are.equal(tonumber(r.dynamic_smem), e.args["dynamic shared memory"])
        assert.are.equal(tonumber(r.static_smem) + tonumber(r.dynamic_smem), e.args["shared memory"])
        n = n + 1
        smem[e.name] = e.args["static shared memory"]
      end
    end
    assert.are.equal(300, n)
    -- The demo's tiled kernels declare static shared memory (16 x 16 x 2 floats, 256 floats).
    assert.are.same({ ["cm_demo_matmul<16>"] = 2048, cm_demo_loss_reduce = 1024,
      ["cm_demo_sgd_update<float>"] = 0, cm_demo_bias_relu = 0, cm_demo_relu_backward = 0 }, smem)
  end)

  it("gives each copy and memset slice its bytes and bandwidth in GB/s", function()
    local n = { memcpy = 0, memset = 0 }
    for _, e in ipairs(events) do
      if e.ph == "X" and (e.cat == "memcpy" or e.cat == "memset") then
        local r = assert(by_corr[e.cat][e.args.correlation])
        local bytes = tonumber(r.bytes)
        local dur = tonumber(u64(r.stop) - u64(r.start))
        assert.are.equal(bytes, e.args.bytes)
        if dur > 0 then
          -- bytes per nanosecond are GB/s; written with 3 decimals
          assert.is_true(math.abs(bytes / dur - e.args["memory bandwidth (GB/s)"]) <= 0.0005,
            ("%d bytes in %d ns: %s"):format(bytes, dur, tostring(e.args["memory bandwidth (GB/s)"])))
        else
          assert.is_nil(e.args["memory bandwidth (GB/s)"])
        end
        n[e.cat] = n[e.cat] + 1
      end
    end
    assert.are.same({ memcpy = 66, memset = 61 }, n)
  end)

  it("starts at the earliest record, whose CLOCK_REALTIME time otherData states", function()
    -- The earliest record of the capture, by dump.lua's exact columns.
    local earliest
    for _, kind in ipairs { "kernel", "memcpy", "memset", "runtime", "marker" } do
      for _, r in ipairs(csv_rows(dir .. "/out/" .. kind .. ".csv")) do
        local t = u64(r.start or r.timestamp)
        if not earliest or t < earliest then earliest = t end
      end
    end
    assert.is_table(trace.otherData)
    assert.are.equal("CLOCK_REALTIME", trace.otherData.clock)
    assert.are.equal(u64_text(earliest), trace.otherData.origin_ns)
    local lowest, origin = math.huge, u64(trace.otherData.origin_ns)
    for _, e in ipairs(events) do
      if e.ts then lowest = math.min(lowest, e.ts) end
      if e.ph == "X" and by_corr[e.cat] then
        -- Absolute times come back exactly: origin_ns + 1000 * ts is the record's start.
        local r = by_corr[e.cat][e.args.correlation]
        assert.are.equal(r.start, u64_text(origin + math.floor(e.ts * 1000 + 0.5)))
      end
    end
    assert.are.equal(0, lowest)
    -- The capture's first record seen is not its earliest (a copy; calls began before it), so
    -- the trace was shifted at exit: its temporary file is gone.
    local first
    for _, e in ipairs(events) do
      if e.ph == "X" then first = first or e end
    end
    assert.is_true(first.ts > 0)
    local rc, left = helpers.sh(("ls %s"):format(dir))
    assert.are.equal(0, rc, left)
    assert.is_nil(left:find("tmp"), left)
  end)
end)

describe("timeline.lua's shift of ts 0 to the earliest record", function()
  -- The fake application's copies arrive before the calls that made them, which began earlier:
  -- the trace is written relative to the first record seen and shifted at exit, 3.5 MB in small
  -- chunks. Recorded, so that dump.lua reads the same records.
  it("keeps every absolute time exact across the rewrite", function()
    local app, why = helpers.agent_app()
    if not app then
      pending(why)
      return
    end
    local rc, out, replays, dir = helpers.record(app .. " --records 20000 --kinds kernel,runtime,memcpy,marker")
    assert.are.equal(0, rc, out)
    local path = dir .. "/live.json"
    -- 4093-byte chunks: a thousand chunk boundaries, hundreds inside a ts.
    rc, out = helpers.sh(("CUPTIMON_TIMELINE_CHUNK=4093 %s %s %s -o %s"):format(bin, replays,
      timeline, path))
    assert.are.equal(0, rc, out)
    local size = #assert(helpers.read(path))
    assert.is_true(size > 2 * 1048576, size)
    local trace, events = trace_of(path)
    local origin, lowest, first = u64(trace.otherData.origin_ns), math.huge, nil
    local starts = {}
    for _, e in ipairs(events) do
      if e.ts then
        first = first or e.ts
        lowest = math.min(lowest, e.ts)
        if e.ph == "X" and (e.cat == "kernel" or e.cat == "memcpy") then
          starts[#starts + 1] = u64_text(origin + math.floor(e.ts * 1000 + 0.5))
        end
      end
    end
    assert.are.equal(0, lowest)
    assert.is_true(first > 0, "the first record seen was the earliest: nothing was shifted")
    rc, out = helpers.sh(("cd %s && %s %s %s --kinds kernel,memcpy --fields start -o out/"):format(dir,
      bin, replays, dump))
    assert.are.equal(0, rc, out)
    local want = {}
    for _, kind in ipairs { "kernel", "memcpy" } do
      for _, r in ipairs(csv_rows(dir .. "/out/" .. kind .. ".csv")) do want[#want + 1] = r.start end
    end
    assert.are.equal(10000, #want)
    table.sort(want)
    table.sort(starts)
    assert.are.same(want, starts)
    os.execute("rm -rf " .. dir)
  end)
end)

describe("timeline.lua's CPU thread names", function()
  it("come from NAME records, the latest winning, else are the thread ids", function()
    if not gen then
      pending("CUPTIMON_WIRE_GEN is not set (run through ctest)")
      return
    end
    local dir = helpers.tmpdir()
    -- wire_gen --small-ids: runtime calls on threads 0..3; NAME record i names an object of kind
    -- i % 4 (2 is a thread, 2 also its tid) with the name i % 3: "_Z7kernelCv" (i = 2),
    -- "kernelA" (6), "kernelB" (10).
    local cap, path = dir .. "/n.cmcap", dir .. "/n.json"
    assert(os.execute(("%s capture %s --pid 7 --records 12 --kinds runtime,name --small-ids")
      :format(gen, cap)) == 0)
    local rc, out = helpers.sh(("%s --replay %s %s -o %s"):format(bin, cap, timeline, path))
    assert.are.equal(0, rc, out)
    local _, events = trace_of(path)
    local last = {}
    for _, t in ipairs(thread_names(events)) do
      assert.are.equal(7, t.pid)
      last[t.tid] = t.name
    end
    assert.are.same({ [0] = "thread 0", [1] = "thread 1", [2] = "kernelB", [3] = "thread 3" }, last)
    os.execute("rm -rf " .. dir)
  end)
end)
