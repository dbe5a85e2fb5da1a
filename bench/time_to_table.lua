-- bench/time_to_table.lua: scripts/top.lua with timestamps, for bench/time_to_table.py.
-- Prints, in CLOCK_REALTIME nanoseconds (microsecond resolution): PROCESS_EXIT_HOOK_REALTIME_NS
-- when a traced process's end reaches the script, EXIT_HOOK_REALTIME_NS when the script's exit
-- hooks begin, and TABLE_DONE_REALTIME_NS after top's table is printed. The workload prints its
-- own EXIT_REALTIME_NS as its last action (spec/gpu/torch_nvtx.py), so the difference is the
-- time from the process's exit to a table.
--
-- Usage: cuptimon-lua bench/time_to_table.lua [top.lua options] -- cmd args...
local cm = require "cuptimon"
local uv = require "luv"

local function realtime_ns()
  local s, us = uv.gettimeofday()
  return s * 1e9 + us * 1e3
end

cm.on("process_exit", function(p)
  print(("PROCESS_EXIT_HOOK_REALTIME_NS %.0f pid %s"):format(realtime_ns(), tostring(p.pid)))
end)
cm.on("exit", function() print(("EXIT_HOOK_REALTIME_NS %.0f"):format(realtime_ns())) end)
-- Hooks run in the order they were registered: top's table comes between the two exit hooks.
local here = debug.getinfo(1, "S").source:match("^@(.*/)") or "./"
dofile(here .. "../scripts/top.lua")
cm.on("exit", function() print(("TABLE_DONE_REALTIME_NS %.0f"):format(realtime_ns())) end)
