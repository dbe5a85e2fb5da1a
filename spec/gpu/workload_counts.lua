-- workload_counts.lua: prints what the traced processes did, as "GOT" lines that
-- spec/gpu/compare.py matches against gpu_plain_workload's "EXPECT" lines.
--
-- Usage: cuptimon-lua spec/gpu/workload_counts.lua -- build/gpu/gpu_plain_workload
--        cuptimon-lua --replay run.cmcap spec/gpu/workload_counts.lua
local cm = require "cuptimon"

local kernels = {}  -- name -> count
local copies = {}   -- copy kind -> { count, bytes }
local sets = { count = 0, bytes = 0 }
local bad_order = 0

cm.observe({
  kernel = { "name", "start", "stop" },
  memcpy = { "copy_kind", "bytes", "start", "stop" },
  memset = { "bytes" },
}, function(b)
  if b.kind == "concurrent_kernel" then
    local start, stop = b.start, b.stop
    for i = 0, b.n - 1 do
      local nm = b:str("name", i) or "?"
      kernels[nm] = (kernels[nm] or 0) + 1
      if stop[i] < start[i] or start[i] == 0 then bad_order = bad_order + 1 end
    end
  elseif b.kind == "memcpy" then
    local ck, bytes = b.copy_kind, b.bytes
    for i = 0, b.n - 1 do
      local k = tonumber(ck[i])
      local c = copies[k] or { count = 0, bytes = 0 }
      copies[k] = c
      c.count = c.count + 1
      c.bytes = c.bytes + tonumber(bytes[i])
    end
  else
    local bytes = b.bytes
    for i = 0, b.n - 1 do
      sets.count = sets.count + 1
      sets.bytes = sets.bytes + tonumber(bytes[i])
    end
  end
end)

cm.on("exit", function()
  local names = {}
  for nm in pairs(kernels) do names[#names + 1] = nm end
  table.sort(names)
  for _, nm in ipairs(names) do print(("GOT kernel %s %d"):format(nm, kernels[nm])) end
  local kinds = {}
  for k in pairs(copies) do kinds[#kinds + 1] = k end
  table.sort(kinds)
  for _, k in ipairs(kinds) do
    print(("GOT memcpy %d %d %d"):format(k, copies[k].count, copies[k].bytes))
  end
  print(("GOT memset %d %d"):format(sets.count, sets.bytes))
  print(("GOT bad_order %d"):format(bad_order))
end)
