-- spec/attach_guard_spec.lua: what --list and --attach refuse and report, end to end with the
-- real agent and the fake CUDA application: a second monitor, a killed monitor, --attach all, a
-- process that exits while attached, another uid, stale sockets, an unsafe rendezvous directory,
-- silent peers, a HELLO that never comes, bad arguments. The attach windows themselves are
-- spec/attach_spec.lua's (two files, so each stays well inside its timeout under TSan).
-- luacheck: std +busted
local A = require "attach_helpers"
local helpers, bin, app, agent, fake, fixture = A.helpers, A.bin, A.app, A.agent, A.fake, A.fixture
local exists, fresh, wait_for, read, start_app = A.exists, A.fresh, A.wait_for, A.read, A.start_app
local dormant_window, stop_app, exact_window = A.dormant_window, A.stop_app, A.exact_window
local start_monitor, hold, monitor_status = A.start_monitor, A.hold, A.monitor_status
local uv = require "luv"

describe("cuptimon-lua --list and --attach: refusals and reports (dormant agents)", function()
  if not app or not exists(agent) or not fake:find("fake") then
    pending("the agent, fake_cuda_app or the fake CUPTI is not built (run through ctest)")
    return
  end

  it("lists the dormant processes, and which monitor is attached", function()
    local run, env = fresh()
    local pid, ctl = start_app(run, env, "CUDA_VISIBLE_DEVICES=1,3")
    local rc, out = helpers.sh(env .. bin .. " --list")
    assert.are.equal(0, rc, out)
    assert.matches("PID%s+STARTED%s+ATTACHED%s+DEVICES%s+COMMAND\n", out)
    assert.matches("\n" .. pid .. "%s+%d%d%d%d%-%d%d%-%d%d %d%d:%d%d:%d%d%s+no%s+1,3%s+%S*fake_cuda_app %-%-control "
      .. ctl:gsub("%p", "%%%0") .. " %-%-kinds kernel\n", out)
    local mon, mout = hold(run, env, pid)
    rc, out = helpers.sh(env .. bin .. " --list")
    assert.are.equal(0, rc, out)
    assert.matches("\n" .. pid .. "%s+%S+ %S+%s+pid " .. mon .. "%s", out)
    os.execute("kill -INT " .. mon)
    monitor_status(mon)
    assert.matches("held records=0", read(mout))
    stop_app(ctl, pid)
    rc, out = helpers.sh(env .. bin .. " --list")
    assert.are.equal(0, rc, out)
    assert.matches("^no dormant cuptimon agent of this user in ", out)
  end)

  it("refuses a second monitor, naming the attached one's pid", function()
    local run, env = fresh()
    local pid, ctl = start_app(run, env)
    local mon = hold(run, env, pid)
    -- (timeout: a monitor that is wrongly admitted would hold the attach until killed)
    local rc, out = helpers.sh(("%stimeout 20 %s --attach %d %s"):format(env, bin, pid, fixture("attach_hold.lua")))
    assert.are.equal(1, rc, out)
    assert.matches("cannot attach to pid " .. pid .. ": already attached: the monitor pid " .. mon
      .. " is attached to this process", out)
    assert.is_nil(out:find("attached pid="), out)
    os.execute("kill -INT " .. mon)
    monitor_status(mon)
    -- The first monitor's window is whole, and the process takes the next one.
    exact_window(env, pid, ctl, 777)
    stop_app(ctl, pid)
  end)

  it("leaves the process running and dormant when the monitor is killed, and attaches again", function()
    local run, env = fresh()
    local pid, ctl = start_app(run, env)
    local mon = hold(run, env, pid)
    os.execute("kill -KILL " .. mon)
    monitor_status(mon)
    wait_for(function() return read(ctl .. ".err"):find("the monitor detached; tracing is off") end,
      10000, "the agent to go dormant")
    assert.are.equal(0, os.execute("kill -0 " .. pid), "the process still runs")
    local w = dormant_window(ctl, 3000)
    assert.are.equal(0, w, "nothing is traced once the monitor is gone")
    local rc, out = helpers.sh(env .. bin .. " --list")
    assert.are.equal(0, rc, out)
    assert.matches("\n" .. pid .. "%s+%S+ %S+%s+no%s", out)
    exact_window(env, pid, ctl, 2500)
    stop_app(ctl, pid)
  end)

  it("--attach all takes the processes running and those started later, until Control-C", function()
    local run, env = fresh()
    local pid1, ctl1 = start_app(run, env)
    local mon, mout = start_monitor(run, env, "--attach all " .. fixture("attach_hold.lua"))
    wait_for(function() return read(mout):find("attached pid=" .. pid1) end, 10000, "the first process")
    local pid2, ctl2 = start_app(run, env)
    wait_for(function() return read(mout):find("attached pid=" .. pid2) end, 10000, "the later process")
    -- Both windows are open: records of both are seen.
    local w1 = dormant_window(ctl1, 1200)
    local w2 = dormant_window(ctl2, 800)
    assert.are.same({ 1200, 800 }, { w1, w2 })
    os.execute("kill -INT " .. mon)
    monitor_status(mon)
    local out = read(mout)
    assert.matches("held records=2000\n", out)
    assert.matches("process_exit pid=" .. pid1 .. " status=detached\n", out)
    assert.matches("process_exit pid=" .. pid2 .. " status=detached\n", out)
    assert.is_nil(out:find("LOST"), out)
    stop_app(ctl1, pid1)
    stop_app(ctl2, pid2)
  end)

  it("reports a process that exits while attached, and ends the run when every pid has gone", function()
    local run, env = fresh()
    local pid, ctl = start_app(run, env)
    local mon, mout = hold(run, env, pid)
    local w = dormant_window(ctl, 4000)
    assert.are.equal(4000, w)
    stop_app(ctl, pid)
    monitor_status(mon)
    local out = read(mout)
    assert.matches("process_exit pid=" .. pid .. " status=exit\n", out)
    assert.matches("held records=4000\n", out)
    assert.is_nil(out:find("LOST"), out)
  end)

  it("refuses a monitor of another uid before reading a byte", function()
    local run, env = fresh()
    -- The test hook makes the agent see uid 4242 as the peer's.
    local pid, ctl = start_app(run, env, "CUPTIMON_LISTEN_TEST_PEER_UID=4242")
    -- (timeout: a monitor that is wrongly admitted would hold the attach until killed)
    local rc, out = helpers.sh(("%stimeout 20 %s --attach %d %s"):format(env, bin, pid, fixture("attach_hold.lua")))
    assert.are.equal(1, rc, out)
    assert.matches("cannot attach to pid " .. pid .. ": it closed the connection without a HELLO", out)
    wait_for(function() return read(ctl .. ".err"):find("refusing a connection from uid 4242") end,
      5000, "the agent's refusal")
    assert.matches("refusing a connection from uid 4242 %(pid %d+%): only uid %d+ may attach", read(ctl .. ".err"))
    assert.is_nil(read(ctl .. ".err"):find("monitor pid %d+ attached"))
    stop_app(ctl, pid)
  end)

  it("removes the stale socket of a process killed without its exit handlers", function()
    local run, env = fresh()
    local pid = start_app(run, env)
    local sock = ("%s/xdg/cuptimon/%d.sock"):format(run, pid)
    os.execute("kill -KILL " .. pid)
    wait_for(function() return os.execute("kill -0 " .. pid .. " 2>/dev/null") ~= 0 end, 10000, "the kill")
    assert.is_true(exists(sock), "SIGKILL leaves the socket behind")
    local rc, out = helpers.sh(env .. bin .. " --list")
    assert.are.equal(0, rc, out)
    assert.matches("removed 1 stale socket of processes that no longer exist", out)
    assert.matches("no dormant cuptimon agent of this user", out)
    assert.is_false(exists(sock))
    -- --attach of a pid with no socket says what to do.
    rc, out = helpers.sh(("%s%s --attach %d %s"):format(env, bin, pid, fixture("attach_hold.lua")))
    assert.are.equal(1, rc, out)
    assert.matches("cannot attach to pid " .. pid .. ": no dormant agent in process " .. pid, out)
  end)

  it("refuses a rendezvous directory that others may write to", function()
    local run, env = fresh()
    os.execute(("mkdir -p %s/xdg/cuptimon && chmod 777 %s/xdg/cuptimon"):format(run, run))
    local rc, out = helpers.sh(env .. bin .. " --list")
    assert.are.equal(1, rc, out)
    assert.matches("cuptimon is writable by its group or by others %(mode 777%); refusing it", out)
    -- A dormant agent refuses it too, and the process runs untraced.
    rc, out = helpers.sh(("%sCUPTIMON_LIBCUPTI=%s CUDA_INJECTION64_PATH=%s CUPTIMON_LISTEN=1 %s --records 10")
      :format(env, fake, agent, app))
    assert.are.equal(0, rc, out)
    assert.matches("dormant: [^\n]*refusing it [^\n]*; not listening %(the process runs untraced%)", out)
  end)

  -- A client that connects to <pid>.sock and sends nothing must not hold the agent's one
  -- listener thread: a real --attach beside it still gets its window with exact counts.
  it("attaches with exact counts while silent peers hold connections to the socket", function()
    local gen = os.getenv("CUPTIMON_WIRE_GEN")
    if not gen then
      pending("CUPTIMON_WIRE_GEN is not set (run through ctest)")
      return
    end
    local run, env = fresh()
    local pid, ctl = start_app(run, env)
    local sock = ("%s/xdg/cuptimon/%d.sock"):format(run, pid)
    local ready = run .. "/idle.ready"
    -- Three silent peers, one after the other (each new one would take the listener's turn).
    os.execute(("CUPTIMON_SOCKET=%s %s idle 3 --hold-ms 15000 --ready %s >%s/idle.out 2>&1 &"):format(sock,
      gen, ready, run))
    wait_for(function() return exists(ready) end, 10000, "the silent peers")
    local t0 = uv.hrtime()
    exact_window(env, pid, ctl, 4321)
    local ms = (uv.hrtime() - t0) / 1e6
    assert.is_true(ms < 5000, ("the attach took %.0f ms behind silent peers"):format(ms))
    exact_window(env, pid, ctl, 1234)
    stop_app(ctl, pid)
  end)

  it("names a pid whose agent never sends HELLO, and exits 1", function()
    local run, env = fresh()
    local pid, ctl = start_app(run, env)
    os.execute("kill -STOP " .. pid)
    local rc, out = helpers.sh(("%sCUPTIMON_ATTACH_HELLO_MS=1500 timeout 20 %s --attach %d %s"):format(env, bin,
      pid, fixture("attach_hold.lua")))
    os.execute("kill -CONT " .. pid)
    assert.are.equal(1, rc, out)
    assert.matches("cannot attach to pid " .. pid .. ": no HELLO within 1500 ms", out)
    exact_window(env, pid, ctl, 99)
    stop_app(ctl, pid)
  end)

  it("names the pid and exits 1 when the script exits before the handshake completes", function()
    local run, env = fresh()
    local pid, ctl = start_app(run, env)
    -- cm.exit on the loop's first turns, racing the agent's HELLO: either the handshake made it
    -- (status 0, attached and detached) or the pid is named and the run fails; never the old
    -- "operation not valid in the current state" with status 0.
    local marker = ("%s/xdg/cuptimon/%d.attached"):format(run, pid)
    for i = 1, 12 do
      wait_for(function() return not exists(marker) end, 10000, "the previous detach")
      local chunk = ("local t = require('luv').new_timer(); t:start(%d, 0, function() "
        .. "require('cuptimon').exit(0) end)"):format(i % 4)
      local rc, out = helpers.sh(("%s%s --attach %d -e \"%s\""):format(env, bin, pid, chunk))
      assert.is_nil(out:find("operation not valid"), out)
      if rc == 1 then
        assert.matches("cannot attach to pid " .. pid .. ": the script ended before ", out)
      else
        assert.are.equal(0, rc, out)
        assert.is_nil(out:find("cannot attach"), out)
      end
    end
    -- Deterministically before the HELLO: the process is stopped while the script ends.
    os.execute("kill -STOP " .. pid)
    local rc, out = helpers.sh(("%s%s --attach %d -e \"%s\""):format(env, bin, pid,
      "local t = require('luv').new_timer(); t:start(200, 0, function() require('cuptimon').exit(0) end)"))
    os.execute("kill -CONT " .. pid)
    assert.are.equal(1, rc, out)
    assert.matches("cannot attach to pid " .. pid .. ": the script ended before the agent's HELLO came", out)
    wait_for(function() return not exists(marker) end, 10000, "the agent to be dormant")
    exact_window(env, pid, ctl, 500)
    stop_app(ctl, pid)
  end)

  it("rejects bad --attach arguments", function()
    local _, env = fresh()
    local rc, out = helpers.sh(env .. bin .. " --attach 12,x " .. fixture("attach_hold.lua"))
    assert.are.equal(2, rc, out)
    assert.matches("%-%-attach 12,x: expected \"all\" or a list of pids", out)
    rc, out = helpers.sh(env .. bin .. " --attach 12")
    assert.are.equal(2, rc, out)
    assert.matches("%-%-attach needs a script", out)
    rc, out = helpers.sh(env .. bin .. " --attach 12 " .. fixture("attach_hold.lua") .. " -- true")
    assert.are.equal(2, rc, out)
    assert.matches("%-%-attach cannot be combined with `%-%- cmd`", out)
  end)
end)
