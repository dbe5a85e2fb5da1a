-- Specs of PM sampling (cm.pm_sample, cm.pm_rows, the pm_sample kind) on the fake CUPTI: the
-- in-process engine, then live agents (the fake CUDA app under the real agent) and their
-- captures, through the gpu_util recipe.
-- luacheck: std +busted
local cm = require "cuptimon"
local ffi = require "ffi"
local helpers = require "helpers"

ffi.cdef [[
int fake_pm_emit(int device, uint32_t n, uint64_t start_ns, uint64_t dt_ns);
double fake_pm_value(const char *metric, uint64_t seq);
void fake_pm_set_denied(int on);
]]

local SM = "sm__cycles_active.avg"
local DRAM = "dram__throughput.avg.pct_of_peak_sustained_elapsed"

local function need_fake()
  local f, why = helpers.fake()
  if not f then pending(why) end
  return f
end

-- The fake numbers the samples of a device from 0 across the whole process: the next number.
local emitted = 0
local function emit(f, n)
  local t0 = f.fake_now()
  assert.are.equal(n, f.fake_pm_emit(0, n, t0, 1000000))
  local first = emitted
  emitted = emitted + n
  return t0, first
end

describe("cuptimon.pm_sample in process", function()
  it("delivers rows of the request's metrics with the fake's values and timestamps", function()
    local f = need_fake()
    if not f then return end
    local got = {}
    local r = assert(cm.pm_sample({ metrics = { SM, DRAM }, interval_us = 1000, device = 0,
      fn = function(rows)
        for i = 0, rows.n - 1 do
          got[#got + 1] = { rows.start[i], rows.stop[i], rows[SM][i], rows[DRAM][i], rows.device[i] }
        end
      end }))
    local t0, seq = emit(f, 5)
    assert.are.same({ true }, { cm.flush() })
    assert.are.equal(5, #got)
    for i, g in ipairs(got) do
      assert.is_true(g[1] == t0 + (i - 1) * 1000000ULL)
      assert.is_true(g[2] == t0 + i * 1000000ULL)
      assert.are.equal(f.fake_pm_value(SM, seq + i - 1), g[3])
      assert.are.equal(f.fake_pm_value(DRAM, seq + i - 1), g[4])
      assert.are.equal(0, g[5])
    end
    assert.are.same({ true }, { r:close() })
    assert.are.same({ true }, { r:close() })
    assert.matches("closed", tostring(r))
  end)

  it("hands every observer of the pm kind one record per sample and metric", function()
    local f = need_fake()
    if not f then return end
    local n, metrics = 0, {}
    local o = assert(cm.observe({ pm = { "metric", "value", "sample" } }, function(b)
      assert.are.equal("pm_sample", b.kind)
      n = n + b.n
      for i = 0, b.n - 1 do metrics[b:str("metric", i)] = true end
    end))
    local r = assert(cm.pm_sample({ metrics = { SM, DRAM } }))
    emit(f, 3)
    cm.flush()
    assert.are.equal(6, n)
    assert.are.same({ [SM] = true, [DRAM] = true }, metrics)
    r:close()
    o:close()
  end)

  it("says which metric the GPU cannot sample, and why a set is refused", function()
    if not need_fake() then return end
    local r, err, name = cm.pm_sample({ metrics = { SM, "sm__no_such.avg" } })
    assert.is_nil(r)
    assert.are.equal("ENOENT", name)
    assert.matches('metric "sm__no_such.avg" cannot be PM%-sampled on device 0', err)
    r, err, name = cm.pm_sample({ metrics = { "fake__two_pass.sum" } })
    assert.is_nil(r)
    assert.are.equal("ENOSYS", name)
    assert.matches("need 2 passes", err)
  end)

  it("says what to do when profiling counters are restricted to admin users", function()
    local f = need_fake()
    if not f then return end
    f.fake_pm_set_denied(1)
    local r, err, name = cm.pm_sample({ metrics = { SM }, device = 1 })
    f.fake_pm_set_denied(0)
    assert.is_nil(r)
    assert.are.equal("EPERM", name)
    assert.matches("CUPTI_ERROR_INSUFFICIENT_PRIVILEGES", err)
    assert.matches("NVreg_RestrictProfilingToAdminUsers=0", err)
  end)

  it("raises on misuse, naming what is valid", function()
    local cases = {
      { nil, "expected a table" },
      { { metrics = {} }, "metrics must be a list of 1 to 64" },
      { { metrics = { "a,b" } }, "is not a metric name" },
      { { metrics = { SM }, interval_us = 5 }, "interval_us must be an integer in %[20, 10000000%]" },
      { { metrics = { SM }, device = -1 }, "device must be a CUDA device ordinal" },
      { { metrics = { SM }, fn = 3 }, "fn must be a function" },
      { { metrics = { SM }, bogus = 1 }, "unknown option \"bogus\"" },
    }
    for _, c in ipairs(cases) do
      local ok, err = pcall(cm.pm_sample, c[1])
      assert.is_false(ok)
      assert.matches(c[2], err)
    end
  end)
end)

describe("gpu_util on live agents and their captures", function()
  local app = os.getenv("CUPTIMON_FAKE_APP")
  local bin, root = helpers.binary(), helpers.root()
  local dir = os.tmpname()
  os.remove(dir)
  os.execute("mkdir -p " .. dir)

  -- The dram% of a window of samples numbered first..last: the mean of the fake's values.
  local function mean_dram(f, first, last)
    local s = 0
    for q = first, last do s = s + f.fake_pm_value(DRAM, q) end
    return ("%.1f"):format(s / (last - first + 1))
  end

  it("joins samples and kernels live, records them, and replays the same rows", function()
    local f = need_fake()
    if not f or not app then return pending("needs the fake CUDA app and the fake CUPTI") end
    local cap = dir .. "/pm.%p.cmcap"
    -- The first two enables find the device not ready yet: the agent tries again.
    local rc, out = helpers.sh(("FAKE_PM_NOT_READY=2 %s --record %s %s/scripts/gpu_util.lua "
      .. "--window-ms 100 --top 1 -- %s --records 10 --pm 50 --rounds 3 --pause-ms 300")
      :format(bin, cap, root, app))
    assert.are.equal(0, rc, out)
    -- Three windows of 50 samples, one per round, each with the two kernels of the round.
    local rows = 0
    for line in out:gmatch("[^\n]+") do
      if line:match("^%s*%d+%s+0%s+%d+ ") then
        rows = rows + 1
        assert.matches(" 50 pm_kernel_a %(12%.5 ms%), %+1 more$", line)
      end
    end
    assert.are.equal(3, rows, out)
    assert.matches(" " .. mean_dram(f, 0, 49) .. " ", out)
    local file = out:match("recorded (%S+%.cmcap)")
    assert.is_string(file, out)
    local rc2, out2 = helpers.sh(("%s --replay %s %s/scripts/gpu_util.lua --window-ms 100 --top 1")
      :format(bin, file, root))
    assert.are.equal(0, rc2, out2)
    local live, replay = {}, {}
    for line in out:gmatch("[^\n]+") do if line:match(" pm_kernel_") then live[#live + 1] = line end end
    for line in out2:gmatch("[^\n]+") do if line:match(" pm_kernel_") then replay[#replay + 1] = line end end
    assert.are.same(live, replay)
  end)

  it("fails the run with the driver's restriction and what to do", function()
    if not need_fake() or not app then return pending("needs the fake CUDA app") end
    local rc, out = helpers.sh(("FAKE_PM_DENIED=1 %s %s/scripts/gpu_util.lua -- %s --records 10 "
      .. "--pm 5 --rounds 2 --pause-ms 300"):format(bin, root, app))
    assert.are.equal(1, rc, out)
    assert.matches("PM sampling in process %d+, device 0: EPERM: cuptiPmSamplingEnable failed: "
      .. "CUPTI_ERROR_INSUFFICIENT_PRIVILEGES", out)
    assert.matches("NVreg_RestrictProfilingToAdminUsers=0", out)
  end)

  it("names a metric the GPU cannot sample", function()
    if not need_fake() or not app then return pending("needs the fake CUDA app") end
    local rc, out = helpers.sh(("%s %s/scripts/gpu_util.lua --tensor sm__bogus.avg -- %s "
      .. "--records 10 --pm 5 --rounds 2 --pause-ms 300"):format(bin, root, app))
    assert.are.equal(1, rc, out)
    assert.matches('ENOENT: metric "sm__bogus.avg" cannot be PM%-sampled on device 0', out)
  end)
end)
