-- Specs of the recipes (scripts/*.lua) on the bundled capture examples/demo.cmcap (a GPU run of
-- examples/demo): each output must equal the reviewed one in spec/fixtures/demo/NAME.out, byte
-- for byte, with exit status 0. A replay is deterministic, so any change in a recipe's output
-- shows here; after an intended change, regenerate a file with
--   build/cuptimon-lua --replay examples/demo.cmcap scripts/RECIPE.lua ARGS > spec/fixtures/demo/NAME.out
-- and explain the difference in the commit.
-- luacheck: std +busted
local helpers = require "helpers"

local bin = helpers.binary()
local root = helpers.root()
local capture = root .. "/examples/demo.cmcap"

-- name -> recipe and arguments.
local cases = {
  { "count", "count.lua" },
  { "count_per_process", "count.lua --per-process" },
  { "top", "top.lua" },
  { "top_full_names", "top.lua --full-names" },
  { "top_mangled_top3", "top.lua --mangled --top 3" },
  { "memcpy_bw", "memcpy_bw.lua" },
  { "memcpy_bw_no_hist", "memcpy_bw.lua --no-hist" },
  -- Stream 14's operations arrive out of start order (kernels, copies and memsets come in
  -- separate batches): its span was once an unsigned subtraction below zero, 18446744073709532 us.
  -- (timeline.lua writes a trace file now: spec/timeline_spec.lua checks it.)
  { "idle", "idle.lua" },
  { "idle_gap_1000", "idle.lua --gap-us 1000" },
  { "idle_interval_1_top_3", "idle.lua --interval 1 --top 3" },
  { "api_latency", "api_latency.lua" },
  { "nvtx", "nvtx.lua" },
  { "api_latency_driver", "api_latency.lua --driver" },
}

local function read(path)
  local f = assert(io.open(path, "rb"))
  local s = f:read("*a")
  f:close()
  return s
end

describe("recipes on examples/demo.cmcap", function()
  for _, c in ipairs(cases) do
    local name, cmd = c[1], c[2]
    it(name .. ": " .. cmd, function()
      local recipe, rest = cmd:match("^(%S+)(.*)$")
      local rc, out = helpers.sh(("%s --replay %s %s/scripts/%s%s"):format(bin, capture, root,
        recipe, rest))
      assert.are.equal(0, rc, out)
      assert.are.equal(read(root .. "/spec/fixtures/demo/" .. name .. ".out"), out)
    end)
  end

  local function run(cmd)
    local rc, out = helpers.sh(("%s --replay %s %s/scripts/%s"):format(bin, capture, root, cmd))
    assert.are.equal(0, rc, out)
    return out
  end

  it("top: its instances equal count.lua's kernel records", function()
    local n = 0
    for c in run("top.lua --top 100"):gmatch("\n%s*[%d.]+%s+%d+%s+(%d+)%s") do n = n + tonumber(c) end
    local want = run("count.lua --kinds kernel"):match("concurrent_kernel%s+(%d+)")
    assert.are.equal(tonumber(want), n)
  end)

  -- top --interval on a replay counts trace time, as idle.lua does, not wall time (which would
  -- give one empty table, then the end).
  it("top: --interval on a replay refreshes by trace time, the deltas adding up", function()
    local out = run("top.lua --interval 1 --top 1")
    local heads, plus = {}, 0
    for h in out:gmatch("\n?(== [^\n]*)") do heads[#heads + 1] = h end
    assert.are.same({ "== trace time +1 ms, every 1 ms", "== trace time +2 ms, every 1 ms",
      "== trace time +3 ms, every 1 ms", "== trace time +4 ms, every 1 ms", "== at exit" }, heads)
    for n in out:gmatch("\n%s*[%d.]+%s+%d+%s+%d+%s+%d+%s+(%d+)%s+[%d.]+%s+[^\n]*cm_demo_matmul") do
      plus = plus + tonumber(n)
    end
    local last = tonumber(out:match("== trace time %+4 ms.-\n%s*[%d.]+%s+%d+%s+(%d+)%s"))
    assert.are.equal(last, plus, out) -- each refresh's +Instances: the instances up to the last
    assert.matches("== at exit\n.-\n%s*[%d.]+%s+%d+%s+150%s[^\n]*cm_demo_matmul<16>", out)
  end)

  -- api_latency's columns are nsys cuda_api_sum's.
  it("api_latency: nsys cuda_api_sum's columns, shares adding up to 100%", function()
    local out = run("api_latency.lua --top 100")
    assert.matches("^Time %(%%%) Total %(us%) Num Calls Avg %(us%) Med %(us%) Min %(us%) Max %(us%) "
      .. "StdDev %(us%) Name\n", out)
    local share = 0
    for p in out:gmatch("\n%s*([%d.]+)%s+[%d.]+%s+%d+%s") do share = share + tonumber(p) end
    assert.is_true(math.abs(share - 100) < 0.5, out)
    assert.matches("\n%s+1%.5%s+2143%.7%s+300%s+7%.1%s+6%.1%s+4%.6%s+141%.6%s+8%.2 cudaLaunchKernel\n", out)
  end)

  -- The table recipes' results go to pandas or jq without scraping.
  it("top, count, nvtx and api_latency: --format csv and json", function()
    local csv = run("top.lua --format csv --top 2")
    assert.matches("^pid,device,Time %(%%%),Total %(us%),Instances,Avg %(us%),Med %(us%),P99 %(us%),"
      .. "Min %(us%),Max %(us%),Name\n601,0,93%.%d+,2862%.989,150,[%d.]+,[%d.]+,[%d.]+,5%.217,30%.08,"
      .. "cm_demo_matmul<16>\n601,0,[^\n]*cm_demo_sgd_update<float>\n$", csv)
    local json = run("top.lua --format json --top 1")
    assert.matches('^{"pid":601,"device":0,"Time %(%%%)":93%.%d+,"Total %(us%)":2862%.989,'
      .. '"Instances":150,[^\n]*"Name":"cm_demo_matmul<16>"}\n$', json)
    local count = run("count.lua --per-process --format csv")
    assert.matches("^pid,kind,records\n601,concurrent_kernel,300\n.*\n601,total,1187\nall,"
      .. "concurrent_kernel,300\n.*\nall,total,1187\n$", count)
    assert.matches('^{"pid":601,"range":"train","ranges":1,"ops":423,', run("nvtx.lua --format json"))
    assert.matches("^Time %(%%%),Total %(us%),Num Calls,", run("api_latency.lua --format csv"))
    local rc, out = helpers.sh(("%s --replay %s %s/scripts/top.lua --format xml"):format(bin,
      capture, root))
    assert.are.same({ 2, 'top.lua: --format: the output format must be text, csv or json, got '
      .. '"xml" (see --help)\n' }, { rc, out })
  end)

  it("top and api_latency: --sort orders the rows", function()
    local function names(out)
      local t = {}
      for line in out:gmatch("[^\n]+") do t[#t + 1] = line:match("^%s*[%d.]+%s+[%d.]+%s+%d+%s.* (%S+)$") end
      return t
    end
    assert.are.same({ "cm_demo_bias_relu", "cm_demo_loss_reduce", "cm_demo_matmul<16>",
      "cm_demo_relu_backward", "cm_demo_sgd_update<float>" }, names(run("top.lua --sort name")))
    -- The demo's loss_reduce and bias_relu have 30 instances each: ties go by name.
    assert.are.same({ "cm_demo_matmul<16>", "cm_demo_sgd_update<float>", "cm_demo_bias_relu",
      "cm_demo_loss_reduce", "cm_demo_relu_backward" }, names(run("top.lua --sort instances")))
    assert.are.same("cudaLaunchKernel", names(run("api_latency.lua --sort calls --top 1"))[1])
    local rc, out = helpers.sh(("%s --replay %s %s/scripts/top.lua --sort bogus"):format(bin,
      capture, root))
    assert.are.same({ 2, "top.lua: --sort must be total, instances, avg, max, min or name, got "
      .. "\"bogus\" (see --help)\n" }, { rc, out })
  end)

  it("top and api_latency: --filter and --exclude keep the names a regular expression picks", function()
    local names = {}
    for line in run("top.lua --filter 'relu|loss'"):gmatch("[^\n]+") do
      names[#names + 1] = line:match("^%s*[%d.]+%s+%d+%s+%d+%s.* (%S+)$")
    end
    assert.are.same({ "cm_demo_loss_reduce", "cm_demo_bias_relu", "cm_demo_relu_backward" }, names)
    local out = run("top.lua --exclude '^cm_demo_(matmul|sgd)'")
    assert.is_nil(out:find("matmul", 1, true), out)
    assert.matches("\n3 kernel names, 128 us of kernel time\n", out)
    out = run("api_latency.lua --filter '^cudaEvent' --exclude Destroy")
    assert.matches("%s30%s[^\n]*cudaEventSynchronize\n", out)
    assert.is_nil(out:find("cudaEventDestroy", 1, true), out)
    assert.is_nil(out:find("cudaLaunchKernel", 1, true), out)
    local rc, err = helpers.sh(("%s --replay %s %s/scripts/top.lua --filter '('"):format(bin, capture, root))
    assert.are.same({ 2, 'top.lua: --filter "(" is not a valid regular expression: Unmatched ( or \\( (see --help)\n' },
      { rc, err })
  end)

  it("nvtx: inclusive >= exclusive, exclusive sums to the GPU time, ranges nest", function()
    local out = run("nvtx.lua")
    local excl, total = 0, tonumber(out:match("([%d.]+) us of GPU time"))
    local rows = 0
    for name, incl, ex in out:gmatch("\n(%S+)%s+%S+%s+%d+%s+([%d.]+)%s+([%d.]+)%s+[%d.]+") do
      rows = rows + 1
      assert.is_true(tonumber(incl) >= tonumber(ex), name)
      assert.is_true(tonumber(incl) <= total + 0.1, name)
      excl = excl + tonumber(ex)
    end
    assert.are.equal(3, rows, out)
    assert.is_true(math.abs(excl - total) < 0.5, out)
    -- The demo's steps are inside "train": they are named by their path ("train/step", as the
    -- header shows), and train's inclusive time covers theirs.
    assert.matches("\ntrain/step%s+30%s+423%s+3609%.1%s+3609%.1", out)
    assert.matches("\ntrain%s+1%s+423%s+3609%.1%s+0%.0", out)
  end)

  it("dump: one file per kind, rows equal the record counts, clock header, strings resolved", function()
    local dir = os.tmpname()
    os.remove(dir)
    for _, fmt in ipairs { "csv", "jsonl" } do
      local out = run(("dump.lua --kinds kernel,memcpy,memset,runtime,marker --format %s -o %s/%s/")
        :format(fmt, dir, fmt))
      local counts = run("count.lua")
      for kind, file in pairs { concurrent_kernel = "kernel", memcpy = "memcpy", memset = "memset",
          runtime = "runtime", marker = "marker" } do
        local want = tonumber(counts:match("\n" .. kind .. "%s+(%d+)"))
        assert.matches(kind .. "%s+" .. want .. "%s", out)
        local text = read(("%s/%s/%s.%s"):format(dir, fmt, file, fmt))
        local lines = select(2, text:gsub("\n", ""))
        assert.are.equal(want + (fmt == "csv" and 2 or 1), lines, file)
        if fmt == "csv" then
          assert.matches("^# clock: CLOCK_REALTIME ns\nprocess_pid,", text)
        else
          assert.matches('^{"clock":"CLOCK_REALTIME","unit":"ns"', text)
        end
      end
      assert.matches("_Z14cm_demo_matmul", read(("%s/%s/kernel.%s"):format(dir, fmt, fmt)))
    end
    os.execute("rm -rf " .. dir)
  end)

  -- The columns come in the order asked, not the kind's field order, and kernel names
  -- demangled, as the header shows them.
  it("dump: --select writes the chosen fields in the order asked, kernel names demangled", function()
    local dir = os.tmpname()
    os.remove(dir)
    run(("dump.lua --select 'kernel:name,start,stop,correlation' -o %s/"):format(dir))
    local text = read(dir .. "/kernel.csv")
    os.execute("rm -rf " .. dir)
    assert.are.equal(read(root .. "/spec/fixtures/demo/dump_kernel_head.csv"),
      text:match("^([^\n]*\n[^\n]*\n[^\n]*\n[^\n]*\n)"))
  end)

  it("dump: --fields keeps its order in every kind; mangled_name is the compiler's name", function()
    local dir = os.tmpname()
    os.remove(dir)
    run(("dump.lua --kinds kernel,memcpy --fields name,start,stop,device,stream -o %s/"):format(dir))
    local kernel, memcpy = read(dir .. "/kernel.csv"), read(dir .. "/memcpy.csv")
    run(("dump.lua --kinds kernel --fields stream,mangled_name -o %s/m/"):format(dir))
    local mangled = read(dir .. "/m/kernel.csv")
    os.execute("rm -rf " .. dir)
    assert.matches("^# clock: CLOCK_REALTIME ns\nprocess_pid,name,start,stop,device,stream\n601,"
      .. "cm_demo_matmul<16>,%d+,%d+,0,14\n", kernel)
    assert.matches("^# clock: CLOCK_REALTIME ns\nprocess_pid,start,stop,device,stream\n", memcpy)
    assert.matches("^# clock: CLOCK_REALTIME ns\nprocess_pid,stream,mangled_name\n601,14,"
      .. "_Z14cm_demo_matmulILi16EEvPKfS1_Pfiiibbf\n", mangled)
  end)

  -- Enums and cbids are written by name, and JSONL timestamps as exact integers: a number above
  -- 2^53 loses its last digits in every JSON reader that holds numbers as doubles.
  it("dump: enum values and cbids by name (numbers with --raw), exact 64-bit integers in JSONL", function()
    local dir = os.tmpname()
    os.remove(dir)
    run(("dump.lua --kinds memcpy,runtime --fields copy_kind,src_kind,start,cbid -o %s/c/"):format(dir))
    run(("dump.lua --kinds memcpy,runtime --fields copy_kind,start,cbid --format jsonl -o %s/j/"):format(dir))
    run(("dump.lua --kinds memcpy --fields copy_kind,start --raw -o %s/r/"):format(dir))
    local csv, rt = read(dir .. "/c/memcpy.csv"), read(dir .. "/c/runtime.csv")
    local jm, jr = read(dir .. "/j/memcpy.jsonl"), read(dir .. "/j/runtime.jsonl")
    local raw = read(dir .. "/r/memcpy.csv")
    os.execute("rm -rf " .. dir)
    assert.matches("\nprocess_pid,copy_kind,src_kind,start\n601,HtoD,pageable,1796230814379745545\n", csv)
    assert.matches("\n601,%d+,cudaGetDeviceCount\n", rt)
    assert.matches('\n{"process_pid":601,"copy_kind":"HtoD","start":"1796230814379745545"}\n', jm)
    assert.matches('"cbid":"cudaLaunchKernel"', jr)
    assert.matches("\nprocess_pid,copy_kind,start\n601,1,1796230814379745545\n", raw)
  end)

  it("idle: no span or gap wraps below zero on the out-of-order stream", function()
    local rc, out = helpers.sh(("%s --replay %s %s/scripts/idle.lua"):format(bin, capture, root))
    assert.are.equal(0, rc, out)
    assert.matches("\n%s+0%s+14%s+393%s+4748%.9%s+3221%.9%s+67%.8%s+29%s+225%.1\n", out)
    assert.is_nil(out:match("%d%d%d%d%d%d%d%d%d%d"), out) -- no 10-digit value anywhere
  end)
end)

-- Every recipe over a capture of several processes recorded from the fake CUDA application with
-- the real agent: one table (or file, or track) per process, and counts equal to what each
-- process reports it wrote.
describe("every recipe on a two-process capture of the fake CUDA app", function()
  it("gives each process its own table with exact counts", function()
    local app, why = helpers.agent_app()
    if not app then
      pending(why)
      return
    end
    local cmd = ("sh -c '%s --records 3000 --kinds kernel,runtime,marker & %s --records 2000 --kinds kernel,memcpy,memset; wait'")
      :format(app, app)
    local rc, out, caps, dir, ncaps = helpers.record(cmd)
    assert.are.equal(0, rc, out)
    local written = {}
    for pid, k in out:gmatch("fake_cuda_app: pid=(%d+)[^\n]*concurrent_kernel=(%d+)") do
      written[pid] = tonumber(k)
    end
    assert.are.equal(2, ncaps, out)
    local replay = ("%s %s %s/scripts/"):format(bin, caps, root)
    local function recipe(args)
      local rc2, o = helpers.sh(replay .. args)
      assert.are.equal(0, rc2, args .. ": " .. o)
      return o
    end
    -- top: a table per process and device, titled by pid and executable; the instances of a
    -- process's tables add up to what it wrote.
    local top = recipe("top.lua --top 100")
    local inst, cur = {}, nil
    for line in top:gmatch("[^\n]+") do
      local pid = line:match("^pid (%d+) %([^)]*fake_cuda_app%), device %d+$")
      if pid then cur = pid end
      local c = line:match("^%s*[%d.]+%s+%d+%s+(%d+)%s")
      if c and cur then inst[cur] = (inst[cur] or 0) + tonumber(c) end
    end
    for pid, n in pairs(written) do assert.are.equal(n, inst[pid], top) end
    -- count, per process.
    local count = recipe("count.lua --per-process")
    for pid in pairs(written) do assert.matches(pid, count, 1, true) end
    -- nvtx, idle, memcpy_bw, api_latency: one section per process, status 0.
    for _, r in ipairs { "nvtx.lua", "idle.lua", "memcpy_bw.lua", "api_latency.lua" } do
      local o = recipe(r)
      assert.is_true(#o > 0, r)
    end
    local idle = recipe("idle.lua")
    local tables = 0
    for _ in idle:gmatch("pid %d+ %([^)]*fake_cuda_app%)\n") do tables = tables + 1 end
    assert.are.equal(2, tables, idle)
    -- dump: rows per process equal what each wrote.
    recipe(("dump.lua --kinds kernel -o %s/dump/"):format(dir))
    local rows = {}
    for line in io.lines(dir .. "/dump/kernel.csv") do
      local pid = line:match("^(%d+),")
      if pid then rows[pid] = (rows[pid] or 0) + 1 end
    end
    for pid, n in pairs(written) do assert.are.equal(n, rows[pid], pid) end
    -- timeline: a valid trace with both processes.
    package.path = root .. "/spec/?.lua;" .. package.path
    recipe(("timeline.lua -o %s/t.json"):format(dir))
    local r, err = require("trace_check").file(dir .. "/t.json")
    assert.is_truthy(r, err)
    local total = 0
    for _, n in pairs(written) do total = total + n end
    assert.are.equal(total, r.by_cat.kernel)
    os.execute("rm -rf " .. dir)
  end)
end)
