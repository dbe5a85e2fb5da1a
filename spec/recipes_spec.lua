-- Specs of the recipes (scripts/*.lua) on the bundled capture examples/demo.cmcap (an H200 run of
-- examples/demo): each output must equal the reviewed one in spec/fixtures/demo/NAME.out, byte
-- for byte, with exit status 0. A replay is deterministic, so any change in a recipe's output
-- shows here; after an intended change, regenerate a file with
--   build/cuptimon-lua --replay examples/demo.cmcap scripts/RECIPE.lua ARGS > spec/fixtures/demo/NAME.out
-- and explain the difference in the commit.
-- luacheck: std +busted
local helpers = require "helpers"

local bin = helpers.binary()
local root = helpers.root()
local capture = root .. "/examples/demo.cmcap"

-- name -> recipe and arguments.
local cases = {
  { "count", "count.lua" },
  { "count_per_process", "count.lua --per-process" },
  { "top_kernels", "top_kernels.lua" },
  { "top_kernels_full_names", "top_kernels.lua --full-names" },
  { "top_kernels_mangled_top3", "top_kernels.lua --mangled --top 3" },
  { "memcpy_bw", "memcpy_bw.lua" },
  { "memcpy_bw_no_hist", "memcpy_bw.lua --no-hist" },
  -- Stream 14's operations arrive out of start order (kernels, copies and memsets come in
  -- separate batches): its span was once an unsigned subtraction below zero, 18446744073709532 us.
  -- (timeline.lua writes a trace file now: spec/timeline_spec.lua checks it.)
  { "idle", "idle.lua" },
  { "idle_gap_1000", "idle.lua --gap-us 1000" },
  { "idle_interval_1_top_3", "idle.lua --interval 1 --top 3" },
  { "api_latency", "api_latency.lua" },
  { "api_latency_driver", "api_latency.lua --driver" },
}

local function read(path)
  local f = assert(io.open(path, "rb"))
  local s = f:read("*a")
  f:close()
  return s
end

describe("recipes on examples/demo.cmcap", function()
  for _, c in ipairs(cases) do
    local name, cmd = c[1], c[2]
    it(name .. ": " .. cmd, function()
      local recipe, rest = cmd:match("^(%S+)(.*)$")
      local rc, out = helpers.sh(("%s --replay %s %s/scripts/%s%s"):format(bin, capture, root,
        recipe, rest))
      assert.are.equal(0, rc, out)
      assert.are.equal(read(root .. "/spec/fixtures/demo/" .. name .. ".out"), out)
    end)
  end

  it("idle: no span or gap wraps below zero on the out-of-order stream", function()
    local rc, out = helpers.sh(("%s --replay %s %s/scripts/idle.lua"):format(bin, capture, root))
    assert.are.equal(0, rc, out)
    assert.matches("\n%s+0%s+14%s+393%s+4748%.9%s+3221%.9%s+67%.8%s+29%s+225%.1\n", out)
    assert.is_nil(out:match("%d%d%d%d%d%d%d%d%d%d"), out) -- no 10-digit value anywhere
  end)
end)
