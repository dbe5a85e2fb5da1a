-- cuptimon.passwd: basic-auth passwords against bcrypt hashes (engine/monitor/passwd.c, through
-- ffi.C: libxcrypt's crypt_rn in the cuptimon-lua binary).
--
-- Design note. A check costs what the hash's cost factor says (tens of milliseconds at cost 10)
-- on the caller's thread: lua/cuptimon/httpd.lua keeps a bounded cache of the credentials that
-- matched, so a scraper's repeated requests cost one check, and bounds the uncached checks a
-- second, so wrong passwords cannot hold the loop.
--
--   passwd.check(password, hash)  -> true | false | nil, err (not a bcrypt hash)
--   passwd.hash(password[, cost]) -> "$2y$10$..." | nil, err
--   cuptimon-lua -e "print(require'cuptimon.passwd'.hash(io.read'*l'))"   -- a hash for a file
local ffi = require "ffi"

local M = {}

ffi.cdef [[
int cm_passwd_check(const char *password, size_t len, const char *hash);
int cm_passwd_hash(const char *password, size_t len, int cost, char *out, size_t outlen);
]]
local C = ffi.C
local out = ffi.new("char[128]")

function M.check(password, hash)
  if type(password) ~= "string" or type(hash) ~= "string" then
    error("passwd.check: the password and the hash must be strings", 2)
  end
  local rc = C.cm_passwd_check(password, #password, hash)
  if rc < 0 then return nil, "not a bcrypt hash" end
  return rc == 1
end

function M.hash(password, cost)
  if type(password) ~= "string" then error("passwd.hash: the password must be a string", 2) end
  cost = cost or 10
  if type(cost) ~= "number" or cost < 4 or cost > 31 or cost ~= math.floor(cost) then
    error("passwd.hash: the cost must be an integer from 4 to 31", 2)
  end
  local rc = C.cm_passwd_hash(password, #password, cost, out, 128)
  if rc ~= 0 then
    return nil, rc == -1 and "a password with a NUL byte cannot be hashed" or "no random salt"
  end
  return ffi.string(out)
end

return M
