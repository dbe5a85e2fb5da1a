-- spec/http_attack.lua: a hostile HTTP client for the specs of scripts/prometheus.lua:
-- it keeps N TCP connections open to the exporter, each either idle (it sends nothing:
-- on a TLS port, no ClientHello), a slowloris (one byte of a never-ending request head every
-- DRIP_MS) or a TLS slowloris (one byte every DRIP_MS of a TLS handshake record that announces
-- 512 bytes and never ends: the server's handshake waits on it), and reopens each one
-- as soon as the server closes it, so the pressure stays on for as long as the test runs. It runs
-- on the caller's luv loop: whatever runs the loop (helpers.run_until, a scrape) drives it too.
--
--   local attack = require("http_attack").flood(port, 500, "idle", { reconnect_ms = 100 })
--   ... scrape ...
--   local st = attack.stop()   -- { opened =, closed_by_server =, open = }
--   local answered, worst, st = require("http_attack").scrape_under_flood(port, 500, "idle", scrape)
local uv = require "luv"

local M = {}

local HEAD = "GET /metrics HTTP/1.1\r\nHost: x\r\nX-Slow: "
-- A TLS record header: handshake (22), TLS 1.0 record version, 512 bytes of body, then a
-- ClientHello's type byte (1); the padding bytes that follow never complete it.
local TLS_HEAD = "\22\3\1\2\0\1"

--- Starts the flood; returns { stop = fn -> stats, stats = fn -> stats }. `mode` is "idle",
--- "slowloris" or "tls_slowloris". Options: drip_ms (200), a slowloris's pause between bytes; reconnect_ms (100),
--- how soon a client the server closed comes back.
function M.flood(port, n, mode, o)
  o = o or {}
  local drip_ms, reconnect_ms = o.drip_ms or 200, o.reconnect_ms or 100
  assert(mode == "idle" or mode == "slowloris" or mode == "tls_slowloris",
    "http_attack.flood: mode is idle, slowloris or tls_slowloris")
  local head, fill = HEAD, "a"
  if mode == "tls_slowloris" then head, fill = TLS_HEAD, "\0" end
  local st = { opened = 0, closed_by_server = 0, open = 0 }
  local stopped = false
  local conns = {}
  local open_one

  local function drop(c, by_server)
    if not conns[c] then return end
    local timer = conns[c].timer
    conns[c] = nil
    st.open = st.open - 1
    if by_server then st.closed_by_server = st.closed_by_server + 1 end
    if timer and not timer:is_closing() then timer:close() end
    if not c:is_closing() then c:close() end
    -- Reopen on the next loop turn, never inside the close's own callback chain.
    if by_server and not stopped then
      local t = uv.new_timer()
      t:start(reconnect_ms, 0, function()
        t:close()
        if not stopped then open_one() end
      end)
    end
  end

  open_one = function()
    local c = uv.new_tcp()
    conns[c] = {}
    st.open = st.open + 1
    c:connect("127.0.0.1", port, function(err)
      if err then return drop(c, true) end
      st.opened = st.opened + 1
      c:read_start(function(rerr, chunk)
        if rerr or not chunk then drop(c, true) end
      end)
      if mode ~= "idle" and conns[c] then
        local pos, t = 0, uv.new_timer()
        conns[c].timer = t
        t:start(drip_ms, drip_ms, function()
          pos = pos + 1
          local byte = pos <= #head and head:sub(pos, pos) or fill
          if not c:is_closing() then c:write(byte) end
        end)
      end
    end)
  end

  -- Writing to a connection the server just closed raises SIGPIPE, which would end this process.
  local sigpipe = uv.new_signal()
  sigpipe:start("sigpipe", function() end)
  for _ = 1, n do open_one() end
  local function stats()
    return { opened = st.opened, closed_by_server = st.closed_by_server, open = st.open }
  end
  return {
    stats = stats,
    stop = function()
      stopped = true
      local list = {}
      for c in pairs(conns) do list[#list + 1] = c end
      for _, c in ipairs(list) do drop(c, false) end
      if not sigpipe:is_closing() then sigpipe:close() end
      uv.run("nowait")
      return stats()
    end,
  }
end

--- Floods `port` with `n` clients of `mode` (drip_ms 50, reconnect_ms 100), lets them fill every
--- slot, then calls scrape() (-> true when it was answered with the metrics) every 100 ms, 30
--- times. Returns how many were answered, the slowest scrape in ms and the flood's stats.
function M.scrape_under_flood(port, n, mode, scrape)
  local helpers = require "helpers"
  local attack = M.flood(port, n, mode, { drip_ms = 50, reconnect_ms = 100 })
  helpers.run_until(function() return attack.stats().opened >= n end, 10000)
  local answered, worst = 0, 0
  for _ = 1, 30 do
    local t0 = uv.now()
    local ok = scrape()
    uv.update_time()
    worst = math.max(worst, uv.now() - t0)
    if ok then answered = answered + 1 end
    helpers.run_until(function() return uv.now() >= t0 + 100 end, 200)
  end
  return answered, worst, attack.stop()
end

return M
