-- spec/nvtx_spec.lua: cuptimon.nvtx's pairing of NVTX range records, on synthetic ids (no process,
-- no engine). The recipes that read the marker kind (nvtx.lua, sqlite.lua, ranks.lua,
-- timeline.lua) are checked on real records by their own specs.
-- luacheck: std +busted
local nvtx = require "cuptimon.nvtx"

local function count(t)
  local n = 0
  for _ in pairs(t) do n = n + 1 end
  return n
end

describe("cuptimon.nvtx", function()
  it("names CUPTI's marker flags and the thread object kind", function()
    assert.are.same({ 1, 2, 4, 2 }, { nvtx.INSTANT, nvtx.START, nvtx.END, nvtx.THREAD })
  end)

  it("pairs a START with its END, whichever comes first", function()
    local p = nvtx.pairing()
    assert.is_nil(p:start(7, "train"))
    assert.are.equal("train", p.open[7])
    assert.are.same({ "train" }, { p:stop(7, 100) })
    assert.are.equal(0, count(p.open))
    -- The END first (another thread's buffer): its values wait for the START.
    assert.is_nil(p:stop(8, 200, "tid 3"))
    assert.are.same({ 200, "tid 3" }, { p:start(8, "step") })
    assert.are.equal(0, count(p.open))
    assert.is_nil(p:stop(8, 300)) -- paired once: a second END waits again
  end)

  it("keeps two values per half", function()
    local p = nvtx.pairing()
    p:start(1, 10, { "a" })
    local t0, r = p:stop(1)
    assert.are.equal(10, t0)
    assert.are.same({ "a" }, r)
  end)

  it("hands back the ranges still open, once", function()
    local p = nvtx.pairing()
    p:start(1, "a")
    p:start(2, "b")
    p:stop(2, 5)
    assert.are.same({ [1] = "a" }, p:take_open())
    assert.are.same({}, p:take_open())
  end)

  it("drops the ENDs kept when `pending` of them wait", function()
    local p = nvtx.pairing { pending = 2 }
    p:stop(1, 10)
    p:stop(2, 20)
    p:stop(3, 30) -- the two kept are dropped, this one kept
    assert.is_nil(p:start(1, "a"))
    assert.are.equal(30, p:start(3, "c"))
  end)

  it("keeps no END with pending = 0", function()
    local p = nvtx.pairing { pending = 0 }
    assert.is_nil(p:stop(1, 10))
    assert.is_nil(p:start(1, "a"))
    assert.are.equal("a", p:stop(1, 20))
  end)

  it("keeps an open range for cap to 2 * cap later STARTs with cap", function()
    local p = nvtx.pairing { cap = 2, pending = 0 }
    p:start(1, "a")
    p:start(2, "b")
    p:start(3, "c") -- a new generation: 1 and 2 are the old one
    assert.are.equal("a", p:stop(1))
    p:start(4, "d")
    p:start(5, "e") -- 3 and 4 become the old generation; 2 is dropped
    assert.is_nil(p:stop(2))
    assert.are.equal("c", p:stop(3))
    assert.are.equal("e", p:stop(5))
  end)
end)
