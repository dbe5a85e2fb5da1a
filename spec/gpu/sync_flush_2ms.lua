-- sync_flush_2ms.lua: traces kernels and the runtime API and asks every agent for a sync flush
-- every 2 ms, the monitor behaviour that used to invalidate the application's CUDA graph captures
-- (issue 9, item 6). Prints how many flushes completed and how many kernels arrived.
--
-- Usage: cuptimon-lua spec/gpu/sync_flush_2ms.lua -- python3 spec/gpu/torch_graphs.py 300
local cm = require "cuptimon"
local kernels, flushes, inflight = 0, 0, false
cm.observe({ kernel = { "name", "start", "stop" }, runtime = { "cbid" } }, function(b)
  if b.kind ~= "runtime" then kernels = kernels + b.n end
end)
cm.every(2, function()
  if inflight then return end
  inflight = true
  cm.flush{ sync = true, done = function() flushes = flushes + 1; inflight = false end }
end)
cm.on("exit", function()
  print(("GOT sync_flushes %d kernels %d"):format(flushes, kernels))
end)
