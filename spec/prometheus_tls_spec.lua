-- Specs of scripts/prometheus.lua --web-config: TLS, client certificates and basic auth as the
-- Prometheus exporter toolkit's web configuration file says them, checked with curl (a real
-- TLS client) against the test-only certificates of spec/fixtures/tls (gen.sh); the files it must
-- refuse, each naming its key; SIGHUP's reload; and the serving limits of prometheus_spec (idle
-- and slowloris clients) on the TLS port, before and during the handshake.
-- (spec/prometheus_scrape.sh tls has a real Prometheus scrape the same port.)
-- luacheck: std +busted
local uv = require "luv"
local helpers = require "helpers"
local exporter = require "exporter"
local write = helpers.write

local root = helpers.root()
local demo = root .. "/examples/demo.cmcap"
local F = root .. "/spec/fixtures/tls"
local PASSWORD = "prometheus-test-password" -- spec/fixtures/tls/web-tls-auth.yml's (test-only)

local function start(argv)
  local e = exporter.start({ demo }, argv)
  finally(e.stop)
  assert.is_truthy(e.port, e.log())
  assert.is_nil(e.exited(), e.log())
  return e
end

-- GETs `path` over TLS (the test CA trusted) with extra curl arguments; returns curl's exit
-- status, the HTTP status (0 when there was no answer) and the body.
local function https(port, path, extra, host)
  local a = { "-s", "--max-time", "10", "--cacert", F .. "/ca.pem", "-w", "\n%{http_code}" }
  for _, v in ipairs(extra or {}) do a[#a + 1] = v end
  a[#a + 1] = ("https://%s:%d%s"):format(host or "127.0.0.1", port, path)
  local rc, out = exporter.curl(a)
  local body, code = out:match("^(.*)\n(%d+)$")
  return rc, tonumber(code) or 0, body or out
end

local function curl_or_pending()
  local ok, why = exporter.need_curl()
  if not ok then pending(why) end
  return ok
end

local function metric(body, name, reason)
  return tonumber(body:match(('%s{reason="%s"} (%%d+)'):format(name, reason)))
end

describe("prometheus.lua --web-config", function()
  it("serves /metrics over TLS to the right password only, and counts each refusal", function()
    if not curl_or_pending() then return end
    local e = start({ "--web-config", F .. "/web-tls-auth.yml" })
    assert.are.equal("https", e.scheme)
    assert.matches("TLS, client certificates: NoClientCert, basic auth: 1 user", e.log())
    local good = { "-u", "prometheus:" .. PASSWORD }
    local rc, code, body = https(e.port, "/metrics", good)
    assert.are.same({ 0, 200 }, { rc, code }, body)
    assert.matches('cuptimon_kernel_launches_total{[^}]*kernel="cm_demo_matmul<16>"} 150', body)
    -- The host name the certificate names works as well as its IP address.
    assert.are.equal(200, select(2, https(e.port, "/", good, "localhost")))
    local wrc, wcode = https(e.port, "/metrics", { "-u", "prometheus:wrong" })
    assert.are.same({ 0, 401 }, { wrc, wcode })
    assert.are.equal(401, select(2, https(e.port, "/metrics", { "-u", "nobody:" .. PASSWORD })))
    assert.are.equal(401, select(2, https(e.port, "/metrics")))
    -- Authentication comes before routing: an unknown path is 401 too without credentials.
    assert.are.equal(401, select(2, https(e.port, "/nope")))
    assert.are.equal(404, select(2, https(e.port, "/nope", good)))
    -- Plain HTTP on the TLS port gets a plain 400 that says so.
    local prc, pout = exporter.curl({ "-s", "--max-time", "10", "-w", "\n%{http_code}",
      ("http://127.0.0.1:%d/metrics"):format(e.port) })
    assert.are.equal(0, prc)
    assert.matches("^Client sent an HTTP request to an HTTPS server%.\n\n400$", pout)
    -- TLS 1.1 is refused at the handshake (curl: 35, an SSL connect error).
    local orc, ocode = https(e.port, "/metrics", { "--tlsv1.1", "--tls-max", "1.1" })
    assert.are_not.equal(0, orc)
    assert.are.equal(0, ocode)
    local _, _, after = https(e.port, "/metrics", good)
    local refused = "cuptimon_exporter_refused_requests_total"
    assert.are.equal(2, metric(after, refused, "wrong_password"), after)
    assert.are.equal(2, metric(after, refused, "no_credentials"))
    assert.are.equal(1, metric(after, refused, "plain_http_on_tls"))
    assert.are.equal(1, metric(after, refused, "tls_handshake"))
    assert.are.equal(0, metric(after, refused, "client_cert"))
    -- One log line at once for the first refusal; the rest wait for the period's summary.
    assert.matches("refused wrong user or password 1 %(user \"prometheus\"%)", e.log())
    local _, lines = e.log():gsub("refused ", "")
    assert.are.equal(1, lines, e.log())
    assert.are.equal(0, e.stop())
    assert.matches("refused [^\n]*no credentials 2[^\n]*TLS handshake failed 1 %(TLS handshake: [^\n]*"
      .. "unsupported protocol%)[^\n]*plain HTTP on the TLS port 1", e.log())
  end)

  -- A bcrypt check costs the loop tens of milliseconds, so only 8 new credentials are checked a
  -- second: a burst of guesses gets 429s beyond that, while the scraper's credentials, checked
  -- once, are still answered at once.
  it("bounds password checks a second, and keeps answering the credentials it checked", function()
    if not curl_or_pending() then return end
    local e = start({ "--web-config", F .. "/web-tls-auth.yml" })
    local good = { "-u", "prometheus:" .. PASSWORD }
    assert.are.equal(200, select(2, https(e.port, "/metrics", good)))
    local a = { "-s", "--max-time", "20", "--parallel", "--parallel-max", "40", "--cacert", F .. "/ca.pem",
      "-o", "/dev/null", "-w", "%{http_code}\n" }
    for i = 1, 40 do a[#a + 1] = ("https://prometheus:guess%d@127.0.0.1:%d/"):format(i, e.port) end
    local t0 = uv.now()
    local rc, out = exporter.curl(a)
    uv.update_time()
    local seconds = math.ceil((uv.now() - t0) / 1000) + 1
    assert.are.equal(0, rc, out)
    local codes = {}
    for c in out:gmatch("(%d+)\n") do codes[c] = (codes[c] or 0) + 1 end
    assert.are.equal(40, (codes["401"] or 0) + (codes["429"] or 0), out)
    assert.is_true((codes["401"] or 0) <= 8 * seconds, out)
    assert.is_true((codes["429"] or 0) > 0, out)
    assert.are.equal(200, select(2, https(e.port, "/metrics", good)))
    local _, _, body = https(e.port, "/metrics", good)
    assert.are.equal(codes["429"], metric(body, "cuptimon_exporter_refused_requests_total", "auth_throttled"))
    assert.are.equal(0, e.stop())
  end)

  it("requires a client certificate its CA signed, and adds the configured headers", function()
    if not curl_or_pending() then return end
    local e = start({ "--web-config", F .. "/web-mtls.yml" })
    local rc, out = exporter.curl({ "-s", "--max-time", "10", "-D", "-", "-o", "/dev/null",
      "--cacert", F .. "/ca.pem", "--cert", F .. "/client.pem", "--key", F .. "/client.key",
      ("https://127.0.0.1:%d/metrics"):format(e.port) })
    assert.are.equal(0, rc, out)
    assert.matches("^HTTP/1%.1 200 OK\r\n", out)
    assert.matches("\r\nX%-Content%-Type%-Options: nosniff\r\n", out)
    assert.matches("\r\nStrict%-Transport%-Security: max%-age=31536000\r\n", out)
    -- No certificate, or one from another CA: refused at the handshake, no HTTP answer.
    local nrc, ncode = https(e.port, "/metrics")
    assert.are_not.equal(0, nrc)
    assert.are.equal(0, ncode)
    local rrc, rcode = https(e.port, "/metrics", { "--cert", F .. "/rogue.pem", "--key", F .. "/rogue.key" })
    assert.are_not.equal(0, rrc)
    assert.are.equal(0, rcode)
    local _, _, body = https(e.port, "/metrics", { "--cert", F .. "/client.pem", "--key", F .. "/client.key" })
    assert.are.equal(2, metric(body, "cuptimon_exporter_refused_requests_total", "client_cert"), body)
    assert.are.equal(0, e.stop())
    assert.matches("client certificate missing or refused", e.log())
  end)

  it("refuses at start a web configuration it cannot honour, naming the key", function()
    local dir = helpers.tmpdir()
    local cert = ("cert_file: %s/server.pem\n  key_file: %s/server.key\n"):format(F, F)
    local cases = {
      { "tls_server_config:\n  " .. cert .. "  min_version: TLS11\n", "tls_server_config.min_version: TLS11 is refused" },
      { "tls_server_config:\n  " .. cert .. "  client_allowed_sans: [a]\n", "tls_server_config.client_allowed_sans: client_allowed_sans is not supported" },
      { "tls_server_config:\n  " .. cert .. "  bogus: 1\n", "tls_server_config.bogus: unknown key" },
      { "tls_server_config:\n  cert_file: /nonexistent.pem\n  key_file: x\n", "tls_server_config.cert_file: cannot read /nonexistent.pem" },
      { "tls_server_config:\n  cert_file: " .. F .. "/client.pem\n  key_file: " .. F .. "/server.key\n", "tls_server_config: key_file " .. F .. "/server.key: error:05800074:x509 certificate routines::key values mismatch" },
      { "tls_server_config:\n  key_file: " .. F .. "/server.key\n", "tls_server_config.cert_file: missing" },
      { "tls_server_config:\n  min_version: TLS13\n", "tls_server_config.cert_file: missing" },
      { "tls_server_config:\n  " .. cert .. "  client_auth_type: RequireAndVerifyClientCert\n", "tls_server_config.client_ca_file: RequireAndVerifyClientCert needs" },
      { "tls_server_config:\n  " .. cert .. "  cipher_suites: [TLS_NOT_A_SUITE]\n", "cipher_suites: TLS_NOT_A_SUITE is not a TLS 1.2 cipher suite" },
      { "basic_auth_users:\n  u: plaintext\n", "basic_auth_users.u: a bcrypt hash" },
      { "http_server_config:\n  headers:\n    X-Bogus: y\n", "http_server_config.headers.X-Bogus: not one of the headers" },
      { "tls_config:\n  cert_file: x\n", "tls_config: unknown key" },
      { "tls_server_config:\n  cert_file: |\n    x\n", "line 2: anchors, aliases, tags, block scalars" },
    }
    for i, case in ipairs(cases) do
      local path = ("%s/wc%d.yml"):format(dir, i)
      write(path, case[1])
      local rc, out = helpers.sh(("%s --replay %s %s/scripts/prometheus.lua --port 0 --linger 0 --web-config %s")
        :format(helpers.binary(), demo, root, path))
      assert.are.equal(1, rc, out)
      assert.is_truthy(out:find(case[2], 1, true), ("case %d: %q not in: %s"):format(i, case[2], out))
      assert.is_nil(out:match("serving"), out)
    end
    local rc, out = helpers.sh(("%s --replay %s %s/scripts/prometheus.lua --port 0 --web-config %s/none.yml")
      :format(helpers.binary(), demo, root, dir))
    assert.are.equal(1, rc, out)
    assert.matches("cannot read the web configuration: .*none%.yml: No such file", out)
  end)

  it("warns when it serves beyond loopback without a web configuration", function()
    local cmd = "%s --replay %s %s/scripts/prometheus.lua --listen 0.0.0.0:0 --linger 0 %s"
    local rc, out = helpers.sh(cmd:format(helpers.binary(), demo, root, ""))
    assert.are.equal(0, rc, out)
    assert.matches("prometheus%.lua: warning: serving 0%.0%.0%.0:0 without %-%-web%-config: anyone who reaches", out)
    rc, out = helpers.sh(cmd:format(helpers.binary(), demo, root, "--web-config " .. F .. "/web-tls-auth.yml"))
    assert.are.equal(0, rc, out)
    assert.is_nil(out:match("warning"), out)
    assert.matches("serving https://0%.0%.0%.0:%d+/metrics", out)
  end)

  it("reloads the file on SIGHUP, and keeps the running settings when the new file is refused", function()
    if not curl_or_pending() then return end
    local passwd = require "cuptimon.passwd"
    local dir = helpers.tmpdir()
    local path = dir .. "/web.yml"
    local function config(password)
      return ("tls_server_config:\n  cert_file: %s/server.pem\n  key_file: %s/server.key\n"
        .. "basic_auth_users:\n  alice: %s\n"):format(F, F, assert(passwd.hash(password, 4)))
    end
    write(path, config("first"))
    local e = start({ "--web-config", path })
    assert.are.equal(200, select(2, https(e.port, "/metrics", { "-u", "alice:first" })))
    write(path, config("second"))
    e.proc:kill("sighup")
    assert.is_true(helpers.run_until(function() return e.log():match("reloaded") ~= nil end, 10000), e.log())
    assert.are.equal(401, select(2, https(e.port, "/metrics", { "-u", "alice:first" })))
    assert.are.equal(200, select(2, https(e.port, "/metrics", { "-u", "alice:second" })))
    write(path, ("tls_server_config:\n  cert_file: %s/server.pem\n  key_file: %s/server.key\n"
      .. "  min_version: TLS10\n"):format(F, F))
    e.proc:kill("sighup")
    assert.is_true(helpers.run_until(function() return e.log():match("was not reloaded") ~= nil end, 10000), e.log())
    assert.matches("the web configuration was not reloaded %(the running one stays%): [^\n]*"
      .. "tls_server_config.min_version: TLS10 is refused", e.log())
    assert.are.equal(200, select(2, https(e.port, "/metrics", { "-u", "alice:second" })))
    assert.are.equal(0, e.stop())
  end)

  -- The limits of the plain endpoint (prometheus_spec) hold on the TLS port: 500 clients that
  -- never send a ClientHello, or dribble one that never ends, do not keep a scraper out.
  for _, mode in ipairs({ "idle", "tls_slowloris" }) do
    it("answers a TLS scrape every 100 ms while 500 " .. mode .. " clients hold connections", function()
      if not curl_or_pending() then return end
      local e = start({ "--web-config", F .. "/web-tls-auth.yml" })
      local failed = {}
      local answered, worst, st = require("http_attack").scrape_under_flood(e.port, 500, mode, function()
        local _, code, body = https(e.port, "/metrics", { "-u", "prometheus:" .. PASSWORD })
        local ok = code == 200 and body:match("cuptimon_kernel_launches_total") ~= nil
        if not ok then failed[#failed + 1] = tostring(code) end
        return ok
      end)
      assert.are.equal(30, answered, (mode .. ": worst scrape %d ms; failed scrapes' HTTP codes: %s; attack %d "
        .. "opened, %d closed by the server"):format(worst, table.concat(failed, " "), st.opened,
        st.closed_by_server))
      assert.is_true(st.closed_by_server > 0, "the server never evicted an attacker")
      local _, _, body = https(e.port, "/metrics", { "-u", "prometheus:" .. PASSWORD })
      assert.is_true(metric(body, "cuptimon_exporter_refused_requests_total", "evicted") > 0, body)
      assert.are.equal(0, e.stop())
    end)
  end

  -- A client that opens TCP and sends nothing is closed on the request clock (5 s), TLS or not.
  it("closes a TLS connection that sends no ClientHello within the request deadline", function()
    local e = start({ "--web-config", F .. "/web-tls-auth.yml" })
    local c = uv.new_tcp()
    local closed_at
    local t0 = uv.now()
    c:connect("127.0.0.1", e.port, function(err)
      assert(not err, err)
      c:read_start(function(_, chunk) if not chunk then closed_at = uv.now() end end)
    end)
    assert.is_true(helpers.run_until(function() return closed_at ~= nil end, 15000), "never closed")
    c:close()
    local waited = closed_at - t0
    assert.is_true(waited >= 4900 and waited < 10000, ("closed after %d ms"):format(waited))
    assert.are.equal(0, e.stop())
  end)
end)
