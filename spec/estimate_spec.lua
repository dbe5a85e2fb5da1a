-- spec/estimate_spec.lua: cuptimon.estimate on synthetic windows (no process, no engine).
--
-- The coverage checks simulate a steady process with a known rate, sample it in jittered
-- windows as cuptimon.duty does (one window of on_s at a uniformly random offset in each period),
-- and run the estimator on each of 100 seeded runs: the 95% intervals must hold the true rate in
-- at least 90 runs and the median estimate must lie within 5% of it.
-- luacheck: std +busted
local estimate = require "cuptimon.estimate"

-- Launch times of a Poisson process of `rate` per second in [a, b), and each launch's GPU time
-- (exponential, mean `mean_s`): returns count, gpu seconds.
local function poisson_window(rate, a, b, mean_s)
  local n, gpu = 0, 0
  local t = a - math.log(1 - math.random()) / rate
  while t < b do
    n = n + 1
    gpu = gpu - math.log(1 - math.random()) * mean_s
    t = t - math.log(1 - math.random()) / rate
  end
  return n, gpu
end

-- A periodic workload: every `step_s` a step of `per_step` launches, `dur_s` each, starting at a
-- phase of its own. Returns the launches and GPU seconds with their start in [a, b).
local function periodic_window(step_s, per_step, dur_s, phase, a, b)
  local first = math.ceil((a - phase) / step_s)
  local last = math.ceil((b - phase) / step_s) - 1
  local steps = math.max(last - first + 1, 0)
  return steps * per_step, steps * per_step * dur_s
end

-- One run: `windows` periods of period_s with one window of on_s each, at a random offset.
-- gen(a, b) -> count, gpu. Returns the estimator and the elapsed time.
local function run(windows, period_s, on_s, gen, est, key)
  est = est or estimate.new()
  key = key or "k"
  est:start(1, 0, { pid = 1 })
  for i = 0, windows - 1 do
    local a = i * period_s + math.random() * (period_s - on_s)
    -- The traced span varies a little from window to window, as the fences' latency does.
    local x = on_s * (1 + (math.random() - 0.5) * 0.01)
    local n, gpu = gen(a, a + x)
    if n > 0 then est:add(1, key, n, gpu) end
    est:commit(1, x)
  end
  return est, windows * period_s
end

local function median(t)
  table.sort(t)
  local n = #t
  return n % 2 == 1 and t[(n + 1) / 2] or (t[n / 2] + t[n / 2 + 1]) / 2
end

-- Runs `runs` seeded runs and returns how many intervals held the truth, and the median ratio of
-- estimate to truth, for launches and for GPU time.
local function coverage(runs, windows, gen_for_seed, true_rate, true_gpu)
  local held, held_gpu, ratios, gratios = 0, 0, {}, {}
  for seed = 1, runs do
    math.randomseed(seed)
    local gen = gen_for_seed(seed)
    local est, elapsed = run(windows, 10, 0.5, gen)
    local e = est:estimate(1, "k", elapsed, "n")
    local g = est:estimate(1, "k", elapsed, "t")
    if e.lo <= true_rate and true_rate <= e.hi then held = held + 1 end
    if g.lo <= true_gpu and true_gpu <= g.hi then held_gpu = held_gpu + 1 end
    ratios[#ratios + 1] = e.rate / true_rate
    gratios[#gratios + 1] = g.rate / true_gpu
  end
  return held, held_gpu, median(ratios), median(gratios)
end

describe("cuptimon.estimate.t_quantile", function()
  it("matches the tables of Student's t", function()
    local cases = { { 1, 12.7062 }, { 2, 4.3027 }, { 4, 2.7764 }, { 9, 2.2622 }, { 29, 2.0452 },
      { 1000, 1.9623 } }
    for _, c in ipairs(cases) do
      assert.is_true(math.abs(estimate.t_quantile(0.975, c[1]) - c[2]) < 1e-3,
        ("df %d: %.5f, not %.4f"):format(c[1], estimate.t_quantile(0.975, c[1]), c[2]))
    end
    assert.is_true(math.abs(estimate.t_cdf(0, 7) - 0.5) < 1e-12)
    assert.is_true(math.abs(estimate.t_quantile(0.9995, 10) - 4.5869) < 1e-3)
  end)
end)

describe("cuptimon.estimate coverage over 100 seeded runs", function()
  it("a steady Poisson process: 30 windows of 0.5 s every 10 s (duty 0.05)", function()
    local rate, mean = 2000, 20e-6
    local held, held_gpu, med, gmed = coverage(100, 30, function()
      return function(a, b) return poisson_window(rate, a, b, mean) end
    end, rate, rate * mean)
    assert.is_true(held >= 90, "launches/s: " .. held .. " of 100 intervals held the rate")
    assert.is_true(held_gpu >= 90, "GPU time/s: " .. held_gpu .. " of 100 intervals held it")
    assert.is_true(math.abs(med - 1) <= 0.05, "median estimate / rate = " .. med)
    assert.is_true(math.abs(gmed - 1) <= 0.05, "median GPU estimate / rate = " .. gmed)
  end)

  it("a rare kernel (2 launches/s) and only 5 windows: the t quantile keeps the coverage", function()
    local held, _, med = coverage(100, 5, function()
      return function(a, b) return poisson_window(2, a, b, 1e-3) end
    end, 2, 2e-3)
    assert.is_true(held >= 90, held .. " of 100 intervals held the rate")
    -- Five windows of 0.5 s see 5 launches on average: the median is coarse, the mean is not.
    assert.is_true(med > 0.5 and med < 1.5, "median estimate / rate = " .. med)
  end)

  it("a periodic training loop (a step every 37 ms) does not alias with the jittered windows", function()
    local steps, per, dur = 1 / 0.037, 50, 40e-6
    local held, held_gpu, med, gmed = coverage(100, 30, function()
      local phase = math.random() * 0.037
      return function(a, b) return periodic_window(0.037, per, dur, phase, a, b) end
    end, steps * per, steps * per * dur)
    assert.is_true(held >= 90, held .. " of 100 intervals held the rate")
    assert.is_true(held_gpu >= 90, held_gpu .. " of 100 intervals held the GPU time")
    assert.is_true(math.abs(med - 1) <= 0.05, "median estimate / rate = " .. med)
    assert.is_true(math.abs(gmed - 1) <= 0.05, "median GPU estimate / rate = " .. gmed)
  end)
end)

describe("cuptimon.estimate phase changes", function()
  it("flags a rate that doubles halfway, and rarely a steady one", function()
    local flagged, false_flags = 0, 0
    for seed = 1, 100 do
      math.randomseed(seed)
      local est, elapsed = run(30, 10, 0.5, function(a, b)
        return poisson_window(a < 150 and 1000 or 2000, a, b, 1e-5)
      end)
      if est:estimate(1, "k", elapsed).phase then flagged = flagged + 1 end
      local steady, el2 = run(30, 10, 0.5, function(a, b) return poisson_window(1000, a, b, 1e-5) end)
      if steady:estimate(1, "k", el2).phase then false_flags = false_flags + 1 end
    end
    assert.is_true(flagged >= 95, flagged .. " of 100 phase changes flagged")
    assert.is_true(false_flags <= 2, false_flags .. " of 100 steady runs flagged")
  end)

  it("flags a kernel that stops, and says what the halves measured", function()
    math.randomseed(7)
    local est, elapsed = run(20, 10, 0.5, function(a, b)
      if a >= 100 then return 0, 0 end
      return poisson_window(500, a, b, 1e-5)
    end)
    local e = est:estimate(1, "k", elapsed)
    assert.is_true(e.phase)
    assert.are.equal(0, e.second)
    assert.is_true(e.first > 400 and e.first < 600, tostring(e.first))
  end)
end)

describe("cuptimon.estimate detection limit and bookkeeping", function()
  it("reports a key seen in no window as below the detection limit, never as zero", function()
    math.randomseed(3)
    local est, elapsed = run(20, 10, 0.5, function(a, b) return poisson_window(100, a, b, 1e-5) end)
    local e = est:estimate(1, "never_seen", elapsed)
    assert.is_true(e.below)
    assert.is_nil(e.rate)
    -- 3 / traced seconds: 20 windows of about 0.5 s.
    assert.is_true(math.abs(e.limit - 3 / e.traced_s) < 1e-12)
    assert.is_true(e.limit > 0.29 and e.limit < 0.31, tostring(e.limit))
    local s = est:sum("never_seen", elapsed)
    assert.is_true(s.below)
    assert.are.equal(e.limit, s.limit)
  end)

  it("gives the same estimate with merged blocks as with one block per window", function()
    math.randomseed(11)
    local gen = function(a, b) return poisson_window(300, a, b, 1e-5) end
    local seeds = {}
    for i = 1, 200 do seeds[i] = math.random(1, 1e9) end
    local function go(max_blocks)
      local est = estimate.new { max_blocks = max_blocks }
      local i = 0
      math.randomseed(5)
      run(200, 10, 0.5, function(a, b)
        i = i + 1
        math.randomseed(seeds[i])
        return gen(a, b)
      end, est)
      return est
    end
    local a, b = go(4), go(1000)
    local ea, eb = a:estimate(1, "k", 2000), b:estimate(1, "k", 2000)
    assert.are.equal(200, ea.windows)
    assert.is_true(#a.units[1].blocks <= 4)
    assert.is_true(math.abs(ea.rate - eb.rate) < 1e-9 * eb.rate)
    assert.is_true(math.abs(ea.half - eb.half) < 1e-6 * eb.half)
  end)

  it("totals scale the rate by the elapsed time; sums over processes add variances", function()
    local est = estimate.new()
    for u = 1, 2 do
      est:start(u, 0)
      for i = 1, 4 do
        est:add(u, "k", 100 + 10 * i * u, 0.01)
        est:commit(u, 1)
      end
    end
    local e1, e2 = est:estimate(1, "k", 100), est:estimate(2, "k", 100)
    assert.are.equal(125, e1.rate)
    assert.are.equal(12500, e1.total)
    assert.is_true(math.abs(e1.total_half - 100 * e1.half) < 1e-9)
    local s = est:sum("k", 100)
    assert.are.equal(e1.rate + e2.rate, s.rate)
    assert.is_true(math.abs(s.half - math.sqrt(e1.half ^ 2 + e2.half ^ 2)) < 1e-9)
    local sm = est:summary(1, 100)
    assert.are.same({ 4, 4, 100, 0.04 }, { sm.windows, sm.traced_s, sm.elapsed_s, sm.duty })
    assert.are.equal("125 ± 8", estimate.pm(125, 8.04))
  end)

  it("a discarded window adds no sample; one window has no interval yet", function()
    local est = estimate.new()
    est:start("p", 0)
    est:add("p", "k", 5)
    est:discard("p")
    est:add("p", "k", 10)
    est:commit("p", 2)
    local e = est:estimate("p", "k", 10)
    assert.are.same({ 1, 5, 50 }, { e.windows, e.rate, e.total })
    assert.is_nil(e.half)
    assert.are.equal(1, est:summary("p", 10).discarded)
  end)
end)
