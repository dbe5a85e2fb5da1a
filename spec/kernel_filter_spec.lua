-- Specs of --filter REGEX and --exclude REGEX on kernel names in timeline.lua, dump.lua and
-- nvtx.lua, on the bundled capture: 300 kernels, 150 of them
-- cm_demo_matmul<16>, 66 copies and 61 memsets. The filter is cuptimon.filter through
-- args.with_filter, as top.lua and api_latency.lua use it.
-- luacheck: std +busted
local helpers = require "helpers"
local check = require "trace_check"

local bin = helpers.binary()
local root = helpers.root()
local demo = root .. "/examples/demo.cmcap"
local function script(name) return root .. "/scripts/" .. name end

-- Runs recipe `name` on the demo capture with `opts`; returns its exit status and output.
local function replay(name, opts)
  return helpers.sh(("%s --replay %s %s %s"):format(bin, demo, script(name), opts))
end

local dir
setup(function() dir = helpers.tmpdir() end)
teardown(function() os.execute("rm -rf " .. dir) end)

describe("--filter and --exclude", function()
  it("are in the --help of timeline, dump and nvtx", function()
    for _, name in ipairs { "timeline.lua", "dump.lua", "nvtx.lua" } do
      local rc, out = replay(name, "--help")
      assert.are.equal(0, rc, out)
      assert.matches("\n  %-%-filter REGEX", out)
      assert.matches("\n  %-%-exclude REGEX", out)
    end
  end)

  it("refuse a bad expression with one line and status 2, writing nothing", function()
    -- (nvtx.lua writes no file: its -o is timeline's and dump's.)
    for _, name in ipairs { "timeline.lua", "dump.lua", "nvtx.lua" } do
      local rc, out = helpers.sh(("cd %s && %s --replay %s %s --filter '('%s"):format(dir,
        bin, demo, script(name), name == "nvtx.lua" and "" or " -o bad.out"))
      assert.are.equal(2, rc, out)
      assert.matches(name:gsub("%.", "%%.") .. ': %-%-filter "%(" is not a valid regular expression', out)
      assert.is_nil(helpers.read(dir .. "/bad.out"))
    end
  end)
end)

describe("timeline.lua --filter/--exclude", function()
  -- The kernel slices of a trace by name, and the number of slices per category.
  local function slices(path)
    local r, err = check.file(path)
    assert.is_truthy(r, err)
    local trace = assert(check.json(assert(helpers.read(path))))
    local names = {}
    for _, e in ipairs(trace.traceEvents) do
      if e.ph == "X" and e.cat == "kernel" then names[e.name] = (names[e.name] or 0) + 1 end
    end
    return names, r.by_cat
  end

  it("keeps only the kernels that match, and every copy, memset and call", function()
    local path = dir .. "/f.json"
    local rc, out = replay("timeline.lua", "--filter 'matmul' -o " .. path)
    assert.are.equal(0, rc, out)
    assert.matches("wrote [^\n]*: 938 slices %(150 kernel, 66 memcpy, 61 memset, 629 runtime, 0 driver, "
      .. "32 nvtx%), 3 marks, 277 flows; 150 kernels left out by %-%-filter/%-%-exclude\n", out)
    local names, cats = slices(path)
    assert.are.same({ ["cm_demo_matmul<16>"] = 150 }, names)
    assert.are.same({ kernel = 150, memcpy = 66, memset = 61, cuda_runtime = 629, nvtx = 32 }, cats)
  end)

  it("leaves out the kernels that match --exclude", function()
    local path = dir .. "/x.json"
    local rc, out = replay("timeline.lua", "--exclude '^cm_demo_(matmul|sgd)' -o " .. path)
    assert.are.equal(0, rc, out)
    assert.matches("210 kernels left out by %-%-filter/%-%-exclude\n", out)
    local names = slices(path)
    assert.are.same({ cm_demo_bias_relu = 30, cm_demo_loss_reduce = 30, cm_demo_relu_backward = 30 }, names)
  end)
end)

describe("dump.lua --filter/--exclude", function()
  local function rows(path)
    local n, names = 0, {}
    for line in assert(io.open(path)):lines() do
      if not line:match("^#") and not line:match("^process_pid") then
        n = n + 1
        local name = line:match("^%d+,([^,]*)")
        if name then names[name] = true end
      end
    end
    return n, names
  end

  it("writes only the kernel rows that match, and every row of the other kinds", function()
    local rc, out = helpers.sh(("cd %s && %s --replay %s %s --fields name,start -o f/ --filter '^cm_demo_matmul'")
      :format(dir, bin, demo, script("dump.lua")))
    assert.are.equal(0, rc, out)
    assert.matches("concurrent_kernel%s+150 f/kernel%.csv\nmemcpy%s+66 f/memcpy%.csv\nmemset%s+61 f/memset%.csv\n"
      .. "runtime%s+629 f/runtime%.csv\n150 kernel rows left out by %-%-filter/%-%-exclude\n", out)
    local n, names = rows(dir .. "/f/kernel.csv")
    assert.are.equal(150, n)
    assert.are.same({ ["cm_demo_matmul<16>"] = true }, names)
    assert.are.equal(66, (rows(dir .. "/f/memcpy.csv")))
  end)

  it("filters by the name even when the name is not written", function()
    local rc, out = helpers.sh(("cd %s && %s --replay %s %s --kinds kernel --fields start,stop -o x/ --exclude matmul")
      :format(dir, bin, demo, script("dump.lua")))
    assert.are.equal(0, rc, out)
    assert.matches("concurrent_kernel%s+150 x/kernel%.csv\n", out)
    assert.matches("# clock: CLOCK_REALTIME ns\nprocess_pid,start,stop\n601,", helpers.read(dir .. "/x/kernel.csv"))
  end)
end)

describe("nvtx.lua --filter/--exclude", function()
  -- The GPU time (us) and the train range's ops of nvtx.lua's output.
  local function totals(opts)
    local rc, out = replay("nvtx.lua", opts)
    assert.are.equal(0, rc, out)
    local ops = tonumber(out:match("\ntrain%s+%d+%s+(%d+)"))
    return tonumber(out:match("range paths, ([%d.]+) us of GPU time")), ops, out
  end

  it("charges only the kernels kept, and the copies and memsets", function()
    local all, all_ops = totals("")
    local kept, kept_ops, out = totals("--filter matmul")
    local rest, rest_ops = totals("--exclude matmul")
    local none, none_ops = totals("--exclude .")
    assert.are.equal(423, all_ops)
    assert.are.equal(273, kept_ops) -- 150 matmul kernels + 123 copies and memsets
    assert.are.equal(273, rest_ops)
    assert.are.equal(123, none_ops)
    assert.matches("; 150 kernels left out by %-%-filter/%-%-exclude\n", out)
    -- matmul's time and the rest's add up to all of it, the copies and memsets counted in each.
    assert.is_true(math.abs(kept + rest - none - all) < 0.2, ("%s + %s - %s vs %s"):format(kept, rest, none, all))
    assert.is_true(kept < all and rest < all)
    local same = totals("--filter .")
    assert.are.equal(all, same)
  end)
end)
