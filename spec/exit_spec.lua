-- Specs of cm.exit() with live processes: the records a process holds when
-- the script exits reach the observers before the exit hooks (a sync flush with a deadline, as a
-- detach does), and the status is the script's.
-- luacheck: std +busted
local helpers = require "helpers"

local bin = helpers.binary()
local fixture = helpers.root() .. "/spec/fixtures/exit_flush.lua"

describe("cm.exit() with a live command", function()
  -- The fake application writes its 500 kernel records at once, then sleeps: they sit in its
  -- CUPTI buffer (not full, no flush cadence) when the script exits, 400 ms after the process
  -- started.
  -- The application outlives cuptimon-lua: its output goes to a file, so that nothing it writes
  -- after cuptimon-lua's exit lands in the output read here.
  local function run(exit_status)
    local app, why = helpers.agent_app()
    if not app then return nil, why end
    local log = os.tmpname()
    local rc, out = helpers.sh(("%s %s 400 %d -- sh -c 'exec %s --records 500 --kinds kernel "
      .. "--linger-ms 1500 >%s 2>&1'"):format(bin, fixture, exit_status, app, log))
    helpers.sleep(50)
    local f = assert(io.open(log))
    local app_out = f:read("*a")
    f:close()
    os.remove(log)
    assert.matches("fake_cuda_app: pid=%d+ init=1 records=500 ", app_out)
    return rc, out
  end

  it("delivers what the process holds before the exit hooks", function()
    local rc, out = run(0)
    if not rc then
      pending(out)
      return
    end
    assert.are.equal(0, rc, out)
    assert.matches("^records=500\n", out)
    assert.is_nil(out:find("LOST", 1, true), out)
  end)

  it("exits with the status the script chose", function()
    local rc, out = run(7)
    if not rc then
      pending(out)
      return
    end
    assert.are.equal(7, rc, out)
    assert.matches("^records=500\n", out)
  end)

  it("--duration ends a live run the same way, delivering what the process holds", function()
    local app, why = helpers.agent_app()
    if not app then
      pending(why)
      return
    end
    -- The fixture itself would wait 100 s; --duration 1 ends the run, counted from cuptimon-lua's
    -- start: a second leaves a loaded machine time to start the application, which writes its
    -- records at once and then lingers 3 s.
    local uv = require "luv"
    local t0 = uv.hrtime()
    local rc, out = helpers.sh(("%s --duration 1 %s 100000 -- sh -c 'exec %s --records 500 "
      .. "--kinds kernel --linger-ms 3000 >/dev/null 2>&1'"):format(bin, fixture, app))
    assert.are.equal(0, rc, out)
    assert.matches("^records=500\n", out)
    assert.is_true((uv.hrtime() - t0) / 1e6 < 2800, "ended before the application did")
    rc, out = helpers.sh(bin .. " --duration 0 -e 1")
    assert.are.same({ 2, "cuptimon-lua: --duration needs a positive number of seconds, got 0 "
      .. "(see --help)\n" }, { rc, out })
  end)

  it("from an exit hook, with the command's processes still attached, chooses the status", function()
    local app, why = helpers.agent_app()
    if not app then
      pending(why)
      return
    end
    -- gpu_util.lua does this when no PM sample arrived.
    local rc, out = helpers.sh(("%s -e 'local cm = require \"cuptimon\"; cm.observe({ kernel = "
      .. "{ \"start\" } }, function() end); cm.on(\"exit\", function() print(\"hook\"); "
      .. "cm.exit(5) end)' -- %s --records 100 --kinds kernel"):format(bin, app))
    assert.are.equal(5, rc, out)
    assert.matches("\nhook\n", out)
  end)

  it("exits at once while the script loads", function()
    local rc, out = helpers.sh(("%s -e 'require(\"cuptimon\").exit(4)' -- sh -c 'echo ran'")
      :format(bin))
    assert.are.same({ 4, "" }, { rc, out })
  end)
end)
