-- cuptimon.enums: the names of the CUPTI 13.0 enum values that activity records carry in their
-- columns (copy_kind, src_kind, launch_type, ...), from cupti_activity.h.
--
--   local enums = require "cuptimon.enums"
--   enums.name("CUpti_ActivityMemcpyKind", 1) --> "HtoD"
--
-- Design note. The field registry's doc of a field names its enum in parentheses
-- ("copy direction (CUpti_ActivityMemcpyKind)"); M.of(doc) finds the enum a doc names, so that
-- docs/lua-api.md (generated) lists the values of every such field and a recipe can print names
-- instead of numbers. The values are fixed by the CUPTI ABI: a new one reads as its number.
local M = {}

--- enum name -> { [value] = short name }.
M.values = {
  CUpti_ActivityMemcpyKind = { [0] = "unknown", "HtoD", "DtoH", "HtoA", "AtoH", "AtoA", "AtoD",
    "DtoA", "DtoD", "HtoH", "PtoP" },
  CUpti_ActivityMemoryKind = { [0] = "unknown", "pageable", "pinned", "device", "array",
    "managed", "device_static", "managed_static" },
  CUpti_ActivitySynchronizationType = { [0] = "unknown", "event_synchronize",
    "stream_wait_event", "stream_synchronize", "context_synchronize" },
  CUpti_ActivityLaunchType = { [0] = "regular", "cooperative_single_device",
    "cooperative_multi_device", "cbl_commandlist" },
  CUpti_ChannelType = { [0] = "invalid", "compute", "async_memcpy" },
  CUpti_ActivityObjectKind = { [0] = "unknown", "process", "thread", "device", "context",
    "stream" },
  CUpti_ActivityMemoryPoolType = { [0] = "invalid", "local", "imported" },
  CUpti_ExternalCorrelationKind = { [0] = "invalid", "unknown", "openacc", "custom0", "custom1",
    "custom2" },
  CUpti_ActivityMemoryOperationType = { [0] = "invalid", "allocation", "release" },
  CUpti_ActivityMemoryPoolOperationType = { [0] = "invalid", "created", "destroyed", "trimmed" },
}

--- The short name of `value` in enum `enum`, or the value as text when it has none.
function M.name(enum, value)
  local t = M.values[enum]
  local n = t and t[tonumber(value)]
  return n or tostring(value)
end

--- The enum a field's doc names ("... (CUpti_ActivityMemcpyKind)"), when this module knows it.
function M.of(doc)
  for e in tostring(doc):gmatch("%((CUpti_[%w_]+)%)") do
    if M.values[e] then return e end
  end
  return nil
end

return M
