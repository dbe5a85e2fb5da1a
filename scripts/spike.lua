-- spike.lua: watch each kernel's duration and record a full trace of the moment it spikes.
--
-- Usage: cuptimon-lua scripts/spike.lua [--factor F] [--ms MS] [--record FILE] [--cooldown-ms MS]
--          [--min-count N] [--select KINDS] [--force] -- cmd args...
--
-- Arguments:
--   --factor F        a kernel spikes when the p99 of its durations over the last second exceeds
--                     F times its running median (default 3)
--   --ms MS           how long the full-trace window records (default 2000)
--   --record FILE     the capture of each window; %p becomes the pid (default spike.%p.cmcap)
--   --cooldown-ms MS  after a window opens, no other one in the same process for MS (default 30000)
--   --min-count N     instances a kernel needs in the last second, and in its history, before it
--                     is judged (default 20)
--   --select KINDS    the kinds the window records, with all their fields
--   --force           replace capture files that exist (a regular file only)
--
-- Per process and kernel name, the durations of the last second (four slots of 250 ms, sliding)
-- are compared with the kernel's history (a quantile sketch of everything older than that
-- second); the agents flush CUPTI's buffers every 100 ms so that the second is current. On a spike, a trigger window (cuptimon.window) widens the process's tracing to the
-- --select kinds for --ms, writes them to the capture, and narrows it back; when the window
-- closes, one line names the kernel, the process and the capture, which --replay reads like any
-- other. Live processes only (`-- cmd`): a capture cannot be re-traced, so --replay is refused
-- (status 2).
--
-- Example output (spec/headers_spec.lua's fake CUDA application, its vectorAdd slowed):
--   cuptimon-lua: recorded spike.21504.cmcap: 13 frames, 8 batches, 16000 records, 0 dropped
--   spike: pid 21504 (.../fake_cuda_app) kernel vectorAdd: p99 2.9 us > 3 x median 0.1 us
--     (1016 in the last second); recorded spike.21504.cmcap (2001 ms, 16000 records)
local cm = require "cuptimon"
local agg = require "cuptimon.agg"
local args = require "cuptimon.args"
local uv = require "luv"

local opts = args.parse(arg, {
  factor = { 3, "the multiple of the running median the last second's p99 must exceed", min = 1 },
  ms = { 2000, "how long the full-trace window records", min = 1, integer = true },
  record = { "spike.%p.cmcap", "the capture of each window (%p: the pid)" },
  cooldown_ms = { 30000, "no other window in the same process for this long", min = 0,
    integer = true },
  min_count = { 20, "instances needed in the last second and in the history", min = 1,
    integer = true },
  select = { "kernel,memcpy,memcpy2,memset,runtime,driver,synchronization,cuda_event,overhead",
    "the kinds the window records, with all their fields" },
  force = { false, "replace capture files that exist" },
})

local sel = {}
for _, name in ipairs(args.list(opts.select)) do
  if not cm.registry.kind(name) then
    args.usage_error(("spike.lua: unknown kind %q; valid kinds: %s")
      :format(name, table.concat(cm.registry.kind_names(), ", ")))
  end
  sel[name] = "all"
end

local STEP_MS, SLOTS = 250, 4 -- the sliding second
-- Records must arrive within a fraction of that second: CUPTI's buffers are flushed every 100 ms.
cm.configure { flush_ms = 100, deliver_ms = 100 }
local SLOT_CAP = 4096         -- durations kept per kernel and slot (a uniform sample beyond)
local cur = 1                 -- the slot being filled

-- pid -> { exe =, kernels = { name -> { slots = { {n =, seen =}, ... }, hist = sketch } },
--          cool_until =, open = }
local procs = {}

local function kernel_of(p, name)
  local k = p.kernels[name]
  if not k then
    k = { slots = {}, hist = agg.sketch() }
    for i = 1, SLOTS do k.slots[i] = { n = 0, seen = 0 } end
    p.kernels[name] = k
  end
  return k
end

cm.observe({ kernel = { "name", "start", "stop" } }, function(b)
  local pr = b:process()
  local pid = pr and pr.pid or 0
  local p = procs[pid]
  if not p then
    p = { exe = pr and pr.exe or "?", kernels = {}, cool_until = 0 }
    procs[pid] = p
  end
  local start, stop = b.start, b.stop
  local k, kname
  for i = 0, b.n - 1 do
    local name = b:kernel_name(i)
    if name ~= kname then k, kname = kernel_of(p, name), name end
    local s = k.slots[cur]
    local d = tonumber(stop[i] - start[i])
    s.seen = s.seen + 1
    if s.n < SLOT_CAP then
      s.n = s.n + 1
      s[s.n] = d
    else -- reservoir sampling keeps a uniform sample of the slot
      local j = math.random(s.seen)
      if j <= SLOT_CAP then s[j] = d end
    end
  end
end)

local function fmt_us(ns) return ("%.1f us"):format(ns / 1e3) end

local function trigger(pid, p, name, p99, med, n)
  p.cool_until = uv.now() + opts.cooldown_ms
  p.open = true
  local what = ("spike: pid %d (%s) kernel %s: p99 %s > %s x median %s (%d in the last second)")
    :format(pid, p.exe, name, fmt_us(p99), tostring(opts.factor), fmt_us(med), n)
  local w, err = cm.window { select = sel, ms = opts.ms, record = opts.record, pid = pid,
    force = opts.force, done = function(w)
      p.open = false
      if w.error then
        print(("%s; recorded %s (%d ms, %d records, incomplete: %s)"):format(what,
          tostring(w.file), w.ms, w.records, w.error))
      else
        print(("%s; recorded %s (%d ms, %d records)"):format(what, w.file, w.ms, w.records))
      end
      io.stdout:flush()
    end }
  if not w then
    p.open = false
    print(("%s; not recorded: %s"):format(what, err))
  end
end

-- Judges every kernel over the last second, then moves the oldest slot into the history.
cm.every(STEP_MS, function()
  local nxt = cur % SLOTS + 1
  for pid, p in pairs(procs) do
    for name, k in pairs(p.kernels) do
      local all = {}
      for i = 1, SLOTS do
        local s = k.slots[i]
        for j = 1, s.n do all[#all + 1] = s[j] end
      end
      if #all >= opts.min_count and k.hist.count >= opts.min_count and not p.open
        and uv.now() >= p.cool_until then
        table.sort(all)
        local p99 = all[math.max(1, math.ceil(0.99 * #all))]
        local med = k.hist:quantile(0.5)
        if med and p99 > opts.factor * med then trigger(pid, p, name, p99, med, #all) end
      end
      local old = k.slots[nxt]
      for j = 1, old.n do k.hist:add(old[j]) end
      k.slots[nxt] = { n = 0, seen = 0 }
    end
  end
  cur = nxt
end)

-- A capture cannot be re-traced: refuse it at its first process rather than watch in vain.
local refused = false
cm.on("process_start", function(p)
  if p.kind ~= "replay" or refused then return end
  refused = true
  io.stderr:write("spike.lua: --replay cannot be used: spike.lua widens the tracing of live "
    .. "processes when a kernel spikes, and a capture cannot be traced again; run it as "
    .. "`cuptimon-lua scripts/spike.lua -- cmd args...`\n")
  cm.exit(2)
end)

cm.on("exit", function() cm.print_shed_notes() end)
