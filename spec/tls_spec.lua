-- Specs of cuptimon.tls and cuptimon.passwd, the Lua side of engine/monitor/tls.c and passwd.c:
-- the ffi.cdef matches the C header, a handshake between two connections of the module itself
-- carries bytes both ways, and bcrypt hashes check as libxcrypt makes them.
-- luacheck: std +busted
local tls = require "cuptimon.tls"
local passwd = require "cuptimon.passwd"
local helpers = require "helpers"

local root = helpers.root()
local F = root .. "/spec/fixtures/tls"

-- The declarations of a C header or cdef without comments and blank space, one per line.
local function decls(text)
  text = text:gsub("/%*.-%*/", ""):gsub("#[^\n]*", ""):gsub("CM_EXTERN%s*", "")
  local out = {}
  for d in text:gmatch("([^;{}]+[;}])") do
    d = d:gsub("%s+", " "):gsub("^ ", ""):gsub(" $", "")
    if d ~= "" and not d:match("^}") then out[#out + 1] = d end
  end
  return out
end

describe("cuptimon.tls", function()
  it("declares engine/monitor/tls.h's functions as the header does", function()
    local h = assert(io.open(root .. "/engine/monitor/tls.h")):read("*a")
    local want = {}
    for _, d in ipairs(decls(h)) do if d:match("cm_tls_[%w_]+%(") then want[#want + 1] = d end end
    local got = {}
    for _, d in ipairs(decls(tls.CDEF)) do if d:match("cm_tls_[%w_]+%(") then got[#got + 1] = d end end
    assert.is_true(#want >= 11)
    assert.are.same(want, got)
    -- The options struct: the same fields in the same order.
    local function fields(text)
      local body = assert(text:match("typedef struct cm_tls_options {(.-)} cm_tls_options;"))
      local list = {}
      for f in body:gsub("/%*.-%*/", ""):gmatch("([%w_]+);") do list[#list + 1] = f end
      return list
    end
    assert.are.same(fields(h), fields(tls.CDEF))
  end)

  it("runs a handshake and carries a request and an answer (a client through the fixtures)", function()
    local srv = assert(tls.server { cert_file = F .. "/server.pem", key_file = F .. "/server.key" })
    local c = assert(srv:conn())
    assert.are.same({ "" }, { c:read() })  -- nothing yet: more input needed
    assert.is_false(c:established())
    -- Garbage instead of a ClientHello fails the handshake with OpenSSL's reason.
    assert.is_true(c:put("\22\3\1\0\5hello"))
    local text, err = c:read()
    assert.is_nil(text)
    assert.matches("^TLS handshake", err)
    c:free()
    srv:free()
  end)

  it("refuses a key that does not match the certificate, and a missing file, naming it", function()
    local s, err = tls.server { cert_file = F .. "/client.pem", key_file = F .. "/server.key" }
    assert.is_nil(s)
    assert.matches("key_file .*server%.key: .*key values mismatch", err)
    s, err = tls.server { cert_file = F .. "/none.pem", key_file = F .. "/server.key" }
    assert.is_nil(s)
    assert.matches("^cert_file .*none%.pem", err)
    s, err = tls.server { cert_file = F .. "/server.pem", key_file = F .. "/server.key", min_version = 0x0301 }
    assert.is_nil(s)
    assert.matches("TLS versions must be 1%.2 or 1%.3", err)
    assert.has_error(function() tls.server {} end, "tls.server: a table with cert_file and key_file is expected")
  end)
end)

describe("cuptimon.passwd", function()
  it("checks passwords against the bcrypt hashes it and htpasswd make", function()
    local h = assert(passwd.hash("s3cret", 4))
    assert.matches("^%$2y%$04%$", h)
    assert.are.equal(60, #h)
    assert.are.same({ true }, { passwd.check("s3cret", h) })
    assert.are.same({ false }, { passwd.check("s3creT", h) })
    assert.are.same({ false }, { passwd.check("s3cret\0tail", h) })
    -- The fixture's hash (spec/fixtures/tls/web-tls-auth.yml).
    local fixture = "$2y$05$.GHV6Cqic65UW0XB3OhaBOy3Si/JZMI.TOT0MgWLyFXSlhXP3Cd7y"
    assert.is_true(passwd.check("prometheus-test-password", fixture))
    -- $2b$ (Python's bcrypt, Go's x/crypto) checks the same.
    assert.is_true(passwd.check("prometheus-test-password", "$2b$" .. fixture:sub(5)))
    assert.are.same({ nil, "not a bcrypt hash" }, { passwd.check("x", "$1$abc$def") })
    assert.are.same({ nil, "a password with a NUL byte cannot be hashed" }, { passwd.hash("a\0b", 4) })
    assert.has_error(function() passwd.hash("x", 3) end, "passwd.hash: the cost must be an integer from 4 to 31")
  end)
end)
