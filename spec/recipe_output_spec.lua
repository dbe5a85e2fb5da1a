-- What the recipes print around their results: a command that cannot start gives its
-- one-line error and nothing else; --format csv|json for memcpy_bw, idle, gpu_util and ranks;
-- every option listed once in each recipe's --help; ranks without steps says how to get them.
-- luacheck: std +busted
local helpers = require "helpers"

local bin = helpers.binary()
local root = helpers.root()
local demo = root .. "/examples/demo.cmcap"
local scripts = root .. "/scripts/"

-- helpers.sh without the line a monitor prints when it removes the directory of one killed with
-- SIGKILL (other specs kill monitors): that line is not the recipe's output.
local function sh(cmd)
  local rc, out = helpers.sh(cmd)
  return rc, (out:gsub("cuptimon%-lua: removed [^\n]*, left by a monitor that was killed\n", ""))
end

describe("a command that cannot start", function()
  local dir = helpers.tmpdir()
  local missing = "/nonexistent/cuptimon-no-such-command"
  local err = "cuptimon-lua: cannot run " .. missing .. ": no such file or directory\n"
  -- The recipe and its options; each run must print the error line alone and exit 127.
  local cases = {
    "top.lua", "top.lua --interval 50", "top.lua --duty 0.5", "top.lua --format json",
    "count.lua", "count.lua --per-process", "count.lua --duty 0.5", "api_latency.lua",
    "memcpy_bw.lua", "idle.lua", "gpu_util.lua", "ranks.lua", "ranks.lua --interval 10",
    "spike.lua", "sqlite.lua -o " .. dir .. "/x.sqlite", "nvtx.lua", "dump.lua -o " .. dir .. "/d/",
    "timeline.lua -o " .. dir .. "/t.json",
  }
  for _, cmd in ipairs(cases) do
    it(cmd .. " prints the one-line error alone, status 127", function()
      local rc, out = sh(("%s %s%s -- %s"):format(bin, scripts, cmd, missing))
      assert.are.same({ 127, err }, { rc, out })
    end)
  end
  it("prometheus.lua prints its serving line, then the error alone, status 127", function()
    local rc, out = sh(("%s %sprometheus.lua --port 0 -- %s"):format(bin, scripts, missing))
    assert.are.equal(127, rc, out)
    assert.matches("^prometheus%.lua: serving http://127%.0%.0%.1:%d+/metrics\n", out)
    assert.are.equal(err, (out:gsub("^prometheus[^\n]*\n", "")))
  end)
  it("a command that ran is not a failure: top.lua -- true says no CUDA process connected", function()
    local rc, out = sh(("%s %stop.lua -- true"):format(bin, scripts))
    assert.are.same({ 0, "no kernels: no CUDA process connected (the command ran no CUDA code, or "
      .. "the agent was not loaded into it: a static binary, or CUDA_INJECTION64_PATH cleared)\n" },
      { rc, out })
  end)
  it("a file that is not executable: the error alone, status 126", function()
    local f = assert(io.open(dir .. "/noexec", "w"))
    f:close()
    local rc, out = sh(("%s %stop.lua -- %s/noexec"):format(bin, scripts, dir))
    assert.are.same({ 126, "cuptimon-lua: cannot run " .. dir .. "/noexec: permission denied\n" },
      { rc, out })
  end)
  it("cm.command_failed() is false on a replay", function()
    local rc, out = sh(("%s --replay %s -e 'require(\"cuptimon\").on(\"exit\", function() "
      .. "print(\"failed\", require(\"cuptimon\").command_failed()) end)'"):format(bin, demo))
    assert.are.same({ 0, "failed\tfalse\n" }, { rc, out })
  end)
  it("cleans up", function() os.execute("rm -rf " .. dir) end)
end)

-- Runs a recipe on captures (the demo capture by default) and asserts status 0; returns stdout
-- alone (stderr goes to /dev/null: what a pipe into pandas or jq reads).
local function stdout_of(cmd, captures)
  local list = {}
  for _, c in ipairs(captures or { demo }) do list[#list + 1] = "--replay " .. c end
  local rc, out = sh(("(%s %s %s%s 2>/dev/null)"):format(bin, table.concat(list, " "),
    scripts, cmd))
  assert.are.equal(0, rc, out)
  return out
end

-- The lines of `text`.
local function lines(text)
  local t = {}
  for l in text:gmatch("[^\n]+") do t[#t + 1] = l end
  return t
end

describe("--format csv|json", function()
  local ranks = { root .. "/spec/fixtures/ranks/rank0.cmcap", root .. "/spec/fixtures/ranks/rank1.cmcap" }
  local pm = { root .. "/spec/fixtures/pm_fake.cmcap" }

  it("memcpy_bw: the bandwidth rows, then a row per histogram bucket", function()
    assert.are.equal("copy kind,count,bytes,time_us,GB/s\nHtoD,33,16973824,419.676,40.44506715\n"
      .. "DtoH,30,120,47.201,0.002542319019\nDtoD,3,3145728,3.936,799.2195122\n",
      stdout_of("memcpy_bw.lua --format csv --no-hist"))
    local json = lines(stdout_of("memcpy_bw.lua --format json"))
    assert.are.equal('{"copy kind":"HtoD","count":33,"bytes":16973824,"time_us":419.676,'
      .. '"GB/s":40.44506715}', json[1])
    -- The buckets add up to the copies of each kind, and none is a text bar.
    local copies = {}
    for _, l in ipairs(json) do
      local kind, n = l:match('^{"copy kind":"(%w+)","lo_bytes":[%dnul]+,"hi_bytes":%d+,"copies":(%d+)}$')
      if kind then copies[kind] = (copies[kind] or 0) + tonumber(n) end
      assert.is_nil(l:find("@", 1, true), l)
    end
    assert.are.same({ HtoD = 33, DtoH = 30, DtoD = 3 }, copies)
    assert.matches("\nDtoH,4,8,30\n", stdout_of("memcpy_bw.lua --format csv"))
  end)

  it("idle: the streams, the buckets as long rows and the gaps, each row with its pid", function()
    local out = stdout_of("idle.lua --format csv --interval 2 --top 1")
    assert.are.same({
      "pid,device,stream,ops,span_us,busy_us,busy%,gaps,max_gap_us",
      "601,0,7,4,93.216,33.504,35.9423275,2,29.057",
      "601,0,13,30,4504.17,387.197,8.59641177,29,546.43",
      "601,0,14,393,4748.873,3221.873,67.84500238,29,225.054",
      "pid,device,stream,start_ms,busy%",
      "601,0,7,0,1.6752", "601,0,7,2,0", "601,0,7,4,0",
      "601,0,13,0,6.9935", "601,0,13,2,9.0736", "601,0,13,4,3.29275",
      "601,0,14,0,51.82565", "601,0,14,2,74.4538", "601,0,14,4,34.8142",
      "pid,device,stream,start_us,gap_us,last_api_before,api_end_us",
      "601,0,13,185.695,546.43,cudaStreamWaitEvent,180.633",
    }, lines(out))
    local json = lines(stdout_of("idle.lua --format json --top 1"))
    assert.are.equal(4, #json)
    assert.are.equal('{"pid":601,"device":0,"stream":13,"start_us":185.695,"gap_us":546.43,'
      .. '"last_api_before":"cudaStreamWaitEvent","api_end_us":180.633}', json[4])
  end)

  it("gpu_util: one row per device and window, a metric without value empty or null", function()
    local csv = lines(stdout_of("gpu_util.lua --format csv", pm))
    assert.are.equal("pid,dev,window_ms,sm%,tensor%,dram%,pcie_rd_GB/s,pcie_wr_GB/s,samples,kernels",
      csv[1])
    assert.are.equal('20636,0,0,13.35,23.35,53.35,7.335e-08,8.335e-08,20,'
      .. '"pm_kernel_a (5.0 ms), pm_kernel_b (5.0 ms)"', csv[2])
    for i = 2, #csv do assert.matches("^20636,0,%d+,", csv[i]) end -- the header once
    local json = lines(stdout_of("gpu_util.lua --format json --sm nope__metric", pm))
    assert.matches('^{"pid":20636,"dev":0,"window_ms":0,"sm%%":null,"tensor%%":23.35,', json[1])
  end)

  it("ranks: one row per rank with the times it was flagged; straggler lines on stderr", function()
    assert.are.same({
      '{"rank":0,"local":0,"pid":24183,"device":0,"steps":8,"kernels":16,"step_med_ms":3,'
        .. '"step_last_ms":3,"busy%":81.21827411,"comm_ms":11.2,"wait_ms":8,"stragglers":0}',
      '{"rank":1,"local":1,"pid":24184,"device":1,"steps":8,"kernels":16,"step_med_ms":3,'
        .. '"step_last_ms":3,"busy%":81.21827411,"comm_ms":3.2,"wait_ms":0,"stragglers":1}',
    }, lines(stdout_of("ranks.lua --format json --interval 0", ranks)))
    local rc, both = sh(("(%s --replay %s --replay %s %sranks.lua --format csv 2>&1 >/dev/null)")
      :format(bin, ranks[1], ranks[2], scripts))
    assert.are.equal(0, rc, both)
    assert.matches("^straggler: rank 1 %(pid 24184, device 1%) steps 1%-3: ", both)
    assert.matches("\nstragglers: rank 1 %(pid 24184, device 1%) 1 time\n$", both)
    -- With --interval, each row says which table it belongs to (at exit: "exit").
    assert.matches("^refresh,rank,local,pid,device,", stdout_of("ranks.lua --format csv", ranks))
    -- The demo capture's one rank has no RANK: empty in CSV.
    assert.matches("\n,,601,0,30,300,", stdout_of("ranks.lua --format csv --interval 0"))
  end)

  it("an unknown format is a usage error naming the choices", function()
    for _, r in ipairs { "memcpy_bw", "idle", "gpu_util", "ranks" } do
      local rc, out = sh(("%s --replay %s %s%s.lua --format xml"):format(bin, demo, scripts, r))
      assert.are.same({ 2, r .. '.lua: --format: the output format must be text, csv or json, got '
        .. '"xml" (see --help)\n' }, { rc, out })
    end
  end)
end)

describe("ranks.lua without steps", function()
  it("says the run has no NVTX ranges and how to count steps by a kernel instead; status 1", function()
    local rc, out = sh(("(%s --replay %s/spec/fixtures/pm_fake.cmcap %sranks.lua --interval 0 "
      .. "2>&1 >/dev/null)"):format(bin, root, scripts))
    assert.are.same({ 1, 'ranks.lua: no step: no NVTX range named "step" (the run has no NVTX '
      .. "ranges); name the step's range with --step NAME, or count steps by the launches of one "
      .. "kernel with --step-kernel NAME\n" }, { rc, (out:gsub("cuptimon%-lua: warning: [^\n]*\n", "")) })
  end)
  it("names the ranges it saw, and prints the table without a 'no straggler' line", function()
    local rc, out = sh(("%s --replay %s %sranks.lua --interval 0 --step nope"):format(bin,
      demo, scripts))
    assert.are.equal(1, rc, out)
    assert.matches('no NVTX range named "nope" %(the ranges seen: "setup", "step", "train"%); ', out)
    assert.matches("\n%s+%-%s+%-%s+601%s+0%s+0%s+300%s", out)
    assert.is_nil(out:find("straggler\n", 1, true), out)
  end)
  it("with --step-kernel, says that no kernel of that name was launched", function()
    local rc, out = sh(("(%s --replay %s %sranks.lua --interval 0 --step-kernel nope 2>&1 "
      .. ">/dev/null)"):format(bin, demo, scripts))
    assert.are.same({ 1, 'ranks.lua: no step: no launch of a kernel named "nope"; --step-kernel '
      .. "takes a name as top.lua shows it\n" }, { rc, out })
  end)
  it("counts the demo's steps by a kernel's launches: 30 loss reductions, 29 steps between", function()
    local out = stdout_of("ranks.lua --interval 0 --step-kernel cm_demo_loss_reduce")
    assert.matches("\n%s+%-%s+%-%s+601%s+0%s+29%s+300%s", out)
    assert.matches("\nno straggler\n$", out)
  end)
end)

describe("every recipe's --help", function()
  -- The long flags that a help line starts with (after blanks), alone ("  --top N  ...") or in a
  -- list ("  -o, --output FILE", "  --sm, --tensor, --dram   ...").
  local function flags_of(line)
    local out, rest = {}, line:match("^%s+(%-.*)$")
    while rest do
      local f, after = rest:match("^(%-%-?%w[%w%-]*)(.*)$")
      if not f then break end
      if f:sub(1, 2) == "--" then out[#out + 1] = f end
      rest = after:gsub("^ %u[%u%d_]*", "", 1):match("^, (%-.*)$")
    end
    return out
  end

  local names = {}
  for path in io.popen("ls " .. root .. "/scripts/*.lua"):lines() do names[#names + 1] = path end
  for _, path in ipairs(names) do
    local name = path:match("([%w_]+)%.lua$")
    it(name .. ": describes every option exactly once", function()
      -- The valid options, as the usage error of an unknown one lists them.
      local rc, err = sh(("%s %s --no-such-option"):format(bin, path))
      assert.are.equal(2, rc, err)
      local valid = err:match("valid options: ([^\n]-) %(see %-%-help%)")
      assert.is_truthy(valid, err)
      local out
      rc, out = sh(("%s %s --help"):format(bin, path))
      assert.are.equal(0, rc, out)
      local seen = {}
      for line in out:gmatch("[^\n]+") do
        for _, f in ipairs(flags_of(line)) do seen[f] = (seen[f] or 0) + 1 end
      end
      local wrong = {}
      for f in valid:gmatch("%-%-[%w%-]+") do
        if seen[f] ~= 1 then wrong[#wrong + 1] = ("%s described %d times"):format(f, seen[f] or 0) end
      end
      assert.are.same({}, wrong, out)
    end)
  end
end)
