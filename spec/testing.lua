-- spec/testing.lua: the test-only C hooks of engine/host/host_testing.h, for the specs.
--
-- Design note. The hooks live in libcuptimon_testing.so, which the build makes with the tests and
-- never installs, so neither the production cdef (lua/cuptimon/cdef.lua) nor the binary carries
-- them. The library's path comes from CUPTIMON_TESTING_LIB (set by spec/CMakeLists.txt), else
-- from CUPTIMON_BUILD_DIR. spec/cdef_spec.lua checks M.source against the header.
local ffi = require "ffi"

local M = {}

M.header = "engine/host/host_testing.h"

M.source = [[
long cm_testing_layout(const char *what);
]]

ffi.cdef(M.source)

local lib

--- The loaded libcuptimon_testing.so; raises when it cannot be found (the specs need it).
function M.lib()
  if lib then return lib end
  local path = os.getenv("CUPTIMON_TESTING_LIB")
  if not path or path == "" then
    path = (os.getenv("CUPTIMON_BUILD_DIR") or "build") .. "/engine/host/libcuptimon_testing.so"
  end
  lib = ffi.load(path)
  return lib
end

return M
