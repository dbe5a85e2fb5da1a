-- spec/hub_spec.lua: cuptimon-lua's hub (`-- cmd`), --record and --replay, end to end, with the
-- wire_gen helper as a synthetic agent and capture writer (spec/wire_gen.c), and with the real
-- agent and the fake CUDA application when the build has them.
local helpers = require "helpers"

local bin = helpers.binary()
local gen = os.getenv("CUPTIMON_WIRE_GEN")
local root = helpers.root()
local tmp = os.tmpname()
os.remove(tmp)
os.execute("mkdir -p " .. tmp)

local function script(name) return root .. "/scripts/" .. name end
local function fixture(name) return root .. "/spec/fixtures/" .. name end
-- The synthetic agent needs no agent library; any readable path satisfies the hub's lookup.
local synth = "CUPTIMON_AGENT=/dev/null "

describe("cuptimon-lua --replay", function()
  if not gen then
    pending("CUPTIMON_WIRE_GEN is not set (run through ctest)")
    return
  end
  local a, b = tmp .. "/a.cmcap", tmp .. "/b.cmcap"
  setup(function()
    assert(os.execute(("%s capture %s --pid 111 --records 5000 --kinds kernel,memcpy"):format(gen, a)) == 0)
    assert(os.execute(("%s capture %s --pid 222 --records 3000 --kinds kernel,runtime"):format(gen, b)) == 0)
  end)

  it("replays two captures as two processes with exact counts", function()
    local rc, out = helpers.sh(("%s --replay %s --replay %s %s --per-process"):format(bin, a, b,
      script("count.lua")))
    assert.are.equal(0, rc, out)
    assert.matches("pid 111%s+records\nconcurrent_kernel%s+5000\nmemcpy%s+5000\ntotal%s+10000", out)
    assert.matches("pid 222%s+records\nconcurrent_kernel%s+3000\nruntime%s+3000\ntotal%s+6000", out)
    assert.matches("kind%s+records\nconcurrent_kernel%s+8000\nmemcpy%s+5000\nruntime%s+3000\ntotal%s+16000", out)
  end)

  it("gives the process table from HELLO and process_exit from BYE", function()
    local rc, out = helpers.sh(("%s --replay %s %s"):format(bin, a, fixture("hub_events.lua")))
    assert.are.equal(0, rc, out)
    assert.matches("start pid=111 kind=replay host=testhost exe=/usr/bin/wire_gen argv=wire_gen %-%-synthetic devices=1", out)
    assert.matches("flush0 done ok=true", out)
    assert.matches("exit pid=111 status=exit exit_code=0 dropped=0", out)
    assert.matches("records=5000", out)
  end)

  it("replays a truncated capture up to its last whole frame, with a warning", function()
    local t = tmp .. "/t.cmcap"
    assert(os.execute(("%s capture %s --records 3000 --kinds kernel --truncate 300000"):format(gen, t)) == 0)
    local rc, out = helpers.sh(("%s --replay %s %s"):format(bin, t, script("count.lua")))
    assert.are.equal(0, rc, out)
    assert.matches("warning: capture .*t%.cmcap: %d+ whole frames, truncated at byte 300000", out)
    local n = tonumber(out:match("concurrent_kernel%s+(%d+)"))
    assert.is_true(n ~= nil and n > 0 and n < 3000 and n % 1000 == 0, out)
  end)

  it("skips a corrupt frame of a capture, says where and how many bytes, and replays the rest", function()
    local c = tmp .. "/c.cmcap"
    assert(os.execute(("%s capture %s --records 3000 --kinds kernel --corrupt 250000"):format(gen, c)) == 0)
    local rc, out = helpers.sh(("%s --replay %s %s"):format(bin, c, script("count.lua")))
    assert.are.equal(0, rc, out)
    local at, n, from, to = out:match("warning: capture [^\n]*c%.cmcap: bad checksum at byte (%d+) [^\n]*; " ..
      "skipped (%d+) bytes from byte (%d+) to the next valid frame at byte (%d+)")
    assert.is_truthy(at, out)
    assert.are.equal(at, from)
    assert.are.equal(tonumber(to) - tonumber(from), tonumber(n))
    assert.is_true(tonumber(at) <= 250000 and tonumber(to) > 250000, out)
    -- One batch of 1000 records is lost; the two others (one after the damage) are replayed.
    assert.matches("concurrent_kernel%s+2000\n", out)
  end)

  it("fails with status 1, before the script runs, for a file that is not a capture", function()
    local f = tmp .. "/not_a_capture.txt"
    local h = assert(io.open(f, "wb"))
    h:write(("this is not a capture\n"):rep(10))
    h:close()
    local rc, out = helpers.sh(("%s --replay %s %s"):format(bin, f, script("count.lua")))
    assert.are.equal(1, rc, out)
    assert.matches("cannot replay .*not_a_capture%.txt: not a cuptimon capture", out)
    assert.is_nil(out:match("total"), out)
  end)

  it("fails with status 1 for a capture that yields no frame", function()
    local header = "CUPTIMON\1\0\0\0\0\0\0\0\0\0\0\0\24\38\243\15"
    for name, body in pairs({ empty = "", garbage = ("\0\1\2 not frames "):rep(100) }) do
      local f = tmp .. "/" .. name .. ".cmcap"
      local h = assert(io.open(f, "wb"))
      h:write(header .. body)
      h:close()
      local rc, out = helpers.sh(("%s --replay %s %s"):format(bin, f, script("count.lua")))
      assert.are.equal(1, rc, name .. ": " .. out)
      assert.matches("capture .*" .. name .. "%.cmcap: no frame could be read from it", out)
    end
  end)

  it("skips columns of an unknown type instead of failing the observers", function()
    local u = tmp .. "/u.cmcap"
    assert(os.execute(("%s capture %s --records 2000 --kinds kernel --unknown-type 42"):format(gen, u)) == 0)
    -- count.lua does not select the name column: exact counts.
    local rc, out = helpers.sh(("%s --replay %s %s"):format(bin, u, script("count.lua")))
    assert.are.equal(0, rc, out)
    assert.matches("concurrent_kernel%s+2000\n", out)
    assert.matches("column %(field %d+%) of unknown type 42; columns of unknown types are skipped", out)
    -- An observer that selects it never sees the column (the batch lacks a field it selected,
    -- so it is skipped for that observer, with a warning); one that does not gets every batch.
    local s = tmp .. "/unknown_type.lua"
    local h = assert(io.open(s, "w"))
    h:write([[
local cm = require "cuptimon"
local named, plain = 0, 0
cm.observe({ kernel = { "start", "name" } }, function(b) named = named + b.n end)
cm.observe({ kernel = { "start" } }, function(b) plain = plain + b.n end)
cm.on("exit", function() print(("named=%d plain=%d"):format(named, plain)) end)
]])
    h:close()
    rc, out = helpers.sh(("%s --replay %s %s"):format(bin, u, s))
    assert.are.equal(0, rc, out)
    assert.matches("named=0 plain=2000", out)
    assert.is_nil(out:match("ffi"), out)
  end)

  it("fails with status 1 for an unreadable capture", function()
    local rc, out = helpers.sh(("%s --replay %s/missing.cmcap %s"):format(bin, tmp, script("count.lua")))
    assert.are.equal(1, rc, out)
    assert.matches("cannot read capture .*missing%.cmcap: No such file", out)
  end)
end)

describe("cuptimon-lua -- cmd (synthetic agents)", function()
  if not gen then
    pending("CUPTIMON_WIRE_GEN is not set (run through ctest)")
    return
  end

  it("counts an agent's records exactly and exits with the command's status", function()
    local rc, out = helpers.sh(("%s%s %s -- %s agent --records 5000 --kinds kernel,memcpy,runtime --exit-code 3")
      :format(synth, bin, script("count.lua"), gen))
    assert.are.equal(3, rc, out)
    assert.matches("concurrent_kernel%s+5000\nmemcpy%s+5000\nruntime%s+5000\ntotal%s+15000", out)
    -- The union selection reached the agent.
    assert.matches("SELECT [^\n]*concurrent_kernel:start", out)
  end)

  it("sees two concurrent agents as two processes", function()
    local cmd = ("sh -c '%s agent --records 4000 --kinds kernel & %s agent --records 2000 --kinds kernel; wait'")
      :format(gen, gen)
    local rc, out = helpers.sh(("%s%s %s --per-process -- %s"):format(synth, bin, script("count.lua"), cmd))
    assert.are.equal(0, rc, out)
    local pids = {}
    for n in out:gmatch("pid %d+%s+records\nconcurrent_kernel%s+(%d+)") do pids[#pids + 1] = tonumber(n) end
    table.sort(pids)
    assert.are.same({ 2000, 4000 }, pids)
    assert.matches("kind%s+records\nconcurrent_kernel%s+6000", out)
  end)

  it("runs process hooks and a sync flush rendezvous", function()
    local rc, out = helpers.sh(("%s%s %s -- %s agent --records 3000 --kinds kernel")
      :format(synth, bin, fixture("hub_events.lua"), gen))
    assert.are.equal(0, rc, out)
    assert.matches("start pid=%d+ kind=agent host=testhost exe=/usr/bin/wire_gen", out)
    assert.matches("flush done ok=true", out)
    assert.matches("exit pid=%d+ status=exit exit_code=0 dropped=7", out)
    assert.matches("records=3000", out)
  end)

  it("records every agent's frames and replays them to the same output", function()
    local cap = tmp .. "/rec.cmcap"
    local rc1, live = helpers.sh(("%s%s --record %s %s -- %s agent --records 4000 --kinds kernel,memcpy")
      :format(synth, bin, cap, script("count.lua"), gen))
    assert.are.equal(0, rc1, live)
    assert.matches("recorded .*rec%.cmcap: %d+ frames, %d+ batches, 8000 records, 7 dropped", live)
    local rc2, replay = helpers.sh(("%s --replay %s %s"):format(bin, cap, script("count.lua")))
    assert.are.equal(0, rc2, replay)
    local table_of = function(s) return s:match("(kind%s+records\n.-total%s+%d+)") end
    assert.are.equal(table_of(live), table_of(replay))
  end)

  it("records with no script, one capture per process", function()
    local cap = tmp .. "/norec.cmcap"
    local cmd = ("sh -c '%s agent --records 1000 --kinds kernel & %s agent --records 2000 --kinds memcpy; wait'")
      :format(gen, gen)
    local rc, out = helpers.sh(("%s%s --record %s -- %s"):format(synth, bin, cap, cmd))
    assert.are.equal(0, rc, out)
    local n = 0
    for _ in out:gmatch("recorded [^\n]*norec%.cmcap[^\n]*") do n = n + 1 end
    assert.are.equal(2, n, out)
    local _, files = helpers.sh("ls " .. tmp .. "/norec.cmcap*")
    local reps = {}
    for path in files:gmatch("%S+") do reps[#reps + 1] = "--replay " .. path end
    assert.are.equal(2, #reps, files)
    local rc2, replay = helpers.sh(("%s %s %s"):format(bin, table.concat(reps, " "), script("count.lua")))
    assert.are.equal(0, rc2, replay)
    assert.matches("concurrent_kernel%s+1000\nmemcpy%s+2000\ntotal%s+3000", replay)
  end)

  it("refuses an agent with a wrong token and goes on", function()
    local rc, out = helpers.sh(("%s%s %s -- %s agent --token nottheone --records 10")
      :format(synth, bin, script("count.lua"), gen))
    assert.are.equal(4, rc, out) -- wire_gen's status for a refused handshake
    assert.matches("refusing an agent %(pid %d+%): wrong token", out)
    assert.matches("wire_gen: refused: wrong token", out)
  end)

  it("closes an agent whose stream is corrupt, with a message, and does not crash", function()
    local rc, out = helpers.sh(("%s%s %s -- %s agent --garbage --records 3000 --kinds kernel")
      :format(synth, bin, script("count.lua"), gen))
    assert.matches("agent pid %d+: corrupt stream %(bad header checksum at byte %d+.*%); closing its connection", out)
    assert.matches("kind%s+records", out) -- the exit hooks still ran
    assert.is_true(rc == 0 or rc == 3 or rc == 141, out)
  end)

  it("reports an observer error with a traceback, completes the command, and fails the run", function()
    local rc, out = helpers.sh(("%s%s %s -- %s agent --records 3000 --kinds kernel")
      :format(synth, bin, fixture("hub_error.lua"), gen))
    assert.are.equal(1, rc, out)
    assert.matches("observer fails on purpose.*stack traceback", out)
    assert.matches("wire_gen: pid=%d+ sent=3000", out)
    assert.matches("exit hook calls=3", out)
  end)

  it("keeps a failing command's status over a script error", function()
    local rc, out = helpers.sh(("%s%s %s -- %s agent --records 3000 --kinds kernel --exit-code 5")
      :format(synth, bin, fixture("hub_error.lua"), gen))
    assert.are.equal(5, rc, out)
  end)

  it("rejects a bad field name before starting the command", function()
    local rc, out = helpers.sh(("%s%s -e 'require(\"cuptimon\").observe({kernel={\"duration\"}}, print)' -- %s agent")
      :format(synth, bin, gen))
    assert.are.equal(1, rc, out)
    assert.matches("unknown field \"duration\" of kind \"kernel\"; valid fields: .*start", out)
    assert.is_nil(out:match("wire_gen: pid"), out)
  end)

  it("forwards Control-C to the command and still runs the exit hooks", function()
    local cmd = ("(%s%s %s -- sh -c 'exec sleep 30' & pid=$!; sleep 1; kill -INT $pid; wait $pid)")
      :format(synth, bin, fixture("hub_sigint.lua"))
    local t0 = os.time()
    local rc, out = helpers.sh(cmd)
    assert.are.equal(130, rc, out)
    assert.matches("exit hook after SIGINT", out)
    assert.is_true(os.time() - t0 < 10, "the run ended promptly")
  end)

  it("fails clearly when the command cannot be run", function()
    local rc, out = helpers.sh(("%s%s %s -- /nonexistent/cmd"):format(synth, bin, script("count.lua")))
    assert.are.equal(127, rc, out)
    assert.matches("cannot run /nonexistent/cmd", out)
  end)
end)

describe("cuptimon-lua -- fake_cuda_app (the real agent)", function()
  local app = os.getenv("CUPTIMON_FAKE_APP")
  local build = os.getenv("CUPTIMON_BUILD_DIR") or ""
  local agent = build .. "/libcuptimon-agent.so"
  local f = io.open(agent, "r")
  if f then f:close() end
  if not app or not f then
    pending("the agent (libcuptimon-agent.so) or fake_cuda_app is not built yet")
    return
  end

  local function app_counts(out)
    local t = {}
    local line = out:match("fake_cuda_app: ([^\n]*)") or ""
    for k, v in line:gmatch("(%w[%w_]*)=(%d+)") do t[k] = tonumber(v) end
    return t
  end

  it("counts 100000 records from 4 threads exactly", function()
    -- count.lua counts only the app's kinds: the agent's final fence adds a synchronization record.
    local rc, out = helpers.sh(("%s %s --kinds kernel,memcpy -- %s --records 100000 --threads 4 --kinds kernel,memcpy")
      :format(bin, script("count.lua"), app))
    assert.are.equal(0, rc, out)
    local want = app_counts(out)
    assert.are.equal(100000, want.records, out)
    assert.matches("concurrent_kernel%s+" .. want.concurrent_kernel .. "\n", out)
    assert.matches("memcpy%s+" .. want.memcpy .. "\n", out)
    assert.matches("total%s+100000\n", out)
  end)

  it("preserves the command's exit code", function()
    local rc, out = helpers.sh(("%s %s -- %s --records 1000 --exit-code 7"):format(bin, script("count.lua"), app))
    assert.are.equal(7, rc, out)
  end)

  it("gives the same output on --record then --replay", function()
    local cap = tmp .. "/app.cmcap"
    local rc1, live = helpers.sh(("%s --record %s %s -- %s --records 20000 --threads 2 --kinds kernel,memcpy")
      :format(bin, cap, script("count.lua"), app))
    assert.are.equal(0, rc1, live)
    local rc2, replay = helpers.sh(("%s --replay %s %s"):format(bin, cap, script("count.lua")))
    assert.are.equal(0, rc2, replay)
    local table_of = function(s) return s:match("(kind%s+records\n.-total%s+%d+)") end
    assert.are.equal(table_of(live), table_of(replay))
  end)

  it("counts two concurrent processes separately", function()
    local cmd = ("sh -c '%s --records 3000 --kinds kernel & %s --records 5000 --kinds kernel; wait'"):format(app, app)
    local rc, out = helpers.sh(("%s %s --per-process -- %s"):format(bin, script("count.lua"), cmd))
    assert.are.equal(0, rc, out)
    assert.matches("kind%s+records\nconcurrent_kernel%s+8000", out)
  end)
end)

describe("recipes", function()
  local recipes = { "count.lua", "top_kernels.lua", "memcpy_bw.lua", "timeline.lua", "api_latency.lua" }
  local cap = tmp .. "/recipes.cmcap"
  setup(function()
    if gen then
      assert(os.execute(("%s capture %s --pid 77 --records 3000 --kinds kernel,memcpy,runtime,memset")
        :format(gen, cap)) == 0)
    end
  end)

  for _, r in ipairs(recipes) do
    it(r .. " --help prints its header and options", function()
      local rc, out = helpers.sh(("%s %s --help"):format(bin, script(r)))
      assert.are.equal(0, rc, out)
      assert.matches("^" .. r:gsub("%.", "%%.") .. ": ", out)
      assert.matches("Usage: cuptimon%-lua", out)
      assert.matches("Example output:", out)
      assert.matches("Options:\n.*%-%-help", out)
    end)
  end

  local shapes = {
    ["count.lua"] = "kind%s+records\nconcurrent_kernel%s+3000\nmemcpy%s+3000\nmemset%s+3000\nruntime%s+3000\ntotal%s+12000",
    ["top_kernels.lua"] = "kernel%s+count%s+total_us%s+avg_us%s+min_us%s+max_us%s+%% gpu\n"
      .. "[%w_]+%s+1000%s+%d+%s+[%d.]+%s+[%d.]+%s+[%d.]+%s+33%.3\n.*3 kernel names",
    ["memcpy_bw.lua"] = "copy kind%s+count%s+bytes%s+time_us%s+GB/s\nHtoD%s+1500%s+%d+%s+[%d.]+%s+[%d.]+\n"
      .. "DtoH%s+1500.*HtoD: size histogram %(bytes%)\n  %[1K, 2K%)%s+%d+ |@+",
    ["timeline.lua"] = "pid%s+stream%s+ops%s+span_us%s+busy_us%s+busy%%%s+gaps%s+max_gap_us\n77%s+0%s+4500",
    ["api_latency.lua"] = "api%s+calls%s+total_us%s+avg_us%s+min_us%s+max_us\n.*cudaLaunchKernel%s+1000",
  }
  for _, r in ipairs(recipes) do
    it(r .. " runs over a capture with the expected output shape", function()
      if not gen then
        pending("CUPTIMON_WIRE_GEN is not set (run through ctest)")
        return
      end
      local rc, out = helpers.sh(("%s --replay %s %s"):format(bin, cap, script(r)))
      assert.are.equal(0, rc, out)
      assert.matches(shapes[r], out)
    end)
  end
end)
