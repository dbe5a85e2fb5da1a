-- cuptimon.args: command-line options for recipes (scripts/*.lua), and --help from the header.
--
--   local args = require("cuptimon.args").parse(arg, {
--     top = { 10, "number of kernels to show" },
--     kinds = { "kernel,memcpy", "kinds to count" },
--     per_process = { false, "one table per process" },
--   })
--
-- Design note. A recipe documents itself in its leading comment block (description, arguments,
-- example output); --help prints that block, then the options with their defaults, and exits 0
-- before anything is traced. Options are `--name value` or `--name=value`; a boolean option takes
-- no value (`--per-process`); dashes and underscores in names are the same. An unknown option is
-- a usage error (status 2) that lists the valid ones. Positional arguments are returned in
-- order in the result's array part.
local M = {}

-- The leading comment block of the script at `path`, without the comment markers.
local function header(path)
  local f = path and io.open(path, "r")
  if not f then return "" end
  local lines = {}
  for line in f:lines() do
    -- A shebang line is not part of the header.
    if line:match("^%-%-") then
      lines[#lines + 1] = (line:gsub("^%-%- ?", ""))
    elseif not line:match("^#!") then
      break
    end
  end
  f:close()
  return table.concat(lines, "\n")
end
M.header = header

local function usage(script, spec, out)
  out:write(header(script), "\n\nOptions:\n")
  local names = {}
  for k in pairs(spec) do names[#names + 1] = k end
  table.sort(names)
  for _, k in ipairs(names) do
    local d = spec[k][1]
    local flag = "--" .. k:gsub("_", "-")
    if type(d) ~= "boolean" then flag = flag .. " " .. string.upper(k) end
    out:write(("  %-24s %s (default: %s)\n"):format(flag, spec[k][2] or "", tostring(d)))
  end
  out:write("  --help                   show this help and exit\n")
end

--- Parses the script's `arg` table against `spec` ({ name = { default, help } }). Returns the
--- options (defaults filled in, numbers converted when the default is a number).
function M.parse(argt, spec)
  argt = argt or {}
  local script = argt[0]
  local opts = {}
  for k, v in pairs(spec) do opts[k] = v[1] end
  local i = 1
  while argt[i] ~= nil do
    local a = argt[i]
    if a == "--help" or a == "-h" then
      usage(script, spec, io.stdout)
      io.stdout:flush()
      os.exit(0)
    end
    local name, value = a:match("^%-%-([%w_%-]+)=(.*)$")
    if not name then name = a:match("^%-%-([%w_%-]+)$") end
    if name then
      local key = name:gsub("%-", "_")
      local s = spec[key]
      if not s then
        io.stderr:write(("%s: unknown option --%s; see --help\n"):format(script or "script", name))
        os.exit(2)
      end
      if type(s[1]) == "boolean" then
        opts[key] = value == nil and true or (value ~= "false" and value ~= "0")
      else
        if value == nil then
          i = i + 1
          value = argt[i]
          if value == nil then
            io.stderr:write(("%s: --%s needs a value\n"):format(script or "script", name))
            os.exit(2)
          end
        end
        if type(s[1]) == "number" then
          local n = tonumber(value)
          if not n then
            io.stderr:write(("%s: --%s needs a number, got %q\n"):format(script or "script", name, value))
            os.exit(2)
          end
          value = n
        end
        opts[key] = value
      end
    else
      opts[#opts + 1] = a
    end
    i = i + 1
  end
  return opts
end

--- Splits "a,b,c" into { "a", "b", "c" }.
function M.list(s)
  local t = {}
  for item in tostring(s):gmatch("[^,%s]+") do t[#t + 1] = item end
  return t
end

return M
