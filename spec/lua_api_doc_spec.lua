-- docs/lua-api.md is generated (docs/gen_lua_api.lua) from the modules' doc comments and the
-- field registry; these specs fail when it is out of date or leaves out part of the API
--. After a change: build/cuptimon-lua docs/gen_lua_api.lua > docs/lua-api.md
-- luacheck: std +busted
local helpers = require "helpers"

local root = helpers.root()

local read = helpers.read

describe("docs/lua-api.md", function()
  local doc = read(root .. "/docs/lua-api.md")

  it("is what docs/gen_lua_api.lua writes now", function()
    local rc, out = helpers.sh(("%s %s/docs/gen_lua_api.lua"):format(helpers.binary(), root))
    assert.are.equal(0, rc, out)
    assert.is_true(out == doc, "docs/lua-api.md is out of date: run "
      .. "`build/cuptimon-lua docs/gen_lua_api.lua > docs/lua-api.md`")
  end)

  it("documents every function of cuptimon and every kind and field of the registry", function()
    local cm = require "cuptimon"
    local missing = {}
    for k, v in pairs(cm) do
      if type(v) == "function" and k:sub(1, 1) ~= "_" and not (doc:find("`cm." .. k, 1, true)
          or doc:find("`agg." .. k .. "(", 1, true)) then
        missing[#missing + 1] = "cm." .. k
      end
    end
    for _, name in ipairs(cm.registry.kind_names()) do
      local k = cm.registry.kind(name)
      local at = doc:find("\n### " .. name .. "\n", 1, true)
      if not at then missing[#missing + 1] = "kind " .. name end
      for i = 0, k.nfields - 1 do
        if not doc:find("| `" .. k.fields[i].name .. "` |", at or 1, true) then
          missing[#missing + 1] = name .. "." .. k.fields[i].name
        end
      end
    end
    table.sort(missing)
    assert.are.same({}, missing)
  end)

  it("is where cuptimon-lua --help points", function()
    local rc, out = helpers.sh(helpers.binary() .. " --help")
    assert.are.equal(0, rc, out)
    assert.matches("docs/lua%-api%.md", out)
  end)
end)
