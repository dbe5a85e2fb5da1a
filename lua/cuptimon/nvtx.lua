-- cuptimon.nvtx: the pairing of NVTX range records, the part the recipes that read the marker
-- kind share (nvtx.lua, sqlite.lua, ranks.lua, timeline.lua).
--
--   local nvtx = require "cuptimon.nvtx"
--   local ranges = nvtx.pairing()                    -- one per process
--   if bit.band(flags, nvtx.START) ~= 0 then
--     local stop = ranges:start(id, { name = name, start = t })
--     if stop then ... end                           -- its END came first: the range is whole
--   elseif bit.band(flags, nvtx.END) ~= 0 then
--     local r = ranges:stop(id, t)
--     if r then ... end                              -- the range is whole
--   end
--
-- Design note. A range (push/pop, or start/end) arrives as two marker records with the same id,
-- a START and an END. Each thread's buffer is delivered on its own, so the END may come first, in
-- another batch. A pairing keeps the STARTs still open (id -> what the recipe keeps of the
-- start) and the ENDs that came first (id -> what it keeps of the end) until the other half
-- arrives, and then hands the recipe the half it kept. The recipe decodes the flags itself, with
-- the constants below (which records are ranges, what an instant mark becomes and which ranges
-- it pairs at all are its own). A half is up to two values kept in parallel tables, so the
-- pairing allocates no table per range: it costs a lookup and a store per record. Memory is
-- bounded by the options: `pending` caps the ENDs kept, `cap` the open ranges. Loop thread only;
-- no FFI, no cuptimon dependency.
local M = {}

M.INSTANT, M.START, M.END = 1, 2, 4 -- CUPTI_ACTIVITY_FLAG_MARKER_INSTANTANEOUS, _START, _END
M.THREAD = 2                        -- CUPTI_ACTIVITY_OBJECT_THREAD (a marker's object_kind)

local Pairing = {}
Pairing.__index = Pairing

--- A pairing of one process's ranges. opts (all optional):
---   pending = n  the ENDs kept waiting for their START: when n are kept, they are all dropped
---                and the count starts over; 0 keeps none (an END whose START is not open is
---                dropped). Default: no bound.
---   cap = n      the open ranges kept, in two generations of n STARTs each: when the current
---                one is full it becomes the old one and the older is dropped, so a range stays
---                open for n to 2n later STARTs, and an END after that finds nothing. Default:
---                no bound.
--- Each half keeps up to two values, in parallel tables (no table per range). p.open (id -> the
--- first value) holds the open ranges (with cap, the older generation is p.old): a recipe may
--- read it (the ranges open on a thread), never write it.
function M.pairing(opts)
  opts = opts or {}
  return setmetatable({ open = {}, open2 = {}, old = opts.cap and {} or nil,
    old2 = opts.cap and {} or nil, nopen = 0, cap = opts.cap, ended = {}, ended2 = {}, nended = 0,
    pending = opts.pending }, Pairing)
end

--- A START of range `id`: returns the values its END left when that came first (the range is
--- whole, and forgotten); otherwise keeps `v` (not nil) and `v2` as the open range's values and
--- returns nil.
function Pairing:start(id, v, v2)
  local ended = self.ended
  local e = ended[id]
  if e ~= nil then
    local e2 = self.ended2[id]
    ended[id], self.ended2[id] = nil, nil
    return e, e2
  end
  if self.cap then
    if self.nopen >= self.cap then
      self.old, self.old2, self.open, self.open2, self.nopen = self.open, self.open2, {}, {}, 0
    end
    self.nopen = self.nopen + 1
  end
  self.open[id], self.open2[id] = v, v2
  return nil
end

--- An END of range `id`: returns the values its START left (the range is whole, and
--- forgotten); otherwise keeps `e` (not nil) and `e2` until the START comes (unless pending is
--- 0) and returns nil.
function Pairing:stop(id, e, e2)
  local open, old = self.open, self.old
  local v, v2 = open[id], nil
  if v ~= nil then
    v2 = self.open2[id]
  elseif old then
    v, v2 = old[id], self.old2[id]
  end
  if v ~= nil then
    open[id], self.open2[id] = nil, nil
    if old then old[id], self.old2[id] = nil, nil end
    return v, v2
  end
  local pending = self.pending
  if pending == 0 then return nil end
  if pending and self.nended >= pending then self.ended, self.ended2, self.nended = {}, {}, 0 end
  self.ended[id], self.ended2[id] = e, e2
  self.nended = self.nended + 1
  return nil
end

--- The ranges still open (id -> the first value), which the pairing forgets: at the end of a
--- run, the ranges whose END never came. For a pairing without cap.
function Pairing:take_open()
  local open = self.open
  self.open, self.open2, self.nopen = {}, {}, 0
  return open
end

return M
