-- spec/window_spec.lua: trigger windows (cuptimon.window), the record-rate budget
-- (cuptimon.budget) and the spike recipe, end to end with the real agent and the fake CUDA
-- application (engine/tests/fake_cuda_app.c).
-- luacheck: std +busted
local helpers = require "helpers"

local bin = helpers.binary()
local root = helpers.root()
local app = os.getenv("CUPTIMON_FAKE_APP")
local build = os.getenv("CUPTIMON_BUILD_DIR") or ""
local tmp = os.tmpname()
os.remove(tmp)
os.execute("mkdir -p " .. tmp)

local function fixture(name) return root .. "/spec/fixtures/" .. name end
local function script(name) return root .. "/scripts/" .. name end

local function has_agent()
  local f = io.open(build .. "/libcuptimon-agent.so", "r")
  if f then f:close() end
  return app ~= nil and f ~= nil
end

local pairs_of = helpers.pairs_of

local function replay_counts(file)
  local rc, out = helpers.sh(("%s --replay %s %s --kinds kernel,runtime"):format(bin, file,
    script("count.lua")))
  local t = {}
  for k, n in out:gmatch("\n(%w[%w_]*)%s+(%d+)") do t[k] = tonumber(n) end
  return rc, t, out
end

describe("cuptimon.window and cuptimon.budget (API checks)", function()
  it("refuse bad options with the valid choices", function()
    local rc, out = helpers.sh(("%s -e 'require(\"cuptimon\").window{ select = { kernel = \"all\" }, ms = 10, colour = 1 }'")
      :format(bin))
    assert.are_not.equal(0, rc, out)
    assert.matches("unknown option \"colour\"; valid options: done, fn, force, ms, pid, record, select", out)
    rc, out = helpers.sh(("%s -e 'require(\"cuptimon\").budget{ records_per_s = 10, shed = { \"nope\" } }'")
      :format(bin))
    assert.are_not.equal(0, rc, out)
    assert.matches("shed%[1%]: unknown kind nope; valid kinds:", out)
  end)

  it("a window needs a live process: nil, ESTATE without one", function()
    local rc, out = helpers.sh(("%s -e 'local cm = require \"cuptimon\"; "
      .. "print(cm.window{ select = { runtime = \"all\" }, ms = 10 })'"):format(bin))
    assert.are.equal(0, rc, out)
    assert.matches("nil\tESTATE: cuptimon.window: no live process", out)
  end)
end)

describe("trigger windows, the budget and spike with the real agent", function()
  if not has_agent() then
    pending("the agent (libcuptimon-agent.so) or fake_cuda_app is not built yet")
    return
  end

  it("a window records exactly the records of its interval, and restores the selection", function()
    -- 6 rounds of 500 kernel and (when traced) 500 runtime records, 600 ms apart; the window
    -- is opened after round 2 and closed after round 4 (spec/fixtures/window_rounds.lua).
    local rc, out = helpers.sh(("%s %s '%s/w.%%p.cmcap' -- %s --records 1000 --kinds kernel,runtime --rounds 6 --pause-ms 600")
      :format(bin, fixture("window_rounds.lua"), tmp, app))
    assert.are.equal(0, rc, out)
    local a = pairs_of(out, "fake_cuda_app:")
    local w = pairs_of(out, "window")
    local run = pairs_of(out, "run")
    -- The app wrote runtime records only while the window was open: rounds 3 and 4.
    assert.are.equal(1000, a.runtime, out)
    assert.are.equal(3000, a.concurrent_kernel, out)
    assert.are.same({ 1000, 2000, 3000 }, { run.at_open, run.at_close, run.kernels }, out)
    -- The window holds those two rounds: every runtime record and the kernels in between.
    assert.are.same({ 2000, 1000, 1000, 0, "nil" },
      { w.records, w.runtime, w.concurrent_kernel, w.dropped, w.error }, out)
    assert.are.equal(1000, w.live_runtime, out)
    -- Nothing outside the window had the extra kind: the run received no other runtime record.
    assert.are.equal(1000, run.runtime_total, out)
    assert.are.equal(tmp .. "/w." .. a.pid .. ".cmcap", w.file, out)
    -- The capture replays with the same counts and no loss.
    local rc2, t, rout = replay_counts(w.file)
    assert.are.equal(0, rc2, rout)
    assert.are.same({ 1000, 1000, 2000 }, { t.concurrent_kernel, t.runtime, t.total }, rout)
  end)

  it("windows back to back under a high rate lose nothing: fn sees every record the windows count", function()
    local rc, out = helpers.sh(("%s %s 60 40 -- %s --records 1200000 --kinds kernel,runtime --rate 600000")
      :format(bin, fixture("window_storm.lua"), app))
    local a = pairs_of(out, "fake_cuda_app:")
    local st = pairs_of(out, "storm")
    assert.is_true(st.windows >= 5, out)
    -- fn receives the window's tail (the records delivered by the narrowing and the closing fence).
    assert.are.equal(st.win_runtime, st.fn_runtime, out)
    assert.are.equal(st.runtime_total, st.win_runtime, out)
    -- Every runtime record the app wrote (only while a window was open) reached the script, or is
    -- counted as lost, with the LOST line and status 3.
    if st.dropped == 0 then
      assert.are.equal(0, rc, out)
      assert.are.equal(a.runtime, st.runtime_total, out)
    else
      assert.are.equal(3, rc, out)
      assert.matches("LOST", out)
      assert.are.equal(a.runtime, st.runtime_total + st.dropped, out)
    end
  end)

  it("shows how far behind the script is, and a budget sheds on lag", function()
    local env = "FAKE_CUPTI_NOW_STAMPS=1 "
    local rc, out = helpers.sh(("%s%s %s 150 0 -- %s --records 300000 --kinds kernel,runtime --rate 100000")
      :format(env, bin, fixture("lag_slow.lua"), app))
    -- The slow script also makes the agent's exit drop what it could not send: 0, or 3 with LOST.
    assert.is_truthy(rc == 0 or (rc == 3 and out:find("LOST")), out)
    local l = pairs_of(out, "lag")
    -- A script that sleeps 150 ms per batch falls seconds behind: it sees so live, and is told.
    assert.is_true(l.live_peak_s > 0.5, out)
    assert.is_true(l.peak_s >= l.live_peak_s, out)
    assert.is_true(l.decode_peak_ns > 0, out)
    assert.matches("note: the records of pid %d+ reached the script up to [%d.]+ s late", out)
    -- The same script under a lag budget of 300 ms: runtime is shed once the lag passes it.
    rc, out = helpers.sh(("%s%s %s 150 300 -- %s --records 300000 --kinds kernel,runtime --rate 100000")
      :format(env, bin, fixture("lag_slow.lua"), app))
    local sh = pairs_of(out, "shed")
    assert.are.equal("runtime", sh.kind, out)
    assert.is_true(sh.lag_s * 1000 > 300, out)
    assert.are.equal(300, sh.lag_ms, out)
    assert.is_truthy(rc == 0 or rc == 3, out)
  end)

  it("a budget sheds kinds in order while the rate is high and restores them once low", function()
    local rc, out = helpers.sh(("%s %s 10000 -- %s --records 20000 --kinds kernel,runtime --rounds 10 --pause-ms 100 --linger-ms 2500")
      :format(bin, fixture("budget_rounds.lua"), app))
    assert.are.equal(0, rc, out)
    local a = pairs_of(out, "fake_cuda_app:")
    local run = pairs_of(out, "run")
    -- runtime goes first, then memcpy (the list's order); they return in the reverse order.
    local events = {}
    for what, kind, shed_now in out:gmatch("\n(%a+) kind=(%a+) pid=%d+ over=%a+ shed_now=(%S*)") do
      events[#events + 1] = what .. ":" .. kind .. ":" .. shed_now
    end
    assert.are.equal("shed:runtime:runtime", events[1], out)
    assert.are.equal("restore:runtime:", events[#events], out)
    assert.are.equal(run.sheds, run.restores, out)
    assert.is_true(run.sheds >= 1, out)
    assert.are.equal("", run.shed_at_exit, out)
    -- Shedding lost no record: the app wrote runtime records only while runtime was traced.
    assert.are.equal(a.runtime, run.runtime, out)
    assert.are.equal(a.concurrent_kernel, run.kernel, out)
    assert.is_true(a.runtime < a.concurrent_kernel, out)
    assert.matches("note: the record%-rate budget shed runtime records of pid " .. a.pid
      .. " for [%d.]+ s: totals that include runtime mix full and shed data", out)
  end)

  it("count --budget says when data was shed", function()
    local rc, out = helpers.sh(("%s %s --budget 10000 --shed runtime --hold-ms 200 -- %s --records 20000 --kinds kernel,runtime --rounds 25 --pause-ms 100")
      :format(bin, script("count.lua"), app))
    assert.are.equal(0, rc, out)
    assert.matches("total%s+%d+\nnote: the record%-rate budget shed runtime records of pid %d+", out)
  end)

  it("spike records one window when a kernel turns slow, and its capture replays", function()
    local rc, out = helpers.sh(("cd %s && %s %s --ms 500 -- %s --records 4000 --kinds kernel,runtime --rounds 14 --pause-ms 250 --slow-round 9 --linger-ms 1000")
      :format(tmp, bin, script("spike.lua"), app))
    assert.are.equal(0, rc, out)
    local a = pairs_of(out, "fake_cuda_app:")
    local lines = {}
    for l in out:gmatch("spike: [^\n]*") do lines[#lines + 1] = l end
    assert.are.equal(1, #lines, out)
    -- Its own window widens the selection: that never warns (such as "a concurrent_kernel
    -- batch lacks 40 of the fields an observer selected").
    assert.is_nil(out:find("warning", 1, true), out)
    local file = lines[1]:match("^spike: pid " .. a.pid .. " %([^)]*%) kernel vectorAdd: p99 [%d.]+ us > 3 x median [%d.]+ us %(%d+ in the last second%); recorded (spike%." .. a.pid .. "%.cmcap) %(%d+ ms, %d+ records%)$")
    assert.is_not_nil(file, out)
    local rc2, t, rout = replay_counts(tmp .. "/" .. file)
    assert.are.equal(0, rc2, rout)
    assert.is_true(t.concurrent_kernel > 0 and t.runtime > 0, rout)
    -- The window traced runtime, which nothing else selected: the app wrote exactly those.
    assert.are.equal(a.runtime, t.runtime, rout)
  end)

  it("a window that widens an observer's selection never warns about the narrow batches", function()
    -- The process holds 2000 records decoded with { start } when the window asks for every
    -- kernel field: they reach the window's observer without those, as they must, silently.
    local rc, out = helpers.sh(("%s %s -- sh -c 'exec %s --records 2000 --kinds kernel "
      .. "--linger-ms 1500 >/dev/null 2>&1'"):format(bin, fixture("window_widen.lua"), app))
    assert.are.equal(0, rc, out)
    assert.matches("window records=%d+\nrecords=2000\n", out)
    assert.is_nil(out:find("warning", 1, true), out)
  end)

  -- top --interval once refreshed "no kernels" while the agents held every record: nothing
  -- flushed CUPTI's buffers before they filled.
  it("top --interval shows the kernels of a live run as it goes", function()
    local rc, out = helpers.sh(("%s %s --interval 300 --top 1 -- %s --records 200 --kinds kernel "
      .. "--rounds 6 --pause-ms 300"):format(bin, script("top.lua"), app))
    assert.are.equal(0, rc, out)
    local refreshes = 0
    for _ in out:gmatch("== %d+%-%d+%-%d+T[%d:]+Z, every 300 ms\npid %d+ ") do
      refreshes = refreshes + 1
    end
    assert.is_true(refreshes >= 2, out)
  end)

  it("spike stays quiet when no kernel turns slow", function()
    local rc, out = helpers.sh(("cd %s && %s %s --ms 500 --record quiet.%%p.cmcap -- %s --records 4000 --kinds kernel --rounds 10 --pause-ms 250")
      :format(tmp, bin, script("spike.lua"), app))
    assert.are.equal(0, rc, out)
    assert.is_nil(out:find("spike:"), out)
  end)

  it("spike --help describes it", function()
    local rc, out = helpers.sh(("%s %s --help"):format(bin, script("spike.lua")))
    assert.are.equal(0, rc, out)
    assert.matches("spike.lua: watch each kernel's duration", out)
    assert.matches("%-%-factor F", out)
  end)
end)
