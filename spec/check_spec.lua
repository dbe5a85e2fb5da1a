-- Specs of `cuptimon-lua --check`: checking a script opens no file for writing, creates and
-- removes nothing, binds no socket and starts nothing (lua/cuptimon/check.lua).
-- luacheck: std +busted
local helpers = require "helpers"
local uv = require "luv"

local bin = helpers.binary()
local root = helpers.root()

local read = helpers.read

local function write(path, s)
  local f = assert(io.open(path, "wb"))
  f:write(s)
  f:close()
end

local function listing(dir)
  local names = {}
  local req = assert(uv.fs_scandir(dir))
  while true do
    local name = uv.fs_scandir_next(req)
    if not name then break end
    names[#names + 1] = name
  end
  table.sort(names)
  return table.concat(names, " ")
end

describe("cuptimon-lua --check", function()
  it("timeline.lua -o FILE leaves an existing FILE as it was", function()
    local dir = helpers.tmpdir()
    local trace = dir .. "/keep.json"
    write(trace, '{"traceEvents":[]}\n')
    local rc, out = helpers.sh(("%s --check %s/scripts/timeline.lua -o %s"):format(bin, root, trace))
    assert.are.same({ 0, "" }, { rc, out })
    assert.are.equal('{"traceEvents":[]}\n', read(trace))
    os.execute("rm -rf " .. dir)
  end)

  it("dump.lua -o DIR/ creates no directory", function()
    local dir = helpers.tmpdir()
    local rc, out = helpers.sh(("%s --check %s/scripts/dump.lua -o %s/d/e/"):format(bin, root, dir))
    assert.are.same({ 0, "" }, { rc, out })
    assert.are.equal("", listing(dir))
    os.execute("rm -rf " .. dir)
  end)

  it("prometheus.lua binds no socket: its port stays free for the one holding it", function()
    -- This process holds the port; a check that bound it would fail (EADDRINUSE) or say
    -- "serving".
    local holder = uv.new_tcp()
    assert(holder:bind("127.0.0.1", 0))
    local port = holder:getsockname().port
    local rc, out = helpers.sh(("%s --check %s/scripts/prometheus.lua --listen 127.0.0.1:%d")
      :format(bin, root, port))
    holder:close()
    assert.are.same({ 0, "" }, { rc, out })
  end)

  it("turns every write, removal, socket and process of a script into nothing", function()
    local dir = helpers.tmpdir()
    for _, name in ipairs { "keep.txt", "append.txt", "remove.txt", "rename.txt", "unlink.txt" } do
      write(dir .. "/" .. name, name .. "\n")
    end
    local before = listing(dir)
    local rc, out = helpers.sh(("%s --check %s/spec/fixtures/check_effects.lua %s 0")
      :format(bin, root, dir))
    assert.are.equal(0, rc, out)
    assert.are.equal("read: keep.txt\nbound 127.0.0.1:0\nloaded\n", out)
    assert.are.equal(before, listing(dir))
    for _, name in ipairs { "keep.txt", "append.txt", "remove.txt", "rename.txt", "unlink.txt" } do
      assert.are.equal(name .. "\n", read(dir .. "/" .. name), name)
    end
    -- The same script run for real does all of it (the fixture is not a no-op by itself).
    rc, out = helpers.sh(("%s %s/spec/fixtures/check_effects.lua %s 0"):format(bin, root, dir))
    assert.are.equal(0, rc, out)
    assert.are.equal("overwritten\n", read(dir .. "/keep.txt"))
    assert.are_not.equal(before, listing(dir))
    os.execute("rm -rf " .. dir)
  end)
end)
