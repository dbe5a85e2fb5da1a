-- spec/renew_spec.lua: CUPTIMON_RENEW_S, the agent renewing CUPTI under a running trace
-- (cm_cupti_renew; docs/agent.md, "Renewing CUPTI under a long trace"), end to end with the real
-- agent, scripts/count.lua and fake_cuda_app --steady-ms, which launches at a steady rate and
-- reports every record the fake CUPTI took (its kinds on) and the runs of them between gaps.
-- luacheck: std +busted
local helpers = require "helpers"

local bin = helpers.binary()
local root = helpers.root()
local app, no_app = helpers.agent_app()

local pairs_of = helpers.pairs_of

-- The script's count of one kind (count.lua's table row), or nil.
local function counted(out, kind) return tonumber(out:match("\n" .. kind .. "%s+(%d+)")) end

describe("CUPTIMON_RENEW_S", function()
  it("renews CUPTI every period: every record written reaches the script, and the gaps are said", function()
    if not app then return pending(no_app) end
    local rc, out = helpers.sh(("CUPTIMON_RENEW_S=1 %s %s/scripts/count.lua -- %s --steady-ms 3500 "
      .. "--kernel-rate 4000"):format(bin, root, app))
    assert.are.equal(0, rc, out)
    local a = pairs_of(out, "fake_cuda_app:")
    -- One renewal per second of tracing (the first second starts at the connection), each a
    -- cuptiFinalize at the API exit of the agent's own driver call with nothing left in CUPTI,
    -- no CUPTI call while finalized, and a new subscription after it.
    assert.is_true(a.finalize >= 2 and a.finalize <= 4, out)
    assert.are.equal(a.finalize, a.finalize_in_callback, out)
    assert.are.same({ 0, 0, 0 }, { a.finalize_lost, a.finalize_buffers, a.calls_finalized }, out)
    assert.are.equal(a.finalize + 1, a.subscribes, out)
    -- Every record the fake took, in the gaps' runs or not, reached the script; none was lost.
    assert.are.equal(a.concurrent_kernel, counted(out, "concurrent_kernel"), out)
    assert.are.equal(a.memcpy, counted(out, "memcpy"), out)
    assert.are.equal(0, a.dropped, out)
    assert.is_nil(out:find("LOST"), out)
    -- The monitor warned at the first renewal, and the end sums them with the untraced time.
    assert.is_truthy(out:find("its agent renewed CUPTI (CUPTIMON_RENEW_S)", 1, true), out)
    local n = tonumber(out:match("note: the agent of pid %d+ renewed CUPTI (%d+) times? %(CUPTIMON_RENEW_S%)"))
    assert.are.equal(a.finalize, n, out)
  end)

  it("is off by default and with 0, and a bad value is said and ignored", function()
    if not app then return pending(no_app) end
    for _, env in ipairs { "", "CUPTIMON_RENEW_S=0 ", "CUPTIMON_RENEW_S=soon " } do
      local rc, out = helpers.sh(("%s%s %s/scripts/count.lua -- %s --steady-ms 1200 --kernel-rate 2000")
        :format(env, bin, root, app))
      assert.are.equal(0, rc, out)
      local a = pairs_of(out, "fake_cuda_app:")
      assert.are.equal(0, a.finalize, out)
      assert.are.equal(a.launched, a.concurrent_kernel, out)
      assert.is_nil(out:find("renewed CUPTI"), out)
      if env:find("soon") then
        assert.is_truthy(out:find("CUPTIMON_RENEW_S=soon is not an integer", 1, true), out)
      end
    end
  end)
end)
