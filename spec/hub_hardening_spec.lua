-- spec/hub_hardening_spec.lua: the hub's defenses against hostile or broken peers and paths,
-- with wire_gen as a synthetic agent: captures never shared or written through links, idle and
-- oversized connections, rate-limited lines, a full disk under --record, stale directories. The
-- rest of the hub is spec/hub_spec.lua's and spec/hub_agent_spec.lua's.
-- luacheck: std +busted
local helpers = require "helpers"

local bin, gen = helpers.binary(), os.getenv("CUPTIMON_WIRE_GEN")
local tmp = helpers.tmpdir()
local script, fixture = helpers.script, helpers.fixture
local synth = helpers.SYNTH

describe("cuptimon-lua hub hardening (synthetic agents)", function()
  if not gen then
    pending("CUPTIMON_WIRE_GEN is not set (run through ctest)")
    return
  end
  local count = script("count.lua")
  local function now() return require("luv").hrtime() / 1e6 end

  it("names each capture by the kernel's pid and never shares a file", function()
    local d = tmp .. "/i1"
    os.execute("mkdir -p " .. d)
    -- Both agents claim pid 4242 in their HELLO; the captures must carry their real pids.
    local cmd = ("sh -c '%s agent --pid 4242 --records 3000 --kinds kernel & %s agent --pid 4242 --records 5000 --kinds kernel; wait'")
      :format(gen, gen)
    local rc, out = helpers.sh(("%s%s --record %s/run.%%p.cmcap -- %s"):format(synth, bin, d, cmd))
    assert.are.equal(0, rc, out)
    local real = {}
    for p in out:gmatch("real_pid=(%d+)") do real[#real + 1] = p end
    assert.are.equal(2, #real, out)
    assert.is_nil(io.open(d .. "/run.4242.cmcap"), "no capture named by the HELLO's pid")
    local counts = {}
    for _, p in ipairs(real) do
      local rc2, rep = helpers.sh(("%s --replay %s/run.%s.cmcap %s"):format(bin, d, p, count))
      assert.are.equal(0, rc2, rep)
      counts[#counts + 1] = tonumber(rep:match("total%s+(%d+)"))
    end
    table.sort(counts)
    assert.are.same({ 3000, 5000 }, counts)
  end)

  it("checks that captures can be created before the command runs", function()
    local rc, out = helpers.sh(("%s%s --record %s/no/such/dir/x.%%p.cmcap -- sh -c 'echo COMMAND RAN'")
      :format(synth, bin, tmp))
    assert.are.equal(2, rc, out)
    assert.matches("cannot create files in .*no/such/dir: No such file or directory", out)
    assert.is_nil(out:match("COMMAND RAN"), out)
  end)

  it("refuses an existing capture unless --force, creates new ones 0600, never follows a symlink", function()
    local d = tmp .. "/i4"
    os.execute("mkdir -p " .. d .. " && echo keep > " .. d .. "/target")
    -- `exec` keeps the shell's pid, so $$ is the agent's pid: the file is there before it connects.
    local function run(prep, force)
      return helpers.sh(("cd %s && %s%s --record %s/c.%%p.cmcap %s -- sh -c '%s; exec %s agent --records 1000 --kinds kernel'")
        :format(d, synth, bin, d, force and "--force" or "", prep, gen))
    end
    local rc, out = run("echo old > c.$$.cmcap")
    assert.are.equal(1, rc, out)
    assert.matches("not recording pid %d+: .*c%.%d+%.cmcap exists %(%-%-force replaces it%)", out)
    local pid = out:match("not recording pid (%d+)")
    local f = assert(io.open(d .. "/c." .. pid .. ".cmcap"))
    assert.are.equal("old\n", f:read("*a"))
    f:close()
    rc, out = run("echo old > c.$$.cmcap; chmod 666 c.$$.cmcap", true)
    assert.are.equal(0, rc, out)
    local path = assert(out:match("recorded (%S+): %d+ frames, %d+ batches, 1000 records"), out)
    local _, mode = helpers.sh("stat -c %a " .. path)
    assert.are.equal("600", mode:match("%d+"))
    rc, out = run("ln -s target c.$$.cmcap", true)
    assert.are.equal(1, rc, out)
    assert.matches("not recording pid %d+: .* is a symbolic link", out)
    f = assert(io.open(d .. "/target"))
    assert.are.equal("keep\n", f:read("*a"))
    f:close()
  end)

  -- A single process's capture takes the name given, with no pid inserted, so the documented
  -- refusal of an existing file (without --force) applies to `--record run.cmcap` itself.
  it("writes a single process's capture under the name given, refusing an existing one before the command runs", function()
    local d = tmp .. "/i20"
    os.execute("mkdir -p " .. d)
    local function run(force)
      return helpers.sh(("%s%s --record %s/run.cmcap %s -- sh -c 'echo COMMAND RAN; exec %s agent --records 1000 --kinds kernel'")
        :format(synth, bin, d, force and "--force" or "", gen))
    end
    local rc, out = run()
    assert.are.equal(0, rc, out)
    assert.matches("recorded [^\n]*/i20/run%.cmcap: %d+ frames, %d+ batches, 1000 records, 0 dropped", out)
    assert.is_nil(out:find("another process", 1, true), out)
    rc, out = run()
    assert.are.equal(2, rc, out)
    assert.matches("%-%-record [^\n]*/i20/run%.cmcap: the file exists %(%-%-force replaces it", out)
    assert.is_nil(out:find("COMMAND RAN", 1, true), out)
    rc, out = run(true)
    assert.are.equal(0, rc, out)
    assert.matches("recorded [^\n]*/i20/run%.cmcap: ", out)
    local _, files = helpers.sh("ls " .. d)
    assert.are.equal("run.cmcap\n", files)
  end)

  it("refuses a FIFO, at start and per process, without hanging", function()
    local d = tmp .. "/i8"
    os.execute("mkdir -p " .. d .. " && mkfifo " .. d .. "/fifo")
    local t0 = now()
    local rc, out = helpers.sh(("%stimeout -s KILL 20 %s --record %s/fifo -- %s agent --records 100")
      :format(synth, bin, d, gen))
    assert.are.equal(2, rc, out)
    assert.matches("%-%-record .*fifo: it is a FIFO; a capture must be a regular file", out)
    rc, out = helpers.sh(("cd %s && %stimeout -s KILL 20 %s --record %s/p.%%p.cmcap -- sh -c 'mkfifo p.$$.cmcap; exec %s agent --records 1000 --kinds kernel'")
      :format(d, synth, bin, d, gen))
    assert.are.equal(1, rc, out)
    assert.matches("not recording pid %d+: .*p%.%d+%.cmcap is a FIFO", out)
    assert.is_true(now() - t0 < 15000, "no hang")
  end)

  it("says so when --record saw no CUDA process", function()
    local rc, out = helpers.sh(("%s%s --record %s/none.%%p.cmcap -- true"):format(synth, bin, tmp))
    assert.are.equal(0, rc, out)
    assert.matches("no CUDA process connected, so nothing was recorded", out)
  end)

  it("closes idle connections at the handshake deadline", function()
    local rc, out = helpers.sh(("CUPTIMON_HELLO_TIMEOUT_MS=300 %s%s %s -- %s idle 5 --hold-ms 4000")
      :format(synth, bin, count, gen))
    assert.are.equal(0, rc, out)
    assert.matches("wire_gen: idle opened=5 closed=5", out)
    assert.matches("sent no valid HELLO within 300 ms", out)
  end)

  it("lets idle connections neither delay the end nor print lines", function()
    local ready = tmp .. "/i9a.ready"
    local cmd = ("sh -c '%s idle 50 --hold-ms 8000 --ready %s >/dev/null 2>&1 & while [ ! -e %s ]; do sleep 0.02; done; exec %s agent --records 2000 --kinds kernel'")
      :format(gen, ready, ready, gen)
    local t0 = now()
    local rc, out = helpers.sh(("%s%s %s -- %s"):format(synth, bin, count, cmd))
    local took = now() - t0
    assert.are.equal(0, rc, out)
    assert.matches("total%s+2000", out)
    assert.is_nil(out:match("still connected"), out)
    assert.is_true(took < 4000, ("the run took %d ms"):format(took))
  end)

  it("serves the real agent despite 1100 idle connections", function()
    local ready = tmp .. "/i9b.ready"
    -- The monitor gets 256 descriptors; the idle peer raises its own limit.
    local cmd = ("sh -c 'ulimit -Sn 4096; %s idle 1100 --hold-ms 8000 --ready %s >/dev/null 2>&1 & while [ ! -e %s ]; do sleep 0.02; done; exec %s agent --records 5000 --kinds kernel'")
      :format(gen, ready, ready, gen)
    local rc, out = helpers.sh(("ulimit -Sn 256; %s%s %s -- %s"):format(synth, bin, count, cmd))
    assert.are.equal(0, rc, out)
    assert.matches("total%s+5000", out)
    assert.is_nil(out:match("still connected"), out)
  end)

  it("caps a frame before HELLO and closes with a message", function()
    local rc, out = helpers.sh(("%s%s %s -- %s agent --oversize-hello 1073741824"):format(synth, bin, count, gen))
    assert.are.equal(0, rc, out)
    assert.matches("its HELLO declares 1073741824 bytes, over the cap of 524288 bytes before the handshake", out)
    assert.matches("wire_gen: oversized HELLO closed by the monitor", out)
  end)

  it("caps a frame after HELLO at the wire format's maximum, with a message", function()
    local rc, out = helpers.sh(("%s%s %s -- %s agent --big-frame 1073741832"):format(synth, bin, count, gen))
    -- The connection is cut before the agent's final counts: the run lost data and says so.
    assert.are.equal(3, rc, out)
    assert.matches("LOST an unknown number of records in pid %d+ %(its final counts are missing%)", out)
    assert.matches("agent pid %d+ sent a frame over the wire format's size limit", out)
    assert.matches("wire_gen: big frame closed by the monitor", out)
  end)

  -- Partly received frames are bounded over all connections together: four authenticated
  -- connections that each start a 64 MiB frame must not grow the monitor by their sum.
  it("bounds the partly received frames of all connections together, and the connections per run", function()
    local peak = "-e 'require(\"cuptimon\").on(\"exit\", function() local f = io.open(\"/proc/self/status\"); "
      .. "print(\"VmHWM \" .. f:read(\"*a\"):match(\"VmHWM:%s*(%d+)\")); f:close() end)'"
    local four = ("sh -c 'for i in 1 2 3 4; do %s agent --big-frame 67108864 --fill 62914560 & done; wait'"):format(gen)
    local rc, out = helpers.sh(("%sCUPTIMON_PARTIAL_BUDGET_MB=100 %s %s -- %s"):format(synth, bin, peak, four))
    assert.are.equal(3, rc, out)
    local _, closed = out:gsub("over the budget of 100 MiB %(CUPTIMON_PARTIAL_BUDGET_MB%); closing its connection", "")
    assert.are.equal(3, closed, out)
    local kb = tonumber(out:match("VmHWM (%d+)"))
    assert.is_not_nil(kb, out)
    -- Under a sanitizer the resident set says nothing (its allocator quarantines freed memory,
    -- TSan's shadow memory multiplies it); the closes above are checked there all the same.
    if not os.getenv("CUPTIMON_SKIP_RSS_CHECK") then
      assert.is_true(kb < 200 * 1024, "peak resident set " .. tostring(kb) .. " kB\n" .. out)
    end
    assert.matches("3 agent connections were closed over the budget of 100 MiB for partly received frames", out)
    -- The cap on connections: two held open, two more closed at once.
    four = ("sh -c 'for i in 1 2 3 4; do %s agent --big-frame 64 & done; wait'"):format(gen)
    rc, out = helpers.sh(("%sCUPTIMON_MAX_AGENTS=2 %s %s -- %s"):format(synth, bin, peak, four))
    local _, capped = out:gsub("over the cap of 2 connections per run %(CUPTIMON_MAX_AGENTS%)", "")
    assert.are.equal(2, capped, out)
    assert.matches("over the cap of 2 connections per run\n", out)
    assert.are_not.equal(0, rc, out)
  end)

  -- An agent decides nothing about the monitor's output: PM_STATUS frames no request asked for
  -- give one warning, never a line each, and no byte of them reaches the terminal raw.
  it("ignores PM_STATUS frames no request asked for, with one warning and no escape sequence", function()
    local rc, out = helpers.sh(("%s%s %s -- %s agent --pm-status 20000 --records 1000 --kinds kernel"):format(synth,
      bin, count, gen))
    assert.are.equal(0, rc, out)
    assert.matches("concurrent_kernel%s+1000\n", out)
    local _, n = out:gsub("PM_STATUS frames with no PM request outstanding are ignored", "")
    assert.are.equal(1, n, out)
    assert.is_nil(out:find("\27", 1, true), out)
    assert.is_true(#out < 4096, #out .. " bytes of output")
  end)

  it("rate-limits the lines agents cause, and says how many it suppressed", function()
    local forty = ("sh -c 'for i in $(seq 40); do %s agent --garbage --records 2000 --kinds kernel & done; wait'")
      :format(gen)
    local t0 = os.time()
    local _, out = helpers.sh(("%s%s %s -- %s"):format(synth, bin, count, forty))
    local elapsed = os.time() - t0
    local _, shown = out:gsub("corrupt stream %(", "")
    local suppressed = 0
    for n in out:gmatch("suppressed (%d+) messages about agents") do suppressed = suppressed + tonumber(n) end
    -- A burst of 20, then one a second.
    assert.is_true(shown <= 21 + elapsed, shown .. " lines in " .. elapsed .. " s\n" .. out)
    assert.are.equal(40, shown + suppressed, out)
  end)

  -- The --record summary counts what the full disk kept out of the capture as dropped.
  it("counts the records --record could not write when the disk is full", function()
    local dir = tmp .. "/full"
    os.execute("rm -rf " .. dir .. " && mkdir -p " .. dir)
    local rc, out = helpers.sh(("%sCUPTIMON_TEST_RECORD_ENOSPC_AT=300000 %s --record %s/r.%%p.cmcap -- %s agent "
      .. "--records 20000 --kinds kernel"):format(synth, bin, dir, gen))
    assert.are.equal(1, rc, out)
    assert.matches("error writing capture [^\n]*: No space left on device; the file ends at the frame that failed", out)
    local recs, dropped = out:match("recorded [^\n]*: %d+ frames, %d+ batches, (%d+) records, (%d+) dropped")
    assert.are.same({ 1000, 19000 }, { tonumber(recs), tonumber(dropped) }, out)
  end)

  -- A SIGKILLed monitor cannot remove its socket directory, so the next run removes it, and only
  -- a directory whose monitor is gone.
  it("removes the socket directory a SIGKILLed monitor left, and only that", function()
    local base = tmp .. "/tmpdir"
    os.execute("rm -rf " .. base .. " && mkdir -p " .. base)
    local env = ("TMPDIR=%s %s"):format(base, synth)
    local p = io.popen(("sh -c '%s%s %s -- sleep 3 >/dev/null 2>&1 & echo $!'"):format(env, bin, count))
    local mon = tonumber(p:read("*l"))
    p:close()
    local dead
    assert.is_true(helpers.run_until(function()
      local l = io.popen("ls " .. base)
      dead = l:read("*l")
      l:close()
      return dead ~= nil
    end, 10000), "the monitor made no directory")
    os.execute("kill -KILL " .. mon)
    helpers.run_until(function() return os.execute("kill -0 " .. mon .. " 2>/dev/null") ~= 0 end, 10000)
    -- Its socket is older than the 10 s a starting monitor may take to listen.
    os.execute(("touch -h -d '1 minute ago' %s/%s/agent.sock"):format(base, dead))
    -- A directory that is not a monitor's stays, and so does one that is not ours to judge.
    os.execute(("mkdir -m 700 %s/cuptimon-keepme && touch %s/cuptimon-keepme/other"):format(base, base))
    local rc, out = helpers.sh(("%s%s %s -- true"):format(env, bin, count))
    assert.are.equal(0, rc, out)
    assert.matches("removed " .. (base .. "/" .. dead):gsub("%p", "%%%0") .. ", left by a monitor that was killed", out)
    local l = io.popen("ls " .. base)
    local left = l:read("*a")
    l:close()
    assert.are.equal("cuptimon-keepme\n", left)
  end)

  it("makes the socket 0600 and takes the pid from the kernel", function()
    local rc, out = helpers.sh(("%s%s %s -- sh -c 'stat -c mode=%%a \"$CUPTIMON_SOCKET\"'"):format(synth, bin, count))
    assert.are.equal(0, rc, out)
    assert.matches("mode=600", out)
    rc, out = helpers.sh(("%s%s %s -- %s agent --pid 4242 --records 100 --kinds kernel")
      :format(synth, bin, fixture("hub_events.lua"), gen))
    assert.are.equal(0, rc, out)
    local real = assert(out:match("real_pid=(%d+)"), out)
    assert.matches("start pid=" .. real .. " ", out)
    assert.is_nil(out:match("start pid=4242"), out)
  end)

  it("answers a handshake while the script is busy", function()
    local marker = tmp .. "/i7.busy"
    local cmd = ("sh -c '%s agent --records 2000 --kinds kernel & while [ ! -e %s ]; do sleep 0.02; done; %s agent --records 10 --kinds kernel; wait'")
      :format(gen, marker, gen)
    local rc, out = helpers.sh(("SLOW_MARKER=%s %s%s %s -- %s"):format(marker, synth, bin, fixture("slow_observer.lua"), cmd))
    assert.are.equal(0, rc, out)
    assert.matches("records=2010", out)
    local times = {}
    for ms in out:gmatch("handshake_ms=(%d+)") do times[#times + 1] = tonumber(ms) end
    assert.are.equal(2, #times, out)
    -- The observer holds the loop for 3 s; the second handshake must not wait for it.
    assert.is_true(times[2] < 1000, out)
  end)
end)

