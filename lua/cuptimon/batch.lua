-- cuptimon.batch: a batch as Lua sees it, built over the C struct without copying.
--
-- Design note. The host hands the dispatcher a light userdata `const cm_batch *`. wrap() casts it
-- and makes one small table per batch whose fields are typed pointers into the columns
-- (b.start is a `const uint64_t *`, indexed from 0 to b.n - 1), so a script's loop reads the
-- engine's memory directly and JIT-compiles to plain loads. The columns are valid only while the
-- observer callback runs: keep numbers and strings, never the batch or its pointers.
--
-- Metadata: b.n (records), b.kind (the kind's name), b.kind_id, b.source (the source id), b.seq;
-- b:process() is the process table of the source (pid, host, exe, argv, devices), the same
-- whether the batch comes from the in-process engine, a live agent or a capture replay.
-- Every column is also in b.cols by name; a column whose name is one of the metadata names (the
-- memory pool kind has a "source" field) is reachable only there or through b:col(name).
-- String columns hold uint32 ids: b:str("name", i) resolves record i through the string table of
-- the batch's source, with a per-source cache.
local ffi = require "ffi"
require "cuptimon.cdef"
local registry = require "cuptimon.registry"

local C = ffi.C

local M = {}

local batch_ptr = ffi.typeof("const cm_batch *")
local ptr_type = registry.ptr_type
local len_out = ffi.new("size_t[1]")
local host -- cm_host *, set by init
local strings = {} -- source id -> { [string id] = string }

local Batch = {}
Batch.__index = Batch

local meta_names = { n = true, kind = true, kind_id = true, source = true, seq = true, cols = true,
  str = true, col = true, process = true }

-- source id -> the process table of its process_start event (kept after process_exit, with the
-- exit fields merged in), filled by cuptimon/init.lua.
M.processes = {}

--- The string of string id `id` from source `source`, or nil when unknown.
function M.string(source, id)
  local cache = strings[source]
  if not cache then
    cache = {}
    strings[source] = cache
  end
  id = tonumber(id)
  local s = cache[id]
  if s then return s end
  local p = C.cm_host_source_string(host, source, id, len_out)
  if p == nil then return nil end
  s = ffi.string(p, len_out[0])
  cache[id] = s
  return s
end

--- Forgets the cached strings of a source (it went away; its ids may be reused).
function M.forget(source) strings[source] = nil end

--- Resolves the string of column `field` at record i.
function Batch:str(field, i)
  local ids = self.cols[field]
  if ids == nil then
    error(("batch:str: the batch has no column %q"):format(tostring(field)), 2)
  end
  return M.string(self.source, ids[i])
end

--- The process the batch comes from: { source=, pid=, ppid=, host=, exe=, argv=, devices=,
--- kind= } with kind "inproc", "agent" or "replay"; the same shape for every kind of source.
function Batch:process() return M.processes[self.source] end

--- The column `name` (a typed pointer), or nil.
function Batch:col(name) return self.cols[name] end

function Batch:__tostring()
  local names = {}
  for name in pairs(self.cols) do names[#names + 1] = name end
  table.sort(names)
  return ("batch(%s, n=%d, source=%d, cols={%s})"):format(self.kind, self.n, self.source,
    table.concat(names, ","))
end

--- Builds the Lua view of the batch at light userdata `p` from `source`.
function M.wrap(p, source)
  local cb = ffi.cast(batch_ptr, p)
  local kind_id = cb.kind
  local kind = registry.kind_by_id(kind_id)
  local cols = {}
  local b = setmetatable({
    n = cb.n, kind = kind and kind.name or tostring(kind_id), kind_id = kind_id,
    source = source, seq = cb.seq, cols = cols,
  }, Batch)
  local fields = kind and kind.fields
  for j = 0, cb.ncols - 1 do
    local col = cb.cols[j]
    local fi = fields and fields[col.field]
    -- A column of a type this version does not know is skipped (docs/wire.md); the wire
    -- sources drop such columns already, this keeps any other source from breaking the view.
    local pt = ptr_type[col.type]
    if pt then
      local name = fi and fi.name or ffi.string(col.name)
      local ptr = ffi.cast(pt, col.data)
      cols[name] = ptr
      if not meta_names[name] then b[name] = ptr end
    end
  end
  return b
end

function M.init(h) host = h end

M.Batch = Batch
return M
