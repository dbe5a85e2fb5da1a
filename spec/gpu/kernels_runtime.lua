-- kernels_runtime.lua: traces kernels and runtime API calls and counts them; the tracing load of
-- the GPU check gpu_exit_spin_live.
local cm = require "cuptimon"
local kernels, calls = 0, 0
cm.observe({ kernel = { "name", "start", "stop" }, runtime = { "cbid", "start", "stop" } },
  function(b)
    if b.kind == "runtime" then calls = calls + b.n else kernels = kernels + b.n end
  end)
cm.on("exit", function() print(("GOT traced kernels %d runtime %d"):format(kernels, calls)) end)
