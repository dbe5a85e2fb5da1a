-- spec/output_errors_spec.lua: every output a user asks for is written whole, or the run says
-- what was not written and fails. A full disk is made without root through RLIMIT_FSIZE (`ulimit
-- -f` in the shell that starts cuptimon-lua): cuptimon-lua ignores SIGXFSZ, so a write past the
-- limit fails with EFBIG as a write to a full disk fails with ENOSPC. Also: an exit request
-- raised inside an observer, and a script that is not there.
-- luacheck: std +busted
local helpers = require "helpers"

local bin = helpers.binary()
local root = helpers.root()
local demo = root .. "/examples/demo.cmcap"
local gen = os.getenv("CUPTIMON_WIRE_GEN")
local function script(name) return root .. "/scripts/" .. name end

-- Runs `cmd` (a cuptimon-lua argument list) with a file-size limit of `kib` KiB, with the
-- environment assignments `env` ("" for none); returns the status and the output (stdout and
-- stderr together).
-- SIGXFSZ's default action comes back first: this spec runs inside cuptimon-lua, which ignores
-- it, and an ignored signal is inherited, so the binary under test would not be the one that
-- chose to ignore it.
local function limited(kib, cmd, env)
  return helpers.sh(("bash -c 'ulimit -f %d; exec env --default-signal=XFSZ %s %s %s'")
    :format(kib, env or "", bin, cmd))
end

-- The lines of a file, or 0 when it cannot be read.
local function lines(path)
  local f = io.open(path, "r")
  if not f then return 0 end
  local n = 0
  for _ in f:lines() do n = n + 1 end
  f:close()
  return n
end

describe("outputs under a file-size limit", function()
  local dir = helpers.tmpdir()

  it("dump.lua -o DIR: reports the path and the reason, counts the rows not written, exits 1",
    function()
      local rc, out = limited(16, ("--replay %s %s -o %s/d/"):format(demo, script("dump.lua"), dir))
      assert.are.equal(1, rc, out)
      assert.matches("cuptimon: error in dump%.lua: cannot write " .. dir:gsub("%p", "%%%0")
        .. "/d/runtime%.csv: File too large\n", out)
      local lost = tonumber(out:match("dump%.lua: LOST (%d+) rows not written: cannot write [^\n]*runtime%.csv"))
      assert.is_truthy(lost, out)
      -- The table counts only the rows that reached the file: with the lost ones, every row.
      local written = tonumber(out:match("\nruntime%s+(%d+) "))
      assert.are.same({ 629, true }, { written + lost, written < 629 }, out)
      -- The files that fit are whole: a comment line, the header and every row.
      assert.are.equal(2 + 66, lines(dir .. "/d/memcpy.csv"), out)
      assert.is_nil(out:find("error object", 1, true), out)
    end)

  it("timeline.lua -o FILE: no 'wrote' line, the events not written counted, exits 1", function()
    local rc, out = limited(16, ("--replay %s %s -o %s/t.json"):format(demo, script("timeline.lua"),
      dir))
    assert.are.equal(1, rc, out)
    assert.matches("cuptimon: error in timeline%.lua: cannot write [^\n]*/t%.json: File too large\n", out)
    local lost, total = out:match("timeline%.lua: LOST (%d+) of (%d+) events")
    assert.is_truthy(lost, out)
    assert.are.same({ true, 1950 }, { tonumber(lost) > 0, tonumber(total) }, out)
    -- Nothing claims the trace was written, and the trace cut short is not rewritten.
    assert.is_nil(out:find("wrote", 1, true), out)
    assert.is_nil(out:find("cannot move ts 0", 1, true), out)
  end)

  it("sqlite.lua -o: the reason, not '(error object ...)'; the records not written; exits 1", function()
    local db = dir .. "/x.sqlite"
    local rc, out = limited(150, ("--replay %s %s --txn-rows 100 -o %s"):format(demo,
      script("sqlite.lua"), db))
    assert.are.equal(1, rc, out)
    assert.is_nil(out:find("error object", 1, true), out)
    assert.is_nil(out:find("no transaction is active", 1, true), out)
    assert.matches("cuptimon: error in sqlite%.lua: cannot write [^\n]*x%.sqlite: [^\n]*disk I/O error "
      .. "%([^\n]*file%-size limit", out)
    local lost, kept = out:match("sqlite%.lua: LOST (%d+) records not written to [^\n]* it holds the (%d+) rows")
    assert.is_truthy(lost, out)
    assert.is_true(tonumber(lost) > 0, out)
    -- The database is intact, holds what the line says, and says it is not complete.
    local q, complete = helpers.sh(("sqlite3 %s \"SELECT value FROM CUPTIMON_META WHERE name = 'complete'\""):format(db))
    if q == 127 then return pending("the sqlite3 tool is not installed (Debian's sqlite3)") end
    assert.are.equal("0\n", complete)
    local _, n = helpers.sh(("sqlite3 %s \"SELECT (SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL) + "
      .. "(SELECT count(*) FROM CUPTI_ACTIVITY_KIND_RUNTIME) + (SELECT count(*) FROM "
      .. "CUPTI_ACTIVITY_KIND_MEMCPY) + (SELECT count(*) FROM CUPTI_ACTIVITY_KIND_MEMSET) + (SELECT "
      .. "count(*) FROM CUPTI_ACTIVITY_KIND_SYNCHRONIZATION) + (SELECT count(*) FROM NVTX_EVENTS)\""):format(db))
    assert.are.equal(kept .. "\n", n, out)
  end)

  it("--record: EFBIG is reported like ENOSPC, the records not written are dropped, exit 1", function()
    if not gen then return pending("wire_gen is not built (CUPTIMON_WIRE_GEN)") end
    -- The synthetic agent needs no agent library; any readable path satisfies the hub's lookup.
    local rc, out = limited(256, ("--record %s/r.%%p.cmcap -- %s agent --records 20000 --kinds kernel")
      :format(dir, gen), "CUPTIMON_AGENT=/dev/null")
    -- A SIGXFSZ death is 153 with no message at all.
    assert.are.equal(1, rc, out)
    assert.matches("error writing capture [^\n]*: File too large; the file ends at the frame that failed", out)
    local recs, dropped = out:match("recorded [^\n]*: %d+ frames, %d+ batches, (%d+) records, (%d+) dropped")
    assert.is_truthy(recs, out)
    assert.are.same({ 20000, true }, { tonumber(recs) + tonumber(dropped), tonumber(dropped) > 0 }, out)
  end)

  it("stdout redirected to a file that hits the limit: said, and exit 1", function()
    -- 20 KiB of output, past a limit of 8 KiB.
    local rc, out = limited(8, ("--replay %s -e \"for _ = 1, 200 do print((\\\"x\\\"):rep(99)) end\" "
      .. "> %s/out.txt"):format(demo, dir))
    assert.are.equal(1, rc, out)
    assert.matches("cuptimon%-lua: cannot write the standard output: File too large\n", out)
  end)

  it("the agent's capture mode: a capture file cut short is said as such, not as a lost connection",
    function()
      local app, why = helpers.agent_app()
      local fake = os.getenv("CUPTIMON_LIBCUPTI") or ""
      if not app or not fake:find("fake") then pending(why or "the fake CUPTI is not set") return end
      local path = dir .. "/agent_limit.cmcap"
      local rc, out = helpers.sh(("bash -c 'ulimit -f 64; exec env --default-signal=XFSZ "
        .. "CUPTIMON_CAPTURE=%s CUDA_INJECTION64_PATH=%s/libcuptimon-agent.so %s --records 200000'")
        :format(path, os.getenv("CUPTIMON_BUILD_DIR"), app))
      assert.are.equal(0, rc, out) -- the application is never failed by its monitor
      local lost = tonumber(out:match("(%d+) records by the agent %(queue full or the capture file not written%)"))
      assert.is_truthy(lost, out)
      assert.is_true(lost > 0, out)
      assert.is_nil(out:find("connection lost", 1, true), out)
    end)

  it("cleans up", function() os.execute("rm -rf " .. dir) end)
end)

describe("an exit request raised inside an observer", function()
  it("prints its message, not '(error object is not a string)', and exits with its status", function()
    local chunk = [[local cm = require "cuptimon"
local args = require "cuptimon.args"
cm.observe({ kernel = { "start" } }, function() error(args.exit_request(4, "stop: the disk is full"), 0) end)]]
    local rc, out = helpers.sh(("%s --replay %s -e '%s'"):format(bin, demo, chunk))
    assert.are.same({ 4, "stop: the disk is full\n" }, { rc, out })
  end)
  it("from an exit hook too", function()
    local chunk = [[local cm = require "cuptimon"
local args = require "cuptimon.args"
cm.on("exit", function() error(args.exit_request(5, "stop at exit"), 0) end)]]
    local rc, out = helpers.sh(("%s --replay %s -e '%s'"):format(bin, demo, chunk))
    assert.are.same({ 5, "stop at exit\n" }, { rc, out })
  end)
end)

describe("a script that is not there", function()
  it("a path: one line, usage status 2", function()
    local rc, out = helpers.sh(("%s --replay %s %s"):format(bin, demo, script("tops.lua")))
    assert.are.same({ 2, ("cuptimon-lua: cannot open the script %s: No such file or directory "
      .. "(see --help)\n"):format(script("tops.lua")) }, { rc, out })
  end)
  it("a bare name: says where recipes are found by name, usage status 2", function()
    local rc, out = helpers.sh(("cd / && %s --replay %s top"):format(bin, demo))
    assert.are.equal(2, rc, out)
    assert.matches("^cuptimon%-lua: no script top: it is not a file here, and recipes are found by "
      .. "name only in an install %([^\n]*/share/cuptimon/scripts/%); in a source tree, name the "
      .. "file: scripts/top%.lua %(see %-%-help%)\n$", out)
  end)
end)
