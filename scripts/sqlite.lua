-- sqlite.lua: the run as an SQLite database in Nsight Systems' export schema, so SQL written for
-- `nsys export --type sqlite` (kernel summaries, API-to-kernel joins, NVTX projections, pandas'
-- read_sql notebooks) runs on it unchanged.
--
-- Usage: cuptimon-lua scripts/sqlite.lua -o run.sqlite [--force] -- cmd args...
--        cuptimon-lua --attach PID scripts/sqlite.lua -o run.sqlite
--        cuptimon-lua --replay run.cmcap scripts/sqlite.lua -o run.sqlite
--
-- Arguments:
--   --output PATH, -o PATH   the database to create (required); an existing file (or a leftover
--                            PATH-journal, -wal or -shm) is refused unless --force, and a
--                            symbolic link is refused always
--   --force                  replace an existing regular file
--   --txn-rows N             rows per transaction (default 200000)
--   --commit-ms MS           also commit every MS milliseconds, so a kill loses at most that much
--                            of a live run (default 1000)
--   --driver                 also write CUDA driver API calls (eventClass 1 in _RUNTIME)
--
-- Tables, as nsys writes them (Nsight Systems' "SQLite Export Schema Reference"):
--   StringIds (id, value); CUPTI_ACTIVITY_KIND_KERNEL, _RUNTIME, _MEMCPY, _MEMSET and
--   _SYNCHRONIZATION; NVTX_EVENTS; PROCESSES (globalPid, pid, name), ThreadNames and
--   TARGET_INFO_GPU; the ENUM_* tables their columns refer to (ENUM_NSYS_EVENT_TYPE,
--   ENUM_NSYS_EVENT_CLASS, ENUM_CUDA_MEMCPY_OPER, ENUM_CUDA_MEM_KIND, ENUM_CUPTI_SYNC_TYPE,
--   ENUM_CUDA_KERNEL_LAUNCH_TYPE, ENUM_CUDA_FUNC_CACHE_CONFIG, ENUM_CUDA_SHARED_MEM_LIMIT_CONFIG).
-- Identifiers are encoded as nsys encodes them: globalPid = pid * 0x1000000 (plus the host's
-- index, from 0, times 2^56 when a replay merges several hosts), globalTid = globalPid + TID, so
-- `globalTid / 0x1000000 % 0x1000000` is the pid. CUPTI's 32-bit thread id is not the OS thread
-- id and does not fit in 24 bits (3446751232 in the demo), so TID is the thread's number in its
-- process (1, 2, ... in order of first appearance); CUPTIMON_THREADS maps it back to CUPTI's id,
-- and its ThreadNames row is named "cupti thread ID".
-- Kernel names: demangledName is the demangled signature, shortName the base name (no
-- namespace, template arguments or parameters: "vectorized_elementwise_kernel"), mangledName
-- the name CUPTI reported. Runtime nameId is the function name without CUPTI's version suffix
-- ("cudaLaunchKernel"); --driver adds driver calls, named "driver cbid N". NVTX ranges are one
-- row each once closed (eventType 59, push/pop, for a thread's range; 60, start/end, for a
-- process range, with rangeId and endGlobalTid), marks are 34, a named domain is one 75 row;
-- text holds the message (textId stays NULL), domainId numbers the domains of a process (0 is
-- the default domain); a range still open at the end is written with a NULL end. Memory kinds follow nsys's numbering (CUPTI's minus one; CUPTI's
-- "unknown" is 7) and copy kinds CUPTI's, which nsys uses.
-- Columns cuptimon does not have are NULL, as nsys leaves a value it lacks: kernel
-- greenContextId, qmd*; memcpy greenContextId, deprecatedSrcId, src/dst DeviceId and ContextId,
-- migrationCause, virtualAddress; sync deviceId when no kernel, copy or memset of the same
-- context was seen before it; NVTX category, color, payloads and textId; ThreadNames priority;
-- TARGET_INFO_GPU busLocation, isDiscrete, chipName and the columns of a device whose DEVICE
-- record never came (a replay of a capture without it has only id, and the name its HELLO
-- gives).
-- cuptimon's own tables (no nsys table starts with CUPTIMON_): CUPTIMON_META (tool, version,
-- clock, complete: 0 until the run ended cleanly), CUPTIMON_LOSS (per process: received,
-- produced, dropped and where, incomplete), CUPTIMON_PROCESSES (host, exe, ppid, source),
-- CUPTIMON_PROCESS_ARGS and _ENV, CUPTIMON_THREADS, CUPTIMON_PM_SAMPLES (PM sampling's samples,
-- one row per sample and metric, metricId in StringIds, from a capture or run that has them),
-- CUPTIMON_UNWRITTEN (records of batches that lacked fields the tables need, per kind: a capture
-- recorded under a script with a narrower selection; the run then exits 3 with a LOST line),
-- CUPTIMON_STRINGS_RAW (the exact bytes of a name that was not valid UTF-8, for a script host that
-- hands raw names over; cuptimon-lua replaces invalid UTF-8 and control characters with U+FFFD
-- before any string reaches a script, so under it this table stays empty and StringIds and NVTX
-- text hold the cleaned names).
--
-- Rows are written as batches arrive, through prepared statements and bound parameters, in
-- transactions of --txn-rows (rollback journal, synchronous off): memory is one batch, SQLite's
-- page cache (16 MiB) and the caches of names, threads, contexts and devices, whatever the run's
-- length, and a kill leaves a database that SQLite opens with
-- every committed transaction. Indexes (CUPTIMON_IDX_*, on correlationId and NVTX start) are
-- built at the end. A run that lost records writes the loss into CUPTIMON_LOSS and exits 3 (the
-- host's LOST line and status). libsqlite3 (Debian's libsqlite3-0) is loaded at run time; without
-- it the script fails at once with a line naming it.
--
-- Example output (on the demo capture):
--   sqlite.lua: wrote run.sqlite: 1155 rows (300 kernel, 629 runtime, 66 memcpy, 61 memset,
--     64 synchronization, 0 driver, 35 nvtx), 30 strings, 1 process, 0 records lost
-- and then
--   sqlite3 run.sqlite "SELECT s.value, count(*), sum(k.end - k.start) FROM
--     CUPTI_ACTIVITY_KIND_KERNEL k JOIN StringIds s ON s.id = k.shortName GROUP BY 1 ORDER BY 3 DESC"
-- gives
--   cm_demo_matmul|150|2862989
--   cm_demo_sgd_update|60|77920
local cm = require "cuptimon"
local args = require "cuptimon.args"
local cbid = require "cuptimon.cbid"
local sqlite = require "cuptimon.sqlite"
local nvtx = require "cuptimon.nvtx"
local bit = require "bit"
local uv = require "luv"

-- -o is --output (cuptimon.args knows only long options).
local argv = { [0] = arg[0] }
for i = 1, #arg do argv[i] = arg[i] == "-o" and "--output" or arg[i] end
local opts = args.parse(argv, {
  output = { "", "the database to create (required)" },
  force = { false, "replace an existing regular file" },
  txn_rows = { 200000, "rows per transaction", min = 1, integer = true },
  commit_ms = { 1000, "also commit every this many milliseconds (0: only by rows)", min = 0,
    integer = true },
  driver = { false, "also write CUDA driver API calls" },
})
if opts[1] ~= nil then args.usage_error("sqlite.lua: unexpected argument " .. opts[1] .. " (see --help)") end
if opts.output == "" then args.usage_error("sqlite.lua: -o PATH is required (see --help)") end

local function fail(msg) error(args.exit_request(1, "sqlite.lua: " .. msg), 0) end

---------------------------------------------------------------------------------------------------
-- the schema

local SCHEMA = [[
CREATE TABLE StringIds (id INTEGER NOT NULL PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE ENUM_NSYS_EVENT_TYPE (id INTEGER NOT NULL PRIMARY KEY, name TEXT NOT NULL, label TEXT NOT NULL);
CREATE TABLE ENUM_NSYS_EVENT_CLASS (id INTEGER NOT NULL PRIMARY KEY, name TEXT NOT NULL, label TEXT NOT NULL);
CREATE TABLE ENUM_CUDA_MEMCPY_OPER (id INTEGER NOT NULL PRIMARY KEY, name TEXT NOT NULL, label TEXT NOT NULL);
CREATE TABLE ENUM_CUDA_MEM_KIND (id INTEGER NOT NULL PRIMARY KEY, name TEXT NOT NULL, label TEXT NOT NULL);
CREATE TABLE ENUM_CUPTI_SYNC_TYPE (id INTEGER NOT NULL PRIMARY KEY, name TEXT NOT NULL, label TEXT NOT NULL);
CREATE TABLE ENUM_CUDA_KERNEL_LAUNCH_TYPE (id INTEGER NOT NULL PRIMARY KEY, name TEXT NOT NULL, label TEXT NOT NULL);
CREATE TABLE ENUM_CUDA_FUNC_CACHE_CONFIG (id INTEGER NOT NULL PRIMARY KEY, name TEXT NOT NULL, label TEXT NOT NULL);
CREATE TABLE ENUM_CUDA_SHARED_MEM_LIMIT_CONFIG (id INTEGER NOT NULL PRIMARY KEY, name TEXT NOT NULL, label TEXT NOT NULL);
CREATE TABLE CUPTI_ACTIVITY_KIND_KERNEL (
  start INTEGER NOT NULL, end INTEGER NOT NULL, deviceId INTEGER NOT NULL,
  contextId INTEGER NOT NULL, greenContextId INTEGER, streamId INTEGER NOT NULL,
  correlationId INTEGER, globalPid INTEGER,
  demangledName INTEGER NOT NULL REFERENCES StringIds(id),
  shortName INTEGER NOT NULL REFERENCES StringIds(id), mangledName INTEGER REFERENCES StringIds(id),
  launchType INTEGER REFERENCES ENUM_CUDA_KERNEL_LAUNCH_TYPE(id),
  cacheConfig INTEGER REFERENCES ENUM_CUDA_FUNC_CACHE_CONFIG(id),
  registersPerThread INTEGER NOT NULL, gridX INTEGER NOT NULL, gridY INTEGER NOT NULL,
  gridZ INTEGER NOT NULL, blockX INTEGER NOT NULL, blockY INTEGER NOT NULL, blockZ INTEGER NOT NULL,
  staticSharedMemory INTEGER NOT NULL, dynamicSharedMemory INTEGER NOT NULL,
  localMemoryPerThread INTEGER NOT NULL, localMemoryTotal INTEGER NOT NULL, gridId INTEGER NOT NULL,
  sharedMemoryExecuted INTEGER, graphNodeId INTEGER,
  sharedMemoryLimitConfig INTEGER REFERENCES ENUM_CUDA_SHARED_MEM_LIMIT_CONFIG(id),
  qmdBulkReleaseDone INTEGER, qmdPreexitDone INTEGER, qmdLastCtaDone INTEGER, graphId INTEGER,
  clusterX INTEGER, clusterY INTEGER, clusterZ INTEGER, clusterSchedulingPolicy INTEGER,
  maxPotentialClusterSize INTEGER, maxActiveClusters INTEGER);
CREATE TABLE CUPTI_ACTIVITY_KIND_RUNTIME (
  start INTEGER NOT NULL, end INTEGER NOT NULL,
  eventClass INTEGER NOT NULL REFERENCES ENUM_NSYS_EVENT_CLASS(id), globalTid INTEGER,
  correlationId INTEGER, nameId INTEGER NOT NULL REFERENCES StringIds(id),
  returnValue INTEGER NOT NULL, callchainId INTEGER);
CREATE TABLE CUPTI_ACTIVITY_KIND_MEMCPY (
  start INTEGER NOT NULL, end INTEGER NOT NULL, deviceId INTEGER NOT NULL,
  contextId INTEGER NOT NULL, greenContextId INTEGER, streamId INTEGER NOT NULL,
  correlationId INTEGER, globalPid INTEGER, bytes INTEGER NOT NULL,
  copyKind INTEGER NOT NULL REFERENCES ENUM_CUDA_MEMCPY_OPER(id), deprecatedSrcId INTEGER,
  srcKind INTEGER REFERENCES ENUM_CUDA_MEM_KIND(id), dstKind INTEGER REFERENCES ENUM_CUDA_MEM_KIND(id),
  srcDeviceId INTEGER, srcContextId INTEGER, dstDeviceId INTEGER, dstContextId INTEGER,
  migrationCause INTEGER, graphNodeId INTEGER, virtualAddress INTEGER, copyCount INTEGER);
CREATE TABLE CUPTI_ACTIVITY_KIND_MEMSET (
  start INTEGER NOT NULL, end INTEGER NOT NULL, deviceId INTEGER NOT NULL,
  contextId INTEGER NOT NULL, greenContextId INTEGER, streamId INTEGER NOT NULL,
  correlationId INTEGER, globalPid INTEGER, value INTEGER NOT NULL, bytes INTEGER NOT NULL,
  graphNodeId INTEGER, memKind INTEGER REFERENCES ENUM_CUDA_MEM_KIND(id));
CREATE TABLE CUPTI_ACTIVITY_KIND_SYNCHRONIZATION (
  start INTEGER NOT NULL, end INTEGER NOT NULL, deviceId INTEGER, contextId INTEGER NOT NULL,
  greenContextId INTEGER, streamId INTEGER NOT NULL, correlationId INTEGER, globalPid INTEGER,
  syncType INTEGER NOT NULL REFERENCES ENUM_CUPTI_SYNC_TYPE(id), eventId INTEGER NOT NULL);
CREATE TABLE NVTX_EVENTS (
  start INTEGER NOT NULL, end INTEGER, eventType INTEGER NOT NULL REFERENCES ENUM_NSYS_EVENT_TYPE(id),
  rangeId INTEGER, category INTEGER, color INTEGER, text TEXT, globalTid INTEGER,
  endGlobalTid INTEGER, textId INTEGER REFERENCES StringIds(id), domainId INTEGER,
  uint64Value INTEGER, int64Value INTEGER, doubleValue REAL, uint32Value INTEGER,
  int32Value INTEGER, floatValue REAL, jsonTextId INTEGER, jsonText TEXT, binaryData TEXT);
CREATE TABLE PROCESSES (globalPid INTEGER, pid INTEGER, name TEXT);
CREATE TABLE ThreadNames (nameId INTEGER NOT NULL REFERENCES StringIds(id), priority INTEGER,
  globalTid INTEGER);
CREATE TABLE TARGET_INFO_GPU (
  vmId INTEGER NOT NULL, id INTEGER NOT NULL, name TEXT, busLocation TEXT, isDiscrete INTEGER,
  l2CacheSize INTEGER, totalMemory INTEGER, memoryBandwidth INTEGER, clockRate INTEGER,
  smCount INTEGER, uuid TEXT, chipName TEXT, computeMajor INTEGER, computeMinor INTEGER,
  maxThreadsPerBlock INTEGER, maxBlockDimX INTEGER, maxBlockDimY INTEGER, maxBlockDimZ INTEGER,
  maxGridDimX INTEGER, maxGridDimY INTEGER, maxGridDimZ INTEGER, maxRegistersPerBlock INTEGER,
  maxShmemPerBlock INTEGER, threadsPerWarp INTEGER, asyncEngines INTEGER, maxWarpsPerSm INTEGER,
  maxBlocksPerSm INTEGER, maxRegistersPerSm INTEGER, maxShmemPerSm INTEGER);
CREATE TABLE CUPTIMON_META (name TEXT NOT NULL PRIMARY KEY, value TEXT);
CREATE TABLE CUPTIMON_PROCESSES (globalPid INTEGER NOT NULL, pid INTEGER NOT NULL, ppid INTEGER,
  host TEXT, exe TEXT, source INTEGER, kind TEXT);
CREATE TABLE CUPTIMON_PROCESS_ARGS (globalPid INTEGER NOT NULL, position INTEGER NOT NULL,
  value TEXT);
CREATE TABLE CUPTIMON_PROCESS_ENV (globalPid INTEGER NOT NULL, name TEXT NOT NULL, value TEXT);
CREATE TABLE CUPTIMON_THREADS (globalTid INTEGER NOT NULL, globalPid INTEGER NOT NULL,
  cuptiThreadId INTEGER NOT NULL);
CREATE TABLE CUPTIMON_STRINGS_RAW (id INTEGER NOT NULL PRIMARY KEY REFERENCES StringIds(id),
  bytes BLOB NOT NULL);
CREATE TABLE CUPTIMON_PM_SAMPLES (globalPid INTEGER NOT NULL, deviceId INTEGER NOT NULL,
  start INTEGER NOT NULL, end INTEGER NOT NULL, metricId INTEGER NOT NULL REFERENCES StringIds(id),
  sample INTEGER NOT NULL, value REAL);
CREATE TABLE CUPTIMON_UNWRITTEN (kind TEXT NOT NULL, records INTEGER NOT NULL, reason TEXT);
CREATE TABLE CUPTIMON_LOSS (globalPid INTEGER, pid INTEGER, status TEXT, received INTEGER,
  produced INTEGER, dropped INTEGER, dropped_cupti INTEGER, dropped_agent INTEGER,
  dropped_exit INTEGER, lost_wire INTEGER, lost_frames INTEGER, incomplete INTEGER,
  last_number INTEGER);
]]

local INDEXES = [[
CREATE INDEX CUPTIMON_IDX_KERNEL_CORR ON CUPTI_ACTIVITY_KIND_KERNEL (correlationId);
CREATE INDEX CUPTIMON_IDX_RUNTIME_CORR ON CUPTI_ACTIVITY_KIND_RUNTIME (correlationId);
CREATE INDEX CUPTIMON_IDX_MEMCPY_CORR ON CUPTI_ACTIVITY_KIND_MEMCPY (correlationId);
CREATE INDEX CUPTIMON_IDX_MEMSET_CORR ON CUPTI_ACTIVITY_KIND_MEMSET (correlationId);
CREATE INDEX CUPTIMON_IDX_NVTX_START ON NVTX_EVENTS (start);
]]

-- The ENUM_* rows: { table, { id, name, label }, ... }.
local ENUMS = {
  { "ENUM_NSYS_EVENT_TYPE", { 34, "NvtxMark", "NvtxMark" },
    { 59, "NvtxPushPopRange", "NvtxPushPopRange" }, { 60, "NvtxStartEndRange", "NvtxStartEndRange" },
    { 75, "NvtxDomainCreate", "NvtxDomainCreate" } },
  { "ENUM_NSYS_EVENT_CLASS", { 0, "TRACE_PROCESS_EVENT_CUDA_RUNTIME", "CUDA runtime" },
    { 1, "TRACE_PROCESS_EVENT_CUDA_DRIVER", "CUDA driver" } },
  { "ENUM_CUDA_MEMCPY_OPER", { 0, "CUDA_MEMCPY_KIND_UNKNOWN", "Unknown" },
    { 1, "CUDA_MEMCPY_KIND_HTOD", "Host-to-Device" }, { 2, "CUDA_MEMCPY_KIND_DTOH", "Device-to-Host" },
    { 3, "CUDA_MEMCPY_KIND_HTOA", "Host-to-Array" }, { 4, "CUDA_MEMCPY_KIND_ATOH", "Array-to-Host" },
    { 5, "CUDA_MEMCPY_KIND_ATOA", "Array-to-Array" }, { 6, "CUDA_MEMCPY_KIND_ATOD", "Array-to-Device" },
    { 7, "CUDA_MEMCPY_KIND_DTOA", "Device-to-Array" }, { 8, "CUDA_MEMCPY_KIND_DTOD", "Device-to-Device" },
    { 9, "CUDA_MEMCPY_KIND_HTOH", "Host-to-Host" }, { 10, "CUDA_MEMCPY_KIND_PTOP", "Peer-to-Peer" },
    { 11, "CUDA_MEMCPY_KIND_UVM_HTOD", "Unified Host-to-Device" },
    { 12, "CUDA_MEMCPY_KIND_UVM_DTOH", "Unified Device-to-Host" },
    { 13, "CUDA_MEMCPY_KIND_UVM_DTOD", "Unified Device-to-Device" } },
  { "ENUM_CUDA_MEM_KIND", { 0, "CUDA_MEMOPR_MEMORY_KIND_PAGEABLE", "Pageable" },
    { 1, "CUDA_MEMOPR_MEMORY_KIND_PINNED", "Pinned" }, { 2, "CUDA_MEMOPR_MEMORY_KIND_DEVICE", "Device" },
    { 3, "CUDA_MEMOPR_MEMORY_KIND_ARRAY", "Array" }, { 4, "CUDA_MEMOPR_MEMORY_KIND_MANAGED", "Managed" },
    { 5, "CUDA_MEMOPR_MEMORY_KIND_DEVICE_STATIC", "Device Static" },
    { 6, "CUDA_MEMOPR_MEMORY_KIND_MANAGED_STATIC", "Managed Static" },
    { 7, "CUDA_MEMOPR_MEMORY_KIND_UNKNOWN", "Unknown" } },
  { "ENUM_CUPTI_SYNC_TYPE", { 0, "CUPTI_ACTIVITY_SYNCHRONIZATION_TYPE_UNKNOWN", "Unknown" },
    { 1, "CUPTI_ACTIVITY_SYNCHRONIZATION_TYPE_EVENT_SYNCHRONIZE", "Event sync" },
    { 2, "CUPTI_ACTIVITY_SYNCHRONIZATION_TYPE_STREAM_WAIT_EVENT", "Stream wait event" },
    { 3, "CUPTI_ACTIVITY_SYNCHRONIZATION_TYPE_STREAM_SYNCHRONIZE", "Stream sync" },
    { 4, "CUPTI_ACTIVITY_SYNCHRONIZATION_TYPE_CONTEXT_SYNCHRONIZE", "Context sync" } },
  { "ENUM_CUDA_KERNEL_LAUNCH_TYPE", { 0, "CUDA_KERNEL_LAUNCH_TYPE_UNKNOWN", "Unknown" },
    { 1, "CUDA_KERNEL_LAUNCH_TYPE_REGULAR", "Regular" },
    { 2, "CUDA_KERNEL_LAUNCH_TYPE_COOPERATIVE_SINGLE_DEVICE", "Coop Single Device" },
    { 3, "CUDA_KERNEL_LAUNCH_TYPE_COOPERATIVE_MULTI_DEVICE", "Coop Multi Device" },
    { 4, "CUDA_KERNEL_LAUNCH_TYPE_CBL_COMMANDLIST", "Command list" } },
  { "ENUM_CUDA_FUNC_CACHE_CONFIG", { 0, "CU_FUNC_CACHE_PREFER_NONE", "None" },
    { 1, "CU_FUNC_CACHE_PREFER_SHARED", "Shared" }, { 2, "CU_FUNC_CACHE_PREFER_L1", "L1" },
    { 3, "CU_FUNC_CACHE_PREFER_EQUAL", "Equal" } },
  { "ENUM_CUDA_SHARED_MEM_LIMIT_CONFIG", { 0, "CUDA_SHARED_MEM_LIMIT_DEFAULT", "Default" },
    { 1, "CUDA_SHARED_MEM_LIMIT_OPTIN", "Opt in" } },
}

---------------------------------------------------------------------------------------------------
-- the output file

-- Refuses PATH (and SQLite's side files, which a new database would otherwise adopt) when it
-- exists, unless --force and it is a regular file; never through a symbolic link. Then creates
-- PATH with O_CREAT|O_EXCL, which fails on any name that appeared meanwhile, links included.
local function create_output(path)
  for _, p in ipairs { path, path .. "-journal", path .. "-wal", path .. "-shm" } do
    local st = uv.fs_lstat(p)
    if st then
      if st.type == "link" then fail(("%s is a symbolic link; refusing to write through it"):format(p)) end
      if not opts.force then fail(("%s exists; use --force to replace it"):format(p)) end
      if st.type ~= "file" then fail(("%s exists and is not a regular file (%s)"):format(p, st.type)) end
      local ok, err = uv.fs_unlink(p)
      if not ok then fail(("cannot remove %s: %s"):format(p, err)) end
    end
  end
  local fd, err = uv.fs_open(path, "wx", 420) -- 0644
  if not fd then fail(("cannot create %s: %s"):format(path, err)) end
  uv.fs_close(fd)
end

local db, lib -- the connection and the loaded library (lib.sqlite3_* in the row loops)
local ins = {} -- prepared INSERT statements by name
local rows = { kernel = 0, runtime = 0, driver = 0, memcpy = 0, memset = 0, synchronization = 0,
  nvtx = 0, pm = 0 }
local txn_rows = 0
local DONE = 101

local function must(ok, err) if not ok then fail(err) end return ok end

local function prepare(name, sql) ins[name] = must(db:prepare(sql)) end

-- The activity tables take many rows per statement: one sqlite3_step for 128 rows costs a
-- third less CPU per row than one row per step (2 M fake-CUPTI rows; 1, 32, 64, 128 and 256 rows
-- per statement tried, 128 the fastest). A batch's rows go 128 at a time, then 16 at a time,
-- then one by one: writers[name] = { ncol =, name =, h = { statement per MULTI entry } }.
local MULTI = { 128, 16, 1 }
local writers = {}
local function writer(name, head, ncol)
  local one = "(" .. ("?, "):rep(ncol - 1) .. "?)"
  local w = { ncol = ncol, name = name, h = {} }
  for k, n in ipairs(MULTI) do
    local many = {}
    for i = 1, n do many[i] = one end
    w.h[k] = must(db:prepare(head .. table.concat(many, ", "))).h
  end
  writers[name] = w
end

if not cm.checking() then
  local err
  lib, err = sqlite.library()
  if not lib then fail(err) end
  create_output(opts.output)
  db = must(sqlite.open(opts.output, false))
  -- A rollback journal (not WAL) keeps the result one file; synchronous off because durability
  -- against power loss is not the point, while a killed process still leaves every committed
  -- transaction (the OS has the writes) and a hot journal that rolls the rest back.
  -- A reader of the database during the run holds a shared lock that a commit waits for (up to
  -- 10 s) instead of failing.
  must(db:exec("PRAGMA journal_mode = DELETE; PRAGMA synchronous = OFF; PRAGMA cache_size = -16384; "
    .. "PRAGMA busy_timeout = 10000"))
  must(db:exec("BEGIN; " .. SCHEMA))
  local st = must(db:prepare("INSERT INTO CUPTIMON_META (name, value) VALUES (?, ?)"))
  for _, kv in ipairs { { "tool", "cuptimon " .. cm.version }, { "sqlite", sqlite.version() },
      { "schema", "Nsight Systems SQLite export (subset); see scripts/sqlite.lua" },
      { "clock", "CLOCK_REALTIME ns" }, { "created_utc", os.date("!%Y-%m-%dT%H:%M:%SZ") },
      { "complete", "0" } } do
    st:text(1, kv[1]); st:text(2, kv[2]); st:insert()
  end
  for _, e in ipairs(ENUMS) do
    -- The table names are constants of this file, never data.
    local es = must(db:prepare(("INSERT INTO %s (id, name, label) VALUES (?, ?, ?)"):format(e[1])))
    for i = 2, #e do es:int(1, e[i][1]); es:text(2, e[i][2]); es:text(3, e[i][3]); es:insert() end
  end
  must(db:exec("COMMIT; BEGIN"))
  prepare("string", "INSERT INTO StringIds (id, value) VALUES (?, ?)")
  prepare("raw", "INSERT INTO CUPTIMON_STRINGS_RAW (id, bytes) VALUES (?, ?)")
  writer("kernel", [[INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL (start, end, deviceId, contextId,
    streamId, correlationId, globalPid, demangledName, shortName, mangledName, launchType,
    cacheConfig, registersPerThread, gridX, gridY, gridZ, blockX, blockY, blockZ,
    staticSharedMemory, dynamicSharedMemory, localMemoryPerThread, localMemoryTotal, gridId,
    sharedMemoryExecuted, graphNodeId, sharedMemoryLimitConfig, graphId, clusterX, clusterY,
    clusterZ, clusterSchedulingPolicy, maxPotentialClusterSize, maxActiveClusters) VALUES ]], 34)
  writer("runtime", [[INSERT INTO CUPTI_ACTIVITY_KIND_RUNTIME (start, end, eventClass, globalTid,
    correlationId, nameId, returnValue) VALUES ]], 7)
  writer("memcpy", [[INSERT INTO CUPTI_ACTIVITY_KIND_MEMCPY (start, end, deviceId, contextId,
    streamId, correlationId, globalPid, bytes, copyKind, srcKind, dstKind, graphNodeId, copyCount)
    VALUES ]], 13)
  writer("memset", [[INSERT INTO CUPTI_ACTIVITY_KIND_MEMSET (start, end, deviceId, contextId,
    streamId, correlationId, globalPid, value, bytes, graphNodeId, memKind) VALUES ]], 11)
  writer("synchronization", [[INSERT INTO CUPTI_ACTIVITY_KIND_SYNCHRONIZATION (start, end,
    deviceId, contextId, streamId, correlationId, globalPid, syncType, eventId) VALUES ]], 9)
  prepare("nvtx", [[INSERT INTO NVTX_EVENTS (start, end, eventType, rangeId, text, globalTid,
    endGlobalTid, domainId) VALUES (?, ?, ?, ?, ?, ?, ?, ?)]])
  prepare("pm", [[INSERT INTO CUPTIMON_PM_SAMPLES (globalPid, deviceId, start, end, metricId,
    sample, value) VALUES (?, ?, ?, ?, ?, ?, ?)]])
  prepare("process", "INSERT INTO PROCESSES (globalPid, pid, name) VALUES (?, ?, ?)")
  prepare("cm_process", [[INSERT INTO CUPTIMON_PROCESSES (globalPid, pid, ppid, host, exe, source,
    kind) VALUES (?, ?, ?, ?, ?, ?, ?)]])
  prepare("arg", "INSERT INTO CUPTIMON_PROCESS_ARGS (globalPid, position, value) VALUES (?, ?, ?)")
  prepare("env", "INSERT INTO CUPTIMON_PROCESS_ENV (globalPid, name, value) VALUES (?, ?, ?)")
  prepare("thread", "INSERT INTO ThreadNames (nameId, priority, globalTid) VALUES (?, NULL, ?)")
  prepare("cm_thread", [[INSERT INTO CUPTIMON_THREADS (globalTid, globalPid, cuptiThreadId)
    VALUES (?, ?, ?)]])
end

-- A write that fails (a full disk, a file-size limit) ends the writing, not the run: the first
-- failure is reported with SQLite's and the system's reason (and fails the run), the open
-- transaction is rolled back, so its rows move from `rows` to `lost`, and every later batch is
-- counted in `lost` unwritten. The database keeps what was committed, with CUPTIMON_META's
-- complete = 0.
local broken -- the first failure's message, or nil while every write succeeded
local pending = {} -- rows key -> rows of the open transaction (lost if it never commits)
local lost = {} -- rows key or kind name -> records that never reached the database
local WRITE_FAILED = {} -- raised through a batch's row loop once a write failed

local function broke(err)
  if broken then return end
  broken = ("cannot write %s: %s"):format(opts.output, tostring(err))
  cm.report("sqlite.lua", broken)
  for k, n in pairs(pending) do
    rows[k] = rows[k] - n
    lost[k] = (lost[k] or 0) + n
  end
  pending, txn_rows = {}, 0
  db:exec("ROLLBACK") -- SQLite may have rolled back already; nothing else can be done here
end

-- Commits the open transaction and starts the next one.
local function commit()
  if broken then return end
  local ok, err = db:exec("COMMIT")
  if not ok then return broke(err) end
  pending, txn_rows = {}, 0
  ok, err = db:exec("BEGIN")
  if not ok then return broke(err) end
end

local function counted(kind, n)
  rows[kind] = rows[kind] + n
  pending[kind] = (pending[kind] or 0) + n
  txn_rows = txn_rows + n
  if txn_rows >= opts.txn_rows then commit() end
end

-- Steps a bound statement and resets it; a failure ends the writing (broke) and the batch.
local function step(h, what)
  if lib.sqlite3_step(h) ~= DONE then
    local msg = db:errmsg()
    lib.sqlite3_reset(h)
    broke(("writing %s: %s"):format(what, msg))
    error(WRITE_FAILED, 0)
  end
  lib.sqlite3_reset(h)
end

-- Writes rows 0 .. n - 1 through writer w: bind(h, o, i) binds row i to the parameters o + 1 ..
-- o + w.ncol of statement h.
local function write_rows(w, n, bind)
  local nc, i = w.ncol, 0
  for k = 1, #MULTI do
    local per, h = MULTI[k], w.h[k]
    while i + per <= n do
      for j = 0, per - 1 do bind(h, j * nc, i + j) end
      step(h, w.name)
      i = i + per
    end
  end
end

---------------------------------------------------------------------------------------------------
-- strings

local string_ids = {} -- content -> StringIds id
local nstrings = 0

-- The string as valid UTF-8: each byte that does not start or continue a well-formed sequence
-- (overlong forms, surrogates and code points past U+10FFFF included) becomes U+FFFD.
local function utf8_clean(s)
  if not s:find("[\128-\255]") then return s end
  local out, i, n, bad = {}, 1, #s, false
  while i <= n do
    local c = s:byte(i)
    local len, lo, hi = 0, 0x80, 0xBF
    if c < 0x80 then len = 1
    elseif c >= 0xC2 and c <= 0xDF then len = 2
    elseif c >= 0xE0 and c <= 0xEF then
      len = 3
      if c == 0xE0 then lo = 0xA0 elseif c == 0xED then hi = 0x9F end
    elseif c >= 0xF0 and c <= 0xF4 then
      len = 4
      if c == 0xF0 then lo = 0x90 elseif c == 0xF4 then hi = 0x8F end
    end
    local ok = len > 0 and i + len - 1 <= n
    for j = 2, ok and len or 0 do
      local d = s:byte(i + j - 1)
      if j == 2 then ok = ok and d >= lo and d <= hi else ok = ok and d >= 0x80 and d <= 0xBF end
    end
    if ok then
      out[#out + 1] = s:sub(i, i + len - 1)
      i = i + len
    else
      out[#out + 1] = "\239\191\189"
      i = i + 1
      bad = true
    end
  end
  return table.concat(out), bad
end

-- The StringIds id of `s`, inserted on first use (by content, shared by every process).
local function string_id(s)
  local id = string_ids[s]
  if id then return id end
  nstrings = nstrings + 1
  id = nstrings
  string_ids[s] = id
  local clean, bad = utf8_clean(s)
  local st = ins.string
  st:int(1, id); st:text(2, clean); st:insert()
  if bad then
    st = ins.raw
    st:int(1, id); st:blob(2, s); st:insert()
  end
  return id
end

-- A kernel's base name: its short table name without template arguments and namespaces
-- ("at::native::vectorized_elementwise_kernel<4, ...>" becomes "vectorized_elementwise_kernel").
local function base_name(short)
  local s, prev = short, nil
  while s ~= prev do
    prev = s
    s = s:gsub("%b<>", "")
  end
  s = s:match("([^:]*)$") or s
  return s ~= "" and s or short
end

---------------------------------------------------------------------------------------------------
-- processes and threads

local hosts, nhosts = {}, 0 -- host name -> index (from 0)
local procs = {}            -- source id -> per-process state
local nprocs = 0

local function global_pid(host_index, pid)
  if host_index == 0 then return pid * 0x1000000 end
  -- Past 2^53 a Lua number loses bits: an int64 cdata keeps them.
  return bit.lshift(0LL + host_index, 56) + pid * 0x1000000
end

local function basename(path) return (tostring(path or "?"):match("([^/]*)$")) end

-- The state of a batch's source: its globalPid, its threads, its names and contexts.
local function proc_of(source)
  local s = procs[source]
  if s then return s end
  local p = cm.process(source) or {}
  local host = p.host or "?"
  local h = hosts[host]
  if not h then
    h = nhosts
    hosts[host] = h
    nhosts = nhosts + 1
  end
  local pid = p.pid or 0
  s = { source = source, pid = pid, host = h, gpid = global_pid(h, pid), tids = {}, ntids = 0,
    knames = {}, ctxdev = {}, domains = { [""] = 0 }, ndomains = 0, ranges = nvtx.pairing() }
  procs[source] = s
  nprocs = nprocs + 1
  if db then
    local st = ins.process
    st:int(1, s.gpid); st:int(2, pid); st:text(3, basename(p.exe)); st:insert()
    st = ins.cm_process
    st:int(1, s.gpid); st:int(2, pid); st:int(3, p.ppid or 0); st:text(4, host)
    st:text(5, p.exe); st:int(6, source); st:text(7, p.kind); st:insert()
    for i, a in ipairs(p.argv or {}) do
      st = ins.arg
      st:int(1, s.gpid); st:int(2, i - 1); st:text(3, a); st:insert()
    end
    local names = {}
    for k in pairs(p.env or {}) do names[#names + 1] = k end
    table.sort(names)
    for _, k in ipairs(names) do
      st = ins.env
      st:int(1, s.gpid); st:text(2, k); st:text(3, tostring(p.env[k])); st:insert()
    end
  end
  return s
end

cm.on("process_start", function(p) proc_of(p.source) end)

-- The globalTid of CUPTI thread id `raw` of process state s.
local function global_tid(s, raw)
  local g = s.tids[raw]
  if g then return g end
  s.ntids = s.ntids + 1
  g = s.gpid + s.ntids
  s.tids[raw] = g
  local st = ins.thread
  st:int(1, string_id(("cupti thread %d"):format(raw))); st:int(2, g); st:insert()
  st = ins.cm_thread
  st:int(1, g); st:int(2, s.gpid); st:int(3, raw); st:insert()
  return g
end

-- StringIds ids { demangled, short, mangled } of the kernel name of record i.
local function kernel_names(s, b, i, id)
  local k = s.knames[id]
  if k then return k end
  local raw = b:str("name", i)
  if raw == nil then
    local missing = string_id("string " .. id) -- the capture lacks it: "string N", as top.lua says
    return { missing, missing, missing }
  end
  k = { string_id(cm.demangle(raw)), string_id(base_name(b:kernel_name(i))), string_id(raw) }
  s.knames[id] = k
  return k
end

-- A batch that lacks a field an observer selected is not delivered to that observer (a capture
-- recorded with a script's narrower selection, say top.lua's). Such records would be missing
-- from the database without a word: each activity observer is followed by a probe of one field
-- ("start"; a marker's "timestamp", a device's "device") that sees the same batch (same source and seq, delivered
-- after it) and counts the records the full observer did not get. The exit hook writes them to
-- CUPTIMON_UNWRITTEN, prints a LOST line, and the run exits 3.
local unwritten = {} -- kind name -> records not written
local function observe(sel, fn)
  local kname = next(sel)
  local seen = {} -- source -> the seq of the last batch the full observer took
  cm.observe(sel, function(b)
    seen[b.source] = b.seq
    local ok, err = true, nil
    if not broken then ok, err = pcall(fn, b) end
    -- A statement's insert (Stmt:insert, "sqlite: ...") fails as a row loop's step does.
    if not ok and err ~= WRITE_FAILED and not (type(err) == "string" and err:find("^sqlite: ")) then
      error(err, 0)
    end
    if not ok then broke(err ~= WRITE_FAILED and err or "write failed") end
    if broken then lost[b.kind] = (lost[b.kind] or 0) + b.n end
  end)
  local probe = kname == "marker" and "timestamp" or kname == "device" and "device" or "start"
  cm.observe({ [kname] = { probe } }, function(b)
    if seen[b.source] ~= b.seq then unwritten[b.kind] = (unwritten[b.kind] or 0) + b.n end
  end)
end

---------------------------------------------------------------------------------------------------
-- GPUs

local gpus = {} -- host index -> device -> { vmId, id, name, ... } (written at the end: a few rows)

local function gpu(s, device)
  local by_dev = gpus[s.host]
  if not by_dev then
    by_dev = {}
    gpus[s.host] = by_dev
  end
  local g = by_dev[device]
  if not g then
    g = { vmId = s.host, id = device }
    by_dev[device] = g
  end
  return g
end

cm.on("process_start", function(p)
  local s = proc_of(p.source)
  for _, d in ipairs(p.devices or {}) do
    local g = gpu(s, d.index or 0)
    g.name = g.name or d.name
    g.uuid = g.uuid or d.uuid
  end
end)

observe({ device = { "device", "name", "global_mem_bandwidth", "global_mem_size",
  "l2_cache_size", "threads_per_warp", "core_clock_rate", "memcpy_engines", "multiprocessors",
  "max_warps_per_sm", "max_blocks_per_sm", "max_smem_per_sm", "max_regs_per_sm",
  "max_regs_per_block", "max_smem_per_block", "max_threads_per_block", "max_block_x",
  "max_block_y", "max_block_z", "max_grid_x", "max_grid_y", "max_grid_z", "cc_major",
  "cc_minor" } }, function(b)
  local s = proc_of(b.source)
  for i = 0, b.n - 1 do
    local g = gpu(s, tonumber(b.device[i]))
    g.name = b:str("name", i) or g.name
    g.l2CacheSize, g.totalMemory = tonumber(b.l2_cache_size[i]), b.global_mem_size[i]
    g.memoryBandwidth = b.global_mem_bandwidth[i] * 1000        -- CUPTI: KB/s; nsys: B/s
    g.clockRate = tonumber(b.core_clock_rate[i]) * 1000         -- CUPTI: kHz; nsys: Hz
    g.smCount, g.computeMajor = tonumber(b.multiprocessors[i]), tonumber(b.cc_major[i])
    g.computeMinor, g.threadsPerWarp = tonumber(b.cc_minor[i]), tonumber(b.threads_per_warp[i])
    g.maxThreadsPerBlock = tonumber(b.max_threads_per_block[i])
    g.maxBlockDimX, g.maxBlockDimY = tonumber(b.max_block_x[i]), tonumber(b.max_block_y[i])
    g.maxBlockDimZ, g.maxGridDimX = tonumber(b.max_block_z[i]), tonumber(b.max_grid_x[i])
    g.maxGridDimY, g.maxGridDimZ = tonumber(b.max_grid_y[i]), tonumber(b.max_grid_z[i])
    g.maxRegistersPerBlock = tonumber(b.max_regs_per_block[i])
    g.maxShmemPerBlock, g.asyncEngines = tonumber(b.max_smem_per_block[i]), tonumber(b.memcpy_engines[i])
    g.maxWarpsPerSm, g.maxBlocksPerSm = tonumber(b.max_warps_per_sm[i]), tonumber(b.max_blocks_per_sm[i])
    g.maxRegistersPerSm, g.maxShmemPerSm = tonumber(b.max_regs_per_sm[i]), tonumber(b.max_smem_per_sm[i])
  end
end)

local GPU_COLUMNS = { "vmId", "id", "name", "l2CacheSize", "totalMemory", "memoryBandwidth",
  "clockRate", "smCount", "uuid", "computeMajor", "computeMinor", "maxThreadsPerBlock",
  "maxBlockDimX", "maxBlockDimY", "maxBlockDimZ", "maxGridDimX", "maxGridDimY", "maxGridDimZ",
  "maxRegistersPerBlock", "maxShmemPerBlock", "threadsPerWarp", "asyncEngines", "maxWarpsPerSm",
  "maxBlocksPerSm", "maxRegistersPerSm", "maxShmemPerSm" }

local function write_gpus()
  local marks = {}
  for i = 1, #GPU_COLUMNS do marks[i] = "?" end
  local st = must(db:prepare(("INSERT INTO TARGET_INFO_GPU (%s) VALUES (%s)")
    :format(table.concat(GPU_COLUMNS, ", "), table.concat(marks, ", "))))
  local list = {}
  for _, by_dev in pairs(gpus) do
    for _, g in pairs(by_dev) do list[#list + 1] = g end
  end
  table.sort(list, function(a, b)
    if a.vmId ~= b.vmId then return a.vmId < b.vmId end
    return a.id < b.id
  end)
  for _, g in ipairs(list) do
    for i, c in ipairs(GPU_COLUMNS) do
      local v = g[c]
      if type(v) == "string" then st:text(i, v) elseif v == nil then st:null(i) else st:int(i, v) end
    end
    st:insert()
  end
end

---------------------------------------------------------------------------------------------------
-- the activity tables

local MEM_KIND = { [0] = 7, 0, 1, 2, 3, 4, 5, 6 } -- CUPTI's memory kind -> nsys's

-- The binder of the columns kernels, copies and memsets share, in the same places of their
-- tables (start, end, deviceId, contextId, streamId, correlationId, globalPid): it binds row i
-- of batch b (of process state s) to the parameters o + 1 .. o + 7, and notes each device seen
-- (its TARGET_INFO_GPU row) and each context's device (for the synchronization rows).
local function gpu_columns(s, b)
  local L = lib
  local start, stop, dev, ctx, strm, corr = b.start, b.stop, b.device, b.context, b.stream,
    b.correlation
  local gpid, ctxdev = s.gpid, s.ctxdev
  return function(h, o, i)
    local d, c = dev[i], ctx[i]
    if ctxdev[c] ~= d then
      ctxdev[c] = d
      gpu(s, d)
    end
    L.sqlite3_bind_int64(h, o + 1, start[i]); L.sqlite3_bind_int64(h, o + 2, stop[i])
    L.sqlite3_bind_int64(h, o + 3, d); L.sqlite3_bind_int64(h, o + 4, c)
    L.sqlite3_bind_int64(h, o + 5, strm[i]); L.sqlite3_bind_int64(h, o + 6, corr[i])
    L.sqlite3_bind_int64(h, o + 7, gpid)
  end
end

observe({ kernel = { "start", "stop", "device", "context", "stream", "correlation", "name",
  "launch_type", "cache_config", "registers", "grid_x", "grid_y", "grid_z", "block_x", "block_y",
  "block_z", "static_smem", "dynamic_smem", "local_mem_per_thread", "local_mem_total",
  "local_mem_total_v2", "grid_id", "shared_mem_executed", "graph_node", "shmem_limit_config",
  "graph", "cluster_x", "cluster_y", "cluster_z", "cluster_scheduling_policy",
  "max_potential_cluster_size", "max_active_clusters" } }, function(b)
  local s = proc_of(b.source)
  local L = lib
  local common, name = gpu_columns(s, b), b.name
  local lt, cc, reg, gx, gy, gz, bx, by, bz = b.launch_type, b.cache_config, b.registers, b.grid_x,
    b.grid_y, b.grid_z, b.block_x, b.block_y, b.block_z
  local ssm, dsm, lmt, lmtot, lmtot2, gid, sme = b.static_smem, b.dynamic_smem,
    b.local_mem_per_thread, b.local_mem_total, b.local_mem_total_v2, b.grid_id, b.shared_mem_executed
  local gn, slc, gr, cx, cy, cz, csp, mpc, mac = b.graph_node, b.shmem_limit_config, b.graph,
    b.cluster_x, b.cluster_y, b.cluster_z, b.cluster_scheduling_policy,
    b.max_potential_cluster_size, b.max_active_clusters
  local knames = s.knames
  write_rows(writers.kernel, b.n, function(h, o, i)
    common(h, o, i)
    local k = knames[name[i]] or kernel_names(s, b, i, name[i])
    L.sqlite3_bind_int64(h, o + 8, k[1]); L.sqlite3_bind_int64(h, o + 9, k[2])
    L.sqlite3_bind_int64(h, o + 10, k[3])
    L.sqlite3_bind_int64(h, o + 11, lt[i] + 1) -- CUPTI's REGULAR is 0, nsys's 1
    L.sqlite3_bind_int64(h, o + 12, bit.rshift(cc[i], 4)) -- the executed half of CUPTI's byte
    L.sqlite3_bind_int64(h, o + 13, reg[i])
    L.sqlite3_bind_int64(h, o + 14, gx[i]); L.sqlite3_bind_int64(h, o + 15, gy[i])
    L.sqlite3_bind_int64(h, o + 16, gz[i]); L.sqlite3_bind_int64(h, o + 17, bx[i])
    L.sqlite3_bind_int64(h, o + 18, by[i]); L.sqlite3_bind_int64(h, o + 19, bz[i])
    L.sqlite3_bind_int64(h, o + 20, ssm[i]); L.sqlite3_bind_int64(h, o + 21, dsm[i])
    L.sqlite3_bind_int64(h, o + 22, lmt[i])
    local lm2 = lmtot2[i]
    L.sqlite3_bind_int64(h, o + 23, lm2 ~= 0 and lm2 or lmtot[i])
    L.sqlite3_bind_int64(h, o + 24, gid[i]); L.sqlite3_bind_int64(h, o + 25, sme[i])
    L.sqlite3_bind_int64(h, o + 26, gn[i]); L.sqlite3_bind_int64(h, o + 27, slc[i])
    L.sqlite3_bind_int64(h, o + 28, gr[i]); L.sqlite3_bind_int64(h, o + 29, cx[i])
    L.sqlite3_bind_int64(h, o + 30, cy[i]); L.sqlite3_bind_int64(h, o + 31, cz[i])
    L.sqlite3_bind_int64(h, o + 32, csp[i]); L.sqlite3_bind_int64(h, o + 33, mpc[i])
    L.sqlite3_bind_int64(h, o + 34, mac[i])
  end)
  counted("kernel", b.n)
end)

local api_names = { [0] = {}, [1] = {} } -- eventClass -> cbid -> StringIds id

local function api_observer(kind, class, name_of)
  return function(b)
    local s = proc_of(b.source)
    local L = lib
    local start, stop, tid, corr, id, ret = b.start, b.stop, b.tid, b.correlation, b.cbid,
      b.return_value
    local names, tids = api_names[class], s.tids
    write_rows(writers.runtime, b.n, function(h, o, i)
      local c = id[i]
      local nid = names[c]
      if not nid then
        nid = string_id(name_of(c))
        names[c] = nid
      end
      local t = tid[i]
      L.sqlite3_bind_int64(h, o + 1, start[i]); L.sqlite3_bind_int64(h, o + 2, stop[i])
      L.sqlite3_bind_int64(h, o + 3, class); L.sqlite3_bind_int64(h, o + 4, tids[t] or global_tid(s, t))
      L.sqlite3_bind_int64(h, o + 5, corr[i]); L.sqlite3_bind_int64(h, o + 6, nid)
      L.sqlite3_bind_int64(h, o + 7, ret[i])
    end)
    counted(kind, b.n)
  end
end
local API_FIELDS = { "cbid", "start", "stop", "tid", "correlation", "return_value" }
observe({ runtime = API_FIELDS }, api_observer("runtime", 0, cbid.name))
if opts.driver then
  observe({ driver = API_FIELDS }, api_observer("driver", 1,
    function(c) return "driver cbid " .. c end))
end

observe({ memcpy = { "start", "stop", "device", "context", "stream", "correlation", "bytes",
  "copy_kind", "src_kind", "dst_kind", "graph_node", "copy_count" } }, function(b)
  local L = lib
  local common = gpu_columns(proc_of(b.source), b)
  local bytes, ck, sk, dk, gn, cnt = b.bytes, b.copy_kind, b.src_kind, b.dst_kind, b.graph_node,
    b.copy_count
  write_rows(writers.memcpy, b.n, function(h, o, i)
    common(h, o, i)
    L.sqlite3_bind_int64(h, o + 8, bytes[i])
    L.sqlite3_bind_int64(h, o + 9, ck[i])
    L.sqlite3_bind_int64(h, o + 10, MEM_KIND[sk[i]] or 7)
    L.sqlite3_bind_int64(h, o + 11, MEM_KIND[dk[i]] or 7)
    L.sqlite3_bind_int64(h, o + 12, gn[i]); L.sqlite3_bind_int64(h, o + 13, cnt[i])
  end)
  counted("memcpy", b.n)
end)

observe({ memset = { "start", "stop", "device", "context", "stream", "correlation", "value",
  "bytes", "graph_node", "memory_kind" } }, function(b)
  local L = lib
  local common = gpu_columns(proc_of(b.source), b)
  local val, bytes, gn, mk = b.value, b.bytes, b.graph_node, b.memory_kind
  write_rows(writers.memset, b.n, function(h, o, i)
    common(h, o, i)
    L.sqlite3_bind_int64(h, o + 8, val[i])
    L.sqlite3_bind_int64(h, o + 9, bytes[i]); L.sqlite3_bind_int64(h, o + 10, gn[i])
    L.sqlite3_bind_int64(h, o + 11, MEM_KIND[mk[i]] or 7)
  end)
  counted("memset", b.n)
end)

observe({ synchronization = { "start", "stop", "context", "stream", "correlation",
  "sync_type", "event" } }, function(b)
  local s = proc_of(b.source)
  local L = lib
  local start, stop, ctx, strm, corr, ty, ev = b.start, b.stop, b.context, b.stream,
    b.correlation, b.sync_type, b.event
  local gpid, ctxdev = s.gpid, s.ctxdev
  write_rows(writers.synchronization, b.n, function(h, o, i)
    local d = ctxdev[ctx[i]]
    L.sqlite3_bind_int64(h, o + 1, start[i]); L.sqlite3_bind_int64(h, o + 2, stop[i])
    if d then L.sqlite3_bind_int64(h, o + 3, d) else L.sqlite3_bind_null(h, o + 3) end
    L.sqlite3_bind_int64(h, o + 4, ctx[i]); L.sqlite3_bind_int64(h, o + 5, strm[i])
    L.sqlite3_bind_int64(h, o + 6, corr[i]); L.sqlite3_bind_int64(h, o + 7, gpid)
    L.sqlite3_bind_int64(h, o + 8, ty[i]); L.sqlite3_bind_int64(h, o + 9, ev[i])
  end)
  counted("synchronization", b.n)
end)

-- PM samples (cm.pm_sample, in a capture that has them): one row per sample and metric.
observe({ pm_sample = { "device", "start", "stop", "metric", "sample", "value" } }, function(b)
  local s = proc_of(b.source)
  local st = ins.pm
  local dev, start, stop, smp, val = b.device, b.start, b.stop, b.sample, b.value
  for i = 0, b.n - 1 do
    st:int(1, s.gpid); st:int(2, dev[i]); st:int(3, start[i]); st:int(4, stop[i])
    st:int(5, string_id(b:str("metric", i) or "?")); st:int(6, smp[i]); st:double(7, val[i])
    st:insert()
  end
  counted("pm", b.n)
end)

---------------------------------------------------------------------------------------------------
-- NVTX

local INSTANT, START, END, THREAD = nvtx.INSTANT, nvtx.START, nvtx.END, nvtx.THREAD
local PUSHPOP, STARTEND, MARK, DOMAIN = 59, 60, 34, 75

-- The domainId of domain name `dom` in process s (0: the default domain); a new named domain
-- gets its NvtxDomainCreate row.
local function domain_id(s, dom, t, g)
  dom = dom or ""
  local id = s.domains[dom]
  if id then return id end
  s.ndomains = s.ndomains + 1
  id = s.ndomains
  s.domains[dom] = id
  local st = ins.nvtx
  st:int(1, t); st:null(2); st:int(3, DOMAIN); st:null(4); st:text(5, (utf8_clean(dom)))
  st:int(6, g); st:null(7); st:int(8, id); st:insert()
  rows.nvtx = rows.nvtx + 1
  return id
end

-- Writes one NVTX row: r = { start, stop (or nil), type, text, gtid, end_gtid, domain, id }.
local function nvtx_row(r)
  local st = ins.nvtx
  st:int(1, r.start)
  if r.stop then st:int(2, r.stop) else st:null(2) end
  st:int(3, r.type)
  if r.type == STARTEND then st:int(4, r.id) else st:null(4) end
  st:text(5, r.text); st:int(6, r.gtid)
  if r.type == STARTEND and r.end_gtid then st:int(7, r.end_gtid) else st:null(7) end
  st:int(8, r.domain); st:insert()
  counted("nvtx", 1)
end

observe({ marker = { "flags", "timestamp", "id", "object_kind", "tid", "name", "domain" } },
  function(b)
  local s = proc_of(b.source)
  local flags, ts, id, ok, tid = b.flags, b.timestamp, b.id, b.object_kind, b.tid
  for i = 0, b.n - 1 do
    local f, mid, t = tonumber(flags[i]), tonumber(id[i]), ts[i]
    local thread = tonumber(ok[i]) == THREAD
    local g = thread and global_tid(s, tonumber(tid[i])) or s.gpid
    if bit.band(f, START) ~= 0 or bit.band(f, INSTANT) ~= 0 then
      local r = { start = t, text = (utf8_clean(b:str("name", i) or "")), gtid = g, id = mid,
        type = bit.band(f, START) ~= 0 and (thread and PUSHPOP or STARTEND) or MARK,
        domain = domain_id(s, b:str("domain", i), t, g) }
      if r.type == MARK then
        nvtx_row(r)
      else
        local stop, end_gtid = s.ranges:start(mid, r)
        if stop then
          r.stop, r.end_gtid = stop, end_gtid
          nvtx_row(r)
        end
      end
    elseif bit.band(f, END) ~= 0 then
      -- When the END comes first (another batch), its time and thread wait for its START.
      local r = s.ranges:stop(mid, t, g)
      if r then
        r.stop, r.end_gtid = t, g
        nvtx_row(r)
      end
    end
  end
end)

---------------------------------------------------------------------------------------------------
-- commits, loss and the end

if db and opts.commit_ms > 0 then
  cm.every(opts.commit_ms, function() if txn_rows > 0 then commit() end end)
end

local LOSS = { "received", "produced", "dropped", "dropped_cupti", "dropped_agent",
  "dropped_exit", "lost_wire", "lost_frames", "incomplete", "last_number" }

-- Writes the end of the database: open NVTX ranges, CUPTIMON_LOSS, the GPUs, CUPTIMON_UNWRITTEN,
-- the indexes and complete = 1. Returns the records lost on the way (the wire's), the records
-- left unwritten for lack of fields, and those per kind ("kernel 3"). Raises on a failed write.
local function finish()
  local function try(ok, err) if not ok then error("sqlite: " .. tostring(err), 0) end return ok end
  -- Ranges never closed: written with a NULL end, as nsys leaves one.
  for _, s in pairs(procs) do
    for _, r in pairs(s.ranges:take_open()) do nvtx_row(r) end
  end
  local st = try(db:prepare([[INSERT INTO CUPTIMON_LOSS (globalPid, pid, status, received,
    produced, dropped, dropped_cupti, dropped_agent, dropped_exit, lost_wire, lost_frames,
    incomplete, last_number) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)]]))
  local wire_lost = 0
  local sources = {}
  for _, p in ipairs(cm.sources()) do sources[p.source] = true end
  for source in pairs(procs) do sources[source] = true end
  local list = {}
  for source in pairs(sources) do list[#list + 1] = source end
  table.sort(list)
  for _, source in ipairs(list) do
    local s, p = proc_of(source), cm.process(source) or {}
    local t = cm.stats(source) or {}
    st:int(1, s.gpid); st:int(2, s.pid); st:text(3, p.status or "running")
    for i, k in ipairs(LOSS) do st:int(i + 3, t[k] or 0) end
    st:insert()
    wire_lost = wire_lost + (t.dropped or 0)
  end
  write_gpus()
  local not_written, parts = 0, {}
  local ust = try(db:prepare("INSERT INTO CUPTIMON_UNWRITTEN (kind, records, reason) VALUES (?, ?, ?)"))
  for _, k in ipairs(cm.registry.kind_names()) do
    local n = unwritten[k]
    if n then
      ust:text(1, k); ust:int(2, n)
      ust:text(3, "the batches lack fields this script's tables need (a narrower selection)")
      ust:insert()
      not_written = not_written + n
      parts[#parts + 1] = ("%s %d"):format(k, n)
    end
  end
  try(db:exec("COMMIT"))
  pending = {}
  try(db:exec("BEGIN; " .. INDEXES
    .. "UPDATE CUPTIMON_META SET value = '1' WHERE name = 'complete'; COMMIT"))
  return wire_lost, not_written, parts
end

cm.on("exit", function()
  if not db then return end
  local wire_lost, not_written, parts = 0, 0, {}
  if not broken then
    local ok, a, b, c = pcall(finish)
    if ok then wire_lost, not_written, parts = a, b, c
    else broke(a ~= WRITE_FAILED and a or "write failed") end
  end
  db:close()
  local total = 0
  for _, n in pairs(rows) do total = total + n end
  if broken then
    -- The failure was reported when it happened (and fails the run); this says what it cost.
    local n = 0
    for _, v in pairs(lost) do n = n + v end
    if n > 0 then
      io.stderr:write(("sqlite.lua: LOST %d records not written to %s (the failed write above); "
        .. "it holds the %d rows committed before, and CUPTIMON_META's complete is 0\n")
        :format(n, opts.output, total))
    else
      io.stderr:write(("sqlite.lua: %s is not complete (the failed write above): it holds all %d "
        .. "rows, but not its indexes, and CUPTIMON_META's complete is 0\n"):format(opts.output, total))
    end
    return
  end
  local incomplete = (cm.stats() or {}).incomplete or 0
  -- After a command that could not start, its one-line error is the run's only output (the file
  -- is a complete, empty database).
  if not cm.command_failed() then
    print(("sqlite.lua: wrote %s: %d rows (%d kernel, %d runtime, %d memcpy, %d memset, %d "
      .. "synchronization, %d driver, %d nvtx%s), %d strings, %d process%s, %d records lost%s")
      :format(opts.output, total, rows.kernel, rows.runtime, rows.memcpy, rows.memset,
        rows.synchronization, rows.driver, rows.nvtx, rows.pm > 0 and (", %d pm"):format(rows.pm) or "",
        nstrings, nprocs, nprocs == 1 and "" or "es",
        wire_lost, incomplete > 0 and " (and an unknown number: a process's final counts are missing)" or ""))
  end
  -- os.exit skips the host's own LOST line (a wire loss is named here too, and in CUPTIMON_LOSS).
  if not_written > 0 then
    io.stderr:write(("sqlite.lua: LOST %d records not written to %s (%s): their batches lack "
      .. "fields the tables need, as a capture recorded under a script with a narrower selection "
      .. "does; record with `cuptimon-lua --record FILE -- cmd` (no script) for a whole export%s\n")
      :format(not_written, opts.output, table.concat(parts, ", "), wire_lost > 0
        and ("; and %d records were lost on the way (CUPTIMON_LOSS)"):format(wire_lost) or ""))
    io.stderr:flush()
    io.stdout:flush()
    os.exit(3)
  end
end)
