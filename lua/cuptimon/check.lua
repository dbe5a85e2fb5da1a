-- cuptimon.check: what `cuptimon-lua --check` does to a script's side effects.
--
-- Design note. --check loads a script, so that its options are parsed and its selections are
-- validated, and exits without running the loop. Recipes open their outputs, bind their sockets
-- and create their directories while they load (timeline.lua opens -o FILE, prometheus.lua binds
-- --listen, dump.lua creates -o DIR/), and so do users' scripts: checking one must change nothing
-- outside the process. The host (engine/host/state.c) calls install() before the script runs,
-- in check mode only, and install() replaces every Lua-level call that writes, creates, removes,
-- binds, connects or starts something with a stand-in that succeeds and does nothing:
--   - io.open with a mode that writes ("w", "a", "+") and io.popen give a sink file object whose
--     writes go nowhere and whose reads find nothing; io.output(FILE) and io.write follow;
--     os.remove, os.rename and os.execute succeed without acting; os.tmpname creates no file;
--   - luv: fs_open for writing gives a stand-in descriptor (negative, so it can never be a real
--     one) that fs_write, fs_close and the other descriptor calls accept; fs_mkdir, fs_unlink,
--     fs_rename and every other call that changes the file system succeed without acting (with a
--     callback too: luv would run an asynchronous request on its thread pool at once, loop or no
--     loop); a TCP, UDP or pipe handle's bind, listen, connect, write and send succeed without
--     acting, and getsockname reports the address a stand-in bind was given; spawn, kill,
--     new_thread and queue_work start nothing.
-- Reading is left alone: a script may read its configuration while it is checked. What the FFI
-- calls directly (ffi.C.open, say) cannot be seen from here; a script that does so should test
-- cuptimon.checking() itself. M.skipped lists what was skipped, for the specs and --verbose.
local bit = require "bit"

local M = {}

--- What the stand-ins skipped, in order: { "io.open trace.json w", "tcp bind 127.0.0.1:9464" }.
M.skipped = {}

local function note(what) M.skipped[#M.skipped + 1] = what end

-- A file object that accepts everything and holds nothing.
local Sink = {}
Sink.__index = Sink
function Sink:write() return self end
function Sink.setvbuf() return true end
function Sink:flush() return self end
function Sink.seek() return 0 end
function Sink.read() return nil end
function Sink.lines() return function() return nil end end
function Sink:close()
  self.closed = true
  return true
end
function Sink:__tostring() return ("file (%s, not opened: --check)"):format(self.path) end

local function sink(path) return setmetatable({ path = path, closed = false }, Sink) end

local function writes(mode) return type(mode) == "string" and mode:find("[wa+]") ~= nil end

local function install_io()
  -- luacheck: ignore 122 (replacing the standard library's functions is the point)
  local real_open, real_output, real_type = io.open, io.output, io.type
  local out -- the sink io.output was given, or nil for the real one
  io.open = function(path, mode)
    if not writes(mode) then return real_open(path, mode) end
    note(("io.open %s %s"):format(tostring(path), mode))
    return sink(tostring(path))
  end
  io.popen = function(cmd)
    note("io.popen " .. tostring(cmd))
    return sink("| " .. tostring(cmd))
  end
  io.output = function(f)
    if f == nil then return out or real_output() end
    if getmetatable(f) == Sink then
      out = f
    elseif type(f) == "string" then
      note("io.output " .. f)
      out = sink(f)
    else
      out = nil
      return real_output(f)
    end
    return out
  end
  local real_write = io.write
  io.write = function(...)
    if out then return out:write(...) end
    return real_write(...)
  end
  io.type = function(f)
    if getmetatable(f) == Sink then return f.closed and "closed file" or "file" end
    return real_type(f)
  end
  os.remove = function(path)
    note("os.remove " .. tostring(path))
    return true
  end
  os.rename = function(from, to)
    note(("os.rename %s %s"):format(tostring(from), tostring(to)))
    return true
  end
  os.execute = function(cmd)
    if cmd == nil then return 0 end -- "is there a shell?": nothing runs
    note("os.execute " .. tostring(cmd))
    return 0
  end
  os.tmpname = function()
    note("os.tmpname")
    return "/tmp/cuptimon-check-tmpname"
  end
end

-- Stand-in descriptors count down from here, far below any real one.
local next_fd = -1000

-- luv's open flags that write (numbers: O_WRONLY, O_RDWR, O_CREAT, O_TRUNC, O_APPEND on Linux).
local function fs_writes(flags)
  if type(flags) == "string" then return writes(flags) end
  if type(flags) == "number" then return bit.band(flags, 0x643) ~= 0 end
  return false
end

-- A request object for an asynchronous stand-in: its callback never runs (the loop does not).
local function request() return setmetatable({}, { __tostring = function() return "uv_fs_t (--check)" end }) end

local function install_luv()
  local ok, uv = pcall(require, "luv")
  if not ok then return end
  local function async(args, n) return type(args[n]) == "function" end
  local real_open = uv.fs_open
  uv.fs_open = function(path, flags, mode, cb)
    if not fs_writes(flags) then return real_open(path, flags, mode, cb) end
    note(("fs_open %s %s"):format(tostring(path), tostring(flags)))
    next_fd = next_fd - 1
    if type(cb) == "function" then return request() end
    return next_fd
  end
  -- Descriptor calls: a stand-in descriptor is accepted.
  local fd_calls = { fs_close = 0, fs_write = "len", fs_ftruncate = 0, fs_fsync = 0,
    fs_fdatasync = 0, fs_fchmod = 0, fs_fchown = 0, fs_futime = 0, fs_sendfile = 0 }
  for name, result in pairs(fd_calls) do
    local real = uv[name]
    if real then
      uv[name] = function(fd, ...)
        -- A real descriptor (opened for reading) keeps its real close; nothing is ever written.
        if name ~= "fs_close" or (type(fd) == "number" and fd <= -1000) then
          if name ~= "fs_close" then note(name) end
          local args = { ... }
          if async(args, select("#", ...)) then return request() end
          if result == "len" then
            local data = args[1]
            if type(data) == "table" then data = table.concat(data) end
            return #tostring(data or "")
          end
          return true
        end
        return real(fd, ...)
      end
    end
  end
  -- Path calls that change the file system.
  for _, name in ipairs { "fs_mkdir", "fs_mkdtemp", "fs_mkstemp", "fs_rmdir", "fs_unlink",
      "fs_rename", "fs_copyfile", "fs_link", "fs_symlink", "fs_chmod", "fs_chown", "fs_lchown",
      "fs_utime", "fs_lutime" } do
    if uv[name] then
      uv[name] = function(path, ...)
        note(name .. " " .. tostring(path))
        local args = { ... }
        if async(args, select("#", ...)) then return request() end
        if name == "fs_mkdtemp" then return (tostring(path):gsub("X+$", "check")) end
        if name == "fs_mkstemp" then
          next_fd = next_fd - 1
          return next_fd, (tostring(path):gsub("X+$", "check"))
        end
        return true
      end
    end
  end
  -- Handles: bind, listen, connect and writes of streams and datagrams do nothing; the address
  -- a stand-in bind got is what getsockname says.
  local bound = setmetatable({}, { __mode = "k" })
  local function family(host) return tostring(host):find(":") and "inet6" or "inet" end
  local stand_ins = {
    bind = function(h, host, port)
      note(("bind %s %s"):format(tostring(host), tostring(port)))
      bound[h] = { ip = host, port = port, family = family(host) }
      return 0
    end,
    listen = function() note("listen") return 0 end,
    connect = function(_, host, port)
      note(("connect %s %s"):format(tostring(host), tostring(port)))
      return request()
    end,
    write = function() return request() end,
    write2 = function() return request() end,
    try_write = function(_, data) return type(data) == "string" and #data or 0 end,
    shutdown = function() return request() end,
    send = function() return request() end,
    try_send = function(_, data) return type(data) == "string" and #data or 0 end,
    open = function() note("open") return 0 end,
  }
  local registry = debug.getregistry()
  for _, tname in ipairs { "uv_tcp", "uv_udp", "uv_pipe", "uv_tty", "uv_stream" } do
    local mt = registry[tname]
    local idx = type(mt) == "table" and mt.__index
    if type(idx) == "table" then
      for name, fn in pairs(stand_ins) do
        if idx[name] ~= nil then idx[name] = fn end
      end
      local real = idx.getsockname
      if real then
        idx.getsockname = function(h)
          if bound[h] then return bound[h] end
          return real(h)
        end
      end
    end
  end
  for name, as in pairs { tcp_bind = "bind", udp_bind = "bind", pipe_bind = "bind",
      listen = "listen", tcp_connect = "connect", pipe_connect = "connect", write = "write",
      write2 = "write2", try_write = "try_write", shutdown = "shutdown", udp_send = "send",
      udp_try_send = "try_send", pipe_open = "open", tcp_open = "open", udp_open = "open" } do
    if uv[name] then uv[name] = stand_ins[as] end
  end
  if uv.tcp_getsockname then
    local real = uv.tcp_getsockname
    uv.tcp_getsockname = function(h) return bound[h] or real(h) end
  end
  -- Processes and threads: nothing starts.
  local null = setmetatable({}, { __index = function() return function() return 0 end end,
    __tostring = function() return "(not started: --check)" end })
  if uv.spawn then
    uv.spawn = function(path)
      note("spawn " .. tostring(path))
      return null, 0
    end
  end
  uv.kill = function() return 0 end
  if uv.new_thread then uv.new_thread = function() note("new_thread") return null end end
  if uv.queue_work then uv.queue_work = function() return true end end
  if uv.new_work then uv.new_work = function() return null end end
end

--- Replaces the side-effecting calls, once. The host calls it in check mode only.
function M.install()
  if M.installed then return end
  M.installed = true
  install_io()
  install_luv()
end

return M
