-- flush_every_2ms.lua: asks every traced process for a sync flush every 2 ms while it runs, and
-- counts kernels; the load of the graph-capture check (engine/tests/gpu/gpu_graph_capture.cu
-- --plain under cuptimon-lua): a sync flush must never break the application's graph captures.
local cm = require "cuptimon"
local kernels, flushes, failed = 0, 0, 0
cm.observe({ kernel = { "name", "start", "stop" } }, function(b) kernels = kernels + b.n end)
local timer = cm.every(2, function()
  flushes = flushes + 1
  cm.flush { sync = true, timeout_ms = 1000, done = function(ok) if not ok then failed = failed + 1 end end }
end)
cm.on("process_exit", function() timer:close() end)
cm.on("exit", function()
  print(("GOT flushes %d (%d not ok) kernels %d"):format(flushes, failed, kernels))
end)
