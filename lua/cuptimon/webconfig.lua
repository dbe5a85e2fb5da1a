-- cuptimon.webconfig: the Prometheus exporter toolkit's web configuration file (the file that
-- node_exporter and dcgm-exporter take with --web.config.file), read and checked.
--
-- Design note. A setting the server would not honour is a hole an operator cannot see, so every
-- key of the file is either honoured or refused at start with the key named: nothing is
-- ignored. Honoured (docs/monitor.md, "Serving over TLS", lists each with its meaning):
--   tls_server_config: cert_file, key_file, client_auth_type (NoClientCert, RequestClientCert,
--     RequireAnyClientCert, VerifyClientCertIfGiven, RequireAndVerifyClientCert), client_ca_file,
--     min_version and max_version (TLS12, TLS13: TLS10 and TLS11 are refused as weak),
--     cipher_suites (TLS 1.2 suites by their standard names), curve_preferences (CurveP256,
--     CurveP384, CurveP521, X25519), prefer_server_cipher_suites
--   http_server_config: http2 (HTTP/1.1 is served either way: the setting only permits HTTP/2),
--     headers (the toolkit's five security headers, added to every answer)
--   basic_auth_users: user name -> bcrypt hash ($2y$, $2b$, $2a$)
-- Refused as not supported: tls_server_config's cert and key (inline PEM), client_allowed_sans,
-- and any key the toolkit does not define. Relative file names are relative to the file's own
-- directory, as the toolkit reads them. An empty tls_server_config means plain HTTP, as the
-- toolkit has it; one with any key needs cert_file and key_file (so no setting in it goes unused).
--
--   local cfg, err = webconfig.load(path)
--   -- cfg.tls: nil or { cert_file, key_file, client_ca_file, client_auth (number),
--   --   client_auth_name, min_version, max_version (0x0303, 0x0304, 0 = newest), ciphers, groups,
--   --   prefer_server_ciphers }; cfg.users: nil or { [user] = hash }; cfg.headers: { [name] = value };
--   -- cfg.path: the file
local yaml = require "cuptimon.yaml"

local M = {}

local CLIENT_AUTH = { NoClientCert = 0, RequestClientCert = 1, RequireAnyClientCert = 2,
  VerifyClientCertIfGiven = 3, RequireAndVerifyClientCert = 4 }
local VERSIONS = { TLS12 = 0x0303, TLS13 = 0x0304 }
local WEAK = { TLS10 = true, TLS11 = true }
local CURVES = { CurveP256 = "P-256", CurveP384 = "P-384", CurveP521 = "P-521", X25519 = "X25519" }
local HEADERS = { ["Content-Security-Policy"] = true, ["X-Frame-Options"] = true,
  ["X-Content-Type-Options"] = true, ["X-XSS-Protection"] = true,
  ["Strict-Transport-Security"] = true }
local TOP = { tls_server_config = true, http_server_config = true, basic_auth_users = true }
local TLS_KEYS = { cert_file = true, key_file = true, client_auth_type = true, client_ca_file = true,
  min_version = true, max_version = true, cipher_suites = true, curve_preferences = true,
  prefer_server_cipher_suites = true }
local UNSUPPORTED = {
  cert = "inline certificates are not supported: write the PEM to a file and name it in cert_file",
  key = "inline keys are not supported: write the PEM to a file and name it in key_file",
  client_allowed_sans = "client_allowed_sans is not supported: give the clients certificates from "
    .. "a CA of their own (client_ca_file) instead",
}

local function names(set)
  local list = {}
  for k in pairs(set) do list[#list + 1] = k end
  table.sort(list)
  return table.concat(list, ", ")
end

local function keys_of(t)
  local list = {}
  for k in pairs(t[yaml.PRESENT] or {}) do list[#list + 1] = k end
  table.sort(list)
  return list
end

local function readable(path)
  local f, err = io.open(path, "rb")
  if not f then return nil, err end
  f:close()
  return true
end

--- Checks the parsed document `doc` (from `path`, for relative names and messages); returns
--- the configuration or nil, err (naming the key at fault).
function M.check(doc, path)
  local where = path or "the web configuration"
  local dir = path and path:match("^(.*)/[^/]*$") or "."
  local function bad(key, why) return nil, ("%s: %s: %s"):format(where, key, why) end
  local function file(key, v)
    if type(v) ~= "string" or v == "" then return bad(key, "a file name is expected") end
    if v:sub(1, 1) ~= "/" then v = dir .. "/" .. v end
    local ok, err = readable(v)
    if not ok then return bad(key, "cannot read " .. tostring(err)) end
    return v
  end
  if type(doc) ~= "table" then return bad("(top)", "a mapping is expected") end
  for _, k in ipairs(keys_of(doc)) do
    if not TOP[k] then return bad(k, "unknown key; the valid keys are " .. names(TOP)) end
  end
  local cfg = { path = path, headers = {} }

  local t = doc.tls_server_config
  if t ~= nil then
    if type(t) ~= "table" or t[yaml.PRESENT] == nil then return bad("tls_server_config", "a mapping is expected") end
    for _, k in ipairs(keys_of(t)) do
      if UNSUPPORTED[k] then return bad("tls_server_config." .. k, UNSUPPORTED[k]) end
      if not TLS_KEYS[k] then
        return bad("tls_server_config." .. k, "unknown key; the valid keys are " .. names(TLS_KEYS))
      end
    end
    if next(t[yaml.PRESENT]) ~= nil then
      if not t.cert_file then return bad("tls_server_config.cert_file", "missing (TLS needs a certificate)") end
      if not t.key_file then return bad("tls_server_config.key_file", "missing (TLS needs the certificate's key)") end
      local tls, err = {}
      tls.cert_file, err = file("tls_server_config.cert_file", t.cert_file)
      if not tls.cert_file then return nil, err end
      tls.key_file, err = file("tls_server_config.key_file", t.key_file)
      if not tls.key_file then return nil, err end
      if t.client_ca_file ~= nil then
        tls.client_ca_file, err = file("tls_server_config.client_ca_file", t.client_ca_file)
        if not tls.client_ca_file then return nil, err end
      end
      local auth = t.client_auth_type or "NoClientCert"
      tls.client_auth = CLIENT_AUTH[auth]
      if not tls.client_auth then
        return bad("tls_server_config.client_auth_type", ("unknown %q; valid: %s"):format(tostring(auth), names(CLIENT_AUTH)))
      end
      tls.client_auth_name = auth
      if (auth == "VerifyClientCertIfGiven" or auth == "RequireAndVerifyClientCert") and not tls.client_ca_file then
        return bad("tls_server_config.client_ca_file", auth .. " needs the CA that signs the clients' certificates")
      end
      if tls.client_ca_file and tls.client_auth == 0 then
        return bad("tls_server_config.client_auth_type", "client_ca_file is given but NoClientCert asks for no "
          .. "client certificate; set client_auth_type (RequireAndVerifyClientCert) or remove client_ca_file")
      end
      for _, k in ipairs { "min_version", "max_version" } do
        local v = t[k]
        if v ~= nil then
          if WEAK[v] then
            return bad("tls_server_config." .. k, v .. " is refused: TLS 1.0 and 1.1 are broken; use TLS12 or TLS13")
          end
          if not VERSIONS[v] then return bad("tls_server_config." .. k, ("unknown %q; valid: TLS12, TLS13"):format(tostring(v))) end
        end
      end
      tls.min_version = VERSIONS[t.min_version or "TLS12"]
      tls.max_version = t.max_version and VERSIONS[t.max_version] or 0
      if tls.max_version ~= 0 and tls.max_version < tls.min_version then
        return bad("tls_server_config.max_version", "below min_version")
      end
      if t.cipher_suites ~= nil then
        if type(t.cipher_suites) ~= "table" or #t.cipher_suites == 0 then
          return bad("tls_server_config.cipher_suites", "a list of cipher suite names is expected")
        end
        for _, c in ipairs(t.cipher_suites) do
          if type(c) ~= "string" or not c:match("^TLS_[%w_]+$") then
            return bad("tls_server_config.cipher_suites", ("%q is not a cipher suite name"):format(tostring(c)))
          end
        end
        tls.ciphers = table.concat(t.cipher_suites, ":")
      end
      if t.curve_preferences ~= nil then
        if type(t.curve_preferences) ~= "table" or #t.curve_preferences == 0 then
          return bad("tls_server_config.curve_preferences", "a list of curve names is expected")
        end
        local g = {}
        for _, c in ipairs(t.curve_preferences) do
          if not CURVES[c] then
            return bad("tls_server_config.curve_preferences", ("unknown %q; valid: %s"):format(tostring(c), names(CURVES)))
          end
          g[#g + 1] = CURVES[c]
        end
        tls.groups = table.concat(g, ":")
      end
      local psc = t.prefer_server_cipher_suites
      if psc ~= nil and type(psc) ~= "boolean" then
        return bad("tls_server_config.prefer_server_cipher_suites", "true or false is expected")
      end
      tls.prefer_server_ciphers = psc ~= false
      cfg.tls = tls
    end
  end

  local h = doc.http_server_config
  if h ~= nil then
    if type(h) ~= "table" or h[yaml.PRESENT] == nil then return bad("http_server_config", "a mapping is expected") end
    for _, k in ipairs(keys_of(h)) do
      if k ~= "http2" and k ~= "headers" then
        return bad("http_server_config." .. k, "unknown key; the valid keys are headers, http2")
      end
    end
    if h.http2 ~= nil and type(h.http2) ~= "boolean" then
      return bad("http_server_config.http2", "true or false is expected")
    end
    if h.headers ~= nil then
      if type(h.headers) ~= "table" or h.headers[yaml.PRESENT] == nil then
        return bad("http_server_config.headers", "a mapping of header names to values is expected")
      end
      for _, k in ipairs(keys_of(h.headers)) do
        local v = h.headers[k]
        if not HEADERS[k] then
          return bad("http_server_config.headers." .. k, "not one of the headers the toolkit allows: " .. names(HEADERS))
        end
        if type(v) ~= "string" or v == "" or v:find("[%z\1-\31\127]") then
          return bad("http_server_config.headers." .. k, "a one-line text value is expected")
        end
        cfg.headers[k] = v
      end
    end
  end

  local u = doc.basic_auth_users
  if u ~= nil then
    if type(u) ~= "table" or u[yaml.PRESENT] == nil then
      return bad("basic_auth_users", "a mapping of user names to bcrypt hashes is expected")
    end
    cfg.users = {}
    for _, name in ipairs(keys_of(u)) do
      local hash = u[name]
      if name:find(":", 1, true) or name == "" then
        return bad("basic_auth_users." .. name, "a user name can hold no colon and cannot be empty")
      end
      if type(hash) ~= "string" or not hash:match("^%$2[aby]%$%d%d%$[./%w]+$") or #hash ~= 60 then
        return bad("basic_auth_users." .. name, "a bcrypt hash ($2y$, $2b$ or $2a$, 60 characters) is "
          .. "expected; make one with htpasswd -nBC 10 \"\" or cuptimon-lua -e \"print(require"
          .. "'cuptimon.passwd'.hash(io.read'*l'))\"")
      end
      cfg.users[name] = hash
    end
    if next(cfg.users) == nil then cfg.users = nil end
  end
  return cfg
end

--- Reads and checks the web configuration file at `path`; returns the configuration or nil, err.
function M.load(path)
  if type(path) ~= "string" then error("webconfig.load: path must be a string", 2) end
  local f, oerr = io.open(path, "rb")
  if not f then return nil, ("cannot read the web configuration: %s"):format(tostring(oerr)) end
  local text = f:read("*a")
  f:close()
  local doc, err = yaml.parse(text)
  if not doc then return nil, ("%s: %s"):format(path, err) end
  return M.check(doc, path)
end

return M
