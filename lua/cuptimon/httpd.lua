-- cuptimon.httpd: a small HTTP/1.1 server on the host's loop for the scripts that serve (the
-- Prometheus exporter), plain or over TLS with basic auth as a web configuration file says.
--
-- Design note. The server answers GET on the routes it is given and nothing else; every answer
-- closes its connection. Limits, the same with and without TLS, because TLS runs over memory
-- buffers (cuptimon.tls) under the same handle, timer and byte bounds as plain text:
--   * a connection that has not sent its whole request head within REQUEST_TIMEOUT_MS of its
--     accept is closed: a TLS client that opens TCP and never sends a ClientHello, or stops in
--     the middle of the handshake, is closed on that same clock;
--   * at most MAX_CLIENTS connections that have had time to send their request are kept: a new
--     client takes the place of the oldest whose request is still incomplete (handshake or head:
--     idle and slowloris clients; one that has sent part of its first message goes before one
--     that has sent nothing), and up to MAX_NEW more may wait through their first NEW_MS, so a
--     scraper gets in while hundreds of such clients keep coming back;
--   * a request head is at most 8 KiB (cuptimon.httpreq: 431 past it), and a TLS connection may
--     send at most MAX_TLS_IN bytes of ciphertext before its request is whole.
-- Refusals are counted by reason (server:stats()) and logged at most once per LOG_EVERY_MS, with
-- the counts since the last line: a wrong password, a missing client certificate, plain HTTP on
-- the TLS port, a failed handshake, an eviction. A password check (bcrypt, cuptimon.passwd) costs
-- tens of milliseconds on the loop: credentials that were checked are remembered (at most
-- AUTH_CACHE that matched and AUTH_CACHE that did not), so a scraper costs one check per run,
-- and at most AUTH_CHECKS_PER_S new ones are checked a second; beyond that a request is answered
-- 429 without a check. SIGHUP reads
-- the web configuration again: a file that loads replaces the TLS settings, users and headers for
-- the next connections; one that does not is reported and the running settings stay.
--
--   local srv, err = httpd.serve{ host = "127.0.0.1", port = 9464, web_config = path or nil,
--     name = "prometheus.lua", routes = { ["/metrics"] = function() return body, ctype end } }
--   srv.url, srv:stats(), srv:clients(), srv:reload(), srv:stop()
local uv = require "luv"
local httpreq = require "cuptimon.httpreq"
local webconfig = require "cuptimon.webconfig"

local M = {}

local REQUEST_TIMEOUT_MS = 5000 -- to a complete request head, from the accept
local MAX_CLIENTS = 64          -- connections that have had a loop turn to send their request
local MAX_NEW = 448             -- more, still new (a burst of accepts; NEW_MS, two loop turns)
local NEW_MS = 50               -- a client this young may not have sent its request yet
local MAX_TLS_IN = 65536        -- ciphertext bytes a TLS client may send before its request is whole
local LOG_EVERY_MS = 10000      -- refusal log lines
local AUTH_CACHE = 256          -- credentials remembered, of those that matched and of the others
local AUTH_CHECKS_PER_S = 8     -- password checks (bcrypt) a second beyond the remembered ones

local REASONS = { [200] = "OK", [400] = "Bad Request", [401] = "Unauthorized", [404] = "Not Found",
  [405] = "Method Not Allowed", [429] = "Too Many Requests",
  [431] = "Request Header Fields Too Large" }

-- The refusal counters, in the order the log line gives them.
M.REFUSALS = { "wrong_password", "no_credentials", "auth_throttled", "tls_handshake",
  "client_cert", "plain_http_on_tls", "tls_too_large", "evicted", "timed_out" }
local REFUSAL_TEXT = { wrong_password = "wrong user or password", no_credentials = "no credentials",
  auth_throttled = "password checks throttled", tls_handshake = "TLS handshake failed",
  client_cert = "client certificate missing or refused", plain_http_on_tls = "plain HTTP on the TLS port",
  tls_too_large = "TLS input past its bound", evicted = "evicted (request incomplete)",
  timed_out = "request head not sent in time" }

local B64 = {}
do
  local a = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
  for i = 1, 64 do B64[a:sub(i, i)] = i - 1 end
end

-- Decodes standard base64 with padding; nil when malformed.
local function unbase64(s)
  if #s % 4 ~= 0 or s:find("[^%w+/=]") or s:find("=[^=]") then return nil end
  local out = {}
  for i = 1, #s, 4 do
    local n, pad = 0, 0
    for j = i, i + 3 do
      local c = s:sub(j, j)
      if c == "=" then
        pad = pad + 1
        n = n * 64
      else
        n = n * 64 + B64[c]
      end
    end
    if pad > 2 then return nil end
    local b1, b2, b3 = math.floor(n / 65536), math.floor(n / 256) % 256, n % 256
    out[#out + 1] = string.char(b1) .. (pad < 2 and string.char(b2) or "") .. (pad < 1 and string.char(b3) or "")
  end
  return table.concat(out)
end

--- Starts serving. Options: host, port (0: any free port), routes ({ [path] = fn() -> body,
--- content type }), name (the log lines' prefix), web_config (a file, or nil for plain HTTP with
--- no authentication), log (fn(line); default: stderr). Returns the server, or nil, err (a web
--- configuration refused, an address not bound).
function M.serve(o)
  if type(o) ~= "table" or type(o.host) ~= "string" or type(o.port) ~= "number"
    or type(o.routes) ~= "table" then
    error("httpd.serve: a table with host, port and routes is expected", 2)
  end
  local name = o.name or "httpd"
  local log = o.log or function(line) io.stderr:write(name, ": ", line, "\n") end
  local tls = o.web_config and require "cuptimon.tls"
  local passwd = o.web_config and require "cuptimon.passwd"

  -- The settings a web configuration gives; replaced whole by a reload.
  local cfg, tls_server = { headers = {} }, nil
  local function load_config()
    local c, err = webconfig.load(o.web_config)
    if not c then return nil, err end
    local ts
    if c.tls then
      ts, err = tls.server(c.tls)
      if not ts then return nil, ("%s: tls_server_config: %s"):format(o.web_config, err) end
    end
    return c, ts
  end
  if o.web_config then
    local c, ts = load_config()
    if not c then return nil, ts end
    cfg, tls_server = c, ts
  end

  local counts = {}
  for _, k in ipairs(M.REFUSALS) do counts[k] = 0 end
  local since_log, last_reason, last_log = {}, {}, nil
  local log_timer
  local function flush_log()
    local parts = {}
    for _, k in ipairs(M.REFUSALS) do
      if (since_log[k] or 0) > 0 then
        parts[#parts + 1] = ("%s %d%s"):format(REFUSAL_TEXT[k], since_log[k],
          last_reason[k] and (" (" .. last_reason[k] .. ")") or "")
      end
    end
    since_log, last_reason = {}, {}
    if #parts > 0 then
      log(("refused %s"):format(table.concat(parts, "; ")))
      last_log = uv.now()
    end
  end
  -- Counts a refusal; logs it now when no line was written in the last LOG_EVERY_MS, else in the
  -- line that closes the current period.
  local function refuse(kind, why)
    counts[kind] = counts[kind] + 1
    since_log[kind] = (since_log[kind] or 0) + 1
    if why then last_reason[kind] = why end
    if kind == "evicted" or kind == "timed_out" then return end -- normal under load: counted only
    if not last_log or uv.now() - last_log >= LOG_EVERY_MS then
      flush_log()
    elseif not log_timer:is_active() then
      log_timer:start(LOG_EVERY_MS - (uv.now() - last_log), 0, flush_log)
    end
  end
  log_timer = uv.new_timer()
  log_timer:unref()

  -- Remembered credentials, "user:password" -> true: those that matched and those that did not,
  -- apart, each cleared whole when full. Wrong guesses therefore never push out the scraper's
  -- credentials, which stay free of the per-second check budget however long a guessing lasts.
  local good, ngood, bad, nbad = {}, 0, {}, 0
  local checks_second, checks_in_second = -1, 0
  -- Returns nil when the request may go on, else the status to answer (401 or 429).
  local function authorize(fields)
    if not cfg.users then return nil end
    local h = fields.authorization
    local cred = h and h:match("^[Bb][Aa][Ss][Ii][Cc] +([%w+/=]+)$")
    cred = cred and unbase64(cred)
    local user, pass = (cred or ""):match("^([^:]*):(.*)$")
    if not user then
      refuse("no_credentials")
      return 401
    end
    local ok = good[cred] or (bad[cred] and false)
    if ok == nil then
      local hash = cfg.users[user]
      local second = math.floor(uv.now() / 1000)
      if second ~= checks_second then checks_second, checks_in_second = second, 0 end
      if checks_in_second >= AUTH_CHECKS_PER_S then
        refuse("auth_throttled")
        return 429
      end
      checks_in_second = checks_in_second + 1
      -- An unknown user costs a check too (against another user's hash), so the time taken
      -- does not say whether the user exists.
      ok = passwd.check(pass, hash or select(2, next(cfg.users))) == true and hash ~= nil
      if ok then
        if ngood >= AUTH_CACHE then good, ngood = {}, 0 end
        good[cred], ngood = true, ngood + 1
      else
        if nbad >= AUTH_CACHE then bad, nbad = {}, 0 end
        bad[cred], nbad = true, nbad + 1
      end
    end
    if not ok then
      refuse("wrong_password", ("user %q"):format(user:sub(1, 64)))
      return 401
    end
    return nil
  end

  local server = uv.new_tcp()
  local clients = {} -- tcp handle -> { close = fn, conn =, greeted =, serial =, answered =, turn =,
  --   since =, bytes = }
  local nclients, serial = 0, 0
  local stopped = false
  local srv = {}

  -- Loop turns, counted before each poll: a client accepted in this turn or the one before may
  -- not have had its bytes read yet (libuv accepts a whole burst before it reads), nor one
  -- accepted less than NEW_MS ago (its own process may be busy), so neither is evicted.
  local turn = 0
  local turns = uv.new_prepare()
  turns:start(function() turn = turn + 1 end)
  turns:unref()
  -- A client that closes before its answer is written must not kill the process with SIGPIPE (a
  -- replay does not ignore it the way a live run does): the write just fails and the client goes.
  local sigpipe = uv.new_signal()
  sigpipe:start("sigpipe", function() end)
  sigpipe:unref()
  local sighup
  if o.web_config then
    sighup = uv.new_signal()
    sighup:start("sighup", function() srv.reload() end)
    sighup:unref()
  end

  -- Makes room for a new client when all slots are taken: closes the oldest client whose request
  -- is still incomplete and that has had a loop turn to send it, taking first one that has sent
  -- part of its first message (a ClientHello, or a plain request head) but not all of it, then
  -- one that has sent nothing, then one whose TLS handshake has not finished. A real client
  -- writes its first message whole, at once, so one that is still partial has been dribbled: a
  -- slowloris. A client that has sent nothing may be a scraper whose own process is slow (a
  -- loaded machine), so under a flood of dribblers it is not evicted in their place; nor is one
  -- slow to finish the handshake and send its request. Returns false when there is none (every
  -- slot is answering, or new): the new client then takes one of MAX_NEW further slots, or is
  -- refused when those are full too.
  local function evict_oldest_incomplete()
    local oldest, oldest_rank
    for _, cl in pairs(clients) do
      if not cl.answered and cl.turn < turn - 1 and uv.now() - cl.since >= NEW_MS then
        local rank = cl.greeted and (cl.conn:established() and 3 or 2) or (cl.bytes > 0 and 0 or 1)
        if not oldest or rank < oldest_rank or (rank == oldest_rank and cl.serial < oldest.serial) then
          oldest, oldest_rank = cl, rank
        end
      end
    end
    if not oldest then return false end
    refuse("evicted")
    oldest.close()
    return true
  end

  local function answer(request)
    local status, target, method, fields = httpreq.judge(request)
    if status then return status end
    status = authorize(fields)
    if status then return status end
    if method ~= "GET" then return 405 end
    local route = o.routes[target:match("^[^?#]*")]
    if not route then return 404 end
    return 200, route()
  end

  local function serve(c)
    local timer = uv.new_timer()
    local request = httpreq.new()
    local conn, tls_in = nil, 0
    if tls_server then conn = assert(tls_server:conn()) end
    local function close()
      if clients[c] == nil then return end
      clients[c] = nil
      nclients = nclients - 1
      if not timer:is_closing() then timer:close() end
      if not c:is_closing() then c:close() end
      if conn then conn:free() end
    end
    serial = serial + 1
    local cl = { close = close, conn = conn, serial = serial, answered = false, turn = turn,
      since = uv.now(), bytes = 0 }
    clients[c] = cl
    nclients = nclients + 1
    timer:start(REQUEST_TIMEOUT_MS, 0, function()
      refuse("timed_out")
      close()
    end)
    -- Sends what TLS has queued (a handshake message, an alert), then runs `after`.
    local function send_tls(after)
      local out = conn:take()
      if out == "" then
        if after then after() end
        return
      end
      cl.greeted = true
      c:write(out, function() if after then after() end end)
    end
    local function respond(status, body, ctype)
      cl.answered = true
      c:read_stop()
      body = body or (REASONS[status] .. "\n")
      local head = { ("HTTP/1.1 %d %s"):format(status, REASONS[status]),
        "Content-Type: " .. (ctype or "text/plain; charset=utf-8"),
        "Content-Length: " .. #body, "Connection: close" }
      if status == 405 then head[#head + 1] = "Allow: GET" end
      if status == 401 then head[#head + 1] = 'WWW-Authenticate: Basic realm="cuptimon", charset="UTF-8"' end
      if status == 429 then head[#head + 1] = "Retry-After: 1" end
      for k, v in pairs(cfg.headers) do head[#head + 1] = k .. ": " .. v end
      local text = table.concat(head, "\r\n") .. "\r\n\r\n" .. body
      if conn then
        if not conn:write(text) then return close() end
        conn:shutdown()
        return send_tls(close)
      end
      c:write(text, function() close() end)
    end
    local function take(text)
      local got = httpreq.feed(request, text)
      if got == nil then return end
      if got ~= "complete" then return respond(got) end
      local ok, status, body, ctype = xpcall(answer, debug.traceback, request)
      if not ok then
        close()
        error(status, 0)
      end
      respond(status, body, ctype)
    end
    c:read_start(function(err, chunk)
      if cl.answered then return end
      if err or not chunk then return close() end
      cl.bytes = cl.bytes + #chunk
      if not conn then return take(chunk) end
      -- A TLS record starts with its content type, 22 for the handshake. A request line instead
      -- is plain HTTP sent to the TLS port: it gets a plain 400 that says so, as Go's servers
      -- answer it.
      if tls_in == 0 and chunk:byte(1) ~= 22 then
        if chunk:match("^%u+ ") then
          refuse("plain_http_on_tls")
          cl.answered = true
          c:read_stop()
          local body = "Client sent an HTTP request to an HTTPS server.\n"
          return c:write(("HTTP/1.0 400 Bad Request\r\nContent-Type: text/plain; charset=utf-8\r\n"
            .. "Content-Length: %d\r\nConnection: close\r\n\r\n%s"):format(#body, body), function() close() end)
        end
        refuse("tls_handshake", "not a TLS record")
        return close()
      end
      tls_in = tls_in + #chunk
      if tls_in > MAX_TLS_IN then
        refuse("tls_too_large")
        return close()
      end
      conn:put(chunk)
      local text, why = conn:read()
      if not text then
        refuse(why:find("certificate", 1, true) and "client_cert" or "tls_handshake", why)
        cl.answered = true
        c:read_stop()
        return send_tls(close) -- the alert tells the client why
      end
      send_tls(nil)
      if text ~= "" then take(text) end
    end)
  end

  local function stop()
    if stopped then return end
    stopped = true
    if not server:is_closing() then server:close() end
    if not turns:is_closing() then turns:close() end
    if not sigpipe:is_closing() then sigpipe:close() end
    if sighup and not sighup:is_closing() then sighup:close() end
    flush_log()
    if not log_timer:is_closing() then log_timer:close() end
    local list = {}
    for _, cl in pairs(clients) do list[#list + 1] = cl.close end
    for _, close in ipairs(list) do close() end
  end

  local ok, err = server:bind(o.host, o.port)
  if ok then ok, err = server:listen(1024, function(lerr)
    if lerr or stopped then return end
    local c = uv.new_tcp()
    if not server:accept(c) or (nclients >= MAX_CLIENTS and not evict_oldest_incomplete()
                                  and nclients >= MAX_CLIENTS + MAX_NEW) then
      c:close()
      return
    end
    serve(c)
  end) end
  if not ok then
    stop()
    return nil, ("cannot serve on %s port %d: %s"):format(o.host, o.port, tostring(err))
  end
  local addr = server:getsockname()
  srv.host = addr.family == "inet6" and "[" .. addr.ip .. "]" or addr.ip
  srv.port = addr.port
  srv.scheme = tls_server and "https" or "http"

  --- What the server enforces, in words, for the start-up line.
  function srv.describe()
    local parts = {}
    if tls_server then
      parts[#parts + 1] = "TLS, client certificates: " .. cfg.tls.client_auth_name
    end
    if cfg.users then
      local n = 0
      for _ in pairs(cfg.users) do n = n + 1 end
      parts[#parts + 1] = ("basic auth: %d user%s"):format(n, n == 1 and "" or "s")
    end
    return #parts > 0 and table.concat(parts, ", ") or "no TLS, no authentication"
  end
  --- The refusals so far, by reason (M.REFUSALS).
  function srv.stats()
    local t = {}
    for k, v in pairs(counts) do t[k] = v end
    return t
  end
  function srv.clients() return nclients end
  function srv.stopped() return stopped end
  --- Reads the web configuration again; returns true, or nil, err (the running settings stay).
  --- TLS cannot be switched on or off by a reload: the port's clients expect one or the other.
  function srv.reload()
    if not o.web_config then return nil, "no web configuration to reload" end
    local c, ts = load_config()
    if c and (ts == nil) ~= (tls_server == nil) then
      c, ts = nil, ("%s: a reload cannot turn TLS %s; restart to change it"):format(o.web_config,
        tls_server and "off" or "on")
    end
    if not c then
      log(("the web configuration was not reloaded (the running one stays): %s"):format(ts))
      return nil, ts
    end
    if tls_server then tls_server:free() end
    cfg, tls_server = c, ts
    good, ngood, bad, nbad = {}, 0, {}, 0
    log(("reloaded %s: %s"):format(o.web_config, srv.describe()))
    return true
  end
  srv.stop = stop
  return srv
end

return M
