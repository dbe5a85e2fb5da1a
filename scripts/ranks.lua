-- ranks.lua: the processes of a distributed job side by side, one row per rank, and the
-- straggler among them: step time, GPU busy %, time in communication kernels and time waiting in
-- them.
--
-- Usage: cuptimon-lua scripts/ranks.lua [--step NAME | --step-kernel NAME] [--threshold F]
--          [--consecutive N] [--interval MS] [--format FMT] -- torchrun --nproc-per-node 2 train.py
--        cuptimon-lua --replay run.1.cmcap --replay run.2.cmcap scripts/ranks.lua
--        cuptimon-lua --replay run.1.cmcap --replay run.2.cmcap scripts/ranks.lua --format json
--
-- Arguments:
--   --step NAME         a step is an NVTX range of this name (default "step")
--   --step-kernel NAME  without NVTX: a step runs from one launch of this kernel (its short name,
--                       as top.lua prints it, or its mangled name) to the next; overrides --step
--   --threshold F       a rank straggles in a step when its own time exceeds the median of the
--                       other ranks' by this fraction (default 0.15)
--   --consecutive N     ... for N steps running (default 3); the straggler line is printed then
--   --interval MS       show the table every MS milliseconds (default 2000; 0: only at exit);
--                       on a terminal the screen is redrawn in place
--   --format FMT        text (aligned table, the default), csv, or json (an object per row): the
--                       table's rows, values unformatted ("-" is empty or null), with the times
--                       each rank was flagged (stragglers) and, with --interval, the refresh
--                       (1, 2, ..., "exit"); the straggler lines go to stderr
--
-- A rank is a process: its rank and local rank come from its RANK and LOCAL_RANK environment
-- variables (torchrun sets them; "-" when unset), its device is the one its kernels ran on.
-- Columns: steps seen, kernels seen, step time median and last (ms), busy % (the share of the span from its
-- first kernel to its last covered by at least one kernel), comm_ms (time in NCCL kernels,
-- names starting ncclDevKernel_ or ncclKernel_) and wait_ms (the part of it spent waiting for
-- other ranks).
--
-- Waiting: the ranks of a job launch the same collectives in the same order, so the n-th NCCL
-- kernel of each rank is the same collective. It lasts until the last rank has joined, plus the
-- transfer: the shortest of the n-th kernels is the transfer alone, and what a rank spent beyond
-- it is its wait. A synchronous job stretches every rank's step to the slowest one's, so the
-- straggler test compares each rank's own time, its step time less its waiting in that step (the
-- collectives launched between the step's start and the next step's start): a rank straggles in
-- a step when its own time exceeds the median of the other ranks' own times by --threshold, and
-- after --consecutive steps running one line names it, e.g.
--   straggler: rank 1 (pid 4243, device 1) steps 4-6: own time 22.4 ms, 412% over the median
--   2.1 ms of the other ranks (step 24.6 ms, waiting 0.1 ms)
-- Steps are compared by index (the k-th step of every rank), once every rank has begun two
-- steps more (at exit, all of them). The number of ranks expected is WORLD_SIZE when set, else
-- the processes seen; collectives are matched once that many ranks launched them (at exit, with
-- those that did). Memory is bounded by the lag between the ranks.
--
-- Example output (spec/fixtures/ranks: two fake ranks, rank 1 slower by 1 ms per step):
--   straggler: rank 1 (pid 24184, device 1) steps 1-3: own time 3.00 ms, 50% over the median
--     2.00 ms of the other ranks (step 3.00 ms, waiting 0.00 ms)
--   == at exit
--   rank local   pid device steps kernels step_med_ms step_last_ms  busy% comm_ms wait_ms
--      0     0 24183      0     8      16       3.000        3.000   81.2   11.20    8.00
--      1     1 24184      1     8      16       3.000        3.000   81.2    3.20    0.00
--   stragglers: rank 1 (pid 24184, device 1) 1 time
local cm = require "cuptimon"
local agg = require "cuptimon.agg"
local args = require "cuptimon.args"
local tabulate = require "cuptimon.table"
local nvtx = require "cuptimon.nvtx"
local bit = require "bit"
local ffi = require "ffi"

local opts = args.parse(arg, args.with_output {
  step = { "step", "the NVTX range that makes a step" },
  step_kernel = { "", "the kernel whose launches separate steps (instead of NVTX ranges)" },
  threshold = { 0.15, "how much slower than the others' median a straggler's step is", min = 0 },
  consecutive = { 3, "how many steps running a straggler must be slow", min = 1, integer = true },
  interval = { 2000, "show the table every this many milliseconds (0: only at exit)", min = 0,
    integer = true },
})
args.output(opts, "ranks.lua")
local by_kernel = opts.step_kernel ~= ""
local text = tabulate.output() == "text"
-- Lines beside the table (straggler lines, the summary): on stdout in text output, on stderr in
-- csv or json output, where stdout holds the rows alone.
local function say(line)
  (text and io.stdout or io.stderr):write(line, "\n")
end
local LAG = 2         -- steps every rank must have begun beyond one before it is judged
local MAX_PENDING = 65536 -- unmatched collectives (and range ends, credits) kept per rank at most
local START, END = nvtx.START, nvtx.END

local int64 = ffi.typeof("int64_t")
-- Nanoseconds from timestamp `base` to timestamp `t` (both uint64), negative when t is earlier.
local function since(t, base) return tonumber(ffi.cast(int64, t - base)) end

local ranks = {}      -- source id -> rank state
local order = {}      -- rank states in order of appearance
local colls = {}      -- collective ordinal -> { n = ranks seen, [source] = { rank, start, dur } }
local coll_lo, coll_hi = 1, 0 -- the ordinals waiting to be matched
local judged = 0      -- steps judged so far (step indices 1..judged)
local stragglers = {} -- lines printed
local changed = false
local range_names, nrange_names = {}, 0 -- NVTX range names seen (up to 8), for the no-step line

local function rank_of(b, t0)
  local r = ranks[b.source]
  if r then return r end
  local p = b:process() or {}
  local env = p.env or {}
  r = { source = b.source, pid = p.pid or 0, rank = tonumber(env.RANK),
    local_rank = tonumber(env.LOCAL_RANK), world = tonumber(env.WORLD_SIZE),
    local_world = tonumber(env.LOCAL_WORLD_SIZE) or tonumber(env.WORLD_SIZE), base = t0,
    devices = {}, steps = {}, ranges = nvtx.pairing { pending = MAX_PENDING }, begun = 0, done = 0,
    dur = agg.sketch(), last = nil, cover = nil, busy = 0, span_lo = nil,
    span_hi = nil, comm = 0, wait = 0, ncoll = 0, credits = {}, streak = 0, streak_from = 0,
    flagged = 0, kernels = 0, matched_t = nil }
  ranks[b.source] = r
  order[#order + 1] = r
  return r
end

local function label(r)
  return ("rank %s (pid %d, device %s)"):format(r.rank or "-", r.pid, r.device_text or "-")
end

-- Step k of rank r begins at `t` (ns from the rank's base).
local function step_begin(r, k, t)
  r.steps[k] = r.steps[k] or {}
  r.steps[k].start = t
  if k > r.begun then r.begun = k end
end

-- Step k of rank r ends at `t` (a step already judged and forgotten is not counted).
local function step_end(r, k, t)
  local s = r.steps[k]
  if not s then return end
  s.stop = t
  local d = t - s.start
  r.dur:add(d)
  r.last = d
  r.done = r.done + 1
  changed = true
end

local function on_marker(b)
  if b.n == 0 then return end
  local r = rank_of(b, b.timestamp[0])
  local flags, ts, id = b.flags, b.timestamp, b.id
  for i = 0, b.n - 1 do
    local f, mid, t = tonumber(flags[i]), tonumber(id[i]), since(ts[i], r.base)
    if bit.band(f, START) ~= 0 then
      local name = b:str("name", i)
      if name and not range_names[name] and nrange_names < 8 then
        range_names[name] = true
        nrange_names = nrange_names + 1
      end
      if name == opts.step then
        local k = r.begun + 1
        step_begin(r, k, t)
        local stop = r.ranges:start(mid, k)
        if stop then step_end(r, k, stop) end
      end
    elseif bit.band(f, END) ~= 0 then
      -- An end before its start (the threads' buffers arrive in any order), or the end of a
      -- range of another name: kept until a start claims it, at most MAX_PENDING of them.
      local k = r.ranges:stop(mid, t)
      if k then step_end(r, k, t) end
    end
  end
end

local function is_comm(name)
  return name:sub(1, 14) == "ncclDevKernel_" or name:sub(1, 11) == "ncclKernel_"
end

local expected -- the number of ranks a collective waits for

local function ranks_expected()
  local world, n = 0, 0
  for _, r in ipairs(order) do
    if r.world and r.world > world then world = r.world end
    if r.ncoll > 0 then n = n + 1 end
  end
  return world > 0 and world or n
end

-- Matches collective `n` (its kernels seen so far): the shortest is the transfer, the rest of
-- each rank's kernel is its wait, credited to the rank and, at evaluation, to its step.
local function match(n)
  local c = colls[n]
  colls[n] = nil
  if not c then return end
  local least = math.huge
  for _, e in pairs(c) do
    if type(e) == "table" and e.dur < least then least = e.dur end
  end
  for _, e in pairs(c) do
    if type(e) == "table" then
      local w = e.dur - least
      local credits = e.r.credits
      e.r.wait = e.r.wait + w
      if not e.r.matched_t or e.start > e.r.matched_t then e.r.matched_t = e.start end
      if #credits >= MAX_PENDING then table.remove(credits, 1) end
      credits[#credits + 1] = { e.start, w }
    end
  end
  changed = true
end

local function on_comm(r, t, dur)
  r.comm = r.comm + dur
  r.ncoll = r.ncoll + 1
  local n = r.ncoll
  if n < coll_lo then return end -- matched already without this rank: its wait is unknown
  local c = colls[n]
  if not c then
    c = { n = 0 }
    colls[n] = c
    if n > coll_hi then coll_hi = n end
  end
  c[r.source] = { r = r, start = t, dur = dur }
  c.n = c.n + 1
  expected = ranks_expected()
  while coll_lo <= coll_hi do
    local lo = colls[coll_lo]
    if lo and lo.n < expected and coll_hi - coll_lo < MAX_PENDING then break end
    match(coll_lo)
    coll_lo = coll_lo + 1
  end
end

-- The step-kernel name matches in the short form or as CUPTI reports it.
local function is_step_kernel(b, i)
  return b:kernel_name(i) == opts.step_kernel or b:kernel_name(i, "mangled") == opts.step_kernel
end

cm.observe({ kernel = { "name", "start", "stop", "device" } }, function(b)
  if b.n == 0 then return end
  local start, stop, device = b.start, b.stop, b.device
  local r = rank_of(b, start[0])
  r.kernels = r.kernels + b.n
  for i = 0, b.n - 1 do
    local a, e = since(start[i], r.base), since(stop[i], r.base)
    local d = tonumber(device[i])
    if not r.devices[d] then
      r.devices[d] = true
      local list = {}
      for k in pairs(r.devices) do list[#list + 1] = k end
      table.sort(list)
      r.device_text = table.concat(list, ",")
    end
    if not r.span_lo or a < r.span_lo then r.span_lo = a end
    if not r.span_hi or e > r.span_hi then r.span_hi = e end
    if not r.cover or a >= r.cover then
      r.busy, r.cover = r.busy + (e - a), e
    elseif e > r.cover then
      r.busy, r.cover = r.busy + (e - r.cover), e
    end
    local name = b:kernel_name(i)
    if is_comm(name) then on_comm(r, a, e - a) end
    if by_kernel and is_step_kernel(b, i) then
      local k = r.begun + 1
      if k > 1 then step_end(r, k - 1, a) end
      step_begin(r, k, a)
    end
  end
end)
if not by_kernel then
  cm.observe({ marker = { "flags", "timestamp", "id", "name" } }, on_marker)
end

-- The waiting credited to rank r within [lo, hi); credits before hi are then forgotten.
local function take_wait(r, lo, hi)
  local w, keep = 0, {}
  for _, c in ipairs(r.credits) do
    if c[1] < hi then
      if c[1] >= lo then w = w + c[2] end
    else
      keep[#keep + 1] = c
    end
  end
  r.credits = keep
  return w
end

local function median(list)
  table.sort(list)
  local n = #list
  if n == 0 then return nil end
  if n % 2 == 1 then return list[(n + 1) / 2] end
  return (list[n / 2] + list[n / 2 + 1]) / 2
end

-- Judges step k: each rank's own time against the median of the others'.
local function judge(k)
  local own, rows = {}, {}
  for _, r in ipairs(order) do
    local s = r.steps[k]
    if s and s.stop then
      local nxt = r.steps[k + 1]
      local w = take_wait(r, s.start, nxt and nxt.start or math.huge)
      local d = s.stop - s.start
      own[r] = d - w
      rows[#rows + 1] = { r = r, step = d, wait = w }
    end
  end
  for _, r in ipairs(order) do r.steps[k] = nil end -- judged: forgotten
  if #rows < 2 then return end
  for _, row in ipairs(rows) do
    local r, others = row.r, {}
    for _, o in ipairs(rows) do
      if o.r ~= r then others[#others + 1] = own[o.r] end
    end
    local med = median(others)
    if own[r] > med * (1 + opts.threshold) then
      if r.streak == 0 then r.streak_from = k end
      r.streak = r.streak + 1
      if r.streak == opts.consecutive then
        local line = ("straggler: %s steps %d-%d: own time %.2f ms, %.0f%% over the median %.2f "
          .. "ms of the other ranks (step %.2f ms, waiting %.2f ms)"):format(label(r),
          r.streak_from, k, own[r] / 1e6, med > 0 and 100 * (own[r] - med) / med or 0, med / 1e6,
          row.step / 1e6, row.wait / 1e6)
        stragglers[#stragglers + 1] = line
        r.flagged = r.flagged + 1
        say(line)
        io.stdout:flush()
      end
    else
      r.streak = 0
    end
  end
end

-- Whether the waiting within step k is known: when the job runs collectives, each rank has had
-- one matched that began at or after its next step began (collectives match in launch order).
local function waits_known(k)
  if coll_hi == 0 then return true end
  for _, r in ipairs(order) do
    local nxt = r.steps[k + 1]
    if nxt and r.ncoll > 0 and (not r.matched_t or r.matched_t < nxt.start) then return false end
  end
  return true
end

-- Judges every step that all ranks have passed by LAG steps and whose waiting is known (at exit:
-- every step), once every rank of the node has connected.
local function evaluate(final)
  -- A rank that has not connected yet (a slower start) would miss the steps judged without it:
  -- while fewer processes than LOCAL_WORLD_SIZE (else WORLD_SIZE) are here, nothing is judged.
  local here_expected = 0
  for _, r in ipairs(order) do
    if r.local_world and r.local_world > here_expected then here_expected = r.local_world end
  end
  if not final and #order < here_expected then return end
  local upto = math.huge
  for _, r in ipairs(order) do
    if r.begun > 0 then upto = math.min(upto, final and r.begun or r.begun - LAG) end
  end
  if upto == math.huge then return end
  while judged < upto and (final or waits_known(judged + 1)) do
    judged = judged + 1
    judge(judged)
  end
end

local function sorted()
  local list = {}
  for _, r in ipairs(order) do list[#list + 1] = r end
  table.sort(list, function(a, b)
    if (a.rank or math.huge) ~= (b.rank or math.huge) then
      return (a.rank or math.huge) < (b.rank or math.huge)
    end
    return a.pid < b.pid
  end)
  return list
end

local refreshes = 0 -- the tables shown by --interval

-- The table; `final` at exit. Machine-readable rows carry numbers (rank and local rank nil when
-- unset), the times each rank was flagged, and their refresh with --interval.
local function report(final)
  local cols = {
    { "rank", "%s", width = 4, align = "right" }, { "local", "%s", width = 5 },
    { "pid", "%d", width = 5 }, { "device", "%s", width = 6 }, { "steps", "%d", width = 5 },
    { "kernels", "%d", width = 7 },
    { "step_med_ms", "%.3f", width = 11 }, { "step_last_ms", "%.3f", width = 12 },
    { "busy%", "%.1f", width = 6 }, { "comm_ms", "%.2f", width = 7 },
    { "wait_ms", "%.2f", width = 7 },
  }
  if not text then cols[#cols + 1] = { "stragglers", "%d" } end
  local t = tabulate.new(cols, { context = {
    refresh = opts.interval > 0 and (final and "exit" or refreshes) or nil } })
  for _, r in ipairs(sorted()) do
    local span = r.span_hi and r.span_hi - r.span_lo or 0
    local rank, local_rank, device = r.rank, r.local_rank, r.device_text
    if text then
      rank, local_rank = rank and tostring(rank) or "-", local_rank and tostring(local_rank) or "-"
      device = device or "-"
    else
      device = tonumber(device) or device -- a number, unless the rank used several ("0,1")
    end
    t:add(rank, local_rank, r.pid, device, r.done, r.kernels,
      r.done > 0 and r.dur:quantile(0.5) / 1e6 or nil, r.last and r.last / 1e6,
      span > 0 and math.min(100, 100 * r.busy / span) or 0, r.comm / 1e6, r.wait / 1e6, r.flagged)
  end
  t:print()
end

if opts.interval > 0 then
  local tty = require("luv").guess_handle(1) == "tty" and text
  cm.every(opts.interval, function()
    evaluate(false)
    if not changed then return end
    changed = false
    refreshes = refreshes + 1
    if tty then
      io.write("\27[H\27[2J")
      for _, line in ipairs(stragglers) do print(line) end
    else
      tabulate.note(("== %s, every %d ms"):format(os.date("!%Y-%m-%dT%H:%M:%SZ"), opts.interval))
    end
    report(false)
    if not tty then tabulate.note("") end
    io.stdout:flush()
  end)
end

cm.on("exit", function()
  if cm.command_failed() then return end -- the one-line error says it all
  for n = coll_lo, coll_hi do match(n) end
  evaluate(true)
  if opts.interval > 0 then tabulate.note("== at exit") end
  if #order == 0 then
    say("no ranks")
    return
  end
  report(true)
  -- No rank began a step: the table has no step figures, and the straggler test saw nothing,
  -- so there is no "no straggler" line; one line says how to get steps.
  local begun = 0
  for _, r in ipairs(order) do begun = begun + r.begun end
  if begun == 0 then
    local seen = {}
    for name in pairs(range_names) do seen[#seen + 1] = ("%q"):format(name) end
    table.sort(seen)
    io.stderr:write(by_kernel and ("ranks.lua: no step: no launch of a kernel named %q; "
      .. "--step-kernel takes a name as top.lua shows it\n"):format(opts.step_kernel)
      or ("ranks.lua: no step: no NVTX range named %q (%s); name the step's range with "
      .. "--step NAME, or count steps by the launches of one kernel with --step-kernel NAME\n")
      :format(opts.step, #seen > 0 and "the ranges seen: " .. table.concat(seen, ", ")
        .. (nrange_names >= 8 and ", ..." or "") or "the run has no NVTX ranges"))
    cm.exit(1)
    return
  end
  local names = {}
  for _, r in ipairs(sorted()) do
    if r.flagged > 0 then
      names[#names + 1] = ("%s %d time%s"):format(label(r), r.flagged, r.flagged > 1 and "s" or "")
    end
  end
  say(#names > 0 and ("stragglers: " .. table.concat(names, ", ")) or "no straggler")
end)
