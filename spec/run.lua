-- spec/run.lua: runs busted inside cuptimon-lua, so the specs exercise the real host (embedded
-- modules, luv on the host's loop, ffi.C bound to the binary's cm_* symbols, the in-process
-- engine on the fake CUPTI).
--
--   cuptimon-lua spec/run.lua [busted options] spec/some_spec.lua ...
--
-- Design note. Busted's Lua modules are plain Lua; its C helpers (lfs, term, system) are Lua 5.1
-- C modules that load into the binary because it exports LuaJIT's API (-Wl,--export-dynamic and
-- the whole static archive). Busted ends with os.exit(status), which the host turns into a clean
-- shutdown (final flush, exit hooks, engine freed) before exiting with busted's status.
package.path = (arg[0]:match("^(.*)/[^/]*$") or ".") .. "/?.lua;" .. package.path
-- Under Lua 5.1 busted signals failure by raising a nil error instead of exiting; turn that into
-- an exit status without the noise of a top-level error.
-- A failure inside a callback (an observer, a hook) is reported by the host, not raised into
-- busted; the specs declare the ones they make on purpose (helpers.expect_errors), and any other
-- fails the run.
-- Loaded here, before busted insulates the spec files (it unloads what a file required).
local helpers = require "helpers"
local cm = require "cuptimon"
local ok, err = pcall(require "busted.runner", { standalone = false })
if not ok then
  if err ~= nil then io.stderr:write(tostring(err), "\n") end
  os.exit(1)
end
local reported = cm.errors()
if reported > helpers.expected_errors then
  io.stderr:write(("spec/run.lua: %d errors were reported in callbacks, %d on purpose: "
    .. "see the \"cuptimon: error in\" lines above\n"):format(reported, helpers.expected_errors))
  os.exit(1)
end
os.exit(0)
