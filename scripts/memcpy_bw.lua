-- memcpy_bw.lua: memory copy bandwidth per copy kind, with a log2 histogram of copy sizes.
--
-- Usage: cuptimon-lua scripts/memcpy_bw.lua [--no-hist] [--format FMT] -- cmd args...
--        cuptimon-lua --replay run.cmcap scripts/memcpy_bw.lua
--        cuptimon-lua --replay run.cmcap scripts/memcpy_bw.lua --format csv --no-hist
--
-- Arguments:
--   --no-hist     print only the bandwidth table
--   --format FMT  text (aligned tables, the default), csv, or json (an object per row): the
--                 bandwidth table's rows, then (without --no-hist) one row per histogram bucket,
--                 with its copy kind, bucket bounds in bytes (lo_bytes empty for bucket 0, the
--                 copies of less than one byte) and copies
--
-- Bandwidth is bytes over the summed duration of the copies of a kind. The table gives it in the
-- unit that keeps at least two significant digits (GB/s, MB/s, KB/s or B/s: 1e9, 1e6, 1e3 and 1
-- bytes/s), so a slow kind never reads 0.00; csv and json give the number in GB/s ("GB/s").
--
-- Example output:
--   copy kind      count          bytes     time_us     bandwidth
--   HtoD              33       16973824       419.7    40.45 GB/s
--   DtoH              30            120        47.2     2.54 MB/s
--
--   HtoD: size histogram (bytes)
--     [64 KiB, 128 KiB)         1 |@                   |
--     [128 KiB, 256 KiB)        1 |@                   |
--     [256 KiB, 512 KiB)        0 |                    |
--     [512 KiB, 1 MiB)         30 |@@@@@@@@@@@@@@@@@@@@|
local cm = require "cuptimon"
local args = require "cuptimon.args"
local tabulate = require "cuptimon.table"

local opts = args.parse(arg, args.with_output { no_hist = { false, "print only the bandwidth table" } })
args.output(opts, "memcpy_bw.lua")

-- CUpti_ActivityMemcpyKind.
local kind_names = { [0] = "unknown", "HtoD", "DtoH", "HtoA", "AtoH", "AtoA", "AtoD", "DtoA",
  "DtoD", "HtoH", "PtoP" }

local bytes = cm.sum_by { unit = "bytes" } -- copy kind -> count and bytes
local time = cm.sum_by { unit = "ns" }     -- copy kind -> nanoseconds
local sizes = {}            -- copy kind -> log2 histogram of copy sizes

cm.observe({ memcpy = { "copy_kind", "bytes", "start", "stop" } }, function(b)
  local ck, nbytes, start, stop = b.copy_kind, b.bytes, b.start, b.stop
  for i = 0, b.n - 1 do
    local k = tonumber(ck[i])
    bytes:add(k, nbytes[i])
    time:add(k, stop[i] - start[i])
    sizes[k] = sizes[k] or cm.hist { unit = "bytes" }
    sizes[k]:add(nbytes[i])
  end
end)

-- A bandwidth of `gbs` GB/s as text, in the largest unit in which it is at least 1.
local UNITS = { { 1, "GB/s" }, { 1e-3, "MB/s" }, { 1e-6, "KB/s" } }
local function rate(gbs)
  for _, u in ipairs(UNITS) do
    if gbs >= u[1] then return ("%.2f %s"):format(gbs / u[1], u[2]) end
  end
  return ("%.2f B/s"):format(gbs * 1e9)
end

cm.on("exit", function()
  if cm.command_failed() then return end -- the one-line error says it all
  local list = bytes:sorted(nil, "key")
  local text = tabulate.output() == "text"
  local t = tabulate.new {
    { "copy kind", width = 10 }, { "count", "%d", width = 9 }, { "bytes", "%d", width = 14 },
    { "time_us", "%.1f", width = 11 },
    text and { "bandwidth", width = 13, align = "right" } or { "GB/s", "%.2f", width = 8 },
  }
  for _, e in ipairs(list) do
    local ns = time:get(e.key)
    local gbs = ns > 0 and e.sum / ns or 0
    t:add(kind_names[e.key] or tostring(e.key), e.count, e.sum, ns / 1e3, text and rate(gbs) or gbs)
  end
  t:print()
  if opts.no_hist then return end
  if tabulate.output() ~= "text" then
    -- Machine-readable: the buckets as rows, unformatted.
    local ht = tabulate.new { "copy kind", "lo_bytes", "hi_bytes", "copies" }
    for _, e in ipairs(list) do
      for _, bin in ipairs(sizes[e.key]:bins()) do
        ht:add(kind_names[e.key] or tostring(e.key), bin.lo, bin.hi, bin.count)
      end
    end
    ht:print()
    return
  end
  for _, e in ipairs(list) do
    print()
    print(("%s: size histogram (bytes)"):format(kind_names[e.key] or tostring(e.key)))
    print(sizes[e.key]:format { indent = "  ", width = 20 })
  end
end)
