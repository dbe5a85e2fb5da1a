-- spec/exporter.lua: scripts/prometheus.lua as a child process for the specs
-- (spec/prometheus_spec.lua, spec/prometheus_tls_spec.lua), and curl run on the spec's loop.
--
-- Design note. Both run as children watched from the spec's luv loop, never blocking it, so a
-- flood (spec/http_attack.lua) on the same loop goes on while a scrape waits.
--
--   local e = exporter.start({ demo }, { "--top-kernels", "1" }); finally(e.stop)
--   e.port, e.scheme, e.log(), e.proc, e.exited() -> status or nil, e.stop() -> exit status
--   local rc, out = exporter.curl({ "-s", url })
local uv = require "luv"
local helpers = require "helpers"

local M = {}

--- Starts the exporter on `captures` (replayed, --linger -1: it serves until stopped) with
--- extra `argv`, on a free port, and waits until it serves or exits. The caller passes e.stop to
--- finally().
function M.start(captures, argv)
  local a = {}
  for _, c in ipairs(captures) do a[#a + 1] = "--replay"; a[#a + 1] = c end
  a[#a + 1] = helpers.root() .. "/scripts/prometheus.lua"
  for _, v in ipairs { "--port", "0", "--linger", "-1" } do a[#a + 1] = v end
  for _, v in ipairs(argv or {}) do a[#a + 1] = v end
  local err = uv.new_pipe(false)
  local log, status = {}, nil
  local e = {}
  local proc = uv.spawn(helpers.binary(), { args = a, stdio = { nil, nil, err } }, function(code, signal)
    status = signal ~= 0 and 128 + signal or code
  end)
  assert(proc, "cannot start cuptimon-lua")
  e.proc = proc
  err:read_start(function(_, chunk) if chunk then log[#log + 1] = chunk end end)
  e.log = function() return table.concat(log) end
  e.exited = function() return status end
  helpers.run_until(function()
    return e.log():match("the run ended") ~= nil or status ~= nil
  end, 60000)
  e.scheme, e.port = e.log():match("serving (https?)://127%.0%.0%.1:(%d+)/metrics")
  e.port = tonumber(e.port)
  e.stop = function()
    if status == nil then proc:kill("sigterm") end
    -- Generous: under ThreadSanitizer on a loaded 2-core machine the exit alone takes seconds.
    helpers.run_until(function() return status ~= nil end, 60000)
    if not err:is_closing() then err:close() end
    if not proc:is_closing() then proc:close() end
    return status
  end
  return e
end

--- Whether curl can run; when not, the reason for pending() (in CI, where curl must be
--- installed, an error instead).
function M.need_curl()
  if os.execute("command -v curl >/dev/null 2>&1") == 0 then return true end
  if os.getenv("CI") == "true" then error("curl is not installed: CI must install it (.ci/run)", 2) end
  return nil, "curl is not installed (apt-get install curl)"
end

--- Runs curl with `argv` as a child, on the spec's loop; returns its exit status and stdout.
function M.curl(argv)
  local out = uv.new_pipe(false)
  local got, status, eof = {}, nil, false
  local proc = uv.spawn("curl", { args = argv, stdio = { nil, out, nil } }, function(code)
    status = code
  end)
  assert(proc, "cannot run curl")
  out:read_start(function(_, chunk)
    if chunk then got[#got + 1] = chunk else eof = true end
  end)
  assert(helpers.run_until(function() return status ~= nil and eof end, 30000), "curl did not finish")
  out:close()
  proc:close()
  return status, table.concat(got)
end

return M
