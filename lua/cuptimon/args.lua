-- cuptimon.args: command-line options for recipes (scripts/*.lua), and --help from the header.
--
--   local args = require("cuptimon.args").parse(arg, {
--     top = { 10, "number of kernels to show", min = 1 },
--     kinds = { "kernel,memcpy", "kinds to count" },
--     per_process = { false, "one table per process" },
--   })
--
-- Design note. A recipe documents itself in its leading comment block (description, arguments,
-- example output); --help prints that block, then the options the block does not describe (on a
-- line that starts with the option's flag, alone or in a list: "  --sm, --tensor   ..."), so
-- each option is described once. Options are `--name value` or `--name=value`; a boolean option
-- takes no value (`--per-process`); dashes and underscores in names are the same. A number option
-- may set `min` (and `max`) and `integer = true`, and any option a one-letter alias with
-- `short = "o"` (`-o FILE` as with nsys). A recipe takes no positional argument unless it says
-- so (parse's third argument, { positional = true }): a stray one is a usage error, never
-- ignored, and a capture file given there is answered with the --replay command meant
-- ("did you mean `cuptimon-lua --replay run.cmcap scripts/count.lua`?"). Positional arguments,
-- when taken, are returned in order in the result's array part.
--
-- A library module never ends the process. --help and usage errors raise an exit request
-- instead: a table { exit_status = n, message = s } (M.is_exit tells it apart). cuptimon-lua's
-- host catches it when the script's main chunk raises it: it prints the message on stderr, never
-- counts it as an error, and exits with the status without starting the command (0 after --help,
-- 2 for a usage error). Anyone else (a spec, a script calling parse itself) catches it with pcall.
-- Misuse of parse itself (a bad spec) raises an ordinary error naming the problem.
local M = {}

local Exit = {}
Exit.__index = Exit
Exit.__tostring = function(e) return e.message or ("exit " .. e.exit_status) end

--- An exit request with `status` and an optional `message` (printed on stderr by the host).
function M.exit_request(status, message)
  return setmetatable({ exit_status = status, message = message }, Exit)
end

--- Raises a usage error (exit request 2 with `msg`): for a recipe that checks its options further
--- than parse does (an unknown kind name, say).
function M.usage_error(msg)
  error(M.exit_request(2, msg), 0)
end

--- Whether `e` (an error object) is an exit request.
function M.is_exit(e)
  return type(e) == "table" and type(e.exit_status) == "number"
end

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

local function flag(k) return "--" .. k:gsub("_", "-") end

-- The flags a help line starts with (after blanks): one, as in "  --top N   how many", or a
-- list, as in "  -o, --output FILE" or "  --sm, --tensor, --dram   the metrics"; each may be
-- followed by its value's placeholder (a word in capitals).
local function leading_flags(line)
  local rest, flags = line:match("^%s+(%-.*)$"), {}
  while rest do
    local f, after = rest:match("^(%-%-?%w[%w%-]*)(.*)$")
    if not f then break end
    flags[#flags + 1] = f
    after = after:gsub("^ %u[%u%d_]*%f[^%w_]", "", 1)
    rest = after:match("^, (%-.*)$")
  end
  return flags
end

-- Whether the header describes option `k`: a line that starts (after blanks) with its flag, or
-- with a list of flags that holds it.
local function described(text, k)
  local f = flag(k)
  for line in (text .. "\n"):gmatch("([^\n]*)\n") do
    for _, g in ipairs(leading_flags(line)) do
      if g == f then return true end
    end
  end
  return false
end

--- The --help text of the script at `script` for `spec`: the header, then the options it does
--- not describe, then --help.
function M.usage(script, spec)
  local text = header(script)
  local out = { text, "", "Options:" }
  local names = {}
  for k in pairs(spec) do names[#names + 1] = k end
  table.sort(names)
  for _, k in ipairs(names) do
    if not described(text, k) then
      local d = spec[k][1]
      local f = flag(k)
      if type(d) ~= "boolean" then f = f .. " " .. string.upper(k) end
      if spec[k].short then f = "-" .. spec[k].short .. ", " .. f end
      out[#out + 1] = ("  %-24s %s (default: %s)"):format(f, spec[k][2] or "", tostring(d))
    end
  end
  out[#out + 1] = ("  %-24s %s"):format("--help", "show this help and exit")
  return table.concat(out, "\n") .. "\n"
end

local function check_spec(spec)
  if type(spec) ~= "table" then
    error("cuptimon.args.parse: expected parse(arg, { name = { default, help }, ... })", 3)
  end
  for k, s in pairs(spec) do
    if type(k) ~= "string" or type(s) ~= "table" or s[1] == nil then
      error(("cuptimon.args.parse: option %s must be { default, help }"):format(tostring(k)), 3)
    end
    if s.short ~= nil and (type(s.short) ~= "string" or not s.short:match("^%a$")) then
      error(("cuptimon.args.parse: option %s: short must be one letter"):format(k), 3)
    end
  end
end

-- cuptimon-lua's own options (those a recipe does not define): given after the script, they
-- reach the script, which says where they go.
local MONITOR_OPTIONS = { replay = "CAPTURE", record = "CAPTURE", attach = "PIDS", select = "SPEC",
  lua_path = "DIR", duration = "SECONDS", list = false, check = false, force = false,
  allow_loss = false, verbose = false }

-- The usage error for a positional argument the script does not take.
local function stray(prog, script, a)
  if a:match("%.cmcap$") then
    return ("unexpected argument %s: did you mean --replay? `cuptimon-lua --replay %s %s`")
      :format(a, a, script or prog)
  end
  if a:match("^%-%a") then return ("unknown option %s"):format(a) end
  return ("unexpected argument %s: %s takes no positional argument; a command to monitor goes "
    .. "after `--`: `cuptimon-lua %s -- %s ...`"):format(a, prog, script or prog, a)
end

-- Checks a number against the option's bounds; returns an error message or nil.
local function bounds(name, s, n)
  if s.integer and n ~= math.floor(n) then
    return ("--%s needs an integer, got %s"):format(name, tostring(n))
  end
  if s.min and n < s.min then
    return ("--%s must be at least %s, got %s"):format(name, tostring(s.min), tostring(n))
  end
  if s.max and n > s.max then
    return ("--%s must be at most %s, got %s"):format(name, tostring(s.max), tostring(n))
  end
end

--- Parses the script's `arg` table against `spec` ({ name = { default, help[, min=, max=,
--- integer=, short=] } }). Returns the options (defaults filled in, numbers converted when the
--- default is a number). --help prints the usage on stdout and raises exit request 0; a usage
--- error raises exit request 2 with its message. popts.positional = true: positional arguments
--- are returned in the array part (else each is a usage error).
function M.parse(argt, spec, popts)
  check_spec(spec)
  local positional = popts and popts.positional
  local short = {}
  for k, s in pairs(spec) do if s.short then short[s.short] = k end end
  argt = argt or {}
  local script = argt[0]
  local prog = script and script:match("([^/]+)$") or "script"
  local function usage_error(fmt, ...)
    error(M.exit_request(2, prog .. ": " .. fmt:format(...) .. " (see --help)"), 0)
  end
  local opts = {}
  for k, v in pairs(spec) do opts[k] = v[1] end
  local i = 1
  while argt[i] ~= nil do
    local a = argt[i]
    if a == "--help" or a == "-h" then
      io.stdout:write(M.usage(script, spec))
      io.stdout:flush()
      error(M.exit_request(0), 0)
    end
    local name, value = a:match("^%-%-([%w_%-]+)=(.*)$")
    if not name then name = a:match("^%-%-([%w_%-]+)$") end
    if not name and short[a:match("^%-(%a)$") or ""] then name = short[a:sub(2)] end
    if name then
      local key = name:gsub("%-", "_")
      local s = spec[key]
      if not s and MONITOR_OPTIONS[key] ~= nil then
        local v = MONITOR_OPTIONS[key] and (value or argt[i + 1] or MONITOR_OPTIONS[key])
        usage_error("unknown option --%s: monitor options go before the script: `cuptimon-lua "
          .. "--%s%s %s ...`", name, name, v and " " .. v or "", script or prog)
      end
      if not s then
        local valid = {}
        for k in pairs(spec) do valid[#valid + 1] = flag(k) end
        table.sort(valid)
        valid[#valid + 1] = "--help"
        usage_error("unknown option --%s; valid options: %s", name, table.concat(valid, ", "))
      end
      if type(s[1]) == "boolean" then
        opts[key] = value == nil and true or (value ~= "false" and value ~= "0")
      else
        if value == nil then
          i = i + 1
          value = argt[i]
          if value == nil then usage_error("--%s needs a value", name) end
        end
        if type(s[1]) == "number" then
          local n = tonumber(value)
          if not n then usage_error("--%s needs a number, got %q", name, value) end
          local err = bounds(name, s, n)
          if err then usage_error("%s", err) end
          value = n
        end
        opts[key] = value
      end
    elseif positional then
      opts[#opts + 1] = a
    else
      usage_error("%s", stray(prog, script, a))
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

--- Adds --filter REGEX and --exclude REGEX to a recipe's option spec (and returns it), and
--- M.filter(opts, prog) builds the filter they ask for (cuptimon.filter), raising the usage error
--- of a bad expression.
function M.with_filter(spec, what)
  spec.filter = { "", ("only %s matching this POSIX extended regular expression"):format(what) }
  spec.exclude = { "", ("leave out %s matching this regular expression"):format(what) }
  return spec
end

function M.filter(opts, prog)
  local f, err = require("cuptimon.filter").new(opts.filter, opts.exclude)
  if not f then M.usage_error(("%s: %s (see --help)"):format(prog, err)) end
  return f
end

-- --sort's choices -> the order of cuptimon.agg's map:sorted.
local sort_orders = { total = "sum", instances = "count", calls = "count", avg = "avg",
  max = "max", min = "min", name = "key" }

--- Adds --sort total|instances|avg|max|min|name to a recipe's option spec (and returns it);
--- M.sort_order(opts, prog) gives the map:sorted order it asks for, raising the usage error of
--- an unknown choice.
function M.with_sort(spec)
  spec.sort = { "total", "the order of the rows: total, instances, avg, max, min or name" }
  return spec
end

function M.sort_order(opts, prog)
  local o = sort_orders[opts.sort]
  if not o then
    M.usage_error(("%s: --sort must be total, instances, avg, max, min or name, got %q (see "
      .. "--help)"):format(prog, tostring(opts.sort)))
  end
  return o
end

--- Adds --format text|csv|json to a recipe's option spec (and returns it); M.output(opts, prog)
--- sets cuptimon.table's output to it, raising the usage error of an unknown choice.
function M.with_output(spec)
  spec.format = { "text", "text (aligned tables), csv, or json (JSON Lines: an object per row)" }
  return spec
end

function M.output(opts, prog)
  local ok, err = require("cuptimon.table").set_output(opts.format)
  if not ok then M.usage_error(("%s: --format: %s (see --help)"):format(prog, err)) end
end

--- Adds the record-rate budget's options to a recipe's option spec (and returns it):
--- --budget N (records per second per process; 0, the default: no budget), --shed LIST (the
--- kinds shed, in order) and --hold-ms MS. The recipe starts the budget with
--- cuptimon.budget_from(opts) and prints cuptimon.print_shed_notes() beside its tables.
function M.with_budget(spec)
  spec.budget = { 0, "records per second a process may sustain before kinds are shed "
    .. "(0: no budget)", min = 0 }
  spec.shed = { "runtime,driver,overhead,synchronization,memset,memcpy",
    "the kinds the budget sheds, in order" }
  spec.hold_ms = { 5000, "how long the rate stays under the budget before a shed kind returns",
    min = 0, integer = true }
  spec.lag_ms = { 0, "also shed while a process's records reach the script more than this late "
    .. "(ms; 0: the rate alone)", min = 0 }
  return spec
end

--- Adds the duty cycle's options to a recipe's option spec (and returns it): --duty F (the
--- fraction of each period traced, 0 < F <= 0.9; 0, the default: trace everything), --period-ms
--- P (10000) and --seed N (the windows' offsets; 0: from the clock). The recipe's --duty path
--- is in cuptimon.sampling.
function M.with_duty(spec)
  spec.duty = { 0, "trace only this fraction of each period, in one window at a random offset, "
    .. "and print estimates with 95% intervals (0: trace everything)", min = 0, max = 0.9 }
  spec.period_ms = { 10000, "the duty cycle's period", min = 2, integer = true }
  spec.seed = { 0, "the seed of the windows' offsets (0: from the clock)", min = 0, integer = true }
  return spec
end

return M
