-- top.lua: the kernels that took the most GPU time, per process and device, by total duration.
--
-- Usage: cuptimon-lua scripts/top.lua [--top N] [--interval MS] [--full-names] [--mangled]
--          -- cmd args...
--        cuptimon-lua --replay run.cmcap scripts/top.lua
--        cuptimon-lua --attach all scripts/top.lua --duty 0.05 --interval 30000
--
-- Arguments:
--   --top N          how many kernels to show per table (default 10; at least 1)
--   --interval MS    also show the tables every MS milliseconds, with the interval's instances
--                    and time (+Instances, +Total) beside the totals; on a terminal the screen is
--                    redrawn in place, otherwise each refresh is a table headed by its time
--                    (default 0: only the final table at exit). On a replay, MS of trace time
--                    (the kernels' start times), as idle.lua's --interval
--   --full-names     show whole demangled signatures (default: name and template arguments)
--   --mangled        show the names as CUPTI reports them, mangled
--   --filter REGEX   only the kernels whose name (as shown) matches REGEX, a POSIX extended
--                    regular expression ("^cm_demo_(matmul|relu)"); Time (%) is then their share
--   --exclude REGEX  leave out the kernels whose name matches REGEX
--   --format FMT     text (aligned tables, the default), csv, or json (an object per row); each
--                    row carries its pid and device (and its refresh with --interval)
--   --sort BY        the order of the rows: total (time, the default), instances, avg, max, min,
--                    or name
--   --budget N       shed kinds (--shed, in order) of a process above N records per second,
--                    and say so under the tables
--   --duty F         trace only a window of F x --period-ms (default 10000) in each period, at
--                    a seeded random offset (--seed), and show estimates with 95% intervals:
--                    launches/s, GPU ms/s and launches since the start, each with a ± column,
--                    and a footer with the duty, the windows so far and traced against elapsed
--                    time (cuptimon.sampling; --interval refreshes them)
--
-- One table per process (pid and executable, and rank when its RANK environment variable is set:
-- "pid 4242 (/usr/bin/python3), rank 1, device 1") and device. The columns follow nsys stats'
-- cuda_gpu_kern_sum, in microseconds: Time (%) is the kernel's share of the summed duration of
-- all kernels of that process and device (concurrent kernels can make the sum exceed the wall
-- time); Med and P99 come from a quantile sketch (cuptimon.agg.sketch, within 1%).
--
-- Example output:
--   pid 601 (cuptimon_demo_cuda), device 0
--   Time (%) Total (us) Instances Avg (us) Med (us) P99 (us) Min (us) Max (us) Name
--       93.3       2863       150     19.1     21.0     30.0      5.2     30.1 cm_demo_matmul<16>
--        2.5         78        60      1.3      1.0      1.7      1.0      1.7 cm_demo_sgd_update<float>
--        1.5         48        30      1.6      1.6      1.7      1.6      1.7 cm_demo_loss_reduce
--        1.4         42        30      1.4      1.4      1.5      1.3      1.5 cm_demo_bias_relu
--        1.3         39        30      1.3      1.3      1.4      1.3      1.4 cm_demo_relu_backward
--   5 kernel names, 3069 us of kernel time
local cm = require "cuptimon"
local agg = require "cuptimon.agg"
local args = require "cuptimon.args"
local tabulate = require "cuptimon.table"

local ffi = require "ffi"

local opts = args.parse(arg, args.with_output(args.with_sort(args.with_filter(args.with_duty(args.with_budget {
  top = { 10, "how many kernels to show per table", min = 1, integer = true },
  interval = { 0, "show the tables every this many milliseconds (0: only at exit)", min = 0,
    integer = true },
  full_names = { false, "show whole demangled signatures" },
  mangled = { false, "show the names as CUPTI reports them, mangled" },
}), "kernels"))))
args.output(opts, "top.lua")
local names = args.filter(opts, "top.lua")
local order = args.sort_order(opts, "top.lua")
cm.budget_from(opts)
-- Live refreshes need records as they happen, not when CUPTI's buffers fill: the agents flush
-- twice per interval (at most every 100 ms; a budget's 250 ms cadence is kept when faster).
if opts.interval > 0 and opts.budget <= 0 then
  local ms = math.max(100, math.floor(opts.interval / 2))
  cm.configure { flush_ms = ms, deliver_ms = ms }
end
local form = opts.mangled and "mangled" or opts.full_names and "full" or "short"
-- --duty: windows and estimates instead of every record (cuptimon.sampling).
if opts.duty > 0 then return require("cuptimon.sampling").top_main(opts, form) end

-- group key ("pid:device") -> { title =, pid =, device =, names = stats_by, sketch = { name -> sketch } }
local groups = {}
-- group key -> { name -> { count, sum } } at the previous refresh, for the interval's deltas.
local last = {}

local function group_of(b, device)
  local p = b:process()
  local pid = p and p.pid or 0
  local key = pid .. ":" .. device
  local g = groups[key]
  if not g then
    g = { pid = pid, device = device, names = agg.stats_by(), sketch = {},
      title = ("%s, device %d"):format(cm.process_title(p), device) }
    groups[key] = g
  end
  return g
end

-- --interval on a replay counts trace time (a capture replays as fast as it is read, so wall time
-- says nothing): the tables are shown whenever the kernels' start times pass another interval
-- since the first kernel's; a gap of several intervals gives one table.
local replay = false
local trace_next, trace_base -- uint64 ns: the next boundary, the first start
local interval_ns = ffi.new("uint64_t", opts.interval * 1000000)
local refresh -- function(heading), set below
local refreshes = 0 -- how many refreshes were shown
local wall_timer

cm.observe({ kernel = { "name", "start", "stop", "device" } }, function(b)
  local start, stop, device = b.start, b.stop, b.device
  local g, gdev
  for i = 0, b.n - 1 do
    if replay and opts.interval > 0 then
      local s = start[i]
      if not trace_base then
        trace_base, trace_next = s + 0, s + interval_ns
      elseif s >= trace_next then
        refresh(("== trace time +%d ms, every %d ms"):format(
          tonumber(ffi.cast("int64_t", trace_next - trace_base)) / 1e6, opts.interval))
        while s >= trace_next do trace_next = trace_next + interval_ns end
      end
    end
    local name = b:kernel_name(i, form)
    if names:keep(name) then
      local d = device[i]
      if d ~= gdev then g, gdev = group_of(b, d), d end
      local dur = tonumber(stop[i] - start[i])
      g.names:add(name, dur)
      local s = g.sketch[name]
      if not s then
        s = agg.sketch()
        g.sketch[name] = s
      end
      s:add(dur)
    end
  end
end)

local function sorted_groups()
  local list = {}
  for k, g in pairs(groups) do list[#list + 1] = { key = k, g = g } end
  table.sort(list, function(a, b)
    if a.g.pid ~= b.g.pid then return a.g.pid < b.g.pid end
    return a.g.device < b.g.device
  end)
  return list
end

-- Prints the table of one group; with `deltas`, the interval's instances and time beside.
local function print_group(key, g, deltas)
  local all = g.names:total()
  local cols = { { "Time (%)", "%.1f", width = 8, align = "right" },
    { "Total (us)", "%.0f", width = 10 }, { "Instances", "%d", width = 9 } }
  if deltas then
    cols[#cols + 1] = { "+Total (us)", "%.0f", width = 11 }
    cols[#cols + 1] = { "+Instances", "%d", width = 10 }
  end
  for _, c in ipairs { "Avg (us)", "Med (us)", "P99 (us)", "Min (us)", "Max (us)" } do
    cols[#cols + 1] = { c, "%.1f", width = 8 }
  end
  cols[#cols + 1] = { "Name", align = "left" }
  -- Machine-readable rows say whose they are, and which refresh (1, 2, ..., "exit") with
  -- --interval.
  local t = tabulate.new(cols, { context = { pid = g.pid, device = g.device,
    refresh = opts.interval > 0 and (deltas and refreshes or "exit") or nil } })
  local prev = last[key] or {}
  local now = {}
  for _, e in ipairs(g.names:sorted(opts.top, order)) do
    local s = g.sketch[e.key]
    local row = { all > 0 and 100 * e.sum / all or 0, e.sum / 1e3, e.count }
    if deltas then
      local p = prev[e.key]
      row[#row + 1] = (e.sum - (p and p.sum or 0)) / 1e3
      row[#row + 1] = e.count - (p and p.count or 0)
    end
    for _, v in ipairs { e.avg, s:quantile(0.5), s:quantile(0.99), e.min, e.max } do
      row[#row + 1] = v / 1e3
    end
    row[#row + 1] = e.key
    t:add(unpack(row))
  end
  if deltas then
    for k, e in pairs(g.names.entries) do now[k] = { count = e.count, sum = e.sum } end
    last[key] = now
  end
  tabulate.note(g.title)
  t:print()
  tabulate.note(("%d kernel names, %.0f us of kernel time"):format(g.names:len(), all / 1e3))
end

-- Processes that connected (or were replayed): without any, "no kernels" would hide that no
-- CUDA process was traced at all.
local connected = 0
cm.on("process_start", function() connected = connected + 1 end)

local function report(deltas)
  local list = sorted_groups()
  if #list == 0 and connected == 0 and not cm.checking() then
    tabulate.note("no kernels: no CUDA process connected (the command ran no CUDA code, or the "
      .. "agent was not loaded into it: a static binary, or CUDA_INJECTION64_PATH cleared)")
  elseif #list == 0 then
    tabulate.note("no kernels")
  end
  for i, e in ipairs(list) do
    if i > 1 then tabulate.note("") end
    print_group(e.key, e.g, deltas)
  end
  -- In csv or json output the notes go to stderr: stdout holds the data alone.
  local notes = tabulate.output() == "text" and io.stdout or io.stderr
  cm.print_shed_notes(notes)
  cm.print_lag_notes(notes)
end

local tty = require("luv").guess_handle(1) == "tty" and tabulate.output() == "text"
refresh = function(heading)
  refreshes = refreshes + 1
  if tty then
    io.write("\27[H\27[2J") -- home and clear: the screen is redrawn in place
  else
    tabulate.note(heading)
  end
  report(true)
  if not tty then tabulate.note("") end
  io.stdout:flush()
end
local function replaying()
  if replay then return true end
  for _, s in ipairs(cm.sources()) do
    if s.kind == "replay" then
      replay = true
      if wall_timer then wall_timer:close() end
    end
  end
  return replay
end
if opts.interval > 0 then
  wall_timer = cm.every(opts.interval, function()
    -- Nothing to show before the first process attaches (and it may be a replay).
    if replaying() or #cm.sources() == 0 then return end
    refresh(("== %s, every %d ms"):format(os.date("!%Y-%m-%dT%H:%M:%SZ"), opts.interval))
  end)
  cm.on("process_start", replaying)
end
cm.on("exit", function()
  if cm.command_failed() then return end -- the one-line error says it all
  if opts.interval > 0 then tabulate.note("== at exit") end
  report(false)
end)
