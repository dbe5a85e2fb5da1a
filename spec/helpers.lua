-- spec/helpers.lua: shared helpers for the specs run by spec/run.lua inside cuptimon-lua.
--
-- Design note. The fake CUPTI is the library the engine loaded through CUPTIMON_LIBCUPTI;
-- ffi.load of the same path returns the same instance, so the specs drive its workloads and read
-- its counters through the FFI. Only fake functions that never call back into the engine's
-- delivery are declared (producing records only fills buffers).
local ffi = require "ffi"

local M = {}

ffi.cdef [[
uint64_t fake_now(void);
int64_t fake_run_workload(int nthreads, uint64_t per_thread, const int *kinds, int nkinds);
size_t fake_gen_record(int kind, uint32_t thread, uint64_t seq, void *out);
int fake_emit(const void *record, size_t size, int pending);
int fake_kind_enabled(int kind);
]]

local fake

--- The fake CUPTI library, or nil (and the reason) when the specs do not run on it.
function M.fake()
  if fake then return fake end
  local path = os.getenv("CUPTIMON_LIBCUPTI")
  if not path or not path:find("fake") then return nil, "CUPTIMON_LIBCUPTI is not the fake CUPTI" end
  fake = ffi.load(path)
  return fake
end

M.KERNEL = 10    -- CM_KIND_CONCURRENT_KERNEL
M.MEMCPY = 1
M.RUNTIME = 5

--- Runs `per_thread` records of each kind in `kinds` on `nthreads` producer threads; returns
--- the number of records written (records of disabled kinds are skipped by the fake).
function M.workload(nthreads, per_thread, kinds)
  local f = assert(M.fake())
  local arr = ffi.new("int[?]", #kinds, kinds)
  return tonumber(f.fake_run_workload(nthreads, per_thread * #kinds, arr, #kinds))
end

--- Runs the host's loop until cond() is true or `timeout_ms` passes; returns cond()'s value.
function M.run_until(cond, timeout_ms)
  local uv = require "luv"
  -- uv.now() is the loop's cached time, as old as the loop's last turn: a spec that ran for a
  -- while without the loop would get a deadline that far short (a TSan run on a loaded machine
  -- gave up on a directory that a monitor had made in time).
  uv.update_time()
  local deadline = uv.now() + (timeout_ms or 5000)
  local t = uv.new_timer()
  t:start(5, 5, function() end)
  while not cond() and uv.now() < deadline do
    uv.run("once")
    uv.update_time()
  end
  t:close()
  uv.run("nowait")
  return cond()
end

--- Runs the loop for `ms` milliseconds.
function M.sleep(ms)
  local uv = require "luv"
  uv.update_time() -- the timer counts from the loop's cached time (see run_until)
  local done = false
  local t = uv.new_timer()
  t:start(ms, 0, function() done = true end)
  while not done do uv.run("once") end
  t:close()
  uv.run("nowait")
end

-- Errors a spec provokes on purpose in callbacks (observers, hooks): spec/run.lua fails the run
-- when cm.errors() counts more than these, so an assertion that fails inside a callback (where
-- the host reports it instead of raising it into busted) still fails the specs.
M.expected_errors = 0

--- Declares that the running spec makes `n` callback errors on purpose.
function M.expect_errors(n) M.expected_errors = M.expected_errors + n end

--- The path of the cuptimon-lua binary running the specs.
function M.binary()
  return os.getenv("CUPTIMON_LUA_BIN") or "cuptimon-lua"
end

--- Runs a shell command; returns its exit status and its output (stdout and stderr together).
function M.sh(cmd)
  local p = io.popen(cmd .. " 2>&1; echo \"::rc=$?\"")
  local out = p:read("*a")
  p:close()
  local rc = tonumber(out:match("::rc=(%d+)%s*$"))
  return rc, (out:gsub("::rc=%d+%s*$", ""))
end

--- The fake CUDA application (CUPTIMON_FAKE_APP) when it and the agent are built, or nil and
--- the reason for pending(): `local app, why = helpers.agent_app(); if not app then
--- pending(why) return end`.
function M.agent_app()
  local app = os.getenv("CUPTIMON_FAKE_APP")
  local f = io.open((os.getenv("CUPTIMON_BUILD_DIR") or "") .. "/libcuptimon-agent.so", "r")
  if f then f:close() end
  if not app or not f then
    return nil, "the agent (libcuptimon-agent.so) or fake_cuda_app is not built yet"
  end
  return app
end

--- The key=value pairs (numbers converted) of the first line of `out` that starts with
--- `prefix` and a space, such as fake_cuda_app's "fake_cuda_app: pid=... records=..." line.
--- Raises, showing `out`, when there is none.
function M.pairs_of(out, prefix)
  local line = out:match("\n" .. prefix .. " ([^\n]*)") or out:match("^" .. prefix .. " ([^\n]*)")
  assert(line, "no line starting with " .. prefix .. " in:\n" .. out)
  local t = {}
  for k, v in line:gmatch("([%w_]+)=(%S*)") do t[k] = tonumber(v) or v end
  return t
end

--- The key=value numbers of the first line of `out` that contains `what`, as the loss_report.lua
--- fixture prints them (the pid left out): { dropped = 0, received = 3000, ... }.
function M.loss_of(out, what)
  local line = out:match(what .. "[^\n]*") or ""
  local t = {}
  for k, v in line:gmatch("([%w_]+)=(%d+)") do t[k] = tonumber(v) end
  t.pid = nil
  return t
end

--- A new empty temporary directory; returns its path.
function M.tmpdir()
  local dir = os.tmpname()
  os.remove(dir)
  assert(os.execute("mkdir -p " .. dir) == 0, "cannot make " .. dir)
  return dir
end

--- Records shell command `cmd` with cuptimon-lua --record into a new temporary directory, one
--- capture per process (PREFIX.<pid>.cmcap, PREFIX "p" by default). Returns the exit status, the
--- output, the captures as --replay arguments ("--replay a --replay b") and the directory (the
--- caller removes it).
function M.record(cmd, prefix)
  local dir = M.tmpdir()
  local rc, out = M.sh(("%s --record %s/%s.%%p.cmcap -- %s"):format(M.binary(), dir, prefix or "p",
    cmd))
  local caps = {}
  for path in out:gmatch("recorded (%S+): ") do caps[#caps + 1] = "--replay " .. path end
  return rc, out, table.concat(caps, " "), dir, #caps
end

--- The path of recipe `name` ("top.lua") and of fixture `name` in the source tree.
function M.script(name) return M.root() .. "/scripts/" .. name end
function M.fixture(name) return M.root() .. "/spec/fixtures/" .. name end

--- The environment assignment a synthetic agent (wire_gen) needs: no agent library, but a
--- readable path, which is all the hub's lookup checks.
M.SYNTH = "CUPTIMON_AGENT=/dev/null "

--- The contents of the file at `path`, or nil when it cannot be read.
function M.read(path)
  local f = io.open(path, "rb")
  if not f then return nil end
  local s = f:read("*a")
  f:close()
  return s
end

--- Sends `request` to 127.0.0.1:`port` over TCP on the host's loop and reads until the peer
--- closes; returns the HTTP status, the head and the body of the answer (asserting that one
--- came within 10 s).
function M.http(port, request)
  local uv = require "luv"
  local c = uv.new_tcp()
  local got, done = {}, false
  c:connect("127.0.0.1", port, function(cerr)
    assert(not cerr, cerr)
    c:write(request)
    c:read_start(function(rerr, chunk)
      if rerr or not chunk then
        done = true
        c:close()
      else
        got[#got + 1] = chunk
      end
    end)
  end)
  assert(M.run_until(function() return done end, 10000), "no answer")
  local text = table.concat(got)
  local head, body = text:match("^(.-)\r\n\r\n(.*)$")
  local status = tonumber((head or ""):match("^HTTP/1%.1 (%d+) "))
  return status, head, body
end

--- Writes `text` to the file at `path` (created or truncated).
function M.write(path, text)
  local f = assert(io.open(path, "wb"))
  f:write(text)
  f:close()
end

--- The repository's root directory.
function M.root()
  return os.getenv("CUPTIMON_SOURCE_DIR") or "."
end

return M
