-- The duty cycle of spec/gpu/duty_slowdown.sh (duty 0.05, 500 ms in every 10 s, the recipes'
-- period): one line per window, "W wall_end=S ms=M ok=B traced_ms=T kernels=N changes=C
-- change_ms=D max_ms=X", with S the wall clock in seconds when the monitor learned the window had
-- closed and M how long the monitor saw it open, so that the window's seconds can be lined up with
-- duty_train.py's PROGRESS lines; C, D and X are the agent's kind changes so far, the time CUPTI's
-- enable and disable calls took in all, and the longest (cm.stats()).
local cm = require "cuptimon"
local uv = require "luv"
assert(cm.duty{ on_ms = tonumber(os.getenv("DUTY_ON_MS")) or 500,
  period_ms = tonumber(os.getenv("DUTY_PERIOD_MS")) or 10000, seed = 1,
  select = { kernel = { "start", "stop" } },
  fn = function() end,
  window = function(w)
    local s, us = uv.gettimeofday()
    local st = cm.stats() or {}
    print(("W wall_end=%.3f ms=%d ok=%s traced_ms=%.2f kernels=%d changes=%d change_ms=%.1f max_ms=%.1f")
      :format(s + us / 1e6, w.ms or -1, tostring(w.ok), w.traced_ms or -1,
        w.by_kind.concurrent_kernel or 0, st.kind_changes or 0, (st.kind_change_ns or 0) / 1e6,
        (st.kind_change_max_ns or 0) / 1e6))
    io.stdout:flush()
  end })
