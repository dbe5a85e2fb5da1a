-- Specs of cuptimon.yaml (the strict YAML subset) and cuptimon.webconfig (the exporter toolkit's
-- web configuration file, checked): what is read, and what is refused with its line or key.
-- luacheck: std +busted
local yaml = require "cuptimon.yaml"
local webconfig = require "cuptimon.webconfig"
local helpers = require "helpers"

local F = helpers.root() .. "/spec/fixtures/tls"

-- The document without the PRESENT sets, for comparisons.
local function plain(v)
  if type(v) ~= "table" then return v end
  local t = {}
  for k, x in pairs(v) do if k ~= yaml.PRESENT then t[k] = plain(x) end end
  return t
end

describe("yaml.parse", function()
  it("reads block mappings, sequences, quoted and flow scalars, comments", function()
    local doc = assert(yaml.parse([[
---
# a comment
a: plain text   # a trailing comment
b: 'it''s'
c: "tab\there #not a comment"
d:
  e: true
  f: [x, "y z", 'w']
  g:
  - one
  - "two"
h:
  - three
empty:
tilde: ~
url: http://host:9090/x#frag
]]))
    assert.are.same({ a = "plain text", b = "it's", c = "tab\there #not a comment",
      d = { e = true, f = { "x", "y z", "w" }, g = { "one", "two" } }, h = { "three" },
      url = "http://host:9090/x#frag" }, plain(doc))
    assert.is_true(doc[yaml.PRESENT].empty)
    assert.is_true(doc[yaml.PRESENT].tilde)
    assert.are.same({}, plain(assert(yaml.parse("# nothing\n"))))
  end)

  it("refuses what it does not read, with the line", function()
    local cases = {
      { "a: &x 1\n", "line 1: anchors" },
      { "a: *x\n", "line 1: anchors" },
      { "a: !!str 1\n", "line 1: anchors" },
      { "a: |\n  x\n", "line 1: anchors" },
      { "a: 1\na: 2\n", 'line 2: the key "a" appears twice' },
      { "a:\n\t b: 1\n", "line 2: a tab in the indentation" },
      { "a: b\n  c\n", "line 2: multi-line scalars are not read" },
      { "a:\n  - k: v\n", "line 2: mappings inside sequences are not read" },
      { "a: {b: 1}\n", "line 1: flow mappings are not read" },
      { "a: 1\n---\nb: 2\n", "line 2: only one document is read" },
      { "a: 1\n   b: 2\n", "line 2: multi-line scalars" },
      { "- a\n", "line 1: the document must be a mapping" },
      { "a: \"open\n", "line 1: an unterminated quoted string" },
      { "just text\n", "line 1: a mapping entry (key: value) was expected" },
    }
    for _, c in ipairs(cases) do
      local doc, err = yaml.parse(c[1])
      assert.is_nil(doc, c[1])
      assert.is_truthy(err:find(c[2], 1, true), ("%q: %s"):format(c[1], err))
    end
  end)
end)

describe("webconfig.check", function()
  local function check(text, path)
    return webconfig.check(assert(yaml.parse(text)), path or (F .. "/web.yml"))
  end

  it("reads the toolkit's keys, file names relative to the file", function()
    local cfg = assert(check([[
tls_server_config:
  cert_file: server.pem
  key_file: server.key
  client_auth_type: RequireAndVerifyClientCert
  client_ca_file: ca.pem
  min_version: TLS13
  cipher_suites: [TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256]
  curve_preferences: [X25519, CurveP256]
  prefer_server_cipher_suites: false
http_server_config:
  http2: false
  headers:
    X-Frame-Options: deny
basic_auth_users:
  alice: $2y$05$.GHV6Cqic65UW0XB3OhaBOy3Si/JZMI.TOT0MgWLyFXSlhXP3Cd7y
]]))
    assert.are.same({ cert_file = F .. "/server.pem", key_file = F .. "/server.key",
      client_ca_file = F .. "/ca.pem", client_auth = 4, client_auth_name = "RequireAndVerifyClientCert",
      min_version = 0x0304, max_version = 0, ciphers = "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256",
      groups = "X25519:P-256", prefer_server_ciphers = false }, cfg.tls)
    assert.are.same({ ["X-Frame-Options"] = "deny" }, cfg.headers)
    assert.are.same({ alice = "$2y$05$.GHV6Cqic65UW0XB3OhaBOy3Si/JZMI.TOT0MgWLyFXSlhXP3Cd7y" }, cfg.users)
  end)

  it("means plain HTTP for an empty file or an empty tls_server_config", function()
    local cfg = assert(check("tls_server_config:\n"))
    assert.is_nil(cfg.tls)
    assert.is_nil(cfg.users)
    assert.is_nil(assert(check("")).tls)
  end)

  it("refuses a setting it would not honour, naming the key", function()
    local cases = {
      { "tls_server_config:\n  cert_file: server.pem\n  key_file: server.key\n  min_version: TLS10\n",
        "tls_server_config.min_version: TLS10 is refused" },
      { "tls_server_config:\n  cert_file: server.pem\n  key_file: server.key\n  max_version: TLS11\n",
        "tls_server_config.max_version: TLS11 is refused" },
      { "tls_server_config:\n  cert_file: server.pem\n  key_file: server.key\n  min_version: TLS13\n  max_version: TLS12\n",
        "tls_server_config.max_version: below min_version" },
      { "tls_server_config:\n  cert_file: server.pem\n  key_file: server.key\n  client_ca_file: ca.pem\n",
        "tls_server_config.client_auth_type: client_ca_file is given but NoClientCert" },
      { "tls_server_config:\n  cert_file: server.pem\n  key_file: server.key\n  client_auth_type: Maybe\n",
        'tls_server_config.client_auth_type: unknown "Maybe"' },
      { "tls_server_config:\n  cert_file: server.pem\n  key_file: server.key\n  curve_preferences: [P256]\n",
        'tls_server_config.curve_preferences: unknown "P256"' },
      { "tls_server_config:\n  cert: x\n", "tls_server_config.cert: inline certificates are not supported" },
      { "tls_server_config:\n  cert_file: server.pem\n  key_file: nope.key\n", "tls_server_config.key_file: cannot read" },
      { "http_server_config:\n  http2: maybe\n", "http_server_config.http2: true or false" },
      { "http_server_config:\n  timeout: 5s\n", "http_server_config.timeout: unknown key" },
      { "basic_auth_users:\n  \"a:b\": $2y$05$.GHV6Cqic65UW0XB3OhaBOy3Si/JZMI.TOT0MgWLyFXSlhXP3Cd7y\n",
        "basic_auth_users.a:b: a user name can hold no colon" },
      { "basic_auth_users:\n  u: $1$abc$def\n", "basic_auth_users.u: a bcrypt hash" },
    }
    for _, c in ipairs(cases) do
      local cfg, err = check(c[1])
      assert.is_nil(cfg, c[1])
      assert.is_truthy(err:find(c[2], 1, true), ("%q: %s"):format(c[1], err))
      assert.is_truthy(err:find(F .. "/web.yml: ", 1, true), err)
    end
  end)

  it("loads a file and says why one cannot be read", function()
    assert.is_truthy(webconfig.load(F .. "/web-tls-auth.yml").tls)
    local cfg, err = webconfig.load(F .. "/none.yml")
    assert.is_nil(cfg)
    assert.matches("cannot read the web configuration: .*none%.yml", err)
    assert.has_error(function() webconfig.load(nil) end, "webconfig.load: path must be a string")
  end)
end)
