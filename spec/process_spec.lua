-- spec/process_spec.lua: the process table a script sees (process_start, process_exit) has the
-- same shape for every kind of source. The sources fill a C struct (cm_process_info) and only the
-- host builds the Lua table, so this pins what each source reports: the replay of a capture
-- (wsrc_frame.c, from HELLO, STATS and BYE) and the in-process engine (inproc.c, from /proc).
local helpers = require "helpers"

local bin = helpers.binary()
local fixture = helpers.root() .. "/spec/fixtures/process_table.lua"

-- The lines "start {...}" and "exit {...}" the fixture prints, keys sorted.
local function tables(out)
  return out:match("\nstart ({[^\n]*})") or out:match("^start ({[^\n]*})"), out:match("\nexit ({[^\n]*})")
end

describe("the process table", function()
  it("of a replayed process carries HELLO, STATS and BYE", function()
    local gen = os.getenv("CUPTIMON_WIRE_GEN")
    if not gen then return pending("CUPTIMON_WIRE_GEN is not set (run through ctest)") end
    local cap = os.tmpname()
    assert.is_true(os.execute(("%s capture %s --pid 111 --records 500 --kinds kernel --rank 3"):format(gen, cap)) == 0)
    local rc, out = helpers.sh(("%s --replay %s %s"):format(bin, cap, fixture))
    os.remove(cap)
    assert.are.equal(0, rc, out)
    local start, exit = tables(out)
    local ppid = assert(start and start:match(" ppid=(%d+) "), out)
    assert.are.equal("{argv={1=wire_gen 2=--synthetic} cupti_version=130000 " ..
      "devices={1={index=0 name=Fake GPU}} env={RANK=3 WORLD_SIZE=4} exe=/usr/bin/wire_gen " ..
      "host=testhost kind=replay pid=111 " ..
      "ppid=" .. ppid .. " source=1}", start)
    assert.are.equal("{argv={1=wire_gen 2=--synthetic} cupti_version=130000 " ..
      "devices={1={index=0 name=Fake GPU}} dropped=0 dropped_agent=0 dropped_cupti=0 dropped_exit=0 " ..
      "env={RANK=3 WORLD_SIZE=4} " ..
      "exe=/usr/bin/wire_gen exit_code=0 guard_lag_s=0 guard_shed={} host=testhost incomplete=0 kind=replay " ..
      "lag_decode_peak_ns=0 lag_peak_s=0 last_number=1 " ..
      "lost_frames=0 lost_wire=0 message= pid=111 ppid=" .. ppid .. " produced=500 received=500 " ..
      "skipped_bytes=0 source=1 stats={batches_queued=1 batches_received=1 records_decoded=500 records_dropped=0 " ..
      "records_queued=500 records_received=500} status=exit tail_unknown=0}", exit)
  end)

  it("of the in-process engine comes from /proc", function()
    local rc, out = helpers.sh(("%s %s one two"):format(bin, fixture))
    -- The fixture observes but nothing runs CUDA in-process, so the run says so and fails;
    -- the process tables are still complete.
    assert.are.equal(1, rc, out)
    assert.matches("the script observed nothing", out, 1, true)
    local start, exit = tables(out)
    assert.is_string(start, out)
    local pid = assert(start:match(" pid=(%d+) "), start)
    local ppid = assert(start:match(" ppid=(%d+) "), start)
    local exe = assert(start:match(" exe=(%S+) "), start)
    local host = assert(start:match(" host=(%S+) "), start)
    assert.matches("cuptimon%-lua$", exe)
    local head = ("{argv={1=%s 2=%s 3=one 4=two} devices={}"):format(bin, fixture)
    local tail = ("env={} exe=%s host=%s kind=inproc pid=%s ppid=%s source=1"):format(exe, host, pid, ppid)
    assert.are.equal(head .. " " .. tail .. "}", start)
    -- The loss fields of the in-process engine: what it decoded (the fence's own sync records
    -- included) reached the script, and nothing was lost.
    local received = assert(exit:match(" received=(%d+) "), exit)
    -- The engine's decode lag is real time (the fence's sync records are stamped now).
    local lag = assert(exit:match(" lag_decode_peak_ns=(%d+) "), exit)
    local tail2 = ("env={} exe=%s guard_lag_s=0 guard_shed={} host=%s incomplete=0 kind=inproc lag_decode_peak_ns=%s lag_peak_s=0 " ..
      "last_number=0 lost_frames=0 lost_wire=0 pid=%s ppid=%s produced=%s received=%s skipped_bytes=0 source=1")
      :format(exe, host, lag, pid, ppid, received, received)
    assert.are.equal(head .. " dropped=0 dropped_agent=0 dropped_cupti=0 dropped_exit=0 " .. tail2 ..
      " status=detached tail_unknown=0}", exit)
  end)
end)
