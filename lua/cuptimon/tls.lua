-- cuptimon.tls: TLS server connections over memory buffers (engine/monitor/tls.c, OpenSSL linked
-- into cuptimon-lua, through ffi.C), for lua/cuptimon/httpd.lua.
--
-- Design note. The caller owns the socket: it puts what it read (conn:put), takes the plaintext
-- (conn:read, which also drives the handshake) and sends what conn:take returns. So the caller's
-- deadlines and byte bounds hold before, during and after the handshake. Each object frees its C
-- side when collected (ffi.gc) or at :free(). The declarations below are engine/monitor/tls.h's,
-- checked against it by spec/tls_spec.lua.
--
--   local server, err = tls.server(cfg.tls)          -- cfg from cuptimon.webconfig
--   local conn = server:conn()
--   conn:put(ciphertext); local text, err = conn:read()   -- "" while the handshake needs more
--   local out = conn:take()                           -- ciphertext to send ("" when none)
local ffi = require "ffi"

local M = {}

local TLS_CDEF = [[
typedef struct cm_tls_options {
  const char *cert_file;
  const char *key_file;
  const char *client_ca_file;
  int client_auth;
  int min_version;
  int max_version;
  const char *ciphers;
  const char *groups;
  int prefer_server_ciphers;
} cm_tls_options;
typedef struct cm_tls_server cm_tls_server;
typedef struct cm_tls_conn cm_tls_conn;
int cm_tls_server_new(cm_tls_server **out, const cm_tls_options *o, char *err, size_t errlen);
void cm_tls_server_free(cm_tls_server *s);
int cm_tls_conn_new(cm_tls_server *s, cm_tls_conn **out);
void cm_tls_conn_free(cm_tls_conn *c);
int cm_tls_conn_put(cm_tls_conn *c, const char *data, size_t len);
int cm_tls_conn_read(cm_tls_conn *c, char *buf, size_t cap, char *err, size_t errlen);
int cm_tls_conn_write(cm_tls_conn *c, const char *data, size_t len, char *err, size_t errlen);
int cm_tls_conn_shutdown(cm_tls_conn *c);
size_t cm_tls_conn_pending(const cm_tls_conn *c);
size_t cm_tls_conn_get(cm_tls_conn *c, char *buf, size_t cap);
int cm_tls_conn_established(const cm_tls_conn *c);
]]
M.CDEF = TLS_CDEF
ffi.cdef(TLS_CDEF)
local C = ffi.C

-- Scratch buffers, allocated once: the loop thread is the only caller.
local BUF = 16384
local buf = ffi.new("char[?]", BUF)
local ERRLEN = 512
local errbuf = ffi.new("char[?]", ERRLEN)
local serverp = ffi.new("cm_tls_server*[1]")
local connp = ffi.new("cm_tls_conn*[1]")

local Conn = {}
Conn.__index = Conn

--- Takes ciphertext the peer sent. Returns true, or nil, err.
function Conn:put(data)
  if C.cm_tls_conn_put(self.c, data, #data) ~= 0 then return nil, "out of memory" end
  return true
end

--- Advances the handshake and returns the plaintext that is ready ("" when none yet), or nil
--- and the reason the connection failed.
function Conn:read()
  local parts = {}
  while true do
    local n = C.cm_tls_conn_read(self.c, buf, BUF, errbuf, ERRLEN)
    if n < 0 then return nil, ffi.string(errbuf) end
    if n == 0 then break end
    parts[#parts + 1] = ffi.string(buf, n)
  end
  return table.concat(parts)
end

--- Encrypts `data` (after the handshake). Returns true, or nil, err.
function Conn:write(data)
  if C.cm_tls_conn_write(self.c, data, #data, errbuf, ERRLEN) ~= 0 then return nil, ffi.string(errbuf) end
  return true
end

--- Queues the close_notify alert.
function Conn:shutdown() C.cm_tls_conn_shutdown(self.c) end

--- The ciphertext waiting to be sent ("" when none).
function Conn:take()
  local parts = {}
  while C.cm_tls_conn_pending(self.c) > 0 do
    local n = tonumber(C.cm_tls_conn_get(self.c, buf, BUF))
    if n == 0 then break end
    parts[#parts + 1] = ffi.string(buf, n)
  end
  return table.concat(parts)
end

function Conn:established() return C.cm_tls_conn_established(self.c) == 1 end

function Conn:free()
  if self.c ~= nil then
    C.cm_tls_conn_free(ffi.gc(self.c, nil))
    self.c = nil
  end
end

local Server = {}
Server.__index = Server

--- A new connection of this server, or nil, err.
function Server:conn()
  if C.cm_tls_conn_new(self.s, connp) ~= 0 then return nil, "out of memory" end
  return setmetatable({ c = ffi.gc(connp[0], C.cm_tls_conn_free) }, Conn)
end

function Server:free()
  if self.s ~= nil then
    C.cm_tls_server_free(ffi.gc(self.s, nil))
    self.s = nil
  end
end

--- A TLS server from the tls table of cuptimon.webconfig's result: reads the certificate, the key
--- and the client CA now. Returns the server, or nil, err.
function M.server(t)
  if type(t) ~= "table" or type(t.cert_file) ~= "string" or type(t.key_file) ~= "string" then
    error("tls.server: a table with cert_file and key_file is expected", 2)
  end
  local o = ffi.new("cm_tls_options")
  -- The strings must outlive the call: they are held by `keep`.
  local keep = { t.cert_file, t.key_file, t.client_ca_file, t.ciphers, t.groups }
  o.cert_file, o.key_file = keep[1], keep[2]
  o.client_ca_file = keep[3]
  o.client_auth = t.client_auth or 0
  o.min_version = t.min_version or 0x0303
  o.max_version = t.max_version or 0
  o.ciphers, o.groups = keep[4], keep[5]
  o.prefer_server_ciphers = t.prefer_server_ciphers == false and 0 or 1
  local rc = C.cm_tls_server_new(serverp, o, errbuf, ERRLEN)
  if rc ~= 0 then return nil, ffi.string(errbuf) end
  return setmetatable({ s = ffi.gc(serverp[0], C.cm_tls_server_free), keep = keep }, Server)
end

return M
