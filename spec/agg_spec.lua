-- Specs of cuptimon.agg: values, edge buckets and printed forms.
-- luacheck: std +busted
local agg = require "cuptimon.agg"
local ffi = require "ffi"

describe("agg.count / agg.sum / agg.stats", function()
  it("counts, sums and summarizes", function()
    local c, s, st = agg.count(), agg.sum(), agg.stats("lat")
    for v = 1, 100 do c:add(); s:add(v); st:add(v) end
    assert.are.equal(100, c.count)
    assert.are.equal(5050, s.sum)
    assert.are.same({ 100, 5050, 1, 100, 50.5 }, { st.count, st.sum, st.min, st.max, st:avg() })
    assert.are.equal("lat\ncount 100, sum 5.05K, min 1, avg 50.5, max 100", tostring(st))
  end)
  it("accepts int64 cdata values", function()
    local s = agg.sum()
    s:add(ffi.new("uint64_t", 7) - ffi.new("uint64_t", 2))
    assert.are.equal(5, s.sum)
  end)
end)

describe("agg units", function()
  -- Counts and durations scale by 1000, only bytes by 1024: a stats_by of
  -- kernel durations prints 2.7 ms and 18.6 us as such, never as "sum 2.7M avg 18.6K".
  it("prints counts with SI prefixes, durations in ns/us/ms/s and bytes in KiB/MiB", function()
    local got = {}
    for _, v in ipairs { 999, 1500, 5050, 999500, 2.7e6, -1500 } do
      got[#got + 1] = agg.human(v) .. " " .. agg.human_ns(v) .. " " .. agg.human_bytes(v)
    end
    assert.are.same({ "999 999 ns 999 B", "1.5K 1.5 us 1.46 KiB", "5.05K 5.05 us 4.93 KiB",
      "1M 1 ms 976 KiB", "2.7M 2.7 ms 2.57 MiB", "-1.5K -1.5 us -1.46 KiB" }, got)
    assert.are.same({ "1.5 s", "90 s", "inf", "nan" },
      { agg.human_ns(1.5e9), agg.human_ns(9e10), agg.human(1 / 0), agg.human(0 / 0) })
    assert.are.equal("18.6 us", agg.format_value(18600, "ns"))
  end)
  it("gives stats_by of durations in ns their unit", function()
    local s = agg.stats_by { name = "kernel time", unit = "ns" }
    for _ = 1, 145 do s:add("k", 18600) end
    assert.are.equal("kernel time\nk  count      145  sum   2.7 ms  avg  18.6 us  min  18.6 us  max  18.6 us",
      tostring(s))
    local c = agg.stats_by("launches")
    for _ = 1, 2 do c:add("k", 1.35e6) end
    assert.matches("sum     2.7M  avg    1.35M", tostring(c))
  end)
  it("labels a histogram of bytes in KiB and MiB", function()
    local h = agg.hist { unit = "bytes" }
    h:add(65536); h:add(600000)
    local text = h:format { width = 4 }
    assert.matches("^%[64 KiB, 128 KiB%)%s+1 |@@@@|\n", text)
    assert.matches("\n%[512 KiB, 1 MiB%)%s+1 |@@@@|$", text)
  end)
  it("refuses an unknown unit, naming the valid ones", function()
    assert.has_error(function() agg.hist { unit = "s" } end,
      "agg.hist: unknown unit \"s\"; valid units: ns, bytes (none for plain numbers)")
    assert.has_error(function() agg.stats_by { name = "x", units = "ns" } end,
      "agg.stats_by: unknown option \"units\"; valid options: name, unit")
  end)
end)

describe("agg.hist", function()
  it("puts powers of two at the start of their bucket", function()
    local h = agg.hist()
    for _, v in ipairs({ 0, 1, 2, 3, 4, 1023, 1024, 1025 }) do h:add(v) end
    assert.are.equal(1, h:bucket_count(0))
    assert.are.equal(1, h:bucket_count(1))
    assert.are.equal(2, h:bucket_count(2))     -- 2, 3
    assert.are.equal(1, h:bucket_count(4))
    assert.are.equal(1, h:bucket_count(1023))  -- [512, 1024)
    assert.are.equal(2, h:bucket_count(1024))  -- 1024, 1025
    assert.are.equal(8, h.count)
  end)
  it("puts 2^k - 1 and 2^k in different buckets for every k up to 52", function()
    -- log(v) / log(2) rounds: 2^48 - 1 gives exactly 48. The edge fix must catch every such case.
    for k = 1, 52 do
      local h = agg.hist()
      h:add(2 ^ k - 1); h:add(2 ^ k)
      -- Bucket b >= 1 holds [2^(b-1), 2^b).
      assert.are.equal(1, h.buckets[k + 1], "2^" .. k)
      assert.are.equal(1, h.buckets[k], "2^" .. k .. " - 1")
      assert.are.equal(1, h:bucket_count(2 ^ k), "bucket_count(2^" .. k .. ")")
    end
  end)
  it("prints one line per bucket from the lowest to the highest", function()
    local h = agg.hist("ns")
    h:add(1500); h:add(1600); h:add(5000)
    local want = table.concat({
      "ns",
      "[1Ki, 2Ki)              2 |" .. ("@"):rep(52) .. "|",
      "[2Ki, 4Ki)              0 |" .. (" "):rep(52) .. "|",
      "[4Ki, 8Ki)              1 |" .. ("@"):rep(26) .. (" "):rep(26) .. "|",
    }, "\n")
    assert.are.equal(want, tostring(h))
  end)
  it("says when it is empty", function()
    assert.are.equal("(empty histogram)", tostring(agg.hist()))
  end)
  it("formats with an indent and a bar width", function()
    local h = agg.hist()
    h:add(4); h:add(5); h:add(8)
    assert.are.equal(("  %-16s %8d |%s|\n  %-16s %8d |%s|"):format("[4, 8)", 2, ("@"):rep(10),
      "[8, 16)", 1, ("@"):rep(5) .. (" "):rep(5)), h:format { indent = "  ", width = 10 })
  end)
end)

describe("agg.lhist", function()
  it("buckets linearly with underflow and overflow", function()
    local h = agg.lhist(0, 100, 10)
    h:add(-1); h:add(0); h:add(9); h:add(10); h:add(99); h:add(100); h:add(1000)
    assert.are.same({ 1, 2, 1, 1, 2 }, { h.buckets[-1], h.buckets[0], h.buckets[1], h.buckets[9],
      h.buckets[10] })
    assert.matches("%(%.%.%., 0%)", tostring(h))
    assert.matches("%[100, %.%.%.%)", tostring(h))
  end)
  it("rejects bad bounds", function()
    assert.has_error(function() agg.lhist(10, 0, 1) end,
      "agg.lhist: expected lhist(min, max, step[, name]) with min < max and step > 0")
  end)
end)

describe("agg.sketch", function()
  it("gives quantiles within the relative error, clamped to min and max", function()
    local s = agg.sketch()
    for v = 1, 10000 do s:add(v) end
    assert.are.equal(10000, s.count)
    for _, c in ipairs({ { 0.5, 5000 }, { 0.99, 9900 }, { 0.01, 100 } }) do
      local got = s:quantile(c[1])
      assert.is_true(math.abs(got - c[2]) <= 0.01 * c[2] + 1, c[1] .. ": " .. got)
    end
    assert.are.equal(1, s:quantile(0))
    assert.are.equal(10000, s:quantile(1))
  end)

  it("keeps its memory bounded whatever the count, and takes counts and values below 1", function()
    local s = agg.sketch(nil, { error = 0.05 })
    for i = 1, 100000 do s:add(i * 37 % 1000003, 2) end
    s:add(0)
    assert.are.equal(200001, s.count)
    assert.is_true(s.nbuckets < 400, tostring(s.nbuckets))
    assert.are.equal(0, s:quantile(0))
    assert.is_nil(agg.sketch():quantile(0.5))
    assert.has_error(function() agg.sketch(nil, { error = 2 }) end)
  end)
end)

describe("agg.quantiles", function()
  it("returns nearest-rank quantiles", function()
    local q = agg.quantiles()
    for v = 1000, 1, -1 do q:add(v) end
    assert.are.same({ 500, 900, 990, 1000, 1 }, { q:quantile(0.5), q:quantile(0.9),
      q:quantile(0.99), q:quantile(1), q:quantile(0) })
    assert.are.equal("n 1000: p50 500, p90 900, p99 990, p100 1K", tostring(q))
  end)
  it("is nil when empty", function()
    assert.is_nil(agg.quantiles():quantile(0.5))
  end)
end)

describe("agg maps", function()
  it("count_by sorts by count, then key", function()
    local m = agg.count_by()
    for _, k in ipairs({ "b", "a", "b", "c", "a", "b" }) do m:add(k) end
    assert.are.equal("b           3\na           2\nc           1", tostring(m))
  end)
  it("topk prints the k largest sums and how many were left out", function()
    local t = agg.topk(2, "top")
    t:add("x", 10); t:add("y", 30); t:add("z", 20); t:add("x", 5)
    local s = t:sorted(2)
    assert.are.same({ "y", "z" }, { s[1].key, s[2].key })
    assert.are.equal("top\ny          30  (1)\nz          20  (1)\n... 1 more", tostring(t))
  end)
  it("refuses cdata keys, which would never compare equal", function()
    local m = agg.count_by()
    assert.has_error(function() m:add(ffi.new("uint64_t", 1)) end,
      "map:add: keys must be strings, numbers or booleans, got a cdata (use tonumber() or batch:str())")
  end)
  it("count_by counts n at once, sorts by key on request, and totals", function()
    local m = agg.count_by()
    m:add("memcpy", 30); m:add("kernel", 10); m:add("kernel", 5); m:add(10); m:add(9)
    local byval = m:sorted()
    assert.are.same({ "memcpy", "kernel", 9, 10 }, { byval[1].key, byval[2].key, byval[3].key,
      byval[4].key })
    local bykey = m:sorted(nil, "key")
    assert.are.same({ 9, 10, "kernel", "memcpy" }, { bykey[1].key, bykey[2].key, bykey[3].key,
      bykey[4].key })
    assert.are.same({ 15, 30 }, { bykey[3].count, bykey[4].count })
    assert.are.equal(47, m:total())
    assert.are.equal(4, m:len())
    assert.has_error(function() m:sorted(nil, "size") end,
      'map:sorted: order must be "value", "key", "count", "sum", "avg", "min" or "max", got "size"')
  end)
  it("stats_by totals sums and gives averages", function()
    local m = agg.stats_by()
    m:add("a", 10); m:add("a", 20); m:add("b", 5)
    assert.are.equal(35, m:total())
    local s = m:sorted(1)
    assert.are.same({ "a", 2, 30, 15, 10, 20 }, { s[1].key, s[1].count, s[1].sum, s[1].avg,
      s[1].min, s[1].max })
  end)
  it("stats_by keeps count, sum, min and max per key", function()
    local m = agg.stats_by()
    m:add("k", 1); m:add("k", 3)
    local e = m:get("k")
    assert.are.same({ 2, 4, 1, 3 }, { e.count, e.sum, e.min, e.max })
  end)
end)
