-- Specs of scripts/sqlite.lua: the run as an SQLite database in Nsight Systems' export
-- schema. NVIDIA's documented example queries ("Common SQLite examples" of the nsys export
-- documentation: the kernel summary of `nsys stats`' cuda_gpu_kern_sum, "Correlate CUDA kernel
-- launches with CUDA API kernel launches", "Rename CUDA kernels with NVTX") run on the output of
-- the demo capture and of the fake CUDA application, and must agree with top.lua, api_latency.lua
-- and nvtx.lua on the same data. Then Python's sqlite3 (and pandas' read_sql where installed)
-- reads it, a SIGKILL mid-run leaves a database that passes PRAGMA integrity_check, hostile names
-- go through unchanged, an existing output or a link is refused, a lossy run writes its loss
-- and exits 3, and a missing libsqlite3 is one clear line and status 1.
-- luacheck: std +busted
local helpers = require "helpers"
local sqlite = require "cuptimon.sqlite"
local uv = require "luv"

local bin = helpers.binary()
local root = helpers.root()
local demo = root .. "/examples/demo.cmcap"
local script = root .. "/scripts/sqlite.lua"
local wire_gen = os.getenv("CUPTIMON_WIRE_GEN")

local tmp = helpers.tmpdir()
teardown(function() os.execute("rm -rf " .. tmp) end)
local serial = 0
local function fresh(name)
  serial = serial + 1
  return ("%s/%d-%s"):format(tmp, serial, name or "run.sqlite")
end

-- Runs sqlite.lua: `source` is "--replay X" or "" (then `tail` holds "-- cmd"). Returns the status,
-- the output and the database path.
local function export(source, tail, db)
  db = db or fresh()
  local rc, out = helpers.sh(("%s %s %s -o %s %s"):format(bin, source, script, db, tail or ""))
  return rc, out, db
end

local function recipe(source, args)
  local rc, out = helpers.sh(("%s %s %s/scripts/%s"):format(bin, source, root, args))
  assert.are.equal(0, rc, args .. ": " .. out)
  return out
end

-- The rows of `sql` (constant text) on database `path`, each a list of strings.
local function query(path, sql)
  local db = assert(sqlite.open(path, false))
  local rows, err = db:rows(sql)
  db:close()
  assert(rows, err)
  return rows
end

-- Runs several statements that change the database (the documented examples ALTER and UPDATE
-- tables), on a copy so the original stays as written.
local function on_copy(path, sql)
  local copy = path .. ".copy"
  assert(os.execute(("cp %s %s"):format(path, copy)) == 0)
  local db = assert(sqlite.open(copy, false))
  assert(db:exec(sql))
  db:close()
  return copy
end

-- NVIDIA's kernel summary (what `nsys stats --report cuda_gpu_kern_sum` computes), by the
-- demangled name, which is what top.lua --full-names shows, per device as top.lua's tables are.
local KERNEL_SUMMARY = [[
SELECT ids.value AS name, count(*) AS instances, sum(k.end - k.start) AS total,
       min(k.end - k.start) AS min, max(k.end - k.start) AS max, k.deviceId
FROM CUPTI_ACTIVITY_KIND_KERNEL AS k JOIN StringIds AS ids ON ids.id = k.demangledName
GROUP BY k.deviceId, k.demangledName ORDER BY total DESC]]

-- "Correlate CUDA kernel launches with CUDA API kernel launches" (the documentation's example,
-- verbatim), then the launches per API name.
local API_TO_KERNEL = [[
ALTER TABLE CUPTI_ACTIVITY_KIND_RUNTIME ADD COLUMN name TEXT;
ALTER TABLE CUPTI_ACTIVITY_KIND_RUNTIME ADD COLUMN kernelName TEXT;
UPDATE CUPTI_ACTIVITY_KIND_RUNTIME SET kernelName =
    (SELECT value FROM StringIds
    JOIN CUPTI_ACTIVITY_KIND_KERNEL AS cuda_gpu
        ON cuda_gpu.shortName = StringIds.id
        AND CUPTI_ACTIVITY_KIND_RUNTIME.correlationId = cuda_gpu.correlationId);
UPDATE CUPTI_ACTIVITY_KIND_RUNTIME SET name =
    (SELECT value FROM StringIds WHERE nameId = StringIds.id);
]]

-- "Rename CUDA kernels with NVTX" (the documentation's example), applied to the kernels and, the
-- same way, to copies and memsets (nvtx.lua charges all three).
local function nvtx_rename(tbl)
  return ([[
ALTER TABLE %s ADD COLUMN nvtxRange TEXT;
UPDATE %s SET nvtxRange = (
    SELECT NVTX_EVENTS.text
    FROM NVTX_EVENTS JOIN CUPTI_ACTIVITY_KIND_RUNTIME ON
        NVTX_EVENTS.eventType == 59 AND
        NVTX_EVENTS.globalTid == CUPTI_ACTIVITY_KIND_RUNTIME.globalTid AND
        NVTX_EVENTS.start <= CUPTI_ACTIVITY_KIND_RUNTIME.start AND
        NVTX_EVENTS.end >= CUPTI_ACTIVITY_KIND_RUNTIME.end
    WHERE
        %s.correlationId == CUPTI_ACTIVITY_KIND_RUNTIME.correlationId
    ORDER BY NVTX_EVENTS.start DESC LIMIT 1
);
]]):format(tbl, tbl, tbl)
end
local NVTX_TO_KERNEL = "CREATE INDEX nvtx_start ON NVTX_EVENTS (start);\n"
  .. nvtx_rename("CUPTI_ACTIVITY_KIND_KERNEL") .. nvtx_rename("CUPTI_ACTIVITY_KIND_MEMCPY")
  .. nvtx_rename("CUPTI_ACTIVITY_KIND_MEMSET")
local NVTX_SUMMARY = [[
SELECT coalesce(nvtxRange, '(no range)'), count(*), sum(d) FROM (
  SELECT nvtxRange, end - start AS d FROM CUPTI_ACTIVITY_KIND_KERNEL
  UNION ALL SELECT nvtxRange, end - start FROM CUPTI_ACTIVITY_KIND_MEMCPY
  UNION ALL SELECT nvtxRange, end - start FROM CUPTI_ACTIVITY_KIND_MEMSET) GROUP BY 1]]

-- top.lua --full-names --top 1000 of one process: "device/name" -> { instances, total us,
-- min us, max us }.
local function top_table(out)
  local t, dev = {}, nil
  for line in out:gmatch("[^\n]+") do
    dev = line:match("^pid %d+ .*, device (%d+)$") or dev
    local total, n, minv, maxv, name = line:match(
      "^%s*[%d.]+%s+(%d+)%s+(%d+)%s+[%d.]+%s+[%d.]+%s+[%d.]+%s+([%d.]+)%s+([%d.]+)%s(.+)$")
    if total then t[dev .. "/" .. name] = { tonumber(n), tonumber(total), minv, maxv } end
  end
  return t
end

-- Checks the kernel summary query against top.lua --full-names on the same data.
local function check_kernel_summary(db, source)
  local top = top_table(recipe(source, "top.lua --full-names --top 1000"))
  local rows = query(db, KERNEL_SUMMARY)
  assert.is_true(#rows > 0)
  local names = 0
  for _ in pairs(top) do names = names + 1 end
  assert.are.equal(names, #rows)
  for _, r in ipairs(rows) do
    local want = top[r[6] .. "/" .. r[1]]
    assert.is_truthy(want, "top.lua has no row for device " .. r[6] .. ", " .. r[1])
    assert.are.same({ want[1], want[2], want[3], want[4] },
      { tonumber(r[2]), tonumber(("%.0f"):format(tonumber(r[3]) / 1e3)),
        ("%.1f"):format(tonumber(r[4]) / 1e3), ("%.1f"):format(tonumber(r[5]) / 1e3) }, r[1])
  end
  return rows
end

-- Checks the API summary (calls and total time per function) against api_latency.lua, and the
-- documented API-to-kernel correlation: every kernel joins its launch call.
local function check_api(db, source)
  local want = {}
  -- api_latency's rows: Time (%), Total (us), Num Calls, ..., Name.
  for line in recipe(source, "api_latency.lua --top 1000"):gmatch("[^\n]+") do
    local total, calls, name = line:match("^%s*[%d.]+%s+([%d.]+)%s+(%d+)%s.*%s(%S+)$")
    if name then want[name] = { tonumber(calls), total } end
  end
  local rows = query(db, [[SELECT s.value, count(*), sum(r.end - r.start)
    FROM CUPTI_ACTIVITY_KIND_RUNTIME r JOIN StringIds s ON s.id = r.nameId GROUP BY 1]])
  local n = 0
  for _, r in ipairs(rows) do
    n = n + 1
    assert.are.same(want[r[1]], { tonumber(r[2]), ("%.1f"):format(tonumber(r[3]) / 1e3) }, r[1])
  end
  local names = 0
  for _ in pairs(want) do names = names + 1 end
  assert.are.equal(names, n)
  local copy = on_copy(db, API_TO_KERNEL)
  local joined = query(copy, [[SELECT name, count(*) FROM CUPTI_ACTIVITY_KIND_RUNTIME
    WHERE kernelName IS NOT NULL GROUP BY name]])
  local kernels = tonumber(query(db, "SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL")[1][1])
  local sum = 0
  for _, r in ipairs(joined) do sum = sum + tonumber(r[2]) end
  os.remove(copy)
  return joined, sum, kernels
end

describe("sqlite.lua on examples/demo.cmcap", function()
  local source = "--replay " .. demo
  local rc, out, db = export(source)

  it("writes every record and says so", function()
    assert.are.equal(0, rc, out)
    assert.matches("sqlite.lua: wrote " .. db:gsub("%p", "%%%0") .. ": %d+ rows %(300 kernel, 629 "
      .. "runtime, 66 memcpy, 61 memset, 64 synchronization, 0 driver, 35 nvtx%), %d+ strings, 1 "
      .. "process, 0 records lost\n", out)
    assert.are.same({ { "ok" } }, query(db, "PRAGMA integrity_check"))
    assert.are.same({ { "1" } }, query(db, "SELECT value FROM CUPTIMON_META WHERE name = 'complete'"))
  end)

  it("the kernel summary query equals top.lua per kernel", function()
    local rows = check_kernel_summary(db, source)
    assert.are.same({ "void cm_demo_matmul<16>(float const*, float const*, float*, int, int, int, "
      .. "bool, bool, float)", "150", "2862989" }, { rows[1][1], rows[1][2], rows[1][3] })
  end)

  it("the API summary equals api_latency.lua, and every kernel joins its launch", function()
    local joined, sum, kernels = check_api(db, source)
    assert.are.same({ { "cudaLaunchKernel", "300" } }, joined)
    assert.are.equal(kernels, sum)
  end)

  it("the NVTX-to-kernel query charges what nvtx.lua charges exclusively", function()
    local nv = recipe(source, "nvtx.lua")
    -- nvtx.lua names a range by its path ("train/step"), the query by its own name: the
    -- exclusive time of every path is the innermost range's.
    local want = {}
    for path, excl in nv:gmatch("\n(%S+)%s+%S+%s+%d+%s+[%d.]+%s+([%d.]+)%s+[%d.]+") do
      local name = path:match("[^/]+$")
      if tonumber(excl) > 0 then
        want[name] = ("%.1f"):format(tonumber(want[name] or 0) + tonumber(excl))
      end
    end
    local copy = on_copy(db, NVTX_TO_KERNEL)
    local got = {}
    for _, r in ipairs(query(copy, NVTX_SUMMARY)) do got[r[1]] = ("%.1f"):format(tonumber(r[3]) / 1e3) end
    os.remove(copy)
    assert.are.same(want, got)
    assert.are.equal("3609.1", got.step)
  end)

  it("encodes globalPid and globalTid as nsys does, and lists the process, threads and GPU", function()
    assert.are.same({ { "601", "cuptimon_demo_cuda", "601" } }, query(db,
      "SELECT pid, name, globalPid / 0x1000000 % 0x1000000 FROM PROCESSES"))
    assert.are.same({ { "601", "1", "3446751232" } }, query(db, [[SELECT t.globalTid / 0x1000000 %
      0x1000000, t.globalTid % 0x1000000, t.cuptiThreadId FROM CUPTIMON_THREADS t]]))
    assert.are.same({ { "0" } }, query(db, [[SELECT count(*) FROM CUPTI_ACTIVITY_KIND_RUNTIME r
      LEFT JOIN ThreadNames t ON t.globalTid = r.globalTid WHERE t.globalTid IS NULL]]))
    -- The demo capture has no DEVICE record: the GPU's name comes from its HELLO.
    assert.are.same({ { "0", "0", "NVIDIA H200" } }, query(db, "SELECT vmId, id, name FROM TARGET_INFO_GPU"))
    -- The demo's process is named neutrally, not by a build path of a developer's machine.
    assert.are.same({ { "cuptimon_demo_cuda", "cuptimon_demo_cuda" } }, query(db,
      "SELECT p.exe, a.value FROM CUPTIMON_PROCESSES p JOIN CUPTIMON_PROCESS_ARGS a ON "
      .. "a.globalPid = p.globalPid AND a.position = 0"))
    -- Every kernel's globalPid is its process's.
    assert.are.same({ { "300" } }, query(db, [[SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL k
      JOIN PROCESSES p ON p.globalPid = k.globalPid]]))
  end)

  it("fills the ENUM tables the columns refer to, and names every string", function()
    assert.are.same({ { "Host-to-Device", "33" }, { "Device-to-Host", "30" },
      { "Device-to-Device", "3" } }, query(db,
      [[SELECT e.label, count(*) FROM CUPTI_ACTIVITY_KIND_MEMCPY m JOIN ENUM_CUDA_MEMCPY_OPER e
        ON e.id = m.copyKind GROUP BY e.id ORDER BY e.id]]))
    assert.are.same({ { "0" } }, query(db, [[SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL k
      WHERE NOT EXISTS (SELECT 1 FROM StringIds WHERE id = k.shortName)
         OR NOT EXISTS (SELECT 1 FROM StringIds WHERE id = k.mangledName)]]))
    assert.are.same({ { "cm_demo_matmul", "_Z14cm_demo_matmulILi16EEvPKfS1_Pfiiibbf" } }, query(db,
      [[SELECT DISTINCT s.value, m.value FROM CUPTI_ACTIVITY_KIND_KERNEL k JOIN StringIds s
        ON s.id = k.shortName JOIN StringIds m ON m.id = k.mangledName
        WHERE s.value = 'cm_demo_matmul']]))
    assert.are.same({ { "NvtxMark", "3" }, { "NvtxPushPopRange", "32" } }, query(db,
      [[SELECT e.name, count(*) FROM NVTX_EVENTS n JOIN ENUM_NSYS_EVENT_TYPE e ON e.id = n.eventType
        GROUP BY e.id ORDER BY e.id]]))
  end)

  it("is read by Python's sqlite3, and by pandas' read_sql where installed", function()
    local rc2, py = helpers.sh(("python3 -c \"import sqlite3; c = sqlite3.connect('%s'); "
      .. "print(c.execute('SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL').fetchone()[0], "
      .. "len(c.execute('SELECT * FROM StringIds').fetchall()))\""):format(db))
    if rc2 == 127 then
      pending("python3 is not installed")
      return
    end
    assert.are.equal(0, rc2, py)
    assert.matches("^300 %d+\n$", py)
    local rc3, pd = helpers.sh(("python3 -c \"import sqlite3, pandas; c = sqlite3.connect('%s'); "
      .. "d = pandas.read_sql('SELECT s.value AS name, count(*) AS n FROM CUPTI_ACTIVITY_KIND_KERNEL k "
      .. "JOIN StringIds s ON s.id = k.shortName GROUP BY 1 ORDER BY 2 DESC', c); "
      .. "print(d.iloc[0]['name'], int(d.iloc[0]['n']))\""):format(db))
    if rc3 ~= 0 and pd:find("No module named 'pandas'") then
      pending("pandas is not installed (python3's sqlite3 read the database)")
      return
    end
    assert.are.equal(0, rc3, pd)
    assert.are.equal("cm_demo_matmul 150\n", pd)
  end)

  it("refuses an existing output unless --force, and a symbolic link always", function()
    local rc2, out2 = export(source, "", db)
    assert.are.equal(1, rc2, out2)
    assert.matches("sqlite.lua: " .. db:gsub("%p", "%%%0") .. " exists; use %-%-force to replace it", out2)
    local rc3, out3 = export(source, "--force", db)
    assert.are.equal(0, rc3, out3)
    local link = fresh("link.sqlite")
    assert(uv.fs_symlink(db, link))
    local rc4, out4 = export(source, "--force", link)
    assert.are.equal(1, rc4, out4)
    assert.matches("is a symbolic link; refusing to write through it", out4)
    assert.are.same({ { "300" } }, query(db, "SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL"))
    -- A leftover rollback journal would be taken for the new database's: refused likewise.
    local fresh_db = fresh("journal.sqlite")
    local f = assert(io.open(fresh_db .. "-journal", "w"))
    f:close()
    local rc6, out6 = export(source, "", fresh_db)
    assert.are.equal(1, rc6, out6)
    assert.matches("journal.sqlite%-journal exists; use %-%-force to replace it", out6)
    local rc7, out7 = export(source, "--force", fresh_db)
    assert.are.equal(0, rc7, out7)
    assert.is_nil(uv.fs_stat(fresh_db .. "-journal"))
    local rc5, out5 = helpers.sh(("%s %s %s"):format(bin, source, script))
    assert.are.equal(2, rc5, out5)
    assert.matches("sqlite.lua: %-o PATH is required", out5)
  end)

  it("says in one line that libsqlite3 is missing, and exits 1", function()
    local rc2, out2 = helpers.sh(("CUPTIMON_LIBSQLITE3=/nonexistent/libsqlite3.so.0 %s %s %s -o %s")
      :format(bin, source, script, fresh()))
    assert.are.equal(1, rc2, out2)
    assert.matches("^sqlite.lua: cannot load libsqlite3 %(tried /nonexistent/libsqlite3.so.0: [^\n]*"
      .. "install Debian's libsqlite3%-0 [^\n]*\n$", out2)
  end)
end)

describe("sqlite.lua on the fake CUDA application", function()
  local app, why = helpers.agent_app()

  it("live: a row per record the application wrote, and the same tables as a replay", function()
    if not app then
      pending(why)
      return
    end
    local kinds = "kernel,runtime,memcpy,memset"
    local rc, out, db = export("", ("-- %s --records 8000 --threads 2 --kinds %s"):format(app, kinds))
    assert.are.equal(0, rc, out)
    local w = {}
    for k, v in out:gmatch("(%a[%w_]*)=(%d+)") do w[k] = tonumber(v) end
    for tbl, k in pairs { KERNEL = "concurrent_kernel", RUNTIME = "runtime", MEMCPY = "memcpy",
        MEMSET = "memset" } do
      assert.are.same({ { tostring(w[k]) } },
        query(db, "SELECT count(*) FROM CUPTI_ACTIVITY_KIND_" .. tbl), tbl)
    end
    assert.are.same({ { "ok" } }, query(db, "PRAGMA integrity_check"))
    assert.are.same({ { tostring(w.pid) } }, query(db, "SELECT pid FROM PROCESSES"))
    assert.are.same({ { "0", "0" } }, query(db, "SELECT dropped, incomplete FROM CUPTIMON_LOSS"))
  end)

  it("on its capture: the documented queries agree with top.lua and api_latency.lua", function()
    if not app then
      pending(why)
      return
    end
    local rc, out, caps, dir = helpers.record(("%s --records 6000 --kinds kernel,runtime,marker")
      :format(app))
    assert.are.equal(0, rc, out)
    local rc2, out2, db = export(caps)
    assert.are.equal(0, rc2, out2)
    check_kernel_summary(db, caps)
    local _, sum, kernels = check_api(db, caps)
    assert.are.equal(kernels, tonumber(out:match("concurrent_kernel=(%d+)")))
    -- The fake's records carry correlation ids of their own sequence (a kernel never shares one
    -- with an API call), so the documented join must find exactly the kernels a plain join does.
    assert.are.same({ { tostring(sum) } }, query(db, [[SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL k
      WHERE EXISTS (SELECT 1 FROM CUPTI_ACTIVITY_KIND_RUNTIME r WHERE r.correlationId = k.correlationId)]]))
    assert.are.same({ { "ok" } }, query(db, "PRAGMA integrity_check"))
    os.execute("rm -rf " .. dir)
  end)

  it("attached to a dormant process, writes what the process wrote meanwhile", function()
    if not app then
      pending(why)
      return
    end
    local run = fresh("attach")
    os.execute("mkdir -p " .. run .. "/xdg && chmod 700 " .. run .. "/xdg")
    local env = ("env XDG_RUNTIME_DIR=%s/xdg "):format(run)
    local fake = os.getenv("CUPTIMON_LIBCUPTI")
    local agent = os.getenv("CUPTIMON_BUILD_DIR") .. "/libcuptimon-agent.so"
    local ctl = run .. "/ctl"
    local p = io.popen(("sh -c '%sCUPTIMON_LIBCUPTI=%s CUPTIMON_LIBCUDA=%s CUDA_INJECTION64_PATH=%s "
      .. "CUPTIMON_LISTEN=1 %s --control %s --kinds kernel >%s.out 2>&1 & echo $!'")
      :format(env, fake, fake, agent, app, ctl, ctl))
    local pid = tonumber(p:read("*l"))
    p:close()
    local function wait_for(cond, what)
      uv.update_time() -- uv.now() is the loop's cached time (helpers.run_until says why)
      local deadline = uv.now() + 15000
      while not cond() do
        assert(uv.now() < deadline, "timed out waiting for " .. what)
        uv.sleep(10)
        uv.update_time()
      end
    end
    wait_for(function() return uv.fs_stat(("%s/xdg/cuptimon/%d.sock"):format(run, pid)) end, "the socket")
    local db = run .. "/attach.sqlite"
    p = io.popen(("sh -c 'exec %s%s --attach %d %s -o %s --commit-ms 20 >%s/mon.out 2>&1 & echo $!'")
      :format(env, bin, pid, script, db, run))
    local mon = tonumber(p:read("*l"))
    p:close()
    wait_for(function()
      local _, l = helpers.sh(env .. bin .. " --list")
      return l:find("pid " .. mon, 1, true) ~= nil
    end, "the attach")
    -- Ask for records until the agent has applied the selection (before that none are written).
    local written = 0
    for _ = 1, 200 do
      local f = assert(io.open(ctl .. ".tmp", "w"))
      f:write("1000\n")
      f:close()
      assert(os.rename(ctl .. ".tmp", ctl))
      wait_for(function() return uv.fs_stat(ctl .. ".ack") end, "the app's acknowledgement")
      local f2 = assert(io.open(ctl .. ".ack"))
      local line = f2:read("*a")
      f2:close()
      os.remove(ctl .. ".ack")
      written = written + tonumber(line:match("written=(%d+)"))
      if written >= 3000 then break end
      uv.sleep(20)
    end
    assert.is_true(written >= 3000)
    os.execute("kill -INT " .. mon)
    wait_for(function() return os.execute("kill -0 " .. mon .. " 2>/dev/null") ~= 0 end, "the monitor")
    local f = assert(io.open(ctl, "w"))
    f:write("quit\n")
    f:close()
    local mout = io.open(run .. "/mon.out"):read("*a")
    assert.matches("sqlite.lua: wrote [^\n]* %(" .. written .. " kernel,", mout)
    assert.are.same({ { tostring(written) } }, query(db, "SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL"))
    assert.are.same({ { "ok" } }, query(db, "PRAGMA integrity_check"))
  end)

  it("killed with SIGKILL mid-run, leaves a database that opens, with its committed rows", function()
    if not app then
      pending(why)
      return
    end
    local db = fresh("killed.sqlite")
    local log = db .. ".log"
    local rc, out = helpers.sh(("sh -c '%s %s -o %s --commit-ms 50 -- %s --records 20000 --rounds 60 "
      .. "--pause-ms 50 --kinds kernel,runtime >%s 2>&1 & m=$!; i=0; "
      -- Rows are being written (the file grows) and a few commits have passed: kill it.
      .. "while [ $(stat -c %%s %s 2>/dev/null || echo 0) -lt 300000 ] && [ $i -lt 400 ]; do "
      .. "sleep 0.05; i=$((i+1)); done; sleep 0.3; kill -KILL $m; wait $m; "
      .. "echo status=$?'"):format(bin, script, db, app, log, db))
    assert.are.equal(0, rc, out)
    assert.matches("status=137", out)
    assert.are.same({ { "ok" } }, query(db, "PRAGMA integrity_check"))
    local n = tonumber(query(db, [[SELECT (SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL)
      + (SELECT count(*) FROM CUPTI_ACTIVITY_KIND_RUNTIME)]])[1][1])
    assert.is_true(n > 0, "no committed rows")
    assert.are.same({ { "0" } }, query(db, "SELECT value FROM CUPTIMON_META WHERE name = 'complete'"))
    local rc2, py = helpers.sh(("python3 -c \"import sqlite3; print(sqlite3.connect('%s')"
      .. ".execute('PRAGMA integrity_check').fetchone()[0])\""):format(db))
    if rc2 == 127 then
      pending("python3 is not installed (sqlite.lua's own checks above ran)")
      return
    end
    assert.are.same({ 0, "ok\n" }, { rc2, py })
  end)
end)

describe("sqlite.lua on a capture recorded with a narrower selection", function()
  -- spec/fixtures/pm_fake.cmcap: the fake CUDA app under gpu_util.lua, whose kernel selection is
  -- four fields; its PM samples are whole.
  it("writes the PM samples, counts the kernels it could not write, says so and exits 3", function()
    local rc, out, db = export("--replay " .. root .. "/spec/fixtures/pm_fake.cmcap")
    assert.are.equal(3, rc, out)
    assert.matches("0 nvtx, 200 pm%)", out)
    assert.matches("sqlite.lua: LOST 40 records not written to [^\n]* %(concurrent_kernel 40%): their "
      .. "batches lack fields the tables need", out)
    assert.are.same({ { "concurrent_kernel", "40" } }, query(db, "SELECT kind, records FROM CUPTIMON_UNWRITTEN"))
    assert.are.same({ { "200", "5" } }, query(db, [[SELECT count(*), count(DISTINCT s.value)
      FROM CUPTIMON_PM_SAMPLES p JOIN StringIds s ON s.id = p.metricId]]))
    assert.are.same({ { "ok" } }, query(db, "PRAGMA integrity_check"))
  end)
end)

-- A new wire_gen capture NAME made with the options OPTS; returns its path.
local function wire_capture(name, opts)
  assert.is_truthy(wire_gen, "CUPTIMON_WIRE_GEN is not set (run through ctest)")
  local cap = fresh(name)
  local rc, out = helpers.sh(("%s capture %s %s"):format(wire_gen, cap, opts))
  assert.are.equal(0, rc, out)
  return cap
end

describe("sqlite.lua on synthetic captures (wire_gen)", function()
  it("stores names with quotes, NULs and invalid UTF-8 as data, never as SQL", function()
    local cap = wire_capture("hostile.cmcap", "--records 300 --kinds kernel,runtime,marker --hostile-names")
    local rc, out, db = export("--replay " .. cap)
    assert.are.equal(0, rc, out)
    local values = {}
    for _, r in ipairs(query(db, "SELECT value FROM StringIds WHERE id <= 3 ORDER BY id")) do
      values[#values + 1] = r[1]
    end
    -- The monitor replaces invalid UTF-8 and control characters (the NUL too) with U+FFFD before
    -- any string reaches a script (engine/host/text.c), so the database holds that text; the
    -- quotes and the SQL in the first name are data.
    assert.are.same({ "k'\"; DROP TABLE StringIds; --", "nul\239\191\189inside",
      "bad\239\191\189\239\191\189utf8\239\191\189" }, values)
    assert.are.same({}, query(db, "SELECT id, bytes FROM CUPTIMON_STRINGS_RAW"))
    assert.are.same({ { "300" } }, query(db, [[SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL k
      JOIN StringIds s ON s.id = k.demangledName]]))
    assert.are.same({ { "ok" } }, query(db, "PRAGMA integrity_check"))
    local names = query(db, "SELECT value FROM StringIds")
    local rc2, py = helpers.sh(("python3 -c \"import sqlite3; c = sqlite3.connect('%s'); "
      .. "v = [r[0] for r in c.execute('SELECT value FROM StringIds')]; "
      .. "print(len(v), v[1] == 'nul' + chr(0xfffd) + 'inside', len(c.execute('SELECT text FROM NVTX_EVENTS').fetchall()))\"")
      :format(db))
    if rc2 == 127 then
      pending("python3 is not installed (sqlite.lua's own checks above ran)")
      return
    end
    assert.are.equal(0, rc2, py)
    assert.matches("^" .. #names .. " True %d+\n$", py)
  end)

  it("puts each field in its column, mapped as the header says (wire_gen: field = record index)", function()
    -- wire_gen: record i has start = 1700000000000000000 + pid * 1000 + i * 1000, stop = start +
    -- 500 + (i % 7) * 100, bytes = 1024 << (i % 5), copy_kind = 1 + i % 2, stream = i % 2, cbid
    -- 211, 31, 13 in turn, and every other field i (so correlationId = i).
    local cap = wire_capture("map.cmcap",
      "--records 300 --pid 601 --kinds kernel,runtime,memcpy,memset,synchronization")
    local rc, out, db = export("--replay " .. cap)
    assert.are.equal(0, rc, out)
    local function all(sql) assert.are.same({ { "300" } }, query(db, sql), sql) end
    all([[SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL WHERE start = 1700000000000601000
      + correlationId * 1000 AND end = start + 500 + (correlationId % 7) * 100
      AND gridX = correlationId AND gridY = correlationId AND gridZ = correlationId
      AND blockX = correlationId AND blockY = correlationId AND blockZ = correlationId
      AND registersPerThread = correlationId AND deviceId = correlationId
      AND contextId = correlationId AND streamId = correlationId % 2
      AND launchType = correlationId % 256 + 1 AND cacheConfig = (correlationId % 256) / 16
      AND staticSharedMemory = correlationId AND dynamicSharedMemory = correlationId
      AND localMemoryPerThread = correlationId AND localMemoryTotal = correlationId
      AND gridId = correlationId AND sharedMemoryExecuted = correlationId
      AND graphNodeId = correlationId AND sharedMemoryLimitConfig = correlationId
      AND graphId = correlationId AND clusterX = correlationId AND clusterY = correlationId
      AND clusterZ = correlationId AND clusterSchedulingPolicy = correlationId
      AND maxPotentialClusterSize = correlationId AND maxActiveClusters = correlationId
      AND globalPid = 601 * 0x1000000 AND greenContextId IS NULL]])
    all([[SELECT count(*) FROM CUPTI_ACTIVITY_KIND_RUNTIME WHERE returnValue = correlationId
      AND start = 1700000000000601000 + correlationId * 1000 AND eventClass = 0
      AND globalTid / 0x1000000 % 0x1000000 = 601]])
    assert.are.same({ { "cudaLaunch", "100" }, { "cudaLaunchKernel", "100" }, { "cudaMemcpy", "100" } },
      query(db, [[SELECT s.value, count(*) FROM CUPTI_ACTIVITY_KIND_RUNTIME r JOIN StringIds s
        ON s.id = r.nameId GROUP BY 1 ORDER BY 1]]))
    all([[SELECT count(*) FROM CUPTI_ACTIVITY_KIND_MEMCPY WHERE bytes = 1024 << (correlationId % 5)
      AND copyKind = 1 + correlationId % 2 AND dstKind = srcKind AND copyCount = correlationId
      AND srcKind = CASE WHEN correlationId % 256 BETWEEN 1 AND 7 THEN correlationId % 256 - 1 ELSE 7 END
      AND deviceId = correlationId AND graphNodeId = correlationId]])
    all([[SELECT count(*) FROM CUPTI_ACTIVITY_KIND_MEMSET WHERE value = correlationId
      AND bytes = 1024 << (correlationId % 5) AND graphNodeId = correlationId
      AND memKind = CASE WHEN correlationId BETWEEN 1 AND 7 THEN correlationId - 1 ELSE 7 END]])
    -- A synchronization's device is that of the kernels, copies and memsets of its context.
    all([[SELECT count(*) FROM CUPTI_ACTIVITY_KIND_SYNCHRONIZATION WHERE syncType = correlationId
      AND eventId = correlationId AND contextId = correlationId AND deviceId = correlationId]])
  end)

  it("gives processes of different hosts different globalPids (the host's index in bits 56 up)", function()
    local cap = wire_capture("other_host.cmcap", "--records 200 --kinds kernel --pid 601")
    -- Both processes have pid 601: the demo's on host "vm", wire_gen's on "testhost".
    local rc, out, db = export("--replay " .. demo .. " --replay " .. cap)
    assert.are.equal(0, rc, out)
    assert.are.same({ { "0", "601", "300" }, { "1", "601", "200" } }, query(db, [[SELECT p.globalPid >> 56,
      p.globalPid / 0x1000000 % 0x1000000, count(*) FROM PROCESSES p JOIN CUPTI_ACTIVITY_KIND_KERNEL k
      ON k.globalPid = p.globalPid GROUP BY p.globalPid ORDER BY 1]]))
    assert.are.same({ { "vm" }, { "testhost" } }, query(db,
      "SELECT host FROM CUPTIMON_PROCESSES ORDER BY globalPid"))
  end)

  it("keeps its memory bounded: twice the rows, the same peak resident set", function()
    if os.getenv("CUPTIMON_SKIP_RSS_CHECK") then
      pending("a sanitizer's allocator keeps freed memory in quarantine: the resident set says nothing")
      return
    end
    -- Past the first 400,000 rows SQLite's page cache (16 MiB) is full, so the peak must stay
    -- while the database grows by another 26 MB: a cost per row would show here. Each size runs
    -- twice and keeps its smaller peak. Under CPU load a run's peak is now and then 8 to 10 MB
    -- higher than the others' (a rare run of the larger size on a 2-core machine; the cause, in a
    -- single-threaded replay, is not known): a cost per row shows in
    -- every run, such a spike in one.
    local peak, size = {}, {}
    for _, n in ipairs { 100000, 200000 } do
      local cap = wire_capture(n .. ".cmcap",
        ("--records %d --kinds kernel,runtime,memcpy,memset --small-ids"):format(n))
      local least
      for _ = 1, 2 do
        local db = fresh(n .. ".sqlite")
        local rc, out = helpers.sh(("%s --replay %s %s/spec/fixtures/sqlite_hwm.lua -o %s")
          :format(bin, cap, root, db))
        assert.are.equal(0, rc, out)
        assert.matches("wrote [^\n]*: " .. 4 * n .. " rows", out)
        local kb = tonumber(out:match("VmHWM kB=(%d+)"))
        least = math.min(least or kb, kb)
        size[#peak + 1] = uv.fs_stat(db).size
        os.remove(db)
      end
      peak[#peak + 1] = least
      os.remove(cap)
    end
    assert.is_true(size[2] - size[1] > 20e6, "the database grew by " .. size[2] - size[1])
    assert.is_true(peak[2] - peak[1] < 8192, ("peak resident set %d kB then %d kB"):format(peak[1], peak[2]))
  end)

  it("writes a lost batch into CUPTIMON_LOSS and exits 3", function()
    local cap = wire_capture("lossy.cmcap", "--records 3000 --kinds kernel --drop-batch 2")
    local rc, out, db = export("--replay " .. cap)
    assert.are.equal(3, rc, out)
    assert.matches("cuptimon%-lua: LOST 1000 of 3000 records", out)
    assert.matches("2000 kernel,[^\n]* 1000 records lost", out)
    assert.are.same({ { "2000", "3000", "1000", "1000", "0" } }, query(db,
      "SELECT received, produced, dropped, lost_wire, incomplete FROM CUPTIMON_LOSS"))
    assert.are.same({ { "2000" } }, query(db, "SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL"))
  end)
end)
