-- count.lua: count the records of each activity kind (the simplest check that tracing works).
--
-- Usage: cuptimon-lua scripts/count.lua [--kinds k1,k2] [--per-process] [--budget N] -- cmd args...
--        cuptimon-lua --attach all scripts/count.lua --duty 0.05 [--period-ms 10000]
--        cuptimon-lua --replay run.cmcap scripts/count.lua
--
-- Arguments:
--   --kinds LIST      comma-separated kinds to count (default: the common ones)
--   --per-process     one table per process as well as the total, each under the process's
--                     title line ("pid 4242 (/usr/bin/python3)")
--   --format FMT      text (aligned tables, the default), csv, or json (an object per row); a
--                     process's rows carry its pid
--   --budget N        shed kinds (--shed, in order) of a process above N records per second,
--                     and say so under the table
--   --duty F          trace only a window of F x --period-ms in each period (at a seeded random
--                     offset, --seed) and print one line per kind at exit instead of the table:
--                       estimated concurrent_kernel 1204310 ± 8120 (95%, 36 windows)
--                     then the duty, windows so far and traced against elapsed time
--
-- Example output:
--   kind                        records
--   concurrent_kernel               300
--   marker                           67
--   memcpy                           66
--   memset                           61
--   runtime                         629
--   synchronization                  64
--   total                          1187
local cm = require "cuptimon"
local args = require "cuptimon.args"
local tabulate = require "cuptimon.table"

local opts = args.parse(arg, args.with_output(args.with_duty(args.with_budget {
  kinds = { "kernel,memcpy,memcpy2,memset,runtime,driver,synchronization,cuda_event,marker,overhead",
    "comma-separated kinds to count" },
  per_process = { false, "also print the counts of each process" },
})))
args.output(opts, "count.lua")
cm.budget_from(opts)
-- --duty: windows and estimates instead of every record (cuptimon.sampling).
if opts.duty > 0 then return require("cuptimon.sampling").count_main(opts, args.list(opts.kinds)) end

-- One cheap field per kind: the count needs only b.n.
local sel = {}
for _, name in ipairs(args.list(opts.kinds)) do
  local k = cm.registry.kind(name)
  if not k then
    args.usage_error(("count.lua: unknown kind %q; valid kinds: %s")
      :format(name, table.concat(cm.registry.kind_names(), ", ")))
  end
  sel[name] = { k.by_name.start and "start" or k.fields[0].name }
end

local total = cm.count_by()  -- kind name -> records
local by_pid = {}            -- pid -> count_by kind name
local titles = {}            -- pid -> the process's title line

cm.observe(sel, function(b)
  total:add(b.kind, b.n)
  if opts.per_process then
    local p = b:process()
    local pid = p and p.pid or 0
    if not by_pid[pid] then
      by_pid[pid] = cm.count_by()
      titles[pid] = cm.process_title(p)
    end
    by_pid[pid]:add(b.kind, b.n)
  end
end)

local function print_table(title, counts, context)
  local t = tabulate.new({ { title, width = 24 }, { "records", "%d", width = 10 } },
    { context = context })
  for _, e in ipairs(counts:sorted(nil, "key")) do t:add(e.key, e.count) end
  t:add("total", counts:total())
  t:print()
end

cm.on("exit", function()
  if cm.command_failed() then return end -- the one-line error says it all
  if opts.per_process then
    local pids = {}
    for pid in pairs(by_pid) do pids[#pids + 1] = pid end
    table.sort(pids)
    for _, pid in ipairs(pids) do
      tabulate.note(titles[pid])
      print_table("kind", by_pid[pid], { pid = pid })
      tabulate.note("")
    end
  end
  print_table("kind", total, opts.per_process and { pid = "all" } or nil)
  -- In csv or json output the notes go to stderr: stdout holds the data alone.
  local notes = tabulate.output() == "text" and io.stdout or io.stderr
  cm.print_shed_notes(notes)
  cm.print_lag_notes(notes)
end)
