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
---   local output = require "cuptimon.output"
---   local f, err = output.open(path, opts.force)   -- a Lua file, or nil and a one-line reason
---   local f = output.open(path, opts.force, true)   -- opened for reading back too ("w+")
local uv = require "luv"

local M = {}

--- Creates `path` for writing (and reading back, when `readable`); returns a Lua file, or nil
--- and a message.
function M.open(path, force, readable)
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
