-- cuptimon.corr: external correlation ids and their metadata (engine/include/cuptimon.h,
-- "external correlation"); cuptimon re-exports every function (cm.corr_push, cm.corr_join, ...).
--
-- Design note. A thin FFI layer over the engine's per-thread correlation stacks and its metadata
-- store: the C side owns the stacks, the chains and the blobs; this module owns only its output
-- cells, allocated once. Loop thread only, like the rest of cuptimon; no state of its own.
--
-- These act on THIS process's CUDA work only: the stacks are per thread of the process that
-- calls them (the monitor itself, or a program embedding the host with the in-process engine).
-- They do not reach the processes of `-- cmd` or a replay; a framework there calls the C API.
local ffi = require "ffi"
require "cuptimon.cdef"

local C = ffi.C

local M = {}

local u64_cell = ffi.new("uint64_t[1]")

local function fail(rc)
  local name = ffi.string(C.cm_err_name(rc))
  local msg = ffi.string(C.cm_errmsg())
  if msg == "" then msg = ffi.string(C.cm_strerror(rc)) end
  return nil, name .. ": " .. msg, name
end

-- Validates an id argument (a positive integer number, or a uint64 cdata); raises at level 3.
local function check_id(fname, id, zero_ok)
  if type(id) == "number" then
    if id == math.floor(id) and (id > 0 or (zero_ok and id == 0)) and id < 2 ^ 53 then return id end
  elseif type(id) == "cdata" and ffi.istype("uint64_t", id) and (zero_ok or id ~= 0) then
    return id
  end
  error(("%s: the id must be a positive integer%s, got %s"):format(fname,
    zero_ok and " (or 0 for the current id)" or "", tostring(id)), 3)
end

-- A 64-bit id as a Lua number (ids come from a counter, so they stay below 2^53).
local function id_number(v) return tonumber(v) end

--- Pushes an external correlation id on the calling thread: a new process-unique one, or `id`.
--- Returns the id, or nil, err, name (ERANGE past CM_CORR_MAX_DEPTH frames).
function M.corr_push(id)
  if id == nil then
    local v = C.cm_corr_push()
    if v == 0 then return fail(C.cm_corr_depth() >= 256 and C.CM_ERANGE or C.CM_ENOMEM) end
    return id_number(v)
  end
  id = check_id("cuptimon.corr_push", id)
  local rc = C.cm_corr_push_id(id)
  if rc ~= 0 then return fail(rc) end
  return id_number(id)
end

--- Pops the calling thread's innermost id and returns it; nil, "ENOENT: ...", "ENOENT" when
--- nothing is pushed.
function M.corr_pop()
  local rc = C.cm_corr_pop(u64_cell)
  if rc ~= 0 then return fail(rc) end
  return id_number(u64_cell[0])
end

--- The id the calling thread's work is tagged with now, or 0.
function M.corr_current() return id_number(C.cm_corr_current()) end

--- The number of ids pushed on the calling thread.
function M.corr_depth() return C.cm_corr_depth() end

local chain_buf = ffi.new("uint64_t[256]") -- CM_CORR_MAX_DEPTH

--- The chain of `id`, innermost first ({ id, enclosing, ..., outermost }); {} when the id is
--- unknown or retired (two drains after its pop).
function M.corr_chain(id)
  id = check_id("cuptimon.corr_chain", id)
  local n = C.cm_corr_chain(id, chain_buf, 256)
  local t = {}
  for i = 0, math.min(n, 256) - 1 do t[i + 1] = id_number(chain_buf[i]) end
  return t
end

-- A column argument of corr_join as a `ctype` array of n: a cdata array or pointer (a batch
-- column, read from index 0) or a Lua list (read from index 1).
local function as_array(fname, what, v, ctype, n)
  local arr = ffi.new(ctype .. "[?]", math.max(n, 1))
  if type(v) == "table" then
    for i = 0, n - 1 do arr[i] = v[i + 1] or 0 end
  elseif type(v) == "cdata" then
    for i = 0, n - 1 do arr[i] = v[i] end
  else
    error(("%s: %s must be a column (a batch's cdata column or a Lua list), got %s")
      :format(fname, what, type(v) == "nil" and "nothing" or "a " .. type(v)), 3)
  end
  return arr
end

-- The arguments of corr_join(ec, rows) as C arrays. `ec` has the columns of an
-- external_correlation batch (external_id and correlation; external_kind optional, and when
-- present only the engine's own kind counts), `rows` a correlation column; both carry n. A batch
-- has that shape; so does a plain table of Lua lists.
local function join_args(fname, ec, rows)
  for i, v in ipairs({ ec, rows }) do
    if type(v) ~= "table" then
      error(("%s: argument %d must be a batch or a table { correlation = col, n = n%s }, got a %s")
        :format(fname, i, i == 1 and ", external_id = col, external_kind = col (optional)" or "",
        type(v)), 3)
    end
    if type(rawget(v, "n")) ~= "number" then
      error(("%s: argument %d has no row count n"):format(fname, i), 3)
    end
  end
  local n_ec, n = rawget(ec, "n"), rawget(rows, "n")
  local kind = rawget(ec, "external_kind")
  return kind and as_array(fname, "external_kind", kind, "uint32_t", n_ec) or nil,
    as_array(fname, "external_id", rawget(ec, "external_id"), "uint64_t", n_ec),
    as_array(fname, "the external_correlation correlation", rawget(ec, "correlation"),
      "uint32_t", n_ec), n_ec,
    as_array(fname, "correlation", rawget(rows, "correlation"), "uint32_t", n), n
end

--- For each row of `rows` (a batch with a correlation column, or { correlation = list, n = n }),
--- the external id its API call was tagged with, or 0, from `ec` (an external_correlation batch
--- with external_id and correlation, or the same as a table of lists). Returns a uint64_t cdata
--- array indexed like the batch's columns (row i at [i], from 0), or nil, err, name.
function M.corr_join(ec, rows)
  local kind, ext, ecc, n_ec, corr, n = join_args("cuptimon.corr_join", ec, rows)
  local out = ffi.new("uint64_t[?]", math.max(n, 1))
  local rc = C.cm_corr_join(kind, ext, ecc, n_ec, corr, n, out)
  if rc ~= 0 then return fail(rc) end
  return out
end

--- Like corr_join, but each row's whole chain: returns a table t with t[i] (i from 0, as the
--- batch's rows) the list of ids innermost first ({} when untagged), or nil, err, name.
function M.corr_join_chains(ec, rows)
  local kind, ext, ecc, n_ec, corr, n = join_args("cuptimon.corr_join_chains", ec, rows)
  local offsets = ffi.new("uint32_t[?]", n + 1)
  local need = C.cm_corr_join_chains(kind, ext, ecc, n_ec, corr, n, offsets, nil, 0)
  if need < 0 then return fail(tonumber(need)) end
  local ids = ffi.new("uint64_t[?]", math.max(tonumber(need), 1))
  need = C.cm_corr_join_chains(kind, ext, ecc, n_ec, corr, n, offsets, ids, need)
  if need < 0 then return fail(tonumber(need)) end
  local t = {}
  for i = 0, n - 1 do
    local c = {}
    for j = offsets[i], offsets[i + 1] - 1 do c[#c + 1] = id_number(ids[j]) end
    t[i] = c
  end
  return t
end

--- Attaches a JSON blob to `id` (0 or nil: the current id); blobs on one id merge, objects key
--- by key. Returns true, or nil, err, name (EINVAL with the byte offset for invalid JSON,
--- ENOENT for id 0 with nothing pushed).
function M.corr_metadata_put(id, json)
  id = check_id("cuptimon.corr_metadata_put", id or 0, true)
  if type(json) ~= "string" then
    error(("cuptimon.corr_metadata_put: argument 2 must be a JSON string, got a %s")
      :format(type(json)), 2)
  end
  local rc = C.cm_corr_metadata_put(id, json, #json)
  if rc ~= 0 then return fail(rc) end
  return true
end

local take_ptr, take_len = ffi.new("char *[1]"), ffi.new("size_t[1]")

--- Moves out every blob put since the last take as one JSON object text, {"<id>": blob, ...}
--- ("{}" when none). Returns the text, or nil, err, name.
function M.corr_metadata_take()
  local rc = C.cm_corr_metadata_take(take_ptr, take_len)
  if rc ~= 0 then return fail(rc) end
  local s = ffi.string(take_ptr[0], take_len[0])
  C.cm_free(take_ptr[0])
  take_ptr[0] = nil
  return s
end

return M
