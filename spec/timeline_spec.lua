-- Specs of scripts/timeline.lua (the Chrome trace event JSON writer) and scripts/idle.lua on the
-- bundled capture, on a multi-process capture from wire_gen, live on two fake CUDA applications,
-- and of timeline's bounded memory on a long synthetic capture. Every trace is checked by
-- spec/trace_check.lua (strict JSON, the fields of each phase, B/E and slice nesting per track,
-- flow pairs), and its slice counts are compared with count.lua's numbers.
-- luacheck: std +busted
local helpers = require "helpers"
local check = require "trace_check"

local bin = helpers.binary()
local root = helpers.root()
local gen = os.getenv("CUPTIMON_WIRE_GEN")
local demo = root .. "/examples/demo.cmcap"
local tmp = os.tmpname()
os.remove(tmp)
os.execute("mkdir -p " .. tmp)
local function script(name) return root .. "/scripts/" .. name end

local function read(path)
  local f = assert(io.open(path, "rb"))
  local s = f:read("*a")
  f:close()
  return s
end

-- count.lua's table as { kind = records }.
local function counts(out)
  local t = {}
  for k, n in out:gmatch("\n([%w_]+)%s+(%d+)") do t[k] = tonumber(n) end
  return t
end

-- The process_name events of a trace: { [pid] = name }.
local function process_names(path)
  local trace = assert(check.json(read(path)))
  local names = {}
  for _, e in ipairs(trace.traceEvents) do
    if e.ph == "M" and e.name == "process_name" then names[e.pid] = e.args.name end
  end
  return names, trace
end

describe("trace_check", function()
  it("accepts a good trace and refuses bad JSON, missing fields, bad nesting and lone flows", function()
    assert.is_truthy(check.check { traceEvents = {
      { ph = "X", name = "a", pid = 1, tid = 1, ts = 0, dur = 10 },
      { ph = "X", name = "b", pid = 1, tid = 1, ts = 2, dur = 3 },
      { ph = "B", name = "c", pid = 1, tid = 2, ts = 0 }, { ph = "E", name = "c", pid = 1, tid = 2, ts = 1 },
      { ph = "s", id = 7, name = "f", pid = 1, tid = 1, ts = 1 },
      { ph = "f", bp = "e", id = 7, name = "f", pid = 1, tid = 2, ts = 1 } } })
    assert.is_nil(check.json('{"traceEvents":[1,]}'))
    assert.is_nil(check.json('{"a":01}'))
    local function fails(events, what)
      local r, err = check.check { traceEvents = events }
      assert.is_nil(r)
      assert.matches(what, err)
    end
    fails({ { ph = "X", name = "a", pid = 1, tid = 1, ts = 0 } }, "X without a dur")
    fails({ { ph = "X", name = "a", pid = 1, ts = 0, dur = 1 } }, "no tid")
    fails({ { ph = "i", name = "a", pid = 1, tid = 1 } }, "no ts")
    fails({ { ph = "X", name = "a", pid = 1, tid = 1, ts = 0, dur = 10 },
      { ph = "X", name = "b", pid = 1, tid = 1, ts = 5, dur = 10 } }, "overlaps")
    fails({ { ph = "B", name = "a", pid = 1, tid = 1, ts = 0 } }, "never ends")
    fails({ { ph = "E", name = "a", pid = 1, tid = 1, ts = 0 } }, "closes no open B")
    fails({ { ph = "s", id = 1, name = "f", pid = 1, tid = 1, ts = 0 } }, "1 starts and 0 finishes")
    fails({ { ph = "f", id = 2, name = "f", pid = 1, tid = 1, ts = 0 } }, "0 starts and 1 finishes")
  end)
end)

describe("timeline.lua", function()
  it("needs -o and says so", function()
    local rc, out = helpers.sh(("%s %s -- /bin/true"):format(bin, script("timeline.lua")))
    assert.are.equal(2, rc, out)
    assert.matches("%-o FILE is required", out)
  end)

  it("writes a valid trace of examples/demo.cmcap whose slices match count.lua", function()
    local path = tmp .. "/demo.json"
    local rc, out = helpers.sh(("%s --replay %s %s -o %s"):format(bin, demo, script("timeline.lua"), path))
    assert.are.equal(0, rc, out)
    assert.matches("wrote [^\n]*demo%.json: 1088 slices %(300 kernel, 66 memcpy, 61 memset, 629 runtime, "
      .. "0 driver, 32 nvtx%), 3 marks, 427 flows\n", out)
    local r, err = check.file(path)
    assert.is_truthy(r, err)
    local rc2, cout = helpers.sh(("%s --replay %s %s"):format(bin, demo, script("count.lua")))
    assert.are.equal(0, rc2, cout)
    local c = counts(cout)
    assert.are.same({ kernel = c.concurrent_kernel, memcpy = c.memcpy, memset = c.memset,
      cuda_runtime = c.runtime, nvtx = 32 }, r.by_cat)
    -- Every marker record is used: a range is a start and an end record, a mark one record.
    assert.are.equal(c.marker, 2 * r.by_cat.nvtx + r.by_ph.i)
    assert.are.equal(427, r.flows)
    assert.are.equal(r.by_ph.s, r.by_ph.f)
    assert.are.equal(150, r.by_name["cm_demo_matmul<16>"])
    local names = process_names(path)
    assert.are.same({ [601] = "cuptimon_demo_cuda" }, names)
    -- Every timestamp and duration keeps its nanoseconds: three decimals.
    local text = read(path)
    for v in text:gmatch('"ts":([^,}]+)') do assert.matches("^%-?%d+%.%d%d%d$", v) end
    for v in text:gmatch('"dur":([^,}]+)') do assert.matches("^%d+%.%d%d%d$", v) end
    assert.matches('"name":"thread_name","pid":601,"tid":%d+,"args":{"name":"GPU 0 stream 14"}', text)
  end)

  it("draws PM samples as counter tracks per device", function()
    local path = tmp .. "/pm.json"
    local rc, out = helpers.sh(("%s --replay %s/spec/fixtures/pm_fake.cmcap %s -o %s"):format(bin,
      helpers.root(), script("timeline.lua"), path))
    assert.are.equal(0, rc, out)
    assert.matches(", 40 counter samples\n", out)
    local r, err = check.file(path)
    assert.is_truthy(r, err)
    assert.are.equal(80, r.by_ph.C)
    local text = read(path)
    -- The first sample's values are the fake's for sample 0: metric index * 10 + 0.5.
    assert.matches('{"ph":"C","name":"GPU 0 utilization %%","pid":20636,"ts":[%d.]+,"args":{"sm":10%.500,'
      .. '"tensor":20%.500,"dram":50%.500}}', text)
    assert.matches('"name":"GPU 0 PCIe GB/s"', text)
  end)

  it("writes one process per capture, named by pid and executable", function()
    if not gen then
      pending("CUPTIMON_WIRE_GEN is not set (run through ctest)")
      return
    end
    local a, b, path = tmp .. "/a.cmcap", tmp .. "/b.cmcap", tmp .. "/ab.json"
    assert(os.execute(("%s capture %s --pid 111 --records 2000 --kinds kernel,runtime,memcpy"):format(gen, a)) == 0)
    assert(os.execute(("%s capture %s --pid 222 --records 1000 --kinds kernel,runtime,marker"):format(gen, b)) == 0)
    local rc, out = helpers.sh(("%s --replay %s --replay %s %s -o %s"):format(bin, a, b,
      script("timeline.lua"), path))
    assert.are.equal(0, rc, out)
    local r, err = check.file(path)
    assert.is_truthy(r, err)
    assert.are.equal(3000, r.by_cat.kernel)
    assert.are.equal(3000, r.by_cat.cuda_runtime)
    assert.are.equal(2000, r.by_cat.memcpy)
    local names, trace = process_names(path)
    -- wire_gen's records name a new device each (device = record index): devices 1..63 of a
    -- process are trace processes of their own, pid + (device + 1) * 2^22.
    assert.are.equal("wire_gen", names[111])
    assert.are.equal("wire_gen", names[222])
    assert.are.equal("wire_gen (pid 111) GPU 1", names[111 + 2 * 2 ^ 22])
    assert.are.equal("wire_gen (pid 222) GPU 63", names[222 + 64 * 2 ^ 22])
    assert.is_nil(names[111 + 65 * 2 ^ 22])
    local per_pid, split = {}, 0
    for _, e in ipairs(trace.traceEvents) do
      if e.ph == "X" and e.cat == "kernel" then
        local pid = e.pid % 2 ^ 22
        per_pid[pid] = (per_pid[pid] or 0) + 1
        if e.pid ~= pid then
          split = split + 1
          assert.are.equal(e.args.device, math.floor(e.pid / 2 ^ 22) - 1)
        end
      end
    end
    assert.are.same({ [111] = 2000, [222] = 1000 }, per_pid)
    assert.are.equal(2 * 63, split)

    local rc2, idle = helpers.sh(("%s --replay %s --replay %s %s --top 3"):format(bin, a, b, script("idle.lua")))
    assert.are.equal(0, rc2, idle)
    assert.matches("^pid 111 %(/usr/bin/wire_gen%)\ndevice%s+stream%s+ops", idle)
    assert.matches("\n\npid 222 %(/usr/bin/wire_gen%)\ndevice%s+stream%s+ops", idle)
    assert.matches("largest idle gaps\ndevice%s+stream%s+start_us%s+gap_us%s+last_api_before%s+api_end_us\n", idle)
  end)

  it("traces two live fake CUDA applications at once", function()
    local app, why = helpers.agent_app()
    if not app then
      pending(why)
      return
    end
    local path = tmp .. "/live.json"
    local cmd = ("sh -c '%s --records 3000 --kinds kernel,runtime,marker & %s --records 2000 --kinds kernel,memcpy,marker; wait'")
      :format(app, app)
    local rc, out = helpers.sh(("%s %s -o %s -- %s"):format(bin, script("timeline.lua"), path, cmd))
    assert.are.equal(0, rc, out)
    local r, err = check.file(path)
    assert.is_truthy(r, err)
    local names = process_names(path)
    local n = 0
    for pid, name in pairs(names) do
      assert.is_true(pid > 0)
      if pid < 2 ^ 22 then
        n = n + 1
        assert.are.equal("fake_cuda_app", name)
      else
        -- The fake's kernels run on devices 0..3: each further device of a process is a trace
        -- process of its own.
        assert.matches(("^fake_cuda_app %%(pid %d%%) GPU [0-3]$"):format(pid % 2 ^ 22), name)
      end
    end
    assert.are.equal(2, n, out)
    -- Each app prints what it wrote; the trace has a slice per kernel record of both.
    local kernels = 0
    for k in out:gmatch("fake_cuda_app: [^\n]*concurrent_kernel=(%d+)") do kernels = kernels + tonumber(k) end
    assert.are.equal(kernels, r.by_cat.kernel, out)
    local rc2, idle = helpers.sh(("%s %s -- %s"):format(bin, script("idle.lua"), cmd))
    assert.are.equal(0, rc2, idle)
    local tables = 0
    for _ in idle:gmatch("pid %d+ %([^)]*fake_cuda_app%)\ndevice") do tables = tables + 1 end
    assert.are.equal(2, tables, idle)
  end)

  it("keeps the Lua heap bounded over a long capture", function()
    if not gen then
      pending("CUPTIMON_WIRE_GEN is not set (run through ctest)")
      return
    end
    local big = tmp .. "/big.cmcap"
    assert(os.execute(("%s capture %s --pid 5 --records 300000 --kinds kernel,runtime"):format(gen, big)) == 0)
    local rc, out = helpers.sh(("%s --replay %s %s/spec/fixtures/timeline_memory.lua %s 600000")
      :format(bin, big, root, script("timeline.lua")))
    os.remove(big)
    assert.are.equal(0, rc, out)
    assert.matches("records 600000 of 600000.*\nbounded\n", out)
  end)
end)

describe("records earlier than the first one seen", function()
  -- wire_gen writes the runtime batches first: the first record seen is a call's end, and the
  -- kernel it launched started before it. An unsigned subtraction would wrap below zero there.
  it("give signed times in idle.lua and timeline.lua", function()
    if not gen then
      pending("CUPTIMON_WIRE_GEN is not set (run through ctest)")
      return
    end
    local cap, path = tmp .. "/rk.cmcap", tmp .. "/rk.json"
    assert(os.execute(("%s capture %s --pid 9 --records 2000 --kinds runtime,kernel"):format(gen, cap)) == 0)
    local rc, out = helpers.sh(("%s --replay %s %s --interval 1"):format(bin, cap, script("idle.lua")))
    assert.are.equal(0, rc, out)
    assert.matches("\n%s+0%s+0%s+1%s+0%.5%s+0%.5%s+100%.0%s+0%s+0%.0\n", out)
    assert.is_nil(out:match("%d%d%d%d%d%d%d%d%d%d"), out)
    rc, out = helpers.sh(("%s --replay %s %s -o %s"):format(bin, cap, script("timeline.lua"), path))
    assert.are.equal(0, rc, out)
    local r, err = check.file(path)
    assert.is_truthy(r, err)
    for v in read(path):gmatch('"ts":([^,}]+)') do assert.is_true(tonumber(v) < 1e8, v) end
  end)
end)

describe("idle.lua on examples/demo.cmcap", function()
  it("has no span or gap that wrapped below zero, and names the call before each gap", function()
    local rc, out = helpers.sh(("%s --replay %s %s"):format(bin, demo, script("idle.lua")))
    assert.are.equal(0, rc, out)
    assert.matches("\n%s+0%s+14%s+393%s+4748%.9%s+3221%.9%s+67%.8%s+29%s+225%.1\n", out)
    assert.is_nil(out:match("%d%d%d%d%d%d%d%d%d%d"), out) -- no 10-digit value anywhere
    local gaps = out:match("largest idle gaps\n[^\n]*\n(.*)$")
    local n = 0
    for line in gaps:gmatch("[^\n]+") do
      n = n + 1
      assert.matches("^%s+%d+%s+%d+%s+[%d.]+%s+[%d.]+ cuda%a+%s+[%d.]+$", line)
    end
    assert.are.equal(5, n, out)
  end)
end)

-- A kernel name with 0xff 0xfe, an overlong sequence or a surrogate, or an executable path with
-- 0xff, must leave timeline.lua's JSON and dump.lua's JSON Lines valid (and trace_check must
-- reject them when they are not); ESC and OSC sequences must not reach the terminal.
describe("outputs of hostile names (wire_gen --hostile)", function()
  if not gen then
    pending("CUPTIMON_WIRE_GEN is not set (run through ctest)")
    return
  end
  local cap = tmp .. "/hostile.cmcap"
  setup(function()
    assert(os.execute(("%s capture %s --hostile --records 300 --kinds kernel,memcpy,runtime"):format(gen, cap)) == 0)
  end)

  it("trace_check rejects invalid UTF-8 in a JSON string", function()
    for _, bad in ipairs({ "\255\254", "\192\175", "\237\160\128", "a\244\144\128\128" }) do
      local v, err = check.json('["' .. bad .. '"]')
      assert.is_nil(v)
      assert.matches("invalid UTF%-8", err)
    end
    assert.are.same({ "caf\195\169 \226\130\172" }, check.json('["caf\195\169 \226\130\172"]'))
  end)

  it("timeline.lua writes a trace that is valid UTF-8 JSON", function()
    local out = tmp .. "/hostile.json"
    local rc, log = helpers.sh(("%s --replay %s %s -o %s"):format(bin, cap, script("timeline.lua"), out))
    assert.are.equal(0, rc, log)
    local text = read(out)
    assert.is_nil(check.utf8_invalid(text))
    local r, err = check.file(out)
    assert.is_truthy(r, err)
    assert.matches("bad\239\191\189\239\191\189", text) -- 0xff 0xfe became two U+FFFD
  end)

  it("dump.lua writes JSON Lines and CSV that are valid UTF-8", function()
    local dir = tmp .. "/hostile_dump/"
    for _, fmt in ipairs({ "jsonl", "csv" }) do
      local rc, log = helpers.sh(("%s --replay %s %s --kinds kernel --format %s -o %s%s/"):format(bin, cap,
        script("dump.lua"), fmt, dir, fmt))
      assert.are.equal(0, rc, log)
      local text = read(dir .. fmt .. "/kernel." .. fmt)
      assert.is_nil(check.utf8_invalid(text), fmt)
      assert.is_nil(text:find("\27", 1, true), fmt)
      if fmt == "jsonl" then
        local n = 0
        for line in text:gmatch("[^\n]+") do
          assert.is_truthy(check.json(line), line)
          n = n + 1
        end
        assert.are.equal(301, n) -- a header line, then one per record
      end
    end
  end)

  it("top.lua prints no control character from a process's strings", function()
    local rc, out = helpers.sh(("%s --replay %s %s"):format(bin, cap, script("top.lua")))
    assert.are.equal(0, rc, out)
    assert.is_nil(out:find("[\1-\8\11-\31\127]") or out:find("\0", 1, true), out)
    assert.is_nil(check.utf8_invalid(out))
    assert.matches("/usr/bin/wire\239\191\189gen", out)
  end)
end)

-- timeline.lua -o and dump.lua -o never follow a symlink (another user's link in /tmp would make
-- root overwrite root-owned files): they create outputs as --record does.
describe("outputs of timeline.lua and dump.lua", function()
  local write = helpers.write

  it("never write through a symlink, nor replace a file without --force, nor open a FIFO", function()
    local dir = tmp .. "/outs"
    os.execute("rm -rf " .. dir .. " && mkdir -p " .. dir)
    local victim = dir .. "/victim"
    write(victim, "precious\n")
    os.execute(("ln -s %s %s/link.json"):format(victim, dir))
    for _, force in ipairs({ "", " --force" }) do
      local rc, out = helpers.sh(("%s --replay %s %s -o %s/link.json%s"):format(bin, demo, script("timeline.lua"),
        dir, force))
      assert.are.equal(1, rc, out)
      assert.matches("link%.json exists and is not a regular file %(a symbolic link%)", out)
      assert.are.equal("precious\n", read(victim))
    end
    os.execute("mkfifo " .. dir .. "/fifo.json")
    local rc, out = helpers.sh(("timeout 20 %s --replay %s %s -o %s/fifo.json --force"):format(bin, demo,
      script("timeline.lua"), dir))
    assert.are.equal(1, rc, out)
    assert.matches("fifo%.json exists and is not a regular file %(a fifo%)", out)
    write(dir .. "/old.json", "old\n")
    rc, out = helpers.sh(("%s --replay %s %s -o %s/old.json"):format(bin, demo, script("timeline.lua"), dir))
    assert.are.equal(1, rc, out)
    assert.matches("old%.json exists; %-%-force replaces it", out)
    assert.are.equal("old\n", read(dir .. "/old.json"))
    rc, out = helpers.sh(("%s --replay %s %s -o %s/old.json --force"):format(bin, demo, script("timeline.lua"), dir))
    assert.are.equal(0, rc, out)
    assert.is_truthy(check.file(dir .. "/old.json"))
    -- dump.lua: a link planted where one of its files goes.
    os.execute(("mkdir -p %s/dump && ln -s %s %s/dump/kernel.csv"):format(dir, victim, dir))
    for _, force in ipairs({ "", " --force" }) do
      rc, out = helpers.sh(("%s --replay %s %s --kinds kernel -o %s/dump/%s"):format(bin, demo, script("dump.lua"),
        dir, force))
      assert.are.equal(1, rc, out)
      assert.matches("kernel%.csv exists and is not a regular file %(a symbolic link%)", out)
      assert.are.equal("precious\n", read(victim))
    end
  end)
end)
