-- cuptimon.sqlite: a small binding of Debian's libsqlite3 through the FFI, for recipes that write
-- databases (scripts/sqlite.lua).
--
--   local sqlite = require "cuptimon.sqlite"
--   local db, err = sqlite.open("run.sqlite")          -- nil, err when libsqlite3 is missing
--   db:exec("CREATE TABLE t (a INTEGER, b TEXT)")
--   local st = db:prepare("INSERT INTO t VALUES (?, ?)")
--   st:int(1, 42); st:text(2, "it's \0 fine"); st:insert()
--   db:close()
--
-- Design note. The library is loaded at run time with ffi.load ($CUPTIMON_LIBSQLITE3 alone when it
-- is set; else libsqlite3.so.0, the soname Debian's libsqlite3-0 ships, then "sqlite3"), so
-- cuptimon-lua itself links nothing but libc and still runs where SQLite is absent: only the
-- scripts that need it fail, with a message that names the library. Values always go through
-- bound parameters (sqlite3_bind_*), with explicit lengths, so any bytes (quotes, NULs, invalid
-- UTF-8) reach the database as data and never as SQL; only constant SQL text is prepared. A
-- statement is prepared once and reused: bind, insert (step and reset), bind again; the binding
-- functions are plain FFI calls that JIT-compile in a row loop. Nothing here is thread-safe;
-- one connection serves the loop thread that opened it. Failures of open, exec and prepare return
-- nil, err; a failed insert raises an error naming the statement and SQLite's message (a full
-- disk mid-run is not something a row loop can recover from).
local ffi = require "ffi"

local M = {}

ffi.cdef [[
typedef struct sqlite3 sqlite3;
typedef struct sqlite3_stmt sqlite3_stmt;
const char *sqlite3_libversion(void);
int sqlite3_open_v2(const char *filename, sqlite3 **db, int flags, const char *vfs);
int sqlite3_close_v2(sqlite3 *db);
int sqlite3_exec(sqlite3 *db, const char *sql, void *cb, void *arg, char **errmsg);
void sqlite3_free(void *p);
const char *sqlite3_errmsg(sqlite3 *db);
int sqlite3_prepare_v2(sqlite3 *db, const char *sql, int nbyte, sqlite3_stmt **stmt,
                       const char **tail);
int sqlite3_bind_int64(sqlite3_stmt *st, int i, int64_t v);
int sqlite3_bind_double(sqlite3_stmt *st, int i, double v);
int sqlite3_bind_null(sqlite3_stmt *st, int i);
int sqlite3_bind_text(sqlite3_stmt *st, int i, const char *s, int n, intptr_t destructor);
int sqlite3_bind_blob(sqlite3_stmt *st, int i, const void *p, int n, intptr_t destructor);
int sqlite3_step(sqlite3_stmt *st);
int sqlite3_reset(sqlite3_stmt *st);
int sqlite3_finalize(sqlite3_stmt *st);
int sqlite3_column_count(sqlite3_stmt *st);
int64_t sqlite3_column_int64(sqlite3_stmt *st, int i);
const unsigned char *sqlite3_column_text(sqlite3_stmt *st, int i);
int sqlite3_column_bytes(sqlite3_stmt *st, int i);
int sqlite3_system_errno(sqlite3 *db);
]]
-- libc's, for the system's reason behind an I/O error; another module may have declared them.
pcall(ffi.cdef, "char *strerror(int errnum);")
pcall(ffi.cdef, "struct cm_sqlite_rlimit { uint64_t cur, max; }; "
  .. "int getrlimit(int resource, struct cm_sqlite_rlimit *rlim);")
local RLIMIT_FSIZE, RLIM_INFINITY = 1, ffi.cast("uint64_t", -1)

local OPEN_READWRITE, OPEN_CREATE, OPEN_NOMUTEX, OPEN_NOFOLLOW = 0x2, 0x4, 0x8000, 0x01000000
local ROW, DONE = 100, 101
local TRANSIENT = -1 -- SQLITE_TRANSIENT: SQLite copies the bytes before the bind returns

local lib, lib_err

--- The loaded library, or nil and a one-line reason naming what was looked for.
function M.library()
  if lib then return lib end
  if lib_err then return nil, lib_err end
  local tried, errs = {}, {}
  local env = os.getenv("CUPTIMON_LIBSQLITE3")
  local names = env and env ~= "" and { env } or { "libsqlite3.so.0", "sqlite3" }
  for _, name in ipairs(names) do
    tried[#tried + 1] = name
    local ok, l = pcall(ffi.load, name)
    if ok then
      lib = l
      return lib
    end
    errs[#errs + 1] = (tostring(l):gsub("\n", " "))
  end
  lib_err = ("cannot load libsqlite3 (tried %s: %s); install Debian's libsqlite3-0 "
    .. "(apt-get install libsqlite3-0) or set CUPTIMON_LIBSQLITE3 to the library's path")
    :format(table.concat(tried, ", "), errs[1] or "not found")
  return nil, lib_err
end

--- SQLite's version string ("3.40.1"), or nil, err.
function M.version()
  local l, err = M.library()
  if not l then return nil, err end
  return ffi.string(l.sqlite3_libversion())
end

local Db = {}
Db.__index = Db
local Stmt = {}
Stmt.__index = Stmt

local db_cell = ffi.new("sqlite3 *[1]")
local stmt_cell = ffi.new("sqlite3_stmt *[1]")
local err_cell = ffi.new("char *[1]")

--- Opens (creating it when `create`) the database at `path`, never through a symbolic link
--- (SQLITE_OPEN_NOFOLLOW), without SQLite's per-connection mutex (SQLITE_OPEN_NOMUTEX: the
--- connection belongs to one thread, and the mutex cost 8% of a bulk insert). Returns a
--- connection, or nil, err.
function M.open(path, create)
  local l, err = M.library()
  if not l then return nil, err end
  local flags = OPEN_READWRITE + OPEN_NOMUTEX + OPEN_NOFOLLOW + (create and OPEN_CREATE or 0)
  local rc = l.sqlite3_open_v2(path, db_cell, flags, nil)
  local h = db_cell[0]
  if rc ~= 0 then
    local msg = h ~= nil and ffi.string(l.sqlite3_errmsg(h)) or ("error " .. rc)
    if h ~= nil then l.sqlite3_close_v2(h) end
    return nil, ("cannot open %s: %s"):format(path, msg)
  end
  return setmetatable({ h = h, path = path, stmts = {} }, Db)
end

-- SQLite's message with the system's reason behind it: "disk I/O error" alone hides whether the
-- disk was full (ENOSPC) or a file-size limit was reached (EFBIG).
local function why(h, msg, path)
  local e = lib.sqlite3_system_errno(h)
  if e ~= 0 then return ("%s (%s)"):format(msg, ffi.string(ffi.C.strerror(e))) end
  -- SQLite does not keep the errno of a failed write (the rollback that follows changes it): a
  -- file that reached the file-size limit (EFBIG) is told by its size.
  local lim = ffi.new("struct cm_sqlite_rlimit")
  local st = path and require("luv").fs_stat(path)
  if st and ffi.C.getrlimit(RLIMIT_FSIZE, lim) == 0 and lim.cur ~= RLIM_INFINITY
    and st.size + 65536 >= lim.cur then
    return ("%s (%s reached the file-size limit, ulimit -f: %d bytes)"):format(msg, path,
      tonumber(lim.cur))
  end
  return msg
end

--- Runs constant SQL text (one or more statements, no parameters). Returns true, or nil, err.
function Db:exec(sql)
  local rc = lib.sqlite3_exec(self.h, sql, nil, nil, err_cell)
  if rc ~= 0 then
    local msg = err_cell[0] ~= nil and ffi.string(err_cell[0]) or ("error " .. rc)
    if err_cell[0] ~= nil then lib.sqlite3_free(err_cell[0]) end
    err_cell[0] = nil
    return nil, ("%s: %s"):format(sql:match("^%s*(.-)%s*$"):sub(1, 60), why(self.h, msg, self.path))
  end
  return true
end

--- SQLite's message for the connection's last failure, with the system's reason behind it when
--- there is one ("disk I/O error (File too large)").
function Db:errmsg() return why(self.h, ffi.string(lib.sqlite3_errmsg(self.h)), self.path) end

--- Prepares one statement of constant SQL text with ? parameters. Returns it, or nil, err.
function Db:prepare(sql)
  local rc = lib.sqlite3_prepare_v2(self.h, sql, #sql, stmt_cell, nil)
  if rc ~= 0 then
    return nil, ("cannot prepare %q: %s"):format(sql:sub(1, 60), ffi.string(lib.sqlite3_errmsg(self.h)))
  end
  local st = setmetatable({ h = stmt_cell[0], db = self, sql = sql }, Stmt)
  self.stmts[#self.stmts + 1] = st
  return st
end

--- The rows of a query of constant SQL text, each a list of column values as strings (nil for
--- NULL), or nil, err. For small reads (a check, a summary); the writer never reads.
function Db:rows(sql)
  local st, err = self:prepare(sql)
  if not st then return nil, err end
  local out = {}
  while true do
    local rc = lib.sqlite3_step(st.h)
    if rc == DONE then break end
    if rc ~= ROW then
      st:finalize()
      return nil, ffi.string(lib.sqlite3_errmsg(self.h))
    end
    local row = {}
    for i = 0, lib.sqlite3_column_count(st.h) - 1 do
      local p = lib.sqlite3_column_text(st.h, i)
      row[i + 1] = p ~= nil and ffi.string(p, lib.sqlite3_column_bytes(st.h, i)) or nil
    end
    out[#out + 1] = row
  end
  st:finalize()
  return out
end

--- Finalizes every statement and closes the connection. Idempotent. Returns true, or nil, err.
function Db:close()
  if not self.h then return true end
  for _, st in ipairs(self.stmts) do st:finalize() end
  self.stmts = {}
  local rc = lib.sqlite3_close_v2(self.h)
  self.h = nil
  if rc ~= 0 then return nil, ("closing %s: error %d"):format(self.path, rc) end
  return true
end

--- Binds an integer (a Lua number or an int64/uint64 cdata) to parameter i (from 1).
function Stmt:int(i, v) lib.sqlite3_bind_int64(self.h, i, v) end

--- Binds a double to parameter i.
function Stmt:double(i, v) lib.sqlite3_bind_double(self.h, i, v) end

--- Binds NULL to parameter i.
function Stmt:null(i) lib.sqlite3_bind_null(self.h, i) end

--- Binds the bytes of Lua string s as TEXT (its whole length, NULs included), or NULL for nil.
function Stmt:text(i, s)
  if s == nil then return lib.sqlite3_bind_null(self.h, i) end
  lib.sqlite3_bind_text(self.h, i, s, #s, TRANSIENT)
end

--- Binds the bytes of Lua string s as a BLOB, or NULL for nil.
function Stmt:blob(i, s)
  if s == nil then return lib.sqlite3_bind_null(self.h, i) end
  lib.sqlite3_bind_blob(self.h, i, s, #s, TRANSIENT)
end

--- Runs the statement with its bound parameters and resets it for the next row; the bindings
--- stay (a parameter never bound is NULL). Raises on failure.
function Stmt:insert()
  local h = self.h
  local rc = lib.sqlite3_step(h)
  lib.sqlite3_reset(h)
  if rc ~= DONE then
    error(("sqlite: %s: %s"):format(self.sql:match("^%s*(%S+%s+%S+%s+%S+)") or self.sql,
      self.db:errmsg()), 0)
  end
end

--- Frees the statement. Idempotent.
function Stmt:finalize()
  if self.h ~= nil then lib.sqlite3_finalize(self.h) end
  self.h = nil
end

return M
