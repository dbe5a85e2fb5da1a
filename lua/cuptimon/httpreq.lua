-- cuptimon.httpreq: one HTTP/1.x request head, parsed by Debian's http-parser and judged
-- strictly, for lua/cuptimon/httpd.lua.
--
-- Design note. Requests are parsed by Debian's http-parser (libhttp-parser-dev: nodejs/http-parser
-- 2.9.4, the parser Node.js used for years, small, fuzzed and still patched by Debian for
-- security), linked statically into cuptimon-lua and called through ffi.C; its successor llhttp
-- is not among Debian's stable C libraries. On top of it judge() checks: HTTP/1.0 or 1.1, header
-- names RFC 9112 tokens, no obsolete line folding, no control characters, request line and header
-- fields within MAX_HEAD (8 KiB; feed() answers 431 past it), Host required on HTTP/1.1, no request
-- body (Content-Length other than 0 or Transfer-Encoding: 400). One request per connection: bytes
-- after the first request are not parsed. Loop thread only (the parser's callbacks fill one
-- module-level request at a time).
--
--   local r = httpreq.new()
--   local got = httpreq.feed(r, chunk)     -- nil: more; "complete"; or a status (400, 431)
--   local status, target, fields = httpreq.judge(r)   -- status nil: valid; fields: lower-case names
local ffi = require "ffi"
local bit = require "bit"

local M = {}

M.MAX_HEAD = 8192 -- bytes of request line and headers
local MAX_HEAD = M.MAX_HEAD

local TOKEN = "^[!#$%%&'*+%.^_`|~%w%-]+$"

-- http-parser 2.9.4 (http_parser.h), bound through ffi.C: cuptimon-lua links libhttp_parser.a
-- whole. LuaJIT's cdef takes no copy of the header's bitfields as they are laid out, so the two
-- bitfield words are plain uint32_t here: `method` is bits 16-23 and `http_errno` bits 24-30 of
-- `_word2` (x86-64 GCC layout). spec/prometheus_spec.lua compares this cdef's size and offsets
-- and these shifts with the C compiler's (spec/http_parser_layout.c). Enums are int.
local HTTP_PARSER_CDEF = [[
typedef struct http_parser {
  uint32_t _word1;         /* type:2 flags:8 state:7 header_state:7 index:5 and 3 flags */
  uint32_t nread;
  uint64_t content_length;
  unsigned short http_major;
  unsigned short http_minor;
  uint32_t _word2;         /* status_code:16 method:8 http_errno:7 upgrade:1 */
  void *data;
} http_parser;
typedef int (*http_data_cb)(http_parser *, const char *at, size_t length);
typedef int (*http_cb)(http_parser *);
typedef struct http_parser_settings {
  http_cb on_message_begin;
  http_data_cb on_url;
  http_data_cb on_status;
  http_data_cb on_header_field;
  http_data_cb on_header_value;
  http_cb on_headers_complete;
  http_data_cb on_body;
  http_cb on_message_complete;
  http_cb on_chunk_header;
  http_cb on_chunk_complete;
} http_parser_settings;
unsigned long http_parser_version(void);
void http_parser_init(http_parser *parser, int type);
size_t http_parser_execute(http_parser *parser, const http_parser_settings *settings,
  const char *data, size_t len);
int http_should_keep_alive(const http_parser *parser);
const char *http_method_str(int m);
const char *http_errno_name(int err);
]]
local METHOD_SHIFT, ERRNO_SHIFT = 16, 24
local HTTP_REQUEST = 0
ffi.cdef(HTTP_PARSER_CDEF)
local C = ffi.C
do
  local v = tonumber(C.http_parser_version())
  if bit.rshift(v, 16) ~= 2 or bit.band(bit.rshift(v, 8), 0xff) < 9 then
    error(("cuptimon.httpreq: http-parser 2.9 or later 2.x expected, found %d.%d.%d"):format(
      bit.rshift(v, 16), bit.band(bit.rshift(v, 8), 0xff), bit.band(v, 0xff)))
  end
end

-- The request being parsed: http_parser_execute runs the callbacks synchronously, so they fill
-- the table `cur` that feed() sets around the call. Header fields arrive in pieces; a field after
-- a value starts a new one. All pieces together are bounded by MAX_HEAD (feed() gives the parser
-- no more), so no bound is needed here.
local cur
local function piece(list, at, len) list[#list + 1] = ffi.string(at, len) end
local function on_url(_, at, len) piece(cur.url, at, len); return 0 end
local function on_header_field(_, at, len)
  local h = cur.headers
  if cur.in_value or #h == 0 then
    h[#h + 1] = { name = {}, value = {} }
    cur.in_value = false
  end
  piece(h[#h].name, at, len)
  return 0
end
local function on_header_value(_, at, len)
  local h = cur.headers
  cur.in_value = true
  piece(h[#h].value, at, len)
  return 0
end
local function on_headers_complete(p)
  cur.method = ffi.string(C.http_method_str(bit.band(bit.rshift(p._word2, METHOD_SHIFT), 0xff)))
  cur.major, cur.minor = p.http_major, p.http_minor
  return 1 -- no body: any would make the request a 400 anyway
end
local function on_message_complete()
  cur.complete = true
  return 1 -- one request per connection: stop here (pipelined bytes after it are not parsed)
end
-- Created once: LuaJIT has a limited number of callback slots.
local settings = ffi.new("http_parser_settings")
settings.on_url = ffi.cast("http_data_cb", on_url)
settings.on_header_field = ffi.cast("http_data_cb", on_header_field)
settings.on_header_value = ffi.cast("http_data_cb", on_header_value)
settings.on_headers_complete = ffi.cast("http_cb", on_headers_complete)
settings.on_message_complete = ffi.cast("http_cb", on_message_complete)

function M.new()
  local p = ffi.new("http_parser")
  C.http_parser_init(p, HTTP_REQUEST)
  return { parser = p, url = {}, headers = {}, in_value = false, fed = 0, raw = {} }
end

-- Feeds `chunk` to the request's parser, at most up to MAX_HEAD bytes in all. Returns nil while
-- the request is incomplete, else the status to answer ("complete" when the request is whole and
-- valid as HTTP, for answer() to judge).
function M.feed(r, chunk)
  local room = MAX_HEAD - r.fed
  if #chunk > room then chunk = chunk:sub(1, room) end
  r.fed = r.fed + #chunk
  r.raw[#r.raw + 1] = chunk
  cur = r
  local n = C.http_parser_execute(r.parser, settings, chunk, #chunk)
  cur = nil
  if r.complete then return "complete" end
  local errno = bit.band(bit.rshift(r.parser._word2, ERRNO_SHIFT), 0x7f)
  if errno ~= 0 or n ~= #chunk then
    r.error = ffi.string(C.http_errno_name(errno))
    return 400
  end
  if r.fed >= MAX_HEAD then return 431 end
  return nil
end
-- The callbacks must not be entered from JIT-compiled code.
jit.off(M.feed)

-- Judges a request http-parser has read whole: HTTP/1.0 or 1.1, header names tokens, values free
-- of control characters, no obsolete line folding (http-parser accepts it; RFC 9112 forbids it in
-- requests), Host required on 1.1 and not repeated, no body. Returns nil, the target, the method
-- and the header fields (by lower-case name) when the request is valid, else the status to answer.
function M.judge(r)
  if r.major ~= 1 or r.minor > 1 then return 400 end
  if table.concat(r.raw):find("\n[ \t]") then return 400 end
  local fields = {}
  for _, h in ipairs(r.headers) do
    local name, value = table.concat(h.name), table.concat(h.value):match("^[ \t]*(.-)[ \t]*$")
    if not name:match(TOKEN) or value:find("[%z\1-\8\10-\31\127]") then return 400 end
    name = name:lower()
    if fields[name] and (name == "host" or name == "content-length" or name == "authorization") then
      return 400
    end
    fields[name] = value
  end
  if r.minor == 1 and not fields.host then return 400 end
  if fields["transfer-encoding"] or (fields["content-length"] and fields["content-length"] ~= "0") then
    return 400
  end
  local target = table.concat(r.url)
  if target:sub(1, 1) ~= "/" then return 400 end
  return nil, target, r.method, fields
end

return M
