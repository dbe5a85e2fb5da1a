-- Specs of cuptimon.args: options, --help, and usage errors raised as exit requests (a library
-- module never calls os.exit; the host or the caller decides).
-- luacheck: std +busted
local args = require "cuptimon.args"

local root = (os.getenv("CUPTIMON_SOURCE_DIR") or ".")
local script = root .. "/scripts/top.lua"
local spec = {
  top = { 10, "how many kernels to show", min = 1, integer = true },
  interval = { 0, "print every MS", min = 0 },
  full_names = { false, "whole signatures" },
  mangled = { false, "mangled names" },
  extra = { "x", "an option the header does not describe" },
}

-- Parses argv (script arg[0] = `script`); returns ok, result, captured stdout.
local function parse(argv, sp, popts)
  local t = { [0] = script }
  for i, a in ipairs(argv) do t[i] = a end
  local out = {}
  local real = io.stdout
  local fake = { write = function(_, ...) for _, s in ipairs({ ... }) do out[#out + 1] = s end end,
    flush = function() end }
  io.stdout = fake -- luacheck: ignore 122
  local ok, res = pcall(args.parse, t, sp or spec, popts)
  io.stdout = real -- luacheck: ignore 122
  return ok, res, table.concat(out)
end

describe("cuptimon.args", function()
  it("fills defaults and converts values", function()
    local ok, o = parse({ "--top", "3", "--full-names", "--interval=250", "pos" }, nil,
      { positional = true })
    assert.is_true(ok)
    assert.are.same({ 3, 250, true, false, "x", "pos" },
      { o.top, o.interval, o.full_names, o.mangled, o.extra, o[1] })
  end)

  -- A stray argument was once ignored: `count.lua examples/demo.cmcap` counted nothing and
  -- exited 0.
  it("refuses a positional argument the script does not take, naming what was meant", function()
    local ok, e = parse({ "examples/demo.cmcap" })
    assert.are.same({ false, 2, "top.lua: unexpected argument examples/demo.cmcap: did you mean "
      .. "--replay? `cuptimon-lua --replay examples/demo.cmcap " .. script .. "` (see --help)" },
      { ok, e.exit_status, e.message })
    ok, e = parse({ "python" })
    assert.are.same({ false, 2, "top.lua: unexpected argument python: top.lua takes no positional "
      .. "argument; a command to monitor goes after `--`: `cuptimon-lua " .. script .. " -- python "
      .. "...` (see --help)" }, { ok, e.exit_status, e.message })
    ok, e = parse({ "-x" })
    assert.are.same({ false, "top.lua: unknown option -x (see --help)" }, { ok, e.message })
  end)

  it("says that cuptimon-lua's options go before the script", function()
    local ok, e = parse({ "--replay", "run.cmcap" })
    assert.are.same({ false, 2, "top.lua: unknown option --replay: monitor options go before the "
      .. "script: `cuptimon-lua --replay run.cmcap " .. script .. " ...` (see --help)" },
      { ok, e.exit_status, e.message })
  end)

  it("takes a one-letter alias", function()
    local ok, o = parse({ "-o", "t.json" }, { output = { "", "the file", short = "o" } })
    assert.are.same({ true, "t.json" }, { ok, o.output })
  end)

  it("rejects --top 0 and --top -1 with exit request 2 naming the bound", function()
    for _, v in ipairs({ "0", "-1" }) do
      local ok, e = parse({ "--top", v })
      assert.is_false(ok)
      assert.is_true(args.is_exit(e))
      assert.are.equal(2, e.exit_status)
      assert.are.equal("top.lua: --top must be at least 1, got " .. v .. " (see --help)",
        e.message)
    end
    local ok, e = parse({ "--top=2.5" })
    assert.is_false(ok)
    assert.are.equal("top.lua: --top needs an integer, got 2.5 (see --help)", e.message)
  end)

  it("raises exit request 2 for an unknown option, listing the valid ones", function()
    local ok, e = parse({ "--bogus" })
    assert.is_false(ok)
    assert.are.equal(2, e.exit_status)
    assert.are.equal("top.lua: unknown option --bogus; valid options: --extra, "
      .. "--full-names, --interval, --mangled, --top, --help (see --help)", e.message)
    assert.are.equal(e.message, tostring(e))
    e = select(2, parse({ "--top" }))
    assert.are.equal("top.lua: --top needs a value (see --help)", e.message)
    e = select(2, parse({ "--top", "many" }))
    assert.are.equal('top.lua: --top needs a number, got "many" (see --help)', e.message)
  end)

  it("prints --help with each option once, then raises exit request 0", function()
    local ok, e, out = parse({ "--help" })
    assert.is_false(ok)
    assert.is_true(args.is_exit(e))
    assert.are.equal(0, e.exit_status)
    assert.is_nil(e.message)
    assert.matches("^top.lua: the kernels", out)
    -- Each option is described on exactly one line: the header's, or the generated one for an
    -- option the header leaves out.
    for _, flag in ipairs({ "top", "interval", "full%-names", "mangled", "extra", "help" }) do
      local n = 0
      for _ in (out):gmatch("\n%s+%-%-" .. flag .. "[ =]") do n = n + 1 end
      assert.are.equal(1, n, flag .. " is described " .. n .. " times in:\n" .. out)
    end
    assert.matches("Options:\n  %-%-extra EXTRA%s+an option the header does not describe "
      .. "%(default: x%)\n  %-%-help%s+show this help and exit\n$", out)
  end)

  it("refuses a malformed spec as misuse", function()
    assert.has_error(function() args.parse({}, { top = 3 }) end,
      "cuptimon.args.parse: option top must be { default, help }")
  end)

  it("never calls os.exit", function()
    local f = assert(io.open(root .. "/lua/cuptimon/args.lua"))
    local src = f:read("*a")
    f:close()
    assert.is_nil(src:match("os%.exit%("))
  end)
end)
