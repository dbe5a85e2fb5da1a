-- cuptimon.batch: a batch as Lua sees it, built over the C struct without copying.
--
-- Design note. The host hands the dispatcher a light userdata `const cm_batch *`. wrap() casts it
-- and makes one small table per batch whose fields are typed pointers into the columns
-- (b.start is a `const uint64_t *`, indexed from 0 to b.n - 1), so a script's loop reads the
-- engine's memory directly and JIT-compiles to plain loads. The columns are valid only while the
-- observer callback runs: keep numbers and strings, never the batch or its pointers.
--
-- Metadata: b.n (records), b.kind (the kind's name), b.kind_id, b.source (the source id), b.seq;
-- b:process() is the process table of the source (pid, host, exe, argv, devices, env), the same
-- whether the batch comes from the in-process engine, a live agent or a capture replay.
-- Every column is also in b.cols by name; a column whose name is one of the metadata names (the
-- memory pool kind has a "source" field) is reachable only there or through b:col(name).
-- String columns hold uint32 ids: b:str("name", i) resolves record i through the string table of
-- the batch's source, with a per-source cache; b:kernel_name(i) gives the kernel's name for
-- tables (demangled and shortened once per source and string id, cuptimon.kernel_name).
-- Reading a column the observer did not select raises an error that names it and says how to
-- select it (a plain nil would fail later as "attempt to index local 's'").
local ffi = require "ffi"
require "cuptimon.cdef"
local registry = require "cuptimon.registry"

local C = ffi.C

local M = {}

local batch_ptr = ffi.typeof("const cm_batch *")
local ptr_type = registry.ptr_type
local len_out = ffi.new("size_t[1]")
local host -- cm_host *, set by init
local namer -- function(name, full) -> the name for tables (cuptimon.kernel_name), set by init
local strings = {} -- source id -> { [string id] = string }
local kernel_names = {} -- source id -> { short = { [id] = name }, full = {...}, mangled = {...} }

local Batch = {}

-- A key that is neither a method nor a selected column: a field of the kind that was not selected
-- raises an error saying to select it; an unknown name raises one listing the selected columns.
function Batch.__index(b, key)
  local m = Batch[key]
  if m ~= nil or type(key) ~= "string" then return m end
  local kind = registry.kind_by_id(rawget(b, "kind_id"))
  local kname = rawget(b, "kind")
  local selected = {}
  for name in pairs(rawget(b, "cols")) do selected[#selected + 1] = name end
  table.sort(selected)
  if kind and kind.by_name[key] then
    error(("batch: the column %q of kind %q was not selected; add it to the observer's "
      .. "selection, e.g. cm.observe({ %s = { %s%q } }, fn)"):format(key, kname, kname,
      #selected > 0 and ("%q, "):rep(#selected):format(unpack(selected)) or "", key), 2)
  end
  error(("batch: no column or method %q; kind %q has the selected columns: %s"):format(key, kname,
    table.concat(selected, ", ")), 2)
end

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
  -- As text: invalid UTF-8 and control characters become U+FFFD (engine/host/text.c), so no
  -- label, JSON or CSV output and no terminal gets a process's raw bytes.
  p = C.cm_host_text(host, p, len_out[0], len_out)
  s = ffi.string(p, len_out[0])
  cache[id] = s
  return s
end

--- Forgets the cached strings of a source (it went away; its ids may be reused).
function M.forget(source)
  strings[source] = nil
  kernel_names[source] = nil
end

local function column(self, fname, field)
  local ids = self.cols[field]
  if ids == nil then
    local kind = registry.kind_by_id(self.kind_id)
    if kind and kind.by_name[field] then
      error(("%s: the column %q of kind %q was not selected; add it to the observer's selection")
        :format(fname, field, self.kind), 3)
    end
    error(("%s: the batch has no column %q"):format(fname, tostring(field)), 3)
  end
  return ids
end

--- Resolves the string of column `field` at record i.
function Batch:str(field, i)
  return M.string(self.source, column(self, "batch:str", field)[i])
end

local name_forms = { short = false, full = true, mangled = "mangled" }

--- The name of the kernel of record i for tables, from the "name" column: `form` "short" (the
--- default: demangled, without parameters and return type, "cm_demo_matmul<16>"), "full" (the
--- whole demangled signature) or "mangled" (as CUPTI reports it). Resolved once per source,
--- string id and form; "string N" when the source's string table lacks id N (not cached: the
--- string may still arrive).
function Batch:kernel_name(i, form)
  form = form or "short"
  local full = name_forms[form]
  if full == nil then
    error(("batch:kernel_name: form must be \"short\", \"full\" or \"mangled\", got %q")
      :format(tostring(form)), 2)
  end
  local id = tonumber(column(self, "batch:kernel_name", "name")[i])
  local by_form = kernel_names[self.source]
  if not by_form then
    by_form = { short = {}, full = {}, mangled = {} }
    kernel_names[self.source] = by_form
  end
  local cache = by_form[form]
  local nm = cache[id]
  if nm then return nm end
  nm = M.string(self.source, id)
  if nm == nil then return "string " .. id end
  if full ~= "mangled" then nm = namer(nm, full) end
  cache[id] = nm
  return nm
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

--- Sets the host and the kernel-name function (cuptimon.kernel_name), from cuptimon/init.lua.
function M.init(h, kernel_name)
  host = h
  namer = kernel_name
end

M.Batch = Batch
return M
