-- spec/attach_helpers.lua: what the specs of dormant agents and --attach share
-- (spec/attach_spec.lua, spec/attach_guard_spec.lua): the real agent in the fake CUDA application
-- started dormant with --control, attach windows with exact counts, monitors started and awaited.
--
-- Each test gets its own rendezvous directory (fresh(): XDG_RUNTIME_DIR), so it sees only its
-- own processes. The app runs with --control: it writes records only when the test (or the
-- attach_window.lua fixture) asks, and says how many it wrote, so each attach window has an exact
-- expected count.
local helpers = require "helpers"
-- busted gives a spec file its assert; a module asks for the same library.
local assert = require "luassert"
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

return {
  helpers = helpers,
  bin = bin,
  app = app,
  agent = agent,
  fake = fake,
  fixture = fixture,
  exists = exists,
  fresh = fresh,
  wait_for = wait_for,
  read = read,
  start_app = start_app,
  dormant_window = dormant_window,
  stop_app = stop_app,
  window = window,
  exact_window = exact_window,
  start_monitor = start_monitor,
  hold = hold,
  monitor_status = monitor_status,
}
