-- cuptimon.estimate: rates and totals estimated from duty-cycled windows, with 95% intervals.
--
-- Design. A duty cycle (cuptimon.duty) traces each process in short windows, exact between
-- their two fences, and nothing in between. This module treats the windows of one process (a
-- "unit") as clusters of a cluster sample of its timeline: window i has an exposure x_i (the
-- seconds it traced) and, for each quantity ("key": a kernel of a device, a copy direction, a
-- kind), a count y_i of launches, a GPU time and bytes. The rate is the ratio estimator
--   R = sum(y_i) / sum(x_i)
-- and its variance the usual linearized one,
--   v(R) = (1 - f) / (n * xbar^2) * sum((y_i - R x_i)^2) / (n - 1),
-- with f = sum(x_i) / elapsed the sampling fraction (the duty achieved) and n the windows so far.
-- The 95% interval is R +- t(0.975, n - 1) * sqrt(v(R)) (Student's t, since n is often small),
-- its lower end clamped at 0. The total since the unit's observation began is R * elapsed, with
-- the interval scaled by elapsed. A window in which a key did not occur counts as y_i = 0.
--
-- Memory is bounded: only sums are kept (sum x, x^2, y, y^2, xy), in at most MAX_BLOCKS blocks
-- of consecutive windows per unit (two neighbours merge when a new block would exceed the cap),
-- so a node exporter that runs for months keeps a fixed number of numbers per key.
--
-- Phase change: the windows of the first half (whole blocks) and of the second half give two
-- ratio estimates; Welch's t-test on them flags the key when p < 0.001 (two-sided) and the two
-- differ by more than 5% of the larger. The first condition says "beyond what sampling
-- explains", the second keeps a tiny but real wobble of a very regular workload from being
-- called a phase. It needs at least 3 windows in each half.
--
-- Detection limit: a key seen in no window is reported as below 3 / sum(x_i) launches per
-- second: the 95% upper bound on a Poisson rate of which no event fell in the traced time
-- (the "rule of three"), never as zero.
--
-- Loop thread only; no FFI, no cuptimon dependency (specs use it on synthetic windows).
local M = {}

M.LEVEL = 0.95
M.MAX_BLOCKS = 32
M.PHASE_P = 0.001
M.PHASE_REL = 0.05
M.MEASURES = { "n", "t", "b" } -- launches (or records), GPU seconds, bytes

---------------------------------------------------------------------------------------------------
-- Student's t distribution

-- log Gamma(x), x > 0 (Lanczos, g = 7, n = 9).
local LANCZOS = { 0.99999999999980993, 676.5203681218851, -1259.1392167224028,
  771.32342877765313, -176.61502916214059, 12.507343278686905, -0.13857109526572012,
  9.9843695780195716e-6, 1.5056327351493116e-7 }
local function lgamma(x)
  if x < 0.5 then return math.log(math.pi / math.abs(math.sin(math.pi * x))) - lgamma(1 - x) end
  x = x - 1
  local a = LANCZOS[1]
  local t = x + 7.5
  for i = 2, 9 do a = a + LANCZOS[i] / (x + i - 1) end
  return 0.5 * math.log(2 * math.pi) + (x + 0.5) * math.log(t) - t + math.log(a)
end

-- The continued fraction of the regularized incomplete beta function (modified Lentz).
local function betacf(a, b, x)
  local tiny = 1e-300
  local qab, qap, qam = a + b, a + 1, a - 1
  local c, d = 1, 1 - qab * x / qap
  if math.abs(d) < tiny then d = tiny end
  d = 1 / d
  local h = d
  for m = 1, 300 do
    local m2 = 2 * m
    local aa = m * (b - m) * x / ((qam + m2) * (a + m2))
    d = 1 + aa * d
    if math.abs(d) < tiny then d = tiny end
    c = 1 + aa / c
    if math.abs(c) < tiny then c = tiny end
    d = 1 / d
    h = h * d * c
    aa = -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))
    d = 1 + aa * d
    if math.abs(d) < tiny then d = tiny end
    c = 1 + aa / c
    if math.abs(c) < tiny then c = tiny end
    d = 1 / d
    local del = d * c
    h = h * del
    if math.abs(del - 1) < 1e-15 then break end
  end
  return h
end

-- I_x(a, b), the regularized incomplete beta function.
local function ibeta(a, b, x)
  if x <= 0 then return 0 end
  if x >= 1 then return 1 end
  local bt = math.exp(lgamma(a + b) - lgamma(a) - lgamma(b) + a * math.log(x) + b * math.log(1 - x))
  if x < (a + 1) / (a + b + 2) then return bt * betacf(a, b, x) / a end
  return 1 - bt * betacf(b, a, 1 - x) / b
end

--- P(T <= t) for Student's t with df degrees of freedom (df > 0, not necessarily whole).
function M.t_cdf(t, df)
  local p = 0.5 * ibeta(df / 2, 0.5, df / (df + t * t))
  return t >= 0 and 1 - p or p
end

local tq_cache = {}
--- The p-quantile of Student's t with df degrees of freedom (0 < p < 1), by bisection on t_cdf.
function M.t_quantile(p, df)
  local key = p .. "/" .. df
  if tq_cache[key] then return tq_cache[key] end
  if p < 0.5 then return -M.t_quantile(1 - p, df) end
  local lo, hi = 0, 1
  while M.t_cdf(hi, df) < p do hi = hi * 2 end
  for _ = 1, 100 do
    local mid = (lo + hi) / 2
    if M.t_cdf(mid, df) < p then lo = mid else hi = mid end
    if hi - lo < 1e-12 * hi then break end
  end
  tq_cache[key] = (lo + hi) / 2
  return tq_cache[key]
end

---------------------------------------------------------------------------------------------------
-- sums of a set of windows

local function new_sums() return { n = 0, sx = 0, sxx = 0 } end
local function new_ksums() return { sy = { 0, 0, 0 }, syy = { 0, 0, 0 }, sxy = { 0, 0, 0 } } end

local function add_ksums(into, k)
  for m = 1, 3 do
    into.sy[m] = into.sy[m] + k.sy[m]
    into.syy[m] = into.syy[m] + k.syy[m]
    into.sxy[m] = into.sxy[m] + k.sxy[m]
  end
end

-- The ratio estimate of measure m over windows with sums w (unit) and k (key, or nil: all 0).
-- Returns R, s2 (the residual variance per window), n, xbar.
local function ratio(w, k, m)
  if w.n == 0 or w.sx <= 0 then return nil end
  local sy = k and k.sy[m] or 0
  local r = sy / w.sx
  local s2 = 0
  if w.n >= 2 and k then
    local ss = k.syy[m] - 2 * r * k.sxy[m] + r * r * w.sxx
    s2 = math.max(ss, 0) / (w.n - 1)
  end
  return r, s2, w.n, w.sx / w.n
end

---------------------------------------------------------------------------------------------------
-- the estimator

local Est = {}
Est.__index = Est

--- A new estimator. opts (all optional): level (0.95), phase_p (0.001), phase_rel (0.05),
--- max_blocks (32).
function M.new(opts)
  opts = opts or {}
  return setmetatable({ units = {}, order = {}, level = opts.level or M.LEVEL,
    phase_p = opts.phase_p or M.PHASE_P, phase_rel = opts.phase_rel or M.PHASE_REL,
    max_blocks = opts.max_blocks or M.MAX_BLOCKS }, Est)
end

-- The unit's state, created on first use.
function Est:_unit(u)
  local st = self.units[u]
  if not st then
    st = { blocks = {}, bsize = 1, keys = {}, open = nil, start = nil, skipped = 0,
      discarded = 0, info = {} }
    self.units[u] = st
    self.order[#self.order + 1] = u
  end
  return st
end

--- Marks when the observation of unit u began (seconds on any clock the caller keeps using) and
--- attaches info (a table: pid, ...). Totals are "since start". Idempotent for the start.
function Est:start(u, t, info)
  local st = self:_unit(u)
  st.start = st.start or t
  if info then for k, v in pairs(info) do st.info[k] = v end end
end

--- Adds n launches (records), gpu seconds and bytes of `key` to the open window of unit u.
function Est:add(u, key, n, gpu_s, bytes)
  local st = self:_unit(u)
  local w = st.open
  if not w then
    w = {}
    st.open = w
  end
  local e = w[key]
  if not e then
    e = { 0, 0, 0 }
    w[key] = e
  end
  e[1] = e[1] + (n or 0)
  e[2] = e[2] + (gpu_s or 0)
  e[3] = e[3] + (bytes or 0)
end

-- Merges neighbouring blocks pairwise, doubling the block size.
local function merge_blocks(st)
  local nb = {}
  for i = 1, #st.blocks, 2 do
    local a, b = st.blocks[i], st.blocks[i + 1]
    if b then
      a.w.n, a.w.sx, a.w.sxx = a.w.n + b.w.n, a.w.sx + b.w.sx, a.w.sxx + b.w.sxx
      for key, k in pairs(b.k) do
        if a.k[key] then add_ksums(a.k[key], k) else a.k[key] = k end
      end
    end
    nb[#nb + 1] = a
  end
  st.blocks = nb
  st.bsize = st.bsize * 2
end

--- Closes the open window of unit u, which traced `traced_s` seconds: its sums join the unit's.
--- A window with no records still counts (every key had y = 0 in it).
function Est:commit(u, traced_s)
  assert(type(traced_s) == "number" and traced_s > 0, "estimate: commit needs traced seconds > 0")
  local st = self:_unit(u)
  local w = st.open or {}
  st.open = nil
  local last = st.blocks[#st.blocks]
  if not last or last.w.n >= st.bsize then
    if #st.blocks >= self.max_blocks then
      merge_blocks(st)
      last = st.blocks[#st.blocks]
    end
    if not last or last.w.n >= st.bsize then
      last = { w = new_sums(), k = {} }
      st.blocks[#st.blocks + 1] = last
    end
  end
  local x = traced_s
  last.w.n, last.w.sx, last.w.sxx = last.w.n + 1, last.w.sx + x, last.w.sxx + x * x
  for key, e in pairs(w) do
    local k = last.k[key]
    if not k then
      k = new_ksums()
      last.k[key] = k
    end
    for m = 1, 3 do
      local y = e[m]
      k.sy[m], k.syy[m], k.sxy[m] = k.sy[m] + y, k.syy[m] + y * y, k.sxy[m] + x * y
    end
    st.keys[key] = true
  end
end

--- Forgets the open window of unit u (a window that failed or was cut short): no sample.
function Est:discard(u)
  local st = self:_unit(u)
  st.open = nil
  st.discarded = st.discarded + 1
end

--- Counts a window of unit u that was skipped (an overloaded process), with the reason.
function Est:skip(u, reason)
  local st = self:_unit(u)
  st.skipped = st.skipped + 1
  st.skip_reason = reason
end

-- The sums of blocks [i, j] of a unit, for the unit and for `key`.
local function sums_of(st, key, i, j)
  local w, k = new_sums(), nil
  for b = i, j do
    local blk = st.blocks[b]
    w.n, w.sx, w.sxx = w.n + blk.w.n, w.sx + blk.w.sx, w.sxx + blk.w.sxx
    local bk = blk.k[key]
    if bk then
      k = k or new_ksums()
      add_ksums(k, bk)
    end
  end
  return w, k
end

--- The units in the order they were first seen.
function Est:unit_list() return self.order end

--- Facts about unit u at time `now` (the caller's clock): windows, traced_s, elapsed_s, duty
--- (traced / elapsed), skipped, discarded, skip_reason, info, and limit (the detection limit
--- in launches per second, nil before the first window).
function Est:summary(u, now)
  local st = self.units[u]
  if not st then return nil end
  local w = sums_of(st, nil, 1, #st.blocks)
  local elapsed = st.start and now and math.max(now - st.start, w.sx) or w.sx
  return { windows = w.n, traced_s = w.sx, elapsed_s = elapsed,
    duty = elapsed > 0 and w.sx / elapsed or 0, skipped = st.skipped, discarded = st.discarded,
    skip_reason = st.skip_reason, info = st.info, limit = w.sx > 0 and 3 / w.sx or nil }
end

--- The keys of unit u seen in at least one window.
function Est:keys(u)
  local st = self.units[u]
  local out = {}
  if not st then return out end
  for k in pairs(st.keys) do out[#out + 1] = k end
  table.sort(out)
  return out
end

local MEASURE_INDEX = { n = 1, t = 2, b = 3 }

-- The phase test of one key and measure: true, p when the halves disagree.
function Est:_phase(st, key, m)
  local nb = #st.blocks
  if nb < 2 then return false end
  -- Split at the block boundary nearest to half of the windows.
  local total, acc, cut = 0, 0, 1
  for b = 1, nb do total = total + st.blocks[b].w.n end
  for b = 1, nb - 1 do
    acc = acc + st.blocks[b].w.n
    cut = b
    if acc * 2 >= total then break end
  end
  local w1, k1 = sums_of(st, key, 1, cut)
  local w2, k2 = sums_of(st, key, cut + 1, nb)
  if w1.n < 3 or w2.n < 3 then return false end
  local r1, s1, n1, x1 = ratio(w1, k1, m)
  local r2, s2, n2, x2 = ratio(w2, k2, m)
  local v1, v2 = s1 / (n1 * x1 * x1), s2 / (n2 * x2 * x2)
  local diff = math.abs(r1 - r2)
  if diff <= self.phase_rel * math.max(math.abs(r1), math.abs(r2)) then return false end
  if v1 + v2 <= 0 then return true, 0, r1, r2 end
  local t = diff / math.sqrt(v1 + v2)
  local df = (v1 + v2) ^ 2 / ((v1 > 0 and v1 * v1 / (n1 - 1) or 0) + (v2 > 0 and v2 * v2 / (n2 - 1) or 0))
  local p = 2 * (1 - M.t_cdf(t, df))
  return p < self.phase_p, p, r1, r2
end

--- The estimate of `key` in unit u at time `now`, for measure m ("n" launches, "t" GPU seconds,
--- "b" bytes; default "n"):
---   { rate, lo, hi, half (per second), total, total_lo, total_hi, total_half (since start),
---     windows, seen (windows in which the key occurred is not kept: seen = true/false),
---     phase (true when the halves disagree), phase_p, first, second (the halves' rates),
---     df, below (true for a key seen in no window), limit (the detection limit, launches/s) }
--- half is nil with fewer than 2 windows (no spread to measure). nil before any window.
function Est:estimate(u, key, now, m)
  local st = self.units[u]
  if not st or #st.blocks == 0 then return nil end
  local mi = MEASURE_INDEX[m or "n"] or error("estimate: measure must be n, t or b", 2)
  local w, k = sums_of(st, key, 1, #st.blocks)
  local elapsed = st.start and now and math.max(now - st.start, w.sx) or w.sx
  local out = { windows = w.n, traced_s = w.sx, elapsed_s = elapsed, limit = 3 / w.sx }
  if not st.keys[key] then
    out.below = true
    return out
  end
  local r, s2, n, xbar = ratio(w, k, mi)
  out.rate, out.total = r, r * elapsed
  if n >= 2 then
    local f = math.min(w.sx / elapsed, 1)
    local v = (1 - f) * s2 / (n * xbar * xbar)
    out.df = n - 1
    out.half = M.t_quantile(1 - (1 - self.level) / 2, n - 1) * math.sqrt(v)
    out.lo, out.hi = math.max(r - out.half, 0), r + out.half
    out.total_half = out.half * elapsed
    out.total_lo, out.total_hi = out.lo * elapsed, out.hi * elapsed
  end
  local ph, p, r1, r2 = self:_phase(st, key, mi)
  out.phase, out.phase_p, out.first, out.second = ph, p, r1, r2
  return out
end

--- The sum over units (a list; default every unit) of the estimates of `key` at `now` (a number,
--- or a function(unit) giving each unit's own clock): rate and total add,
--- and so do the variances (processes are independent strata), so half = sqrt(sum of half^2).
--- Units that never saw the key add nothing; below = true when none did (limit: the smallest
--- rate that would have been seen, 3 / the traced seconds of all units). phase when any unit's is.
function Est:sum(key, now, m, units)
  units = units or self.order
  local out = { rate = 0, total = 0, windows = 0, traced_s = 0, phase = false, below = true }
  local h2, th2, have_half = 0, 0, true
  for _, u in ipairs(units) do
    local e = self:estimate(u, key, type(now) == "function" and now(u) or now, m)
    if e then
      out.windows = out.windows + e.windows
      out.traced_s = out.traced_s + e.traced_s
      if not e.below then
        out.below = false
        out.rate = out.rate + e.rate
        out.total = out.total + e.total
        if e.half then
          h2, th2 = h2 + e.half ^ 2, th2 + e.total_half ^ 2
        else
          have_half = false
        end
        out.phase = out.phase or e.phase
      end
    end
  end
  if out.traced_s > 0 then out.limit = 3 / out.traced_s end
  if not out.below and have_half then
    out.half, out.total_half = math.sqrt(h2), math.sqrt(th2)
    out.lo, out.hi = math.max(out.rate - out.half, 0), out.rate + out.half
    out.total_lo, out.total_hi = math.max(out.total - out.total_half, 0), out.total + out.total_half
  end
  return out
end

--- Every key seen in any unit, sorted.
function Est:all_keys()
  local seen, out = {}, {}
  for _, u in ipairs(self.order) do
    for k in pairs(self.units[u].keys) do
      if not seen[k] then seen[k] = true out[#out + 1] = k end
    end
  end
  table.sort(out)
  return out
end

--- Formats "N ± M" for a value and its half-width (either may be nil: "?"), with `fmt` for both.
function M.pm(v, half, fmt)
  fmt = fmt or "%.0f"
  return (v and fmt:format(v) or "?") .. " ± " .. (half and fmt:format(half) or "?")
end

return M
