-- cuptimon.registry: the engine's kinds and fields, read once from the C registry.
--
-- Design note. Names are resolved once, at selection time, never per record: observe() validates
-- a selection here and builds the text the engine parses ("kernel:name,start;memcpy:all"). The
-- registry calls are thread-safe pure functions, safe through the FFI. Tables are keyed by kind
-- and field ids (plain numbers) and by names; cdata never serves as a key.
local ffi = require "ffi"
require "cuptimon.cdef"

local C = ffi.C

local M = {}

local kinds_by_id = {}   -- kind id -> { id=, name=, fields = {...}, by_name = {...} }
local kind_names = {}    -- sorted canonical names, for messages

local info = ffi.new("cm_field_info")

local ctype_of = {
  [C.CM_TYPE_U8] = "uint8_t", [C.CM_TYPE_U16] = "uint16_t", [C.CM_TYPE_U32] = "uint32_t",
  [C.CM_TYPE_U64] = "uint64_t", [C.CM_TYPE_I32] = "int32_t", [C.CM_TYPE_I64] = "int64_t",
  [C.CM_TYPE_STR] = "uint32_t", [C.CM_TYPE_I8] = "int8_t", [C.CM_TYPE_I16] = "int16_t",
  [C.CM_TYPE_F64] = "double",
}
M.ctype_of = ctype_of

-- Pointer ctypes per cm_type, created once.
M.ptr_type = {}
for t, name in pairs(ctype_of) do
  M.ptr_type[t] = ffi.typeof("const " .. name .. " *")
end

for i = 0, C.cm_kind_count() - 1 do
  local k = C.cm_kind_at(i)
  local kname = ffi.string(C.cm_kind_name(k))
  local kind = { id = k, name = kname, fields = {}, by_name = {} }
  for f = 0, C.cm_field_count(k) - 1 do
    assert(C.cm_field_info_get(k, f, info) == 0)
    local fi = {
      id = f, name = ffi.string(info.name), type = tonumber(info.type),
      width = tonumber(info.width), doc = info.doc ~= nil and ffi.string(info.doc) or "",
    }
    fi.ctype = ctype_of[fi.type]
    fi.is_string = fi.type == C.CM_TYPE_STR
    kind.fields[f] = fi
    kind.by_name[fi.name] = fi
  end
  kind.nfields = C.cm_field_count(k)
  kinds_by_id[k] = kind
  kind_names[#kind_names + 1] = kname
end
table.sort(kind_names)

--- The kind record of a name or alias ("kernel"), or nil.
function M.kind(name)
  if type(name) ~= "string" then return nil end
  local k = C.cm_kind_by_name(name)
  if k < 0 then return nil end
  return kinds_by_id[k]
end

function M.kind_by_id(id) return kinds_by_id[id] end

--- The sorted list of kind names.
function M.kind_names() return kind_names end

--- The field names of a kind, in id order.
function M.field_names(kind)
  local out = {}
  for f = 0, kind.nfields - 1 do out[#out + 1] = kind.fields[f].name end
  return out
end

return M
