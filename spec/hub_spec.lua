-- spec/hub_spec.lua: cuptimon-lua's hub (`-- cmd`), --record and --replay, end to end, with the
-- wire_gen helper as a synthetic agent and capture writer (spec/wire_gen.c). The real agent in
-- the fake CUDA application is spec/hub_agent_spec.lua's, the hub's defenses
-- spec/hub_hardening_spec.lua's.
-- luacheck: std +busted
local helpers = require "helpers"

local bin, gen = helpers.binary(), os.getenv("CUPTIMON_WIRE_GEN")
local root, tmp = helpers.root(), helpers.tmpdir()
local script, fixture = helpers.script, helpers.fixture
-- The capture mutator and re-encoder (spec/capture_tool.c), or nil after pending() when ctest
-- did not pass it.
local function need_tool()
  local tool = os.getenv("CUPTIMON_CAPTURE_TOOL")
  if not tool then pending("CUPTIMON_CAPTURE_TOOL is not set (run through ctest)") end
  return tool
end
local synth = helpers.SYNTH

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
    assert.matches("pid 111 %([^)]*%)\nkind%s+records\nconcurrent_kernel%s+5000\nmemcpy%s+5000\ntotal%s+10000", out)
    assert.matches("pid 222 %([^)]*%)\nkind%s+records\nconcurrent_kernel%s+3000\nruntime%s+3000\ntotal%s+6000", out)
    assert.matches("kind%s+records\nconcurrent_kernel%s+8000\nmemcpy%s+5000\nruntime%s+3000\ntotal%s+16000", out)
  end)

  it("top, nvtx and dump give a table (or rows) per process over two captures", function()
    local rc, out = helpers.sh(("%s --replay %s --replay %s %s"):format(bin, a, b, script("top.lua")))
    assert.are.equal(0, rc, out)
    -- The synthetic records name a different device each, so each gets a table.
    assert.matches("pid 111 %([^)]*%), device %d+\n.*\n\npid 222 %(", out)
    local n = 0
    for c in out:gmatch("\n%s*[%d.]+%s+%d+%s+(%d+)%s") do n = n + tonumber(c) end
    assert.are.equal(8000, n, out)
    rc, out = helpers.sh(("%s --replay %s --replay %s %s"):format(bin, a, b, script("nvtx.lua")))
    assert.are.equal(0, rc, out)
    assert.matches("pid 111 %(.*\n%(no API record%)%s+%-%s+5000%s.*pid 222 %(.*\n%(no range%)%s+%-%s+3000%s", out)
    local dir = tmp .. "/dump2"
    rc, out = helpers.sh(("%s --replay %s --replay %s %s --kinds kernel,runtime -o %s/"):format(bin, a,
      b, script("dump.lua"), dir))
    assert.are.equal(0, rc, out)
    assert.matches("concurrent_kernel%s+8000%s.*runtime%s+3000%s", out)
    local _, pids = helpers.sh("cut -d, -f1 " .. dir .. "/kernel.csv | sort | uniq -c")
    assert.matches("5000 111\n.*3000 222", pids)
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
    -- The tail is lost: the run says so last, and fails with the loss status.
    assert.are.equal(3, rc, out)
    assert.matches("warning: capture .*t%.cmcap: %d+ whole frames, truncated at byte 300000", out)
    assert.matches("\ncuptimon%-lua: LOST an unknown number of records in pid %d+ %(its final counts are missing; the last batch frame received was %d%)\n$", out)
    local n = tonumber(out:match("concurrent_kernel%s+(%d+)"))
    assert.is_true(n ~= nil and n > 0 and n < 3000 and n % 1000 == 0, out)
  end)

  it("skips a corrupt frame of a capture, says where and how many bytes, and replays the rest", function()
    local c = tmp .. "/c.cmcap"
    assert(os.execute(("%s capture %s --records 3000 --kinds kernel --corrupt 250000"):format(gen, c)) == 0)
    local rc, out = helpers.sh(("%s --replay %s %s"):format(bin, c, script("count.lua")))
    -- The damaged frame is a loss like any other: counted, printed, and status 3.
    assert.are.equal(3, rc, out)
    assert.matches("cuptimon%-lua: LOST ", out)
    local at, n, from, to = out:match("warning: capture [^\n]*c%.cmcap: bad checksum at byte (%d+) [^\n]*; " ..
      "skipped (%d+) bytes from byte (%d+) to the next valid frame at byte (%d+)")
    assert.is_truthy(at, out)
    assert.are.equal(at, from)
    assert.are.equal(tonumber(to) - tonumber(from), tonumber(n))
    assert.is_true(tonumber(at) <= 250000 and tonumber(to) > 250000, out)
    -- One batch of 1000 records is lost; the two others (one after the damage) are replayed.
    assert.matches("concurrent_kernel%s+2000\n", out)
  end)

  -- A damaged capture is never replayed as if whole: every bit-flipped copy of the demo capture
  -- says what it lost in one LOST line and exits 3, however much of it still replays.
  it("fails every bit-flipped copy of the demo capture with the LOST line and status 3", function()
    local tool = need_tool()
    if not tool then return end
    local demo = root .. "/examples/demo.cmcap"
    for seed = 1, 30 do
      local f = tmp .. "/flip" .. seed .. ".cmcap"
      assert(os.execute(("%s flip %s %s --seed %d --flips %d > /dev/null"):format(tool, demo, f, seed,
        1 + seed % 3)) == 0)
      local rc, out = helpers.sh(("%s --replay %s %s"):format(bin, f, script("count.lua")))
      assert.are.equal(3, rc, "seed " .. seed .. ": " .. out)
      local _, nlost = out:gsub("cuptimon%-lua: LOST ", "")
      assert.are.equal(1, nlost, "seed " .. seed .. ": " .. out)
      assert.matches("\ncuptimon%-lua: LOST [^\n]* in pid 601 %([^\n]*%)\n$", out)
    end
  end)

  -- A frame header with valid checksums that declares more than the wire format allows is
  -- skipped as 24 bad bytes, not taken for the capture's end: every frame after it replays.
  it("replays every frame after a crafted header that declares 1 GiB, and reports the 24 bytes", function()
    local tool = need_tool()
    if not tool then return end
    local src, f = tmp .. "/big_src.cmcap", tmp .. "/big.cmcap"
    assert(os.execute(("%s capture %s --pid 333 --records 20000 --kinds kernel,memcpy,runtime"):format(gen,
      src)) == 0)
    assert(os.execute(("%s bighdr %s %s --after 2 > /dev/null"):format(tool, src, f)) == 0)
    local rc, out = helpers.sh(("%s --replay %s %s"):format(bin, f, script("count.lua")))
    assert.are.equal(3, rc, out)
    assert.matches("total%s+60000\n", out)
    assert.matches("truncated at byte %d+ %(the frame at byte %d+ needs 1073741848 bytes, %d+ present%); " ..
      "skipped 24 bytes from byte %d+ to the next valid frame", out)
    assert.matches("LOST an unknown number of records %(24 corrupt capture bytes skipped%) in pid 333 " ..
      "%(its capture is damaged%)\n$", out)
  end)

  it("counts junk after a process's BYE as damage to that process", function()
    local f = tmp .. "/junk.cmcap"
    assert(os.execute(("%s capture %s --pid 444 --records 1000 --kinds kernel"):format(gen, f)) == 0)
    local h = assert(io.open(f, "ab"))
    h:write(("\0junk"):rep(40))
    h:close()
    local rc, out = helpers.sh(("%s --replay %s %s"):format(bin, f, script("count.lua")))
    assert.are.equal(3, rc, out)
    assert.matches("concurrent_kernel%s+1000\n", out)
    assert.matches("no valid frame in the 200 bytes from byte %d+ to the end", out)
    assert.matches("LOST an unknown number of records %(200 corrupt capture bytes skipped%) in pid 444 ", out)
  end)

  it("names a pid once in the LOST line, however many sources it had", function()
    local t1, t2 = tmp .. "/same1.cmcap", tmp .. "/same2.cmcap"
    for _, t in ipairs({ t1, t2 }) do
      assert(os.execute(("%s capture %s --pid 555 --records 3000 --kinds kernel --truncate 200000"):format(gen,
        t)) == 0)
    end
    local rc, out = helpers.sh(("%s --replay %s --replay %s %s"):format(bin, t1, t2, script("count.lua")))
    assert.are.equal(3, rc, out)
    local line = out:match("cuptimon%-lua: LOST [^\n]*")
    assert.is_truthy(line, out)
    local _, n = line:gsub("pid 555", "")
    assert.are.equal(1, n, line)
  end)

  it("bundles a demo capture of the current wire version, with numbered batches", function()
    local tool = need_tool()
    if not tool then return end
    local rc, out = helpers.sh(("%s info %s/examples/demo.cmcap"):format(tool, root))
    assert.are.equal(0, rc, out)
    assert.matches("minor 2\n", out)
    assert.matches("records 1187\nnumbered 6\n", out)
    assert.matches("frames.BATCH 6\n", out)
  end)

  it("rate-limits the once-per-process warnings across processes", function()
    local f = tmp .. "/unknown_type.cmcap"
    assert(os.execute(("%s capture %s --unknown-type 99 --records 100 --kinds kernel"):format(gen, f)) == 0)
    local t0 = os.time()
    local rc, out = helpers.sh(("%s%s %s"):format(bin, (" --replay " .. f):rep(30), script("count.lua")))
    local elapsed = os.time() - t0
    assert.are.equal(0, rc, out)
    assert.matches("total%s+3000\n", out)
    local _, shown = out:gsub("of unknown type 99", "")
    local suppressed = 0
    for n in out:gmatch("suppressed (%d+) warnings about processes' frames") do suppressed = suppressed + tonumber(n) end
    assert.is_true(shown <= 21 + elapsed, out)
    assert.are.equal(30, shown + suppressed, out)
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
    assert.is_nil(out:find("LOST"), out)
    -- The union selection reached the agent.
    assert.matches("SELECT [^\n]*concurrent_kernel:start", out)
  end)

  it("sees two concurrent agents as two processes", function()
    local cmd = ("sh -c '%s agent --records 4000 --kinds kernel & %s agent --records 2000 --kinds kernel; wait'")
      :format(gen, gen)
    local rc, out = helpers.sh(("%s%s %s --per-process -- %s"):format(synth, bin, script("count.lua"), cmd))
    assert.are.equal(0, rc, out)
    local pids = {}
    for n in out:gmatch("pid %d+ %([^)]*%)\nkind%s+records\nconcurrent_kernel%s+(%d+)") do pids[#pids + 1] = tonumber(n) end
    table.sort(pids)
    assert.are.same({ 2000, 4000 }, pids)
    assert.matches("kind%s+records\nconcurrent_kernel%s+6000", out)
  end)

  it("runs process hooks and a sync flush rendezvous", function()
    local rc, out = helpers.sh(("%s%s %s -- %s agent --records 3000 --kinds kernel --cupti-dropped 7")
      :format(synth, bin, fixture("hub_events.lua"), gen))
    assert.are.equal(3, rc, out) -- 7 records lost: the loss status
    assert.matches("start pid=%d+ kind=agent host=testhost exe=/usr/bin/wire_gen", out)
    assert.matches("flush done ok=true", out)
    assert.matches("exit pid=%d+ status=exit exit_code=0 dropped=7", out)
    -- The agent's own last line (wire_gen's "sent=") may come between the script's and the loss
    -- line: it is another process writing to the same output.
    assert.matches("\nrecords=3000\n", out)
    assert.matches("\ncuptimon%-lua: LOST 7 of 3007 records %(CUPTI had no buffer: 7%) in pid %d+\n$", out)
  end)

  it("records every agent's frames and replays them to the same output", function()
    local cap = tmp .. "/rec.%p.cmcap"
    local rc1, live = helpers.sh(("%s%s --record %s %s -- %s agent --records 4000 --kinds kernel,memcpy --cupti-dropped 7")
      :format(synth, bin, cap, script("count.lua"), gen))
    assert.are.equal(3, rc1, live)
    assert.matches("recorded .*rec%.%d+%.cmcap: %d+ frames, %d+ batches, 8000 records, 7 dropped\n", live)
    assert.matches("LOST 7 of 8007 records", live)
    cap = live:match("recorded (%S+): ")
    local rc2, replay = helpers.sh(("%s --replay %s %s"):format(bin, cap, script("count.lua")))
    assert.are.equal(3, rc2, replay) -- the capture keeps the agent's counts
    assert.matches("LOST 7 of 8007 records", replay)
    local table_of = function(s) return s:match("(kind%s+records\n.-total%s+%d+)") end
    assert.are.equal(table_of(live), table_of(replay))
  end)

  it("records with no script, one capture per process", function()
    local cap = tmp .. "/norec.cmcap"
    local cmd = ("sh -c '%s agent --records 1000 --kinds kernel & %s agent --records 2000 --kinds memcpy; wait'")
      :format(gen, gen)
    local rc, out = helpers.sh(("%s%s --record %s -- %s"):format(synth, bin, cap, cmd))
    assert.are.equal(0, rc, out)
    -- Without %p the first process writes the name as given, the second gets its pid.
    assert.matches("%-%-record [^\n]*norec%.cmcap: another process, pid %d+, is recorded to [^\n]*norec%.%d+%.cmcap", out)
    assert.matches("recorded [^\n]*norec%.cmcap: ", out)
    assert.matches("recorded [^\n]*norec%.%d+%.cmcap: ", out)
    local _, files = helpers.sh("ls " .. tmp .. "/norec.cmcap " .. tmp .. "/norec.*.cmcap")
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

  it("reports an observer error in one line, completes the command, and fails the run", function()
    local rc, out = helpers.sh(("%s%s %s -- %s agent --records 3000 --kinds kernel")
      :format(synth, bin, fixture("hub_error.lua"), gen))
    assert.are.equal(1, rc, out)
    assert.matches("hub_error%.lua:%d+: [^\n]*observer fails on purpose[^\n]* %(%-%-verbose shows the traceback%)\n", out)
    assert.is_nil(out:find("stack traceback", 1, true), out)
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

local loss_of = helpers.loss_of

describe("lost records (synthetic captures and agents)", function()
  if not gen then
    pending("CUPTIMON_WIRE_GEN is not set (run through ctest)")
    return
  end

  it("counts a BATCH frame that never arrived, exactly, from the numbers and the final STATS", function()
    local cap = tmp .. "/gap.cmcap"
    assert(os.execute(("%s capture %s --pid 41 --records 3000 --kinds kernel --drop-batch 2"):format(gen, cap)) == 0)
    local rc, out = helpers.sh(("%s --replay %s %s"):format(bin, cap, fixture("loss_report.lua")))
    assert.are.equal(3, rc, out)
    for _, what in ipairs({ "process_exit pid=41", "source_stats pid=41", "run_stats" }) do
      local l = loss_of(out, what)
      assert.are.same({ 3000, 2000, 1000, 1000, 1, 0, 0 }, { l.produced, l.received, l.dropped,
        l.lost_wire, l.lost_frames, l.incomplete, l.dropped_agent }, what .. "\n" .. out)
    end
    assert.are.equal(1000, loss_of(out, "run_stats").records_dropped, out)
    assert.matches("observed=2000\ncuptimon%-lua: LOST 1000 of 3000 records %(never received: 1000, 1 batch frame missing%) in pid 41\n$", out)
  end)

  it("keeps the command's status with --allow-loss, and still prints the loss line", function()
    local cap = tmp .. "/gap.cmcap"
    local rc, out = helpers.sh(("%s --allow-loss --replay %s %s"):format(bin, cap, script("count.lua")))
    assert.are.equal(0, rc, out)
    assert.matches("total%s+2000\ncuptimon%-lua: LOST 1000 of 3000 records", out)
  end)

  it("reports the gap and an unknown tail when the final STATS never came", function()
    local cap = tmp .. "/cut.cmcap"
    assert(os.execute(("%s capture %s --pid 42 --records 3000 --kinds kernel --drop-batch 2 --no-end"):format(gen, cap)) == 0)
    local rc, out = helpers.sh(("%s --replay %s %s"):format(bin, cap, fixture("loss_report.lua")))
    assert.are.equal(3, rc, out)
    local l = loss_of(out, "process_exit pid=42")
    assert.are.same({ 2000, 0, 1, 1 }, { l.received, l.dropped, l.lost_frames, l.incomplete }, out)
    assert.matches("cuptimon%-lua: LOST an unknown number of records %(1 batch frame missing%) in pid 42 %(its final counts are missing; the last batch frame received was 3%)\n$", out)
  end)

  it("reports a live agent that ended without its final counts", function()
    local rc, out = helpers.sh(("%s%s %s -- %s agent --records 3000 --kinds kernel --no-end")
      :format(synth, bin, fixture("loss_report.lua"), gen))
    assert.are.equal(3, rc, out) -- the command exited 0, but the run cannot vouch for its data
    local l = loss_of(out, "process_exit pid=%d+ status=disconnected")
    assert.are.same({ 3000, 0, 1 }, { l.received, l.dropped, l.incomplete }, out)
    assert.matches("LOST an unknown number of records in pid %d+ %(its final counts are missing; the last batch frame received was 3%)\n$", out)
  end)

  it("prints no loss line and keeps the status when nothing was lost", function()
    local rc, out = helpers.sh(("%s%s %s -- %s agent --records 3000 --kinds kernel --exit-code 6")
      :format(synth, bin, fixture("loss_report.lua"), gen))
    assert.are.equal(6, rc, out)
    local l = loss_of(out, "run_stats")
    assert.are.same({ 3000, 3000, 0, 0 }, { l.produced, l.received, l.dropped, l.incomplete }, out)
    assert.is_nil(out:find("LOST"), out)
  end)
end)

describe("recipes", function()
  local recipes = { "count.lua", "top.lua", "nvtx.lua", "dump.lua", "memcpy_bw.lua", "timeline.lua",
    "idle.lua", "api_latency.lua" }
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
      -- Each option is described on one line only (the header's, or the generated one).
      local seen = {}
      for flag in out:gmatch("\n%s+(%-%-[%w%-]+)") do
        assert.is_nil(seen[flag], flag .. " is described twice in:\n" .. out)
        seen[flag] = true
      end
      assert.is_true(seen["--help"])
    end)
  end

  local shapes = {
    ["count.lua"] = "kind%s+records\nconcurrent_kernel%s+3000\nmemcpy%s+3000\nmemset%s+3000\nruntime%s+3000\ntotal%s+12000",
    ["top.lua"] = "pid 77 %([^)]*%), device %d+\nTime %(%%%)%s+Total %(us%)%s+Instances%s+Avg %(us%)%s+"
      .. "Med %(us%)%s+P99 %(us%)%s+Min %(us%)%s+Max %(us%)%s+Name\n"
      .. "%s+100%.0%s+%d+%s+1%s.*kernel names",
    ["nvtx.lua"] = "pid 77 %([^)]*%)\nrange%s+ranges%s+ops%s+incl_us%s+excl_us%s+%% gpu\n",
    ["dump.lua"] = "kind%s+rows%s+file\nconcurrent_kernel%s+3000%s",
    ["memcpy_bw.lua"] = "copy kind%s+count%s+bytes%s+time_us%s+bandwidth\nHtoD%s+1500%s+%d+%s+[%d.]+%s+[%d.]+ [GMK]?B/s\n"
      .. "DtoH%s+1500.*HtoD: size histogram %(bytes%)\n  %[1 KiB, 2 KiB%)%s+%d+ |@+",
    ["timeline.lua"] = "timeline.lua: wrote [^\n]*: 12000 slices %(3000 kernel, 3000 memcpy, 3000 memset, "
      .. "3000 runtime, 0 driver, 0 nvtx%), 0 marks, %d+ flows\n",
    ["idle.lua"] = "pid 77 %([^)]*wire_gen%)\ndevice%s+stream%s+ops%s+span_us%s+busy_us%s+busy%%%s+gaps%s+max_gap_us\n",
    ["api_latency.lua"] = "Time %(%%%)%s+Total %(us%)%s+Num Calls%s+Avg %(us%)%s+Med %(us%)%s+Min %(us%)%s+Max %(us%)%s+StdDev %(us%)%s+Name\n.*%s1000%s[^\n]*cudaLaunchKernel",
  }
  for _, r in ipairs(recipes) do
    it(r .. " runs over a capture with the expected output shape", function()
      if not gen then
        pending("CUPTIMON_WIRE_GEN is not set (run through ctest)")
        return
      end
      local extra = r == "dump.lua" and (" -o %s/shape_dump/"):format(tmp)
        or r == "timeline.lua" and (" -o " .. tmp .. "/recipes.json") or ""
      local rc, out = helpers.sh(("%s --replay %s %s%s"):format(bin, cap, script(r), extra))
      assert.are.equal(0, rc, out)
      assert.matches(shapes[r], out)
    end)
  end
end)
