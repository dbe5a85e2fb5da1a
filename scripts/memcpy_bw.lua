-- memcpy_bw.lua: memory copy bandwidth per copy kind, with a log2 histogram of copy sizes.
--
-- Usage: cuptimon-lua scripts/memcpy_bw.lua [--no-hist] -- cmd args...
--        cuptimon-lua --replay run.cmcap scripts/memcpy_bw.lua
--
-- Arguments:
--   --no-hist     print only the bandwidth table
--
-- Bandwidth is bytes over the summed duration of the copies of a kind (GB/s = 1e9 bytes/s).
--
-- Example output:
--   copy kind      count        bytes     time_us     GB/s
--   HtoD            2500     15500000      2000.0     7.75
--
--   HtoD: size histogram (bytes)
--     [1K, 2K)          500 |@@@@@@@@@@@@@@@@@@@@
--     [2K, 4K)          500 |@@@@@@@@@@@@@@@@@@@@
local cm = require "cuptimon"
local args = require "cuptimon.args"

local opts = args.parse(arg, { no_hist = { false, "print only the bandwidth table" } })

-- CUpti_ActivityMemcpyKind.
local kind_names = { [0] = "unknown", "HtoD", "DtoH", "HtoA", "AtoH", "AtoA", "AtoD", "DtoA",
  "DtoD", "HtoH", "PtoP" }

local per = {} -- copy kind -> { count, bytes, time, hist = { [log2] = n } }

local function observe_kind(kind)
  cm.observe({ [kind] = { "copy_kind", "bytes", "start", "stop" } }, function(b)
    local ck, bytes, start, stop = b.copy_kind, b.bytes, b.start, b.stop
    for i = 0, b.n - 1 do
      local k = tonumber(ck[i])
      local s = per[k]
      if not s then
        s = { count = 0, bytes = 0, time = 0, hist = {} }
        per[k] = s
      end
      local n = tonumber(bytes[i])
      s.count = s.count + 1
      s.bytes = s.bytes + n
      s.time = s.time + tonumber(stop[i] - start[i])
      local bucket = n > 0 and math.floor(math.log(n) / math.log(2) + 1e-9) or -1
      s.hist[bucket] = (s.hist[bucket] or 0) + 1
    end
  end)
end
observe_kind("memcpy")

local function size(n)
  local units = { "", "K", "M", "G", "T" }
  local u = 1
  while n >= 1024 and u < #units do
    n = n / 1024
    u = u + 1
  end
  return ("%d%s"):format(n, units[u])
end

cm.on("exit", function()
  local kinds = {}
  for k in pairs(per) do kinds[#kinds + 1] = k end
  table.sort(kinds)
  print(("%-10s %9s %14s %11s %8s"):format("copy kind", "count", "bytes", "time_us", "GB/s"))
  for _, k in ipairs(kinds) do
    local s = per[k]
    print(("%-10s %9d %14d %11.1f %8.2f"):format(kind_names[k] or tostring(k), s.count, s.bytes,
      s.time / 1e3, s.time > 0 and s.bytes / s.time or 0))
  end
  if opts.no_hist then return end
  for _, k in ipairs(kinds) do
    local h, lo, hi, top = per[k].hist, math.huge, -math.huge, 0
    for bucket, n in pairs(h) do
      if bucket < lo then lo = bucket end
      if bucket > hi then hi = bucket end
      if n > top then top = n end
    end
    print()
    print(("%s: size histogram (bytes)"):format(kind_names[k] or tostring(k)))
    for bucket = lo, hi do
      local n = h[bucket] or 0
      local label = bucket < 0 and "0" or ("[%s, %s)"):format(size(2 ^ bucket), size(2 ^ (bucket + 1)))
      print(("  %-14s %8d |%s"):format(label, n, ("@"):rep(math.floor(20 * n / top + 0.5))))
    end
  end
end)
