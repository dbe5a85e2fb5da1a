-- spec/attach_spec.lua: dormant agents (CUPTIMON_LISTEN=1), `cuptimon-lua --list` and
-- `--attach`, end to end with the real agent and the fake CUDA application.
--
-- Each test gets its own rendezvous directory (XDG_RUNTIME_DIR), so it sees only its own
-- processes. The app runs with --control: it writes records only when the test (or the
-- attach_window.lua fixture) asks, and says how many it wrote, so each attach window has an exact
-- expected count.
-- luacheck: std +busted
local helpers = require "helpers"
local uv = require "luv"

local bin = helpers.binary()
local root = helpers.root()
local app = os.getenv("CUPTIMON_FAKE_APP")
local build = os.getenv("CUPTIMON_BUILD_DIR") or ""
local agent = build .. "/libcuptimon-agent.so"
local fake = os.getenv("CUPTIMON_LIBCUPTI") or ""

local function fixture(name) return root .. "/spec/fixtures/" .. name end
-- (io.open cannot open a socket: ask stat.)
local function exists(path) return uv.fs_stat(path) ~= nil end

local tmp = os.tmpname()
os.remove(tmp)
os.execute("mkdir -p " .. tmp)
local serial = 0

-- A fresh rendezvous directory and the environment prefix that points agents and monitors at it.
local function fresh()
  serial = serial + 1
  local run = ("%s/run%d"):format(tmp, serial)
  os.execute("mkdir -p " .. run .. "/xdg && chmod 700 " .. run .. "/xdg")
  return run, ("env XDG_RUNTIME_DIR=%s/xdg "):format(run)
end

local function wait_for(cond, ms, what)
  uv.update_time() -- uv.now() is the loop's cached time (helpers.run_until says why)
  local deadline = uv.now() + (ms or 10000)
  while not cond() do
    if uv.now() > deadline then error("timed out waiting for " .. (what or "a condition"), 2) end
    uv.sleep(10)
    uv.update_time()
  end
end

local function read(path)
  local f = io.open(path, "r")
  if not f then return "" end
  local s = f:read("*a")
  f:close()
  return s
end

-- Starts a dormant fake_cuda_app (EXTRA: environment assignments; ARGS: more of its arguments);
-- returns its pid and its control path. Its stdout and stderr go
-- to RUN/app<pid>.{out,err}.
local function start_app(run, env, extra, kinds, args)
  local ctl = ("%s/ctl%d"):format(run, serial)
  serial = serial + 1
  local cmd = ("%sCUPTIMON_LIBCUPTI=%s CUPTIMON_LIBCUDA=%s CUDA_INJECTION64_PATH=%s CUPTIMON_LISTEN=1 "
    .. "CUPTIMON_AGENT_LOG=info %s %s --control %s --kinds %s %s >%s.out 2>%s.err & echo $!")
    :format(env, fake, fake, agent, extra or "", app, ctl, kinds or "kernel", args or "", ctl, ctl)
  local p = io.popen("sh -c '" .. cmd .. "'")
  local pid = tonumber(p:read("*l"))
  p:close()
  wait_for(function() return exists(("%s/xdg/cuptimon/%d.sock"):format(run, pid)) end, 10000,
    "the dormant socket of pid " .. pid)
  return pid, ctl
end

-- Asks the app for n records while no monitor is attached (nothing is enabled: it writes none).
local function dormant_window(ctl, n)
  local f = assert(io.open(ctl .. ".tmp", "w"))
  f:write(n, "\n")
  f:close()
  assert(os.rename(ctl .. ".tmp", ctl))
  wait_for(function() return exists(ctl .. ".ack") end, 10000, "the app's acknowledgement")
  local line = read(ctl .. ".ack")
  os.remove(ctl .. ".ack")
  return tonumber(line:match("written=(%d+)")), tonumber(line:match("total=(%d+)"))
end

local function stop_app(ctl, pid)
  local f = assert(io.open(ctl, "w"))
  f:write("quit\n")
  f:close()
  wait_for(function() return os.execute("kill -0 " .. pid .. " 2>/dev/null") ~= 0 end, 10000,
    "the app to exit")
end

-- One attach window through attach_window.lua: returns the monitor's status, output, and the
-- written and seen counts.
local function window(env, pid, ctl, n)
  local rc, out = helpers.sh(("%s%s --attach %d %s %s %d"):format(env, bin, pid,
    fixture("attach_window.lua"), ctl, n))
  return rc, out, tonumber(out:match("window written=(%d+)")), tonumber(out:match("seen=(%d+)"))
end

-- A window whose counts must be exact: the app wrote n records and the script saw n, no loss.
local function exact_window(env, pid, ctl, n)
  local rc, out, written, seen = window(env, pid, ctl, n)
  assert.are.equal(0, rc, out)
  assert.are.same({ n, n }, { written, seen }, out)
  assert.is_nil(out:find("LOST"), out)
end

-- Starts a monitor in the background; returns its pid and output file.
local function start_monitor(run, env, args)
  serial = serial + 1
  local out = ("%s/mon%d.out"):format(run, serial)
  local p = io.popen(("sh -c 'exec %s%s %s >%s 2>&1 & echo $!'"):format(env, bin, args, out))
  local pid = tonumber(p:read("*l"))
  p:close()
  return pid, out
end

-- Starts `--attach PID attach_hold.lua` in the background and waits for its process_start.
local function hold(run, env, pid)
  local mon, mout = start_monitor(run, env, ("--attach %d %s"):format(pid, fixture("attach_hold.lua")))
  wait_for(function() return read(mout):find("attached pid=" .. pid) end, 10000, "the attach")
  return mon, mout
end

local function monitor_status(pid)
  -- The monitor is a child of the shell that started it, not of this process: wait for it to go.
  wait_for(function() return os.execute("kill -0 " .. pid .. " 2>/dev/null") ~= 0 end, 20000,
    "monitor pid " .. pid .. " to exit")
end

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

  -- A client that connects to <pid>.sock and sends nothing must not hold the only listener
  -- thread: a real --attach meanwhile would see nothing and exit 0.
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
