-- cuptimon.agg: aggregations in the spirit of bpftrace maps, printing themselves.
--
--   local h = agg.hist("kernel ns")        -- log2 histogram
--   h:add(1500); print(h)                  -- or h:print()
--
-- Design note. Every aggregation takes plain Lua numbers (a cdata int64 is converted with
-- tonumber, so `h:add(stop[i] - start[i])` works) and keeps its state in Lua numbers and arrays
-- indexed by small integers, so add() compiles inside a script's column loop. Keyed maps
-- (count_by, sum_by, stats_by, topk) accept string or number keys only: cdata keys compare by
-- identity in Lua tables, which would silently make every key distinct, so they are refused.
-- Quantiles keep every value in a growable double array until `cap`, then a uniform reservoir.
local ffi = require "ffi"

local M = {}
local floor, huge, log = math.floor, math.huge, math.log
local fmt = string.format

-- Units. A value prints in the unit of what it measures, with three significant digits:
--   - a count or any other plain number (the default) with SI prefixes: 1500 -> "1.5K",
--     2.7e6 -> "2.7M";
--   - a duration in nanoseconds (unit "ns") as ns, us, ms or s: 18600 -> "18.6 us";
--   - a size in bytes (unit "bytes") with binary prefixes: 1536 -> "1.5 KiB", 120 -> "120 B".
-- Integers below the first step print exactly. An aggregation takes its unit with its name:
-- cm.stats_by{ name = "kernel time", unit = "ns" }.
local function scaled(v, base, units, sep)
  if v ~= v then return "nan" end
  local a, i = v < 0 and -v or v, 1
  if a == huge then return v < 0 and "-inf" or "inf" end
  while a >= base and i < #units do a, i = a / base, i + 1 end
  local s
  if i == 1 and a == floor(a) and a < base then
    s = fmt("%d", a)
  else
    s = fmt("%.3g", a)
    if s:find("e", 1, true) then -- rounds to 1000 or more: the next step up, or whole units
      if base == 1000 and i < #units then
        a, i = a / base, i + 1
        s = fmt("%.3g", a)
      else
        s = fmt("%.0f", a)
      end
    end
  end
  local u = units[i]
  return (v < 0 and "-" or "") .. s .. (u ~= "" and sep or "") .. u
end

local SI = { "", "K", "M", "G", "T", "P", "E" }
local DURATION = { "ns", "us", "ms", "s" }
local BYTES = { "B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB" }
local POW2 = { "", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei" }

local function human(v) return scaled(v, 1000, SI, "") end
local function human_ns(v)
  if v ~= v then return "nan" end
  local a = v < 0 and -v or v
  if a >= 1e9 then -- seconds do not scale further
    local s = fmt("%.3g", v / 1e9)
    if s:find("e", 1, true) then s = fmt("%.0f", v / 1e9) end
    return s .. " s"
  end
  return scaled(v, 1000, DURATION, " ")
end
local function human_bytes(v) return scaled(v, 1024, BYTES, " ") end

--- A plain number with SI prefixes: 1500 -> "1.5K".
M.human = human
--- Nanoseconds as a duration: 18600 -> "18.6 us".
M.human_ns = human_ns
--- Bytes with binary prefixes: 1536 -> "1.5 KiB".
M.human_bytes = human_bytes

-- unit -> the formatter of values (sums, averages, quantiles) and of log2 histogram edges (powers
-- of two: binary prefixes, "[1Ki, 2Ki)", unless the unit says otherwise).
local units = {
  none = { value = human, edge = function(v) return scaled(v, 1024, POW2, "") end },
  ns = { value = human_ns, edge = human_ns },
  bytes = { value = human_bytes, edge = human_bytes },
}

--- The text of value v in `unit` (nil, "ns" or "bytes").
function M.format_value(v, unit) return units[unit or "none"].value(v) end

-- The name and unit of an aggregation from its constructor's name argument: a string (the name)
-- or a table { name = "...", unit = "ns" | "bytes" }. Raises (level 3) on anything else.
local function named(fname, arg)
  if arg == nil or type(arg) == "string" then return arg, units.none end
  if type(arg) ~= "table" then
    error(("%s: the name must be a string or a table { name = s, unit = \"ns\" | \"bytes\" }, "
      .. "got a %s"):format(fname, type(arg)), 3)
  end
  for k in pairs(arg) do
    if k ~= "name" and k ~= "unit" then
      error(("%s: unknown option %q; valid options: name, unit"):format(fname, tostring(k)), 3)
    end
  end
  local u = arg.unit == nil and units.none or units[arg.unit]
  if not u or arg.unit == "none" then
    error(("%s: unknown unit %q; valid units: ns, bytes (none for plain numbers)")
      :format(fname, tostring(arg.unit)), 3)
  end
  if arg.name ~= nil and type(arg.name) ~= "string" then
    error(("%s: name must be a string, got a %s"):format(fname, type(arg.name)), 3)
  end
  return arg.name, u
end

local function bar(n, max, width)
  if max <= 0 then return "" end
  local w = floor(n * width / max + 0.5)
  if n > 0 and w == 0 then w = 1 end
  return string.rep("@", w)
end

local function title(self)
  return self.name and (self.name .. "\n") or ""
end

local function key_check(fname, key)
  local t = type(key)
  if t ~= "string" and t ~= "number" and t ~= "boolean" then
    error(("%s: keys must be strings, numbers or booleans, got a %s%s"):format(fname, t,
      t == "cdata" and " (use tonumber() or batch:str())" or ""), 3)
  end
end

local function new(mt, fields)
  return setmetatable(fields, mt)
end

local function class(name)
  local c = { kind = name }
  c.__index = c
  c.__tostring = function(self) return self:format() end
  c.print = function(self, out)
    out = out or io.stdout
    out:write(self:format(), "\n")
  end
  return c
end

---------------------------------------------------------------------------------------------------
-- scalar: count, sum, min, max, avg in one

local Stats = class("stats")

function Stats:add(v)
  v = tonumber(v) or 1
  self.count = self.count + 1
  self.sum = self.sum + v
  if v < self.min then self.min = v end
  if v > self.max then self.max = v end
  return self
end

function Stats:avg() return self.count > 0 and self.sum / self.count or 0 end

function Stats:reset()
  self.count, self.sum, self.min, self.max = 0, 0, huge, -huge
  return self
end

function Stats:format()
  if self.count == 0 then return title(self) .. "count 0" end
  local h = self.unit.value
  return title(self) .. fmt("count %d, sum %s, min %s, avg %s, max %s", self.count,
    h(self.sum), h(self.min), h(self:avg()), h(self.max))
end

--- Count, sum, min, max and avg of the values added. name: a string, or { name =, unit = }.
function M.stats(name)
  local n, u = named("agg.stats", name)
  return new(Stats, { name = n, unit = u }):reset()
end

local Count = class("count")
function Count:add(n) self.count = self.count + (tonumber(n) or 1) return self end
function Count:reset() self.count = 0 return self end
function Count:format() return title(self) .. tostring(self.count) end
--- A counter: :add([n]) counts n (default 1), .count holds the count.
function M.count(name)
  local n, u = named("agg.count", name)
  return new(Count, { name = n, unit = u, count = 0 })
end

local Sum = class("sum")
function Sum:add(v) self.sum = self.sum + tonumber(v) return self end
function Sum:reset() self.sum = 0 return self end
function Sum:format() return title(self) .. self.unit.value(self.sum) end
--- A sum: :add(v) adds v (a number or an int64 cdata), .sum holds the sum.
function M.sum(name)
  local n, u = named("agg.sum", name)
  return new(Sum, { name = n, unit = u, sum = 0 })
end

function M.min(name) return M.stats(name) end
function M.max(name) return M.stats(name) end
function M.avg(name) return M.stats(name) end

---------------------------------------------------------------------------------------------------
-- log2 histogram: bucket 0 holds values < 1 (0 and negatives), bucket b >= 1 holds [2^(b-1), 2^b)

local Hist = class("hist")
local LN2 = log(2)

function Hist:add(v, n)
  v = tonumber(v)
  n = n or 1
  local b = 0
  if v >= 1 then
    b = floor(log(v) / LN2) + 1
    -- log() can land a hair below an exact power of two; fix the edge.
    if 2 ^ (b - 1) > v then b = b - 1 elseif 2 ^ b <= v then b = b + 1 end
  end
  self.buckets[b] = (self.buckets[b] or 0) + n
  if b > self.top then self.top = b end
  if b < self.bottom then self.bottom = b end
  self.count = self.count + n
  return self
end

--- The count of the bucket holding v.
function Hist:bucket_count(v)
  v = tonumber(v)
  local b = 0
  if v >= 1 then
    b = floor(log(v) / LN2) + 1
    if 2 ^ (b - 1) > v then b = b - 1 elseif 2 ^ b <= v then b = b + 1 end
  end
  return self.buckets[b] or 0
end

function Hist:reset()
  self.buckets, self.count, self.top, self.bottom = {}, 0, -1, huge
  return self
end

local function range_label(lo, hi)
  return fmt("[%s, %s)", lo, hi)
end

-- The options of a histogram's format(): indent (a prefix for each bucket line, default "") and
-- width (the bar's width in characters, default 52).
local function hist_opts(opts)
  if opts ~= nil and type(opts) ~= "table" then
    error("hist:format: expected format([{ indent = s, width = n }])", 3)
  end
  opts = opts or {}
  return opts.indent or "", opts.width or 52
end

--- The buckets from the lowest to the highest (empty ones between included), for output other
--- than text: { { lo =, hi =, count = }, ... }, each bucket [lo, hi); lo is nil for bucket 0,
--- which holds the values below 1. An empty histogram gives {}.
function Hist:bins()
  local out = {}
  if self.count == 0 then return out end
  for b = self.bottom, self.top do
    out[#out + 1] = { lo = b > 0 and 2 ^ (b - 1) or nil, hi = 2 ^ b, count = self.buckets[b] or 0 }
  end
  return out
end

--- The histogram as text, one line per bucket from the lowest to the highest. opts: indent,
--- width (see hist_opts).
function Hist:format(opts)
  local indent, width = hist_opts(opts)
  if self.count == 0 then return title(self) .. indent .. "(empty histogram)" end
  local lines, max = {}, 0
  for b = self.bottom, self.top do
    local c = self.buckets[b] or 0
    if c > max then max = c end
  end
  local labels, lw = {}, 16
  local edge = self.unit.edge
  for b = self.bottom, self.top do
    local label = b == 0 and "(..., 1)" or range_label(edge(2 ^ (b - 1)), edge(2 ^ b))
    labels[b] = label
    if #label > lw then lw = #label end
  end
  for b = self.bottom, self.top do
    local c = self.buckets[b] or 0
    lines[#lines + 1] = fmt("%s%-" .. lw .. "s %8d |%-" .. width .. "s|", indent, labels[b], c,
      bar(c, max, width))
  end
  return title(self) .. table.concat(lines, "\n")
end

--- A log2 histogram (bpftrace's hist()). name: a string, or { name =, unit = } (bucket edges
--- print in the unit: "[64 KiB, 128 KiB)" for bytes, "[1Ki, 2Ki)" for plain numbers).
function M.hist(name)
  local n, u = named("agg.hist", name)
  return new(Hist, { name = n, unit = u }):reset()
end

---------------------------------------------------------------------------------------------------
-- linear histogram over [min, max) in steps of `step`, with under/overflow buckets

local Lhist = class("lhist")

function Lhist:add(v, n)
  v = tonumber(v)
  n = n or 1
  local b
  if v < self.lo then b = -1
  elseif v >= self.hi then b = self.nb
  else b = floor((v - self.lo) / self.step) end
  self.buckets[b] = self.buckets[b] + n
  self.count = self.count + n
  return self
end

function Lhist:reset()
  self.buckets, self.count = {}, 0
  for b = -1, self.nb do self.buckets[b] = 0 end
  return self
end

function Lhist:format()
  if self.count == 0 then return title(self) .. "(empty histogram)" end
  local max, first, last = 0, nil, nil
  for b = -1, self.nb do
    local c = self.buckets[b]
    if c > max then max = c end
    if c > 0 then first = first or b; last = b end
  end
  local lines, labels, lw = {}, {}, 16
  local h = self.unit.value
  for b = first, last do
    local label
    if b == -1 then label = fmt("(..., %s)", h(self.lo))
    elseif b == self.nb then label = fmt("[%s, ...)", h(self.hi))
    else label = range_label(h(self.lo + b * self.step), h(self.lo + (b + 1) * self.step)) end
    labels[b] = label
    if #label > lw then lw = #label end
  end
  for b = first, last do
    local c = self.buckets[b]
    lines[#lines + 1] = fmt("%-" .. lw .. "s %8d |%-52s|", labels[b], c, bar(c, max, 52))
  end
  return title(self) .. table.concat(lines, "\n")
end

--- A linear histogram (bpftrace's lhist(v, min, max, step)).
function M.lhist(min, max, step, name)
  if type(min) ~= "number" or type(max) ~= "number" or type(step) ~= "number" or step <= 0
      or max <= min then
    error("agg.lhist: expected lhist(min, max, step[, name]) with min < max and step > 0", 2)
  end
  local nb = math.ceil((max - min) / step)
  local n, u = named("agg.lhist", name)
  return new(Lhist, { name = n, unit = u, lo = min, hi = min + nb * step, step = step, nb = nb }):reset()
end

---------------------------------------------------------------------------------------------------
-- quantiles

local Quant = class("quantiles")

function Quant:add(v)
  v = tonumber(v)
  local n = self.seen
  self.seen = n + 1
  if n < self.cap then
    if n >= self.size then
      local size = self.size * 2
      local a = ffi.new("double[?]", size)
      ffi.copy(a, self.values, self.size * 8)
      self.values, self.size = a, size
    end
    self.values[n] = v
  else
    local j = floor(math.random() * (n + 1))
    if j < self.cap then self.values[j] = v end
  end
  return self
end

function Quant:reset()
  self.size, self.seen = 1024, 0
  self.values = ffi.new("double[?]", self.size)
  return self
end

--- The q-quantile (0 <= q <= 1) by nearest rank, or nil when empty.
function Quant:quantile(q)
  local n = self.seen < self.cap and self.seen or self.cap
  if n == 0 then return nil end
  local t = {}
  for i = 0, n - 1 do t[i + 1] = self.values[i] end
  table.sort(t)
  local r = math.ceil(q * n)
  if r < 1 then r = 1 end
  return t[r]
end

function Quant:format()
  if self.seen == 0 then return title(self) .. "(no values)" end
  local parts = {}
  for _, q in ipairs(self.qs) do
    parts[#parts + 1] = fmt("p%s %s", tostring(q * 100):gsub("%.0$", ""),
      self.unit.value(self:quantile(q)))
  end
  return title(self) .. fmt("n %d: %s", self.seen, table.concat(parts, ", "))
end

--- Quantiles: :quantile(q), printing p50/p90/p99/p100 (or opts.qs). opts.cap bounds memory.
function M.quantiles(name, opts)
  opts = opts or {}
  local n, u = named("agg.quantiles", name)
  return new(Quant, { name = n, unit = u, cap = opts.cap or 1000000,
    qs = opts.qs or { 0.5, 0.9, 0.99, 1 } }):reset()
end

---------------------------------------------------------------------------------------------------
-- sketch: quantiles within a relative error, in bounded memory (a log-bucketed histogram, as in
-- DDSketch). A positive value v lands in bucket ceil(log(v) / log(gamma)) with
-- gamma = (1 + e) / (1 - e); the bucket's representative 2 * gamma^i / (gamma + 1) is within a
-- relative error e of every value in it. Values below 1 share bucket "low" (their quantile is the
-- smallest value seen). Values up to 2^64 with e = 0.01 need at most about 2200 buckets whatever
-- the count, so a sketch per key stays small; quantiles are clamped to the exact min and max.

local Sketch = class("sketch")

function Sketch:add(v, n)
  v = tonumber(v)
  n = n or 1
  local i = v >= 1 and math.ceil(log(v) / self.lg) or -huge
  local b = self.buckets
  if b[i] == nil then
    b[i] = n
    self.nbuckets = self.nbuckets + 1
    self.keys = nil
  else
    b[i] = b[i] + n
  end
  self.count = self.count + n
  if v < self.min then self.min = v end
  if v > self.max then self.max = v end
  return self
end

function Sketch:reset()
  self.buckets, self.nbuckets, self.keys = {}, 0, nil
  self.count, self.min, self.max = 0, huge, -huge
  return self
end

--- The q-quantile (0 <= q <= 1) by nearest rank, within the relative error, or nil when empty.
function Sketch:quantile(q)
  if self.count == 0 then return nil end
  local keys = self.keys
  if not keys then
    keys = {}
    for i in pairs(self.buckets) do keys[#keys + 1] = i end
    table.sort(keys)
    self.keys = keys
  end
  local rank = math.ceil(q * self.count)
  if rank < 1 then rank = 1 end
  if rank >= self.count then return self.max end
  local seen = 0
  for _, i in ipairs(keys) do
    seen = seen + self.buckets[i]
    if seen >= rank then
      local v = i == -huge and self.min or 2 * self.gamma ^ i / (self.gamma + 1)
      if v < self.min then v = self.min end
      if v > self.max then v = self.max end
      return v
    end
  end
  return self.max
end

function Sketch:format()
  if self.count == 0 then return title(self) .. "(no values)" end
  local h = self.unit.value
  return title(self) .. fmt("n %d: p50 %s, p99 %s, max %s", self.count, h(self:quantile(0.5)),
    h(self:quantile(0.99)), h(self.max))
end

--- A quantile sketch: :add(v[, n]), :quantile(q), .count, .min, .max. opts.error is the relative
--- error of a quantile (default 0.01, between 0.0001 and 0.5).
function M.sketch(name, opts)
  local e = opts and opts.error or 0.01
  if type(e) ~= "number" or e < 0.0001 or e > 0.5 then
    error("agg.sketch: opts.error must be a number between 0.0001 and 0.5", 2)
  end
  local gamma = (1 + e) / (1 - e)
  local n, u = named("agg.sketch", name)
  return new(Sketch, { name = n, unit = u, gamma = gamma, lg = log(gamma) }):reset()
end

---------------------------------------------------------------------------------------------------
-- keyed maps: count_by, sum_by, stats_by, topk

local Map = class("map")

--- Adds value v (default 1) under `key`. For count_by, v is how many to count (count_by:add(k, n)
--- counts n at once); for the others, one value.
function Map:add(key, v)
  key_check("map:add", key)
  v = tonumber(v) or 1
  local e = self.entries[key]
  if e == nil then
    e = { count = 0, sum = 0, min = huge, max = -huge }
    self.entries[key] = e
    self.size = self.size + 1
  end
  e.count = e.count + (self.value == "count" and v or 1)
  e.sum = e.sum + v
  if v < e.min then e.min = v end
  if v > e.max then e.max = v end
  return self
end

function Map:get(key)
  local e = self.entries[key]
  if e == nil then return nil end
  if self.value == "count" then return e.count end
  if self.value == "sum" then return e.sum end
  return e
end

function Map:reset()
  self.entries, self.size = {}, 0
  return self
end

--- The number of keys.
function Map:len() return self.size end

local function value_of(self, e)
  if self.value == "count" then return e.count end
  return e.sum
end

-- Key order: numbers before strings before booleans, numbers by value, strings as strings.
local key_rank = { number = 1, string = 2, boolean = 3 }
local function key_less(a, b)
  local ta, tb = type(a), type(b)
  if ta ~= tb then return key_rank[ta] < key_rank[tb] end
  if ta == "boolean" then return not a and b end
  return a < b
end

local orders = { value = true, key = true, count = true, sum = true, avg = true, min = true,
  max = true }

--- The entries, at most n, as { { key=, count=, sum=, min=, max=, avg=, value= }, ... } (value is
--- what the map ranks by: the count for count_by, else the sum). order: "value" (the default:
--- by value descending, ties by key), "key" (by key ascending: numbers by value, then strings),
--- or "count", "sum", "avg", "min", "max" (by that figure descending, ties by key).
function Map:sorted(n, order)
  if order ~= nil and not orders[order] then
    error(("map:sorted: order must be \"value\", \"key\", \"count\", \"sum\", \"avg\", "
      .. "\"min\" or \"max\", got %q"):format(tostring(order)), 2)
  end
  local by = order ~= nil and order ~= "key" and order or "value"
  local list = {}
  for k, e in pairs(self.entries) do
    list[#list + 1] = { key = k, count = e.count, sum = e.sum, min = e.min, max = e.max,
      avg = e.count > 0 and e.sum / e.count or 0, value = value_of(self, e) }
  end
  if order == "key" then
    table.sort(list, function(a, b) return key_less(a.key, b.key) end)
  else
    table.sort(list, function(a, b)
      if a[by] ~= b[by] then return a[by] > b[by] end
      if type(a.key) == type(b.key) and type(a.key) ~= "boolean" then return a.key < b.key end
      return tostring(a.key) < tostring(b.key)
    end)
  end
  if n and #list > n then
    for i = #list, n + 1, -1 do list[i] = nil end
  end
  return list
end

--- The sum of every key's value (counts for count_by, sums for the others): the whole that a
--- key's share is a part of.
function Map:total()
  local t = 0
  for _, e in pairs(self.entries) do t = t + value_of(self, e) end
  return t
end

function Map:format(n)
  n = n or self.k
  local list = self:sorted(n)
  if #list == 0 then return title(self) .. "(empty)" end
  local lines = {}
  local width = 0
  for _, e in ipairs(list) do
    local s = tostring(e.key)
    if #s > 60 then s = s:sub(1, 57) .. "..." end
    e.label = s
    if #s > width then width = #s end
  end
  local h = self.unit.value
  for _, e in ipairs(list) do
    if self.value == "stats" then
      lines[#lines + 1] = fmt("%-" .. width .. "s  count %8d  sum %8s  avg %8s  min %8s  max %8s",
        e.label, e.count, h(e.sum), h(e.sum / e.count), h(e.min), h(e.max))
    elseif self.value == "count" then
      lines[#lines + 1] = fmt("%-" .. width .. "s  %10d", e.label, e.count)
    else
      lines[#lines + 1] = fmt("%-" .. width .. "s  %10s  (%d)", e.label, h(e.sum), e.count)
    end
  end
  if self.size > #list then lines[#lines + 1] = fmt("... %d more", self.size - #list) end
  return title(self) .. table.concat(lines, "\n")
end

local function map(fname, name, value, k)
  local n, u = named(fname, name)
  return new(Map, { name = n, unit = u, value = value, k = k }):reset()
end

-- The name argument of each: a string, or { name = s, unit = "ns" | "bytes" } (the unit of the
-- values added; counts have none).
--- Counts per key (bpftrace's @[key] = count()).
function M.count_by(name) return map("agg.count_by", name, "count") end
--- Sums per key (@[key] = sum(v)), printed by sum.
function M.sum_by(name) return map("agg.sum_by", name, "sum") end
--- Count, sum, min, max and avg per key, printed by sum.
function M.stats_by(name) return map("agg.stats_by", name, "stats") end
--- The k keys with the largest sums (all keys are kept; printing shows the top k).
function M.topk(k, name)
  if type(k) ~= "number" or k < 1 then error("agg.topk: k must be a positive number", 2) end
  return map("agg.topk", name, "sum", k)
end

M.constructors = {
  count = M.count, sum = M.sum, summary = M.stats, hist = M.hist, lhist = M.lhist,
  quantiles = M.quantiles, sketch = M.sketch, count_by = M.count_by, sum_by = M.sum_by, stats_by = M.stats_by,
  topk = M.topk,
}

return M
