-- cuptimon.filter: name filters for recipes, `--filter REGEX` and `--exclude REGEX` (as nsys's
-- and torch.profiler's users expect), with POSIX extended regular expressions.
--
--   local f = assert(filter.new("^cm_demo_", "relu"))
--   f:keep("cm_demo_matmul<16>") --> true; f:keep("cm_demo_bias_relu") --> false
--
-- Design note. The expressions are compiled once with the C library's regcomp (REG_EXTENDED,
-- REG_NOSUB) and a name's answer is cached, so a recipe's column loop pays a table lookup per
-- record: a run has few distinct names. regex_t is opaque here: a buffer larger than glibc's
-- (64 bytes on 64-bit Linux) and musl's holds it, freed with regfree when the filter is
-- collected.
local ffi = require "ffi"

local C = ffi.C
local M = {}

ffi.cdef [[
int regcomp(void *preg, const char *regex, int cflags);
int regexec(const void *preg, const char *string, size_t nmatch, void *pmatch, int eflags);
void regfree(void *preg);
size_t regerror(int errcode, const void *preg, char *errbuf, size_t errbuf_size);
]]

local REG_EXTENDED, REG_NOSUB = 1, 8
local REGEX_BYTES = 256

local function compile(what, text)
  local re = ffi.new("char[?]", REGEX_BYTES)
  local rc = C.regcomp(re, text, REG_EXTENDED + REG_NOSUB)
  if rc ~= 0 then
    local buf = ffi.new("char[256]")
    C.regerror(rc, re, buf, 256)
    return nil, ("%s %q is not a valid regular expression: %s"):format(what, text,
      ffi.string(buf))
  end
  return ffi.gc(re, C.regfree)
end

local Filter = {}
Filter.__index = Filter

--- Whether `name` passes: it matches the include expression (when there is one) and not the
--- exclude expression (when there is one).
function Filter:keep(name)
  local v = self.cache[name]
  if v == nil then
    v = (not self.inc or C.regexec(self.inc, name, 0, nil, 0) == 0)
      and not (self.exc and C.regexec(self.exc, name, 0, nil, 0) == 0)
    self.cache[name] = v
  end
  return v
end

--- A filter of names: `include` and `exclude` are POSIX extended regular expressions, either ""
--- or nil for none. Returns the filter, or nil and a message naming the bad expression.
function M.new(include, exclude)
  local f = setmetatable({ cache = {} }, Filter)
  local err
  if include and include ~= "" then
    f.inc, err = compile("--filter", include)
    if not f.inc then return nil, err end
  end
  if exclude and exclude ~= "" then
    f.exc, err = compile("--exclude", exclude)
    if not f.exc then return nil, err end
  end
  f.active = f.inc ~= nil or f.exc ~= nil
  return f
end

return M
