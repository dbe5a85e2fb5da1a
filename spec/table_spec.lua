-- Specs of cuptimon.table: aligned tables as the recipes print them.
-- luacheck: std +busted
local tabulate = require "cuptimon.table"

describe("cuptimon.table", function()
  it("prints what string.format with fixed widths would, while values fit", function()
    local t = tabulate.new {
      { "kernel", width = 12 }, { "count", "%d", width = 6 }, { "avg_us", "%.1f", width = 8 },
    }
    t:add("matmul", 150, 19.08):add("relu", 30, 1.3)
    local want = ("%-12s %6s %8s\n"):format("kernel", "count", "avg_us")
      .. ("%-12s %6d %8.1f\n"):format("matmul", 150, 19.08)
      .. ("%-12s %6d %8.1f\n"):format("relu", 30, 1.3)
    assert.are.equal(want, tostring(t))
    assert.are.equal(2, t:count())
  end)

  it("widens a column to its widest cell, so rows stay aligned", function()
    local t = tabulate.new { { "k" }, { "v", "%.1f", width = 4 } }
    t:add("a", 1):add("b", 123456.7)
    assert.are.equal("k        v\na      1.0\nb 123456.7\n", t:format())
  end)

  it("cuts cells longer than max with an ellipsis", function()
    local t = tabulate.new { { "name", max = 8 }, { "n", "%d" } }
    t:add("abcdefghijkl", 1)
    assert.are.equal("name     n\nabcde... 1\n", t:format())
  end)

  it("aligns on request, prints nil as -, and never pads the last cell", function()
    local t = tabulate.new({ { "n", "%d" }, { "name", align = "left" } }, { sep = "  " })
    t:add(1, "x"):add(22, nil)
    assert.are.equal("n   name\n1   x\n22  -\n", t:format())
  end)

  it("refuses malformed columns as misuse", function()
    assert.has_error(function() tabulate.new {} end)
    assert.has_error(function() tabulate.new { { "a", align = "middle" } } end,
      'cuptimon.table.new: column 1: align must be "left" or "right", got "middle"')
  end)
end)
