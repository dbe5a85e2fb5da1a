-- spec/attach_spec.lua: dormant agents (CUPTIMON_LISTEN=1), `cuptimon-lua --list` and
-- `--attach`, end to end with the real agent and the fake CUDA application.
--
-- Each test gets its own rendezvous directory (XDG_RUNTIME_DIR), so it sees only its own
-- processes. The app runs with --control: it writes records only when the test (or the
-- attach_window.lua fixture) asks, and says how many it wrote, so each attach window has an exact
-- expected count.
-- luacheck: std +busted
local A = require "attach_helpers"
local helpers, bin, app, agent, fake, fixture = A.helpers, A.bin, A.app, A.agent, A.fake, A.fixture
local exists, fresh, wait_for, read, start_app = A.exists, A.fresh, A.wait_for, A.read, A.start_app
local dormant_window, stop_app, exact_window = A.dormant_window, A.stop_app, A.exact_window

describe("cuptimon-lua --attach (dormant agents)", function()
  if not app or not exists(agent) or not fake:find("fake") then
    pending("the agent, fake_cuda_app or the fake CUPTI is not built (run through ctest)")
    return
  end

  it("attaches, detaches and re-attaches 50 times with exact counts per window", function()
    local run, env = fresh()
    local pid, ctl = start_app(run, env)
    local total = 0
    for i = 1, 50 do
      local n = 1000 + 37 * i
      exact_window(env, pid, ctl, n)
      total = total + n
      if i % 10 == 0 then
        -- Between windows the agent is dormant: nothing is enabled, so nothing is written.
        local w, t = dormant_window(ctl, 5000)
        assert.are.same({ 0, total }, { w, t })
      end
    end
    stop_app(ctl, pid)
    local err = read(ctl .. ".err")
    local _, attaches = err:gsub("dormant: monitor pid %d+ attached", "")
    local _, detaches = err:gsub("dormant: the monitor detached; tracing is off", "")
    assert.are.same({ 50, 50 }, { attaches, detaches }, err)
    assert.matches("records=" .. total .. " ", read(ctl .. ".out"))
    assert.is_false(exists(("%s/xdg/cuptimon/%d.sock"):format(run, pid)), "the socket is removed at exit")
  end)

  -- A monitor that detached and exited, then a new --attach at once: the agent's control thread
  -- may not yet have told its listener that the first session is over (here it tells it 1.5 s
  -- late, as a loaded machine can). The listener sees that the attached monitor is gone, ends
  -- its session and serves the new one instead of refusing it as "already attached".
  it("serves an --attach that comes right after the last monitor exited", function()
    local run, env = fresh()
    local pid, ctl = start_app(run, env, "CUPTIMON_LISTEN_TEST_OVER_DELAY_MS=1500")
    local total = 0
    for i = 1, 4 do
      local n = 500 + i
      exact_window(env, pid, ctl, n)
      total = total + n
    end
    stop_app(ctl, pid)
    local err = read(ctl .. ".err")
    local _, gone = err:gsub("dormant: the attached monitor pid %d+ is gone; its session ends", "")
    assert.is_true(gone >= 1, err)
    assert.matches("records=" .. total .. " ", read(ctl .. ".out"))
  end)

  it("detaches while the app writes and loses nothing: every record written while traced is seen or counted", function()
    local run, env = fresh()
    local pid, ctl = start_app(run, env, "", "kernel,runtime")
    local total_written, total_seen, total_dropped = 0, 0, 0
    for i = 0, 39 do
      local delay = i % 41
      local rc, out = helpers.sh(("%s%s --attach %d %s %s %d %d"):format(env, bin, pid,
        fixture("attach_detach_mid.lua"), ctl, 200000, delay))
      wait_for(function() return exists(ctl .. ".ack") end, 20000,
        ("the app's acknowledgement of window %d (the script exited %d:\n%s)"):format(i, rc, out))
      local written = tonumber(read(ctl .. ".ack"):match("written=(%d+)"))
      os.remove(ctl .. ".ack")
      local seen, dropped = out:match("detached seen=(%d+) dropped=(%d+)")
      seen, dropped = tonumber(seen), tonumber(dropped)
      assert.is_not_nil(seen, out)
      -- Exact, or the loss is counted, printed and in the exit status.
      if seen + dropped ~= written or dropped > 0 then
        assert.are.equal(written, seen + dropped, out)
        assert.matches("LOST", out)
        assert.are.equal(3, rc, out)
      else
        assert.are.equal(0, rc, out)
        assert.is_nil(out:find("LOST"), out)
      end
      total_written, total_seen = total_written + written, total_seen + seen
      total_dropped = total_dropped + dropped
    end
    stop_app(ctl, pid)
    assert.is_true(total_seen > 0, "no window saw a record")
    assert.are.equal(total_written, total_seen + total_dropped, "records of the 40 windows")
    -- A record the app writes just as its kind is turned off can land after the last flush (it
    -- is counted above); anything more is a lost mechanism, not a race.
    assert.is_true(total_dropped <= 40, "dropped " .. total_dropped)
  end)

  -- The agent's lag guard sheds for the rest of a session, not for good: a monitor that attaches
  -- next gets every kind again. The fake holds its kernel records and releases 5 per flush, so
  -- each session's 100 kernel records come out up to 1 s late and the guard (300 ms) sheds
  -- runtime, then kernels; yet the next session's app writes both kinds again, and every record
  -- written in a session is seen in it.
  it("starts each session with every kind the lag guard shed in the one before", function()
    local run, env = fresh()
    local pid, ctl = start_app(run, env, "FAKE_CUPTI_NOW_STAMPS=1 CUPTIMON_GUARD_LAG_MS=300",
      "kernel,runtime", "--kernel-backlog 5")
    for i = 1, 2 do
      local rc, out = helpers.sh(("%s%s --attach %d %s %s 200"):format(env, bin, pid,
        fixture("attach_guard.lua"), ctl))
      assert.are.equal(0, rc, out)
      local s = helpers.pairs_of(out, "session")
      assert.are.same({ 200, 200, "concurrent_kernel,runtime" }, { s.written, s.seen, s.guard_shed },
        "session " .. i .. ":\n" .. out .. "\n" .. read(ctl .. ".err"))
    end
    stop_app(ctl, pid)
    local _, sheds = read(ctl .. ".err"):gsub("tracing of runtime stops for the rest of the session", "")
    assert.are.equal(2, sheds, read(ctl .. ".err"))
  end)
end)
