-- Each window of a duty cycle (100 ms every 500 ms) over the launch loop: its traced time, its
-- kernels, their rate per traced ms, and the span of their starts (spec/gpu/duty_window_rate.sh).
local cm = require "cuptimon"
local first, last = math.huge, 0
assert(cm.duty{ on_ms = 100, period_ms = 500, seed = 1,
  select = { kernel = { "start", "stop" } },
  fn = function(b)
    local c = b.start
    for i = 0, b.n - 1 do
      local t = tonumber(c[i])
      if t < first then first = t end
      if t > last then last = t end
    end
  end,
  window = function(w)
    local n = w.by_kind.concurrent_kernel or 0
    print(("W ok=%s traced_ms=%.2f kernels=%d rate_per_ms=%.1f span_ms=%.2f"):format(tostring(w.ok),
      w.traced_ms or -1, n, n / (w.traced_ms or 1), (last - first) / 1e6))
    first, last = math.huge, 0
  end })
