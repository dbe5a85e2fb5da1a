-- script.lua: the script examples/embed_script runs in-process. It counts kernels per name
-- (demangled, as the recipes show them) and sums their durations (stop - start, in ns),
-- delivered every 20 ms, and prints both when the program shuts it down: the counts, then one
-- line that says what the sum is, in microseconds.
local cm = require "cuptimon"

cm.configure({ deliver_ms = 20 })
local per_name = cm.count_by("kernels by name")
local busy = cm.sum { name = "kernel time", unit = "ns" }
local total = 0

cm.observe({ kernel = { "name", "start", "stop" } }, function(b)
  local start, stop = b.start, b.stop
  for i = 0, b.n - 1 do
    busy:add(stop[i] - start[i])
    per_name:add(b:kernel_name(i)) -- demangled, as the recipes' tables show it
  end
  total = total + b.n
end)

cm.on("exit", function()
  print(("script: observed %d kernel records"):format(total))
  print(per_name)
  print(("script: %s (the summed duration, stop - start, of %d kernels): %.1f us"):format(busy.name,
    total, busy.sum / 1e3))
end)
