-- cuptimon.yaml: the block-style subset of YAML that configuration files such as the Prometheus
-- exporter toolkit's web configuration are written in.
--
-- Design note. A reader of a security setting must never guess, so this reads a strict subset and
-- refuses the rest with the line it stopped at, rather than reading it some other way: block
-- mappings and block sequences nested by indentation (spaces), plain, 'single' and "double"
-- quoted scalars, flow sequences of scalars ([a, "b"]), the empty flow mapping {}, comments, and
-- one document (an optional leading ---). Anchors, aliases, tags, block scalars (| and >),
-- multi-line plain scalars, mappings inside sequences, duplicate keys and tabs in indentation are
-- refused. Scalars come back as strings, except true/false (booleans) and null, ~ or nothing (nil,
-- kept as the key's presence in `present`). Pure functions.
--
--   local doc, err = yaml.parse(text)   -- doc: a table, or nil and "line N: why"
local M = {}

local function trim(s) return (s:gsub("^%s+", ""):gsub("%s+$", "")) end

-- Removes a comment: a # at the start or after white space, outside quotes.
local function strip_comment(s)
  local q
  for i = 1, #s do
    local c = s:sub(i, i)
    if q then
      if c == q then q = nil end
    elseif c == "'" or c == '"' then
      q = c
    elseif c == "#" and (i == 1 or s:sub(i - 1, i - 1):match("%s")) then
      return s:sub(1, i - 1)
    end
  end
  return s
end

local DQ_ESC = { n = "\n", t = "\t", r = "\r", ['"'] = '"', ["\\"] = "\\", ["/"] = "/", ["0"] = "\0" }

-- Reads one quoted scalar starting at s[i] (a quote); returns the value and the index after it.
local function quoted(s, i)
  local q, out, j = s:sub(i, i), {}, i + 1
  while j <= #s do
    local c = s:sub(j, j)
    if q == "'" and c == "'" then
      if s:sub(j + 1, j + 1) == "'" then
        out[#out + 1] = "'"
        j = j + 2
      else
        return table.concat(out), j + 1
      end
    elseif q == '"' and c == "\\" then
      local e = DQ_ESC[s:sub(j + 1, j + 1)]
      if not e then return nil, "an escape this reader does not know: " .. s:sub(j, j + 1) end
      out[#out + 1] = e
      j = j + 2
    elseif q == '"' and c == '"' then
      return table.concat(out), j + 1
    else
      out[#out + 1] = c
      j = j + 1
    end
  end
  return nil, "an unterminated quoted string"
end

local PLAIN_BAD = "^[&*!|>%%@`]"

-- A whole scalar (quoted or plain) or flow collection: returns value, is_null; or nil, nil, err.
local function scalar(s)
  s = trim(s)
  if s == "" or s == "~" or s == "null" or s == "Null" or s == "NULL" then return nil, true end
  local c = s:sub(1, 1)
  if c == "'" or c == '"' then
    local v, j = quoted(s, 1)
    if not v then return nil, nil, j end
    if trim(s:sub(j)) ~= "" then return nil, nil, "text after a quoted string: " .. s end
    return v
  end
  if c == "[" then
    if s:sub(-1) ~= "]" then return nil, nil, "a flow sequence must end on its line: " .. s end
    local body, list = trim(s:sub(2, -2)), {}
    local i = 1
    while i <= #body do
      local ch = body:sub(i, i)
      local v
      if ch == "'" or ch == '"' then
        local j
        v, j = quoted(body, i)
        if not v then return nil, nil, j end
        i = j
      else
        local j = body:find(",", i, true) or #body + 1
        v = trim(body:sub(i, j - 1))
        if v == "" or v:match("^[%[{]") or v:match(PLAIN_BAD) then
          return nil, nil, "a flow sequence holds plain or quoted scalars only: " .. s
        end
        i = j
      end
      list[#list + 1] = v
      local rest = body:sub(i):match("^%s*,?%s*()")
      if body:sub(i):match("^%s*[^,%s]") then return nil, nil, "a missing comma: " .. s end
      i = i + rest - 1
    end
    return list
  end
  if c == "{" then
    if s:match("^{%s*}$") then return {} end
    return nil, nil, "flow mappings are not read; write the mapping in block style: " .. s
  end
  if s:match(PLAIN_BAD) or s:match("^%- ") or s:match("^[?:,%]}]") then
    return nil, nil, "anchors, aliases, tags, block scalars and these indicators are not read: " .. s
  end
  if s:find(": ", 1, true) or s:sub(-1) == ":" then
    return nil, nil, "a mapping where a scalar was expected: " .. s
  end
  if s == "true" or s == "True" or s == "TRUE" then return true end
  if s == "false" or s == "False" or s == "FALSE" then return false end
  return s
end

-- Splits "key: rest" (the key plain or quoted); returns key, rest or nil when the line is no
-- mapping entry.
local function split_key(s)
  local c = s:sub(1, 1)
  if c == "'" or c == '"' then
    local k, j = quoted(s, 1)
    if not k then return nil end
    local rest = s:sub(j):match("^%s*:(.*)$")
    if not rest or (rest ~= "" and not rest:match("^%s")) then return nil end
    return k, rest
  end
  local k, rest = s:match("^([^%s:#][^:]-)%s*:(%s.*)$")
  if not k then k, rest = s:match("^([^%s:#][^:]-)%s*:()$"), "" end
  if not k then return nil end
  return k, rest
end

--- Parses `text`; returns the document (a table; {} for an empty one) or nil, "line N: why".
--- Each mapping also holds, under the key M.PRESENT, the set of its keys, null-valued ones too.
M.PRESENT = setmetatable({}, { __tostring = function() return "yaml.PRESENT" end })

function M.parse(text)
  if type(text) ~= "string" then error("yaml.parse: text must be a string", 2) end
  local lines = {}
  local n = 0
  for raw in (text .. "\n"):gmatch("([^\n]*)\n") do
    n = n + 1
    raw = raw:gsub("\r$", "")
    if raw:match("^%s*\t") and trim(raw) ~= "" then return nil, ("line %d: a tab in the indentation"):format(n) end
    local body = strip_comment(raw)
    if trim(body) ~= "" then
      local t = trim(body)
      if t == "---" and #lines > 0 then return nil, ("line %d: only one document is read"):format(n) end
      if t == "..." then break end
      if t ~= "---" then -- (a leading --- is the document start marker)
        lines[#lines + 1] = { indent = #body:match("^( *)"), text = trim(body), n = n }
      end
    end
  end
  local pos = 1
  local block

  local function fail(l, why) return nil, ("line %d: %s"):format(l.n, why) end

  local function is_item(l) return l.text == "-" or l.text:sub(1, 2) == "- " end

  -- The value of a key or item whose own line held nothing after it: a nested block deeper
  -- than `indent` (or, for a key, a sequence at the same indent), else null.
  local function nested(indent, allow_same_seq)
    local l = lines[pos]
    if l and (l.indent > indent or (allow_same_seq and l.indent == indent and is_item(l))) then
      return block(l.indent)
    end
    return nil, nil, true
  end

  local function sequence(indent)
    local list = {}
    while lines[pos] and lines[pos].indent == indent and is_item(lines[pos]) do
      local l = lines[pos]
      pos = pos + 1
      local rest = trim(l.text:sub(2))
      if rest == "" then
        local v, err = nested(indent, false)
        if err then return nil, err end
        list[#list + 1] = v
      else
        if split_key(rest) then return fail(l, "mappings inside sequences are not read") end
        local v, _, err = scalar(rest)
        if err then return fail(l, err) end
        list[#list + 1] = v
      end
    end
    return list
  end

  local function mapping(indent)
    local map, present = {}, {}
    map[M.PRESENT] = present
    while lines[pos] and lines[pos].indent == indent and not is_item(lines[pos]) do
      local l = lines[pos]
      pos = pos + 1
      local k, rest = split_key(l.text)
      if not k then return fail(l, "a mapping entry (key: value) was expected: " .. l.text) end
      if present[k] then return fail(l, ("the key %q appears twice"):format(k)) end
      present[k] = true
      if trim(rest) == "" then
        local v, err = nested(indent, true)
        if err then return nil, err end
        map[k] = v
      else
        local v, _, err = scalar(rest)
        if err then return fail(l, err) end
        map[k] = v
        if lines[pos] and lines[pos].indent > indent then
          return fail(lines[pos], "multi-line scalars are not read (quote the value on one line)")
        end
      end
    end
    return map
  end

  block = function(indent)
    local l = lines[pos]
    local v, err
    if is_item(l) then v, err = sequence(indent) else v, err = mapping(indent) end
    if err then return nil, err end
    if lines[pos] and lines[pos].indent > indent then
      return fail(lines[pos], "unexpected indentation")
    end
    return v
  end

  if #lines == 0 then return { [M.PRESENT] = {} } end
  if lines[1].indent ~= 0 then return fail(lines[1], "the document must start at column 1") end
  local doc, err = block(0)
  if err then return nil, err end
  if lines[pos] then return fail(lines[pos], "unexpected text: " .. lines[pos].text) end
  if type(doc) ~= "table" or doc[M.PRESENT] == nil then
    return nil, "line 1: the document must be a mapping"
  end
  return doc
end

return M
