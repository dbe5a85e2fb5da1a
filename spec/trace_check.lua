-- spec/trace_check.lua: a validator of the Chrome trace event format (the JSON that
-- scripts/timeline.lua writes), for the specs.
--
--   local check = require "trace_check"
--   local r, err = check.file("trace.json")  -- r: { events =, by_cat =, by_name =, by_ph = }
--
-- Design note. The file is parsed by a small strict JSON parser (RFC 8259: no trailing commas,
-- no comments, strings with escapes, numbers in JSON's grammar, strings in well-formed UTF-8), so
-- "valid JSON" means what any JSON reader would accept (Python's json.loads of the file's bytes
-- decoded as UTF-8). Then, per event: ph, name and pid are required; ts for every phase
-- but metadata ("M"); dur (>= 0) for complete events ("X"); tid for every thread-scoped phase.
-- Per (pid, tid) track, events are ordered by ts (file order breaks ties): each "E" closes the
-- innermost open "B", none is left open, and complete slices nest (a slice that starts inside
-- another ends inside it), as Perfetto requires of a thread's slices. Every flow start ("s") has
-- exactly one finish ("f") with the same id and the other way round. The first problems found
-- (at most 20) are returned as the error.
local M = {}

---------------------------------------------------------------------------------------------------
-- UTF-8

--- The byte position of the first byte of `s` that does not begin a well-formed UTF-8 sequence
--- (a stray continuation byte, a truncated sequence, an overlong form, a surrogate, past
--- U+10FFFF), or nil when `s` is valid UTF-8. JSON text must be UTF-8 (RFC 8259, 8.1).
function M.utf8_invalid(s)
  local i, n = 1, #s
  while i <= n do
    local c = s:byte(i)
    local len, lo, hi
    if c < 0x80 then len, lo, hi = 1, 0, 0 -- ASCII: one byte
    elseif c >= 0xC2 and c <= 0xDF then len, lo, hi = 2, 0x80, 0xBF
    elseif c >= 0xE0 and c <= 0xEF then
      len, lo, hi = 3, c == 0xE0 and 0xA0 or 0x80, c == 0xED and 0x9F or 0xBF
    elseif c >= 0xF0 and c <= 0xF4 then
      len, lo, hi = 4, c == 0xF0 and 0x90 or 0x80, c == 0xF4 and 0x8F or 0xBF
    else
      return i
    end
    if len > 1 then
      local b = s:byte(i + 1)
      if not b or b < lo or b > hi then return i end
      for k = 2, len - 1 do
        b = s:byte(i + k)
        if not b or b < 0x80 or b > 0xBF then return i end
      end
    end
    i = i + len
  end
  return nil
end

---------------------------------------------------------------------------------------------------
-- JSON

local function parser(s)
  local pos = 1
  local function fail(msg) error(("JSON: %s at byte %d"):format(msg, pos), 0) end
  local function ws() pos = s:find("[^ \t\r\n]", pos) or #s + 1 end
  local value
  local esc = { ['"'] = '"', ["\\"] = "\\", ["/"] = "/", b = "\b", f = "\f", n = "\n", r = "\r",
    t = "\t" }
  local function str()
    pos = pos + 1
    local parts = {}
    while true do
      local a, b = s:find('^[^"\\%c]+', pos)
      if a then
        local raw = s:sub(a, b)
        local bad = M.utf8_invalid(raw)
        if bad then
          pos = a + bad - 1
          fail("invalid UTF-8 in a string")
        end
        parts[#parts + 1] = raw
        pos = b + 1
      end
      local c = s:sub(pos, pos)
      if c == '"' then
        pos = pos + 1
        return table.concat(parts)
      elseif c == "\\" then
        local e = s:sub(pos + 1, pos + 1)
        if esc[e] then
          parts[#parts + 1] = esc[e]
          pos = pos + 2
        elseif e == "u" and s:find("^%x%x%x%x", pos + 2) then
          parts[#parts + 1] = "?"
          pos = pos + 6
        else
          fail("bad escape")
        end
      else
        fail(c == "" and "unterminated string" or "control character in a string")
      end
    end
  end
  function value()
    ws()
    local c = s:sub(pos, pos)
    if c == "{" then
      pos = pos + 1
      local t = {}
      ws()
      if s:sub(pos, pos) == "}" then pos = pos + 1 return t end
      while true do
        ws()
        if s:sub(pos, pos) ~= '"' then fail("expected a key") end
        local k = str()
        ws()
        if s:sub(pos, pos) ~= ":" then fail("expected ':'") end
        pos = pos + 1
        t[k] = value()
        ws()
        c = s:sub(pos, pos)
        pos = pos + 1
        if c == "}" then return t end
        if c ~= "," then fail("expected ',' or '}'") end
      end
    elseif c == "[" then
      pos = pos + 1
      local t = {}
      ws()
      if s:sub(pos, pos) == "]" then pos = pos + 1 return t end
      while true do
        t[#t + 1] = value()
        ws()
        c = s:sub(pos, pos)
        pos = pos + 1
        if c == "]" then return t end
        if c ~= "," then fail("expected ',' or ']'") end
      end
    elseif c == '"' then
      return str()
    elseif s:find("^true", pos) then pos = pos + 4 return true
    elseif s:find("^false", pos) then pos = pos + 5 return false
    elseif s:find("^null", pos) then pos = pos + 4 return nil
    end
    local int = s:match("^%-?%d+", pos)
    if not int then fail("unexpected character " .. (c == "" and "(end)" or c)) end
    if int:match("^%-?0%d") then fail("a number with a leading zero") end
    local b = pos + #int
    local frac = s:match("^%.%d+", b)
    if frac then b = b + #frac end
    local exp = s:match("^[eE][%+%-]?%d+", b)
    if exp then b = b + #exp end
    b = b - 1
    local n = tonumber(s:sub(pos, b))
    pos = b + 1
    return n
  end
  return function()
    local v = value()
    ws()
    if pos <= #s then fail("trailing characters") end
    return v
  end
end

--- Parses JSON text; returns the value, or nil, err.
function M.json(text)
  local ok, v = pcall(parser(text))
  if not ok then return nil, v end
  return v
end

---------------------------------------------------------------------------------------------------
-- the trace event format

local thread_phases = { X = true, B = true, E = true, i = true, I = true, s = true, t = true,
  f = true }

--- Checks a decoded trace (an array of events or { traceEvents = array }). Returns a summary
--- { events = n, by_ph = {}, by_cat = {}, by_name = {} (X slices by name), flows = n } or nil, err.
function M.check(trace)
  local events = trace.traceEvents or trace
  if type(events) ~= "table" then return nil, "no traceEvents array" end
  local problems = {}
  local function bad(i, msg)
    if #problems < 20 then problems[#problems + 1] = ("event %d: %s"):format(i, msg) end
  end
  local r = { events = #events, by_ph = {}, by_cat = {}, by_name = {}, flows = 0 }
  local tracks, flows = {}, {}
  for i, e in ipairs(events) do
    local ph = e.ph
    if type(ph) ~= "string" then bad(i, "no ph") end
    if type(e.name) ~= "string" then bad(i, "no name") end
    if type(e.pid) ~= "number" then bad(i, "no pid") end
    if ph ~= "M" and type(e.ts) ~= "number" then bad(i, "no ts") end
    if thread_phases[ph] and type(e.tid) ~= "number" then bad(i, "no tid") end
    if ph == "X" and (type(e.dur) ~= "number" or e.dur < 0) then bad(i, "X without a dur >= 0") end
    if type(ph) == "string" then r.by_ph[ph] = (r.by_ph[ph] or 0) + 1 end
    if ph == "X" then
      r.by_cat[e.cat or ""] = (r.by_cat[e.cat or ""] or 0) + 1
      if type(e.name) == "string" then r.by_name[e.name] = (r.by_name[e.name] or 0) + 1 end
    end
    -- Nesting is checked on the events that have what it needs (the others are reported above).
    if (ph == "X" or ph == "B" or ph == "E") and type(e.tid) == "number" and type(e.ts) == "number"
        and (ph ~= "X" or type(e.dur) == "number") then
      local key = tostring(e.pid) .. "/" .. tostring(e.tid)
      local t = tracks[key] or {}
      tracks[key] = t
      t[#t + 1] = { i = i, e = e }
    end
    if ph == "s" or ph == "f" then
      if e.id == nil then bad(i, "flow without an id") end
      local f = flows[tostring(e.id)] or { s = 0, f = 0 }
      flows[tostring(e.id)] = f
      f[ph] = f[ph] + 1
    end
  end
  for id, f in pairs(flows) do
    if f.s ~= 1 or f.f ~= 1 then
      bad(0, ("flow id %s has %d starts and %d finishes"):format(id, f.s, f.f))
    end
    r.flows = r.flows + 1
  end
  for key, list in pairs(tracks) do
    table.sort(list, function(a, b)
      if a.e.ts ~= b.e.ts then return a.e.ts < b.e.ts end
      -- At the same ts, a longer slice opens first (it encloses the shorter one).
      local da, db = a.e.dur or 0, b.e.dur or 0
      if da ~= db then return da > db end
      return a.i < b.i
    end)
    local open = {} -- stack of { ends = ts or nil for B, name = }
    for _, x in ipairs(list) do
      local e = x.e
      while #open > 0 and open[#open].ends and open[#open].ends <= e.ts do open[#open] = nil end
      if e.ph == "X" then
        local top = open[#open]
        if top and top.ends and e.ts + e.dur > top.ends + 1e-6 then
          bad(x.i, ("track %s: slice %q [%s, %s] overlaps %q which ends at %s"):format(key, e.name,
            e.ts, e.ts + e.dur, top.name, top.ends))
        end
        open[#open + 1] = { ends = e.ts + e.dur, name = e.name }
      elseif e.ph == "B" then
        open[#open + 1] = { name = e.name }
      else -- "E"
        local top = open[#open]
        if not top or top.ends then
          bad(x.i, ("track %s: E %q closes no open B"):format(key, e.name))
        else
          open[#open] = nil
        end
      end
    end
    for _, o in ipairs(open) do
      if not o.ends then bad(0, ("track %s: B %q never ends"):format(key, o.name)) end
    end
  end
  if #problems > 0 then return nil, table.concat(problems, "\n") end
  return r
end

--- Reads, parses and checks the trace file at `path`.
function M.file(path)
  local f, err = io.open(path, "rb")
  if not f then return nil, err end
  local text = f:read("*a")
  f:close()
  local trace, jerr = M.json(text)
  if trace == nil then return nil, jerr end
  return M.check(trace)
end

return M
