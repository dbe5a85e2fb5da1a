-- count.lua: count the records of each activity kind (the simplest check that tracing works).
--
-- Usage: cuptimon-lua scripts/count.lua [--kinds k1,k2] [--per-process] -- cmd args...
--        cuptimon-lua --replay run.cmcap scripts/count.lua
--
-- Arguments:
--   --kinds LIST      comma-separated kinds to count (default: the common ones)
--   --per-process     one table per process (pid) as well as the total
--
-- Example output:
--   kind                      records
--   concurrent_kernel           50000
--   memcpy                      50000
--   total                      100000
local cm = require "cuptimon"
local args = require "cuptimon.args"

local opts = args.parse(arg, {
  kinds = { "kernel,memcpy,memcpy2,memset,runtime,driver,synchronization,cuda_event,marker,overhead",
    "comma-separated kinds to count" },
  per_process = { false, "also print the counts of each process" },
})

-- One cheap field per kind: the count needs only b.n.
local sel = {}
for _, name in ipairs(args.list(opts.kinds)) do
  local k = cm.registry.kind(name)
  if not k then
    io.stderr:write(("count.lua: unknown kind %q; valid kinds: %s\n")
      :format(name, table.concat(cm.registry.kind_names(), ", ")))
    os.exit(2)
  end
  sel[name] = { k.by_name.start and "start" or k.fields[0].name }
end

local total = {}     -- kind name -> records
local by_pid = {}    -- pid -> kind name -> records

cm.observe(sel, function(b)
  total[b.kind] = (total[b.kind] or 0) + b.n
  if opts.per_process then
    local p = b:process()
    local pid = p and p.pid or 0
    local t = by_pid[pid]
    if not t then
      t = {}
      by_pid[pid] = t
    end
    t[b.kind] = (t[b.kind] or 0) + b.n
  end
end)

local function print_table(title, t)
  local names, sum = {}, 0
  for k, n in pairs(t) do
    names[#names + 1] = k
    sum = sum + n
  end
  table.sort(names)
  print(("%-24s %10s"):format(title, "records"))
  for _, k in ipairs(names) do print(("%-24s %10d"):format(k, t[k])) end
  print(("%-24s %10d"):format("total", sum))
end

cm.on("exit", function()
  if opts.per_process then
    local pids = {}
    for pid in pairs(by_pid) do pids[#pids + 1] = pid end
    table.sort(pids)
    for _, pid in ipairs(pids) do
      print_table("pid " .. pid, by_pid[pid])
      print()
    end
  end
  print_table("kind", total)
end)
