--- cuptimon.output: opening the files a recipe writes (timeline.lua -o, dump.lua -o) the way
--- `cuptimon-lua --record` creates captures (engine/monitor/record.c).
---
--- A recipe may run as root, and its output path may lie in a directory others can write to
--- (/tmp): a plain io.open(path, "w") follows a symlink planted there and truncates whatever it
--- points at. So an output is created exclusively (fopen's "x": O_CREAT|O_EXCL, which never
--- follows a symlink in the last component nor opens a FIFO), and an existing path is refused
--- with a message that names --force. With force, only a regular file is replaced (unlinked, then
--- created exclusively again); a symlink, a FIFO, a directory or a block device is refused even
--- then. A character device (/dev/null) is written as it is.
---
--- Every write and the close are checked: an output that lost bytes never looks complete. The
--- file returned is a checked file: the first write, flush or close that fails (a full disk, a
--- file-size limit: ENOSPC, EFBIG, EIO) is reported once, through cm.report (so the run's status
--- of 0 becomes 1), as "cannot write PATH: REASON" (the OS's reason), and is kept: every later
--- write returns nil and that message at once, without writing, so that the recipe counts what
--- was not written. A write that returns the file has reached the C library's buffer only;
--- :flush() after a unit of output (a batch's rows) tells whether the unit reached the file.
---
---   local output = require "cuptimon.output"
---   local f, err = output.open(path, opts.force)   -- a checked file, or nil and a one-line reason
---   local f = output.open(path, opts.force, true)   -- opened for reading back too ("w+")
---   local f = output.open(path, opts.force, false, "dump.lua")   -- reported as dump.lua's
---   f:write(s) f:flush() f:close()   -- the file, or nil and "cannot write PATH: REASON"
---   f:failure()                       -- that message, or nil while every write succeeded
local uv = require "luv"

local M = {}

local Checked = {}
Checked.__index = Checked

-- Keeps the first failure and reports it; returns nil and its message, as a failed write does.
function Checked:_fail(err)
  if not self.err then
    self.err = ("cannot write %s: %s"):format(self.path, tostring(err))
    require("cuptimon").report(self.who, self.err)
  end
  return nil, self.err
end

function Checked:write(...)
  if self.err then return nil, self.err end
  local ok, err = self.f:write(...)
  if not ok then return self:_fail(err) end
  return self
end

function Checked:flush()
  if self.err then return nil, self.err end
  local ok, err = self.f:flush()
  if not ok then return self:_fail(err) end
  return self
end

-- Closing flushes what the C library still buffers: its failure is the write's.
function Checked:close()
  if self.closed then return self.err == nil or nil, self.err end
  self.closed = true
  local ok, err = self.f:close()
  if not ok then self:_fail(err) end
  if self.err then return nil, self.err end
  return true
end

function Checked:failure() return self.err end
function Checked:setvbuf(...) return self.f:setvbuf(...) end
function Checked:seek(...) return self.f:seek(...) end
function Checked:read(...) return self.f:read(...) end
function Checked:__tostring() return ("output (%s)"):format(self.path) end

local function checked(f, path, who)
  if not f then return nil end
  return setmetatable({ f = f, path = path, who = who or "output", closed = false }, Checked)
end

local create -- below: the exclusive creation

--- Creates `path` for writing (and reading back, when `readable`); returns a checked file whose
--- failures are reported as `who`'s (a recipe's name; default "output"), or nil and a message.
function M.open(path, force, readable, who)
  local f, err = create(path, force, readable)
  if not f then return nil, err end
  return checked(f, path, who)
end

-- Creates `path` as the design note says; returns a Lua file, or nil and a message.
function create(path, force, readable)
  local mode = readable and "w+x" or "wx"
  local f, err, code = io.open(path, mode)
  if f then return f end
  if code ~= 17 then return nil, err end -- EEXIST: decided below; anything else as it is
  local st = uv.fs_lstat(path)
  if not st then return nil, err end
  -- A character device (/dev/null) has no content to destroy, and only root can make one.
  if st.type == "char" then return io.open(path, readable and "w+" or "w") end
  if st.type ~= "file" then
    return nil, ("%s exists and is not a regular file (a %s); it is never written through, "
      .. "even with --force"):format(path, st.type == "link" and "symbolic link" or st.type)
  end
  if not force then return nil, ("%s exists; --force replaces it"):format(path) end
  local ok, rerr = os.remove(path)
  if not ok then return nil, rerr end
  return io.open(path, mode)
end

return M
