-- Specs of scripts/prometheus.lua without a Prometheus server (spec/prometheus_scrape.sh has the
-- real one): the exporter serves a replay, a luv client fetches /metrics, and a small parser of
-- the text exposition format 0.0.4 checks every line (HELP and TYPE before a family's samples,
-- families contiguous, `name{labels} value` samples, histogram buckets cumulative and ending with
-- le="+Inf" equal to _count) before the values are compared with count.lua's figures. Also the
-- HTTP answers (404, 405, 400, 431), the bounded kernel label, and one series set per process.
-- luacheck: std +busted
local helpers = require "helpers"

local bin = helpers.binary()
local root = helpers.root()
local gen = os.getenv("CUPTIMON_WIRE_GEN")
local demo = root .. "/examples/demo.cmcap"

-- Starts the exporter (spec/exporter.lua); its stop() runs in finally().
local function start(captures, argv)
  local e = require("exporter").start(captures, argv)
  finally(e.stop)
  assert.is_truthy(e.port, e.log())
  assert.is_nil(e.exited(), e.log())
  return e
end

-- Sends `request` to the port and returns the status, the head and the body of the answer.
local http = helpers.http

local function get(port, path)
  return http(port, ("GET %s HTTP/1.1\r\nHost: 127.0.0.1\r\nUser-Agent: spec\r\n\r\n"):format(path))
end

-- Parses an exposition; returns { [family] = { type =, samples = { { name =, labels =, value = } } } }
-- or raises naming the line at fault.
local function parse(text)
  local fams, order, current = {}, {}, nil
  local function family(name, line)
    local f = fams[name]
    if not f then
      f = { samples = {} }
      fams[name] = f
      order[#order + 1] = name
    elseif current ~= name then
      error("family " .. name .. " is not contiguous: " .. line)
    end
    current = name
    return f
  end
  assert(text:sub(-1) == "\n", "the exposition must end with a newline")
  for line in text:gmatch("([^\n]*)\n") do
    local name, help = line:match("^# HELP ([%a_:][%w_:]*) (.*)$")
    local tname, typ = line:match("^# TYPE ([%a_:][%w_:]*) (%a+)$")
    if name then
      local f = family(name, line)
      assert(not f.help and #f.samples == 0, "HELP after samples or twice: " .. line)
      f.help = help
    elseif tname then
      local f = family(tname, line)
      assert(not f.type and #f.samples == 0, "TYPE after samples or twice: " .. line)
      assert(typ == "counter" or typ == "gauge" or typ == "histogram" or typ == "summary" or typ == "untyped", line)
      f.type = typ
    else
      local sname, rest = line:match("^([%a_:][%w_:]*)(.*)$")
      assert(sname, "not a sample line: " .. line)
      local labels = {}
      if rest:sub(1, 1) == "{" then
        local i = 2
        while rest:sub(i, i) ~= "}" do
          local k, after = rest:match("^([%a_][%w_]*)=\"()", i)
          assert(k, "bad label at " .. i .. ": " .. line)
          local v, j = {}, after
          while true do
            local ch = rest:sub(j, j)
            assert(ch ~= "" and ch ~= "\n", "unterminated label value: " .. line)
            if ch == "\\" then
              local esc = rest:sub(j + 1, j + 1)
              v[#v + 1] = ({ ["\\"] = "\\", ['"'] = '"', n = "\n" })[esc] or error("bad escape: " .. line)
              j = j + 2
            elseif ch == '"' then
              break
            else
              v[#v + 1] = ch
              j = j + 1
            end
          end
          assert(labels[k] == nil, "label twice: " .. line)
          labels[k] = table.concat(v)
          i = j + 1
          if rest:sub(i, i) == "," then i = i + 1 end
        end
        rest = rest:sub(i + 1)
      end
      local value = rest:match("^ (%S+)$")
      local n = tonumber(value) or (value == "+Inf" and math.huge) or nil
      assert(n, "bad value: " .. line)
      local base = sname:gsub("_bucket$", ""):gsub("_sum$", ""):gsub("_count$", "")
      local f = fams[sname] or fams[base]
      assert(f and (fams[sname] or f.type == "histogram"), "sample without its TYPE: " .. line)
      family(fams[sname] and sname or base, line)
      f.samples[#f.samples + 1] = { name = sname, labels = labels, value = n }
    end
  end
  -- Histograms: per label set, buckets cumulative in le order, ending with +Inf = _count.
  for fname, f in pairs(fams) do
    if f.type == "histogram" then
      local sets = {}
      for _, s in ipairs(f.samples) do
        local key = {}
        for k, v in pairs(s.labels) do if k ~= "le" then key[#key + 1] = k .. "=" .. v end end
        table.sort(key)
        key = table.concat(key, ",")
        local set = sets[key] or { buckets = {} }
        sets[key] = set
        if s.name == fname .. "_bucket" then
          set.buckets[#set.buckets + 1] = { le = tonumber(s.labels.le) or (s.labels.le == "+Inf" and math.huge), n = s.value }
        elseif s.name == fname .. "_count" then
          set.count = s.value
        elseif s.name == fname .. "_sum" then
          set.sum = s.value
        end
      end
      for key, set in pairs(sets) do
        local prev = { le = -math.huge, n = 0 }
        for _, b in ipairs(set.buckets) do
          assert(b.le and b.le > prev.le and b.n >= prev.n, "buckets not cumulative: " .. key)
          prev = b
        end
        assert(prev.le == math.huge and prev.n == set.count and set.sum, "no +Inf = _count or _sum: " .. key)
      end
    end
  end
  return fams
end

local function sum(f, where)
  local n = 0
  for _, s in ipairs(f.samples) do
    local ok = true
    for k, v in pairs(where or {}) do if s.labels[k] ~= v then ok = false end end
    if ok and (s.name:match("_total$") or s.name:match("_count$")) then n = n + s.value end
  end
  return n
end

describe("prometheus.lua", function()
  -- cuptimon.httpreq's ffi.cdef of http-parser's structs (plain words for the bitfields) must match the
  -- C compiler's layout, printed by spec/http_parser_layout.c.
  it("declares http-parser's structs with the C compiler's layout", function()
    local ffi = require "ffi"
    local layout_bin = assert(os.getenv("CUPTIMON_HTTP_PARSER_LAYOUT"), "CUPTIMON_HTTP_PARSER_LAYOUT")
    local pipe = assert(io.popen(layout_bin))
    local c = {}
    for line in pipe:lines() do
      local k, v = line:match("^(%S+) (%d+)$")
      c[k] = tonumber(v)
    end
    pipe:close()
    local f = assert(io.open(root .. "/lua/cuptimon/httpreq.lua"))
    local text = f:read("*a")
    f:close()
    local cdef = assert(text:match("local HTTP_PARSER_CDEF = %[%[(.-)%]%]"), "no HTTP_PARSER_CDEF")
    local ms, es = text:match("local METHOD_SHIFT, ERRNO_SHIFT = (%d+), (%d+)")
    -- The types only (the functions follow them), renamed so as not to collide with another
    -- declaration in this process.
    cdef = assert(cdef:match("^(.-)unsigned long http_parser_version"))
    cdef = cdef:gsub("http_parser", "spec_http_parser"):gsub("http_data_cb", "spec_http_data_cb")
      :gsub("http_cb", "spec_http_cb")
    ffi.cdef(cdef)
    assert.are.equal(c.size, ffi.sizeof("spec_http_parser"))
    for _, k in ipairs { "nread", "content_length", "http_major", "http_minor", "data" } do
      assert.are.equal(c[k], ffi.offsetof("spec_http_parser", k), k)
    end
    assert.are.equal(c.http_minor + 2, ffi.offsetof("spec_http_parser", "_word2"))
    assert.are.equal(c.method_shift, tonumber(ms))
    assert.are.equal(c.errno_shift, tonumber(es))
    assert.are.equal(c.settings_size, ffi.sizeof("spec_http_parser_settings"))
    assert.are.equal(c.on_message_complete,
      ffi.offsetof("spec_http_parser_settings", "on_message_complete"))
  end)

  it("serves the demo capture's metrics in the text exposition format", function()
    local e = start({ demo })
    local status, head, body = get(e.port, "/metrics")
    assert.are.equal(200, status, head)
    assert.matches("Content%-Type: text/plain; version=0%.0%.4", head)
    local fams = parse(body)
    local launches = fams.cuptimon_kernel_launches_total
    assert.are.equal("counter", launches.type)
    assert.are.equal(300, sum(launches))
    assert.are.equal(150, sum(launches, { kernel = "cm_demo_matmul<16>" }))
    assert.are.equal(300, sum(fams.cuptimon_kernel_duration_seconds))
    assert.are.equal("histogram", fams.cuptimon_kernel_duration_seconds.type)
    assert.are.equal(300, sum(fams.cuptimon_records_total, { kind = "concurrent_kernel" }))
    assert.are.equal(0, sum(fams.cuptimon_records_dropped_total))
    assert.is_true(sum(fams.cuptimon_memcpy_bytes_total, { copy_kind = "HtoD" }) > 0)
    assert.is_truthy(fams.cuptimon_memcpy_duration_seconds_total)
    local s = launches.samples[1].labels
    assert.are.same({ host = "vm", pid = "601", executable = "cuptimon_demo_cuda", device = "0",
      kernel = s.kernel }, s)
    -- A second scrape gives the same numbers (nothing arrives after the run).
    local _, _, again = get(e.port, "/metrics")
    assert.are.equal(body, again)
    assert.are.equal(0, e.stop())
  end)

  -- spec/fixtures/pm_fake.cmcap: the fake CUDA app under gpu_util (--pm 20 --rounds 2), so 40 PM
  -- samples on device 0 whose values are the fake's: metric index * 10 + seq % 7 + 0.5.
  it("exports PM sampling gauges only when asked, as the mean of the samples", function()
    local pmcap = root .. "/spec/fixtures/pm_fake.cmcap"
    local e = start({ pmcap }, { "--pm-devices", "0" })
    local status, head, body = get(e.port, "/metrics")
    assert.are.equal(200, status, head)
    local fams = parse(body)
    assert.are.equal(40, sum(fams.cuptimon_gpu_pm_samples_total, { device = "0" }))
    local function gauge(name)
      local f = fams[name]
      assert.is_truthy(f, name)
      assert.are.equal("gauge", f.type)
      assert.are.equal(1, #f.samples)
      return f.samples[1].value
    end
    assert.are.equal(0.53375, gauge("cuptimon_gpu_dram_throughput_ratio"))
    assert.are.equal(0.13375, gauge("cuptimon_gpu_sm_active_ratio"))
    assert.are.equal(0.23375, gauge("cuptimon_gpu_tensor_active_ratio"))
    assert.are.equal(73.375, gauge("cuptimon_gpu_pcie_read_bytes_per_second"))
    -- No samples since the last scrape: the gauges keep their last values.
    local _, _, again = get(e.port, "/metrics")
    assert.are.equal(body, again)
    assert.are.equal(0, e.stop())
    -- Without the option, no PM family at all.
    local plain = start({ pmcap })
    local _, _, body2 = get(plain.port, "/metrics")
    assert.is_nil(body2:match("cuptimon_gpu_"))
    assert.are.equal(0, plain.stop())
  end)

  it("answers only GET / and GET /metrics, strictly", function()
    local e = start({ demo })
    assert.are.equal(200, (get(e.port, "/")))
    assert.are.equal(200, (get(e.port, "/metrics?x=1")))
    assert.are.equal(404, (get(e.port, "/nope")))
    local st, head = http(e.port, "POST /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n")
    assert.are.equal(405, st)
    assert.matches("Allow: GET", head)
    assert.are.equal(400, (http(e.port, "GET /metrics\r\n\r\n")))
    assert.are.equal(400, (http(e.port, "GET /metrics HTTP/1.1\r\n\r\n")))       -- no Host
    assert.are.equal(200, (http(e.port, "GET /metrics HTTP/1.0\r\n\r\n")))       -- 1.0: optional
    assert.are.equal(400, (http(e.port, "GET /metrics HTTP/2.0\r\nHost: x\r\n\r\n")))
    assert.are.equal(400, (http(e.port, "GET /metrics HTTP/1.1\r\nHost: x\r\n folded\r\n\r\n")))
    assert.are.equal(400, (http(e.port, "GET /metrics HTTP/1.1\r\nHost: x\r\nBad Name: y\r\n\r\n")))
    assert.are.equal(400, (http(e.port, "GET /metrics HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n")))
    assert.are.equal(400, (http(e.port, "GET metrics HTTP/1.1\r\nHost: x\r\n\r\n")))
    local big = "GET /metrics HTTP/1.1\r\nHost: x\r\nX-Big: " .. ("a"):rep(9000) .. "\r\n\r\n"
    assert.are.equal(431, (http(e.port, big)))
    -- One request per connection: a pipelined second one is not parsed.
    assert.are.equal(200, (http(e.port, "GET / HTTP/1.1\r\nHost: x\r\n\r\nGET /nope HTTP/1.1\r\n\r\n")))
    -- A method http-parser does not know is malformed.
    assert.are.equal(400, (http(e.port, "FOO / HTTP/1.1\r\nHost: x\r\n\r\n")))
    -- The server still answers after all that.
    assert.are.equal(200, (get(e.port, "/metrics")))
    assert.are.equal(0, e.stop())
  end)

  -- Idle and slowloris TCP clients must not lock the endpoint out: with 500 of either held
  -- open, a scrape every 100 ms is answered.
  for _, mode in ipairs({ "idle", "slowloris" }) do
    it("answers a scrape every 100 ms while 500 " .. mode .. " clients hold connections", function()
      local e = start({ demo })
      local answered, worst, st = require("http_attack").scrape_under_flood(e.port, 500, mode, function()
        local code, _, body = get(e.port, "/metrics")
        return code == 200 and body:match("cuptimon_kernel_launches_total") ~= nil
      end)
      assert.are.equal(30, answered, ("worst scrape %d ms; attack %d opened, %d closed by the server")
        :format(worst, st.opened, st.closed_by_server))
      assert.is_true(st.closed_by_server > 0, "the server never evicted an attacker")
      assert.are.equal(0, e.stop())
    end)
  end

  -- When the slots are full, a client that has sent part of its request head (a real client
  -- writes it whole: this one is dribbling it) goes before an older one that has sent nothing
  -- yet, which may be a scraper whose own process is slow on a loaded machine.
  it("evicts a dribbling client before an older one that has sent nothing", function()
    local uv = require "luv"
    local e = start({ demo })
    local conns = {}
    local function open(first)
      local c = { closed = false, got = "", tcp = uv.new_tcp() }
      conns[#conns + 1] = c
      c.tcp:connect("127.0.0.1", e.port, function(err)
        assert(not err, err)
        c.tcp:read_start(function(rerr, chunk)
          if rerr or not chunk then c.closed = true else c.got = c.got .. chunk end
        end)
        if first then
          c.tcp:write(first)
          -- One more byte every 20 ms, as a slowloris sends them (and the server's loop turns).
          c.timer = uv.new_timer()
          c.timer:start(20, 20, function() if not c.closed then c.tcp:write("a") end end)
        end
      end)
      return c
    end
    local function closed(list)
      local n = 0
      for _, c in ipairs(list) do n = n + (c.closed and 1 or 0) end
      return n
    end
    finally(function()
      for _, c in ipairs(conns) do
        if c.timer and not c.timer:is_closing() then c.timer:close() end
        if not c.tcp:is_closing() then c.tcp:close() end
      end
    end)
    local silent = open(nil)
    helpers.sleep(100)
    -- 63 dribblers fill the server's 64 slots.
    local dribblers = {}
    for i = 1, 63 do dribblers[i] = open("GET /metrics HTTP/1.1\r\nHost: x\r\nX-Slow: ") end
    helpers.sleep(200)
    local late = {}
    for i = 1, 5 do
      late[i] = open(nil)
      helpers.sleep(20)
    end
    -- Each of the 5 late clients takes a dribbler's slot, the oldest first.
    assert.is_true(helpers.run_until(function() return closed(dribblers) >= 5 end, 3000),
      ("%d dribblers were evicted"):format(closed(dribblers)))
    helpers.sleep(100)
    assert.are.same({ false, 5, 0 }, { silent.closed, closed(dribblers), closed(late) })
    for i = 1, 5 do assert.is_true(dribblers[i].closed, ("dribbler %d was kept"):format(i)) end
    -- The silent client still gets its answer when it sends its request.
    silent.tcp:write("GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
    assert.is_true(helpers.run_until(function() return silent.closed end, 5000), "no answer")
    assert.matches("^HTTP/1.1 200 OK\r\n", silent.got)
    assert.are.equal(0, e.stop())
  end)

  -- Invalid UTF-8 in a kernel name or an executable path would make promtool (and Prometheus)
  -- reject the whole exposition, every honest process's series included.
  it("exposes hostile names as valid UTF-8 that promtool check metrics accepts", function()
    if not gen then
      pending("CUPTIMON_WIRE_GEN is not set (run through ctest)")
      return
    end
    local cap = os.tmpname()
    assert(os.execute(("%s capture %s --hostile --records 30 --kinds kernel"):format(gen, cap)) == 0)
    local e = start({ cap, demo })
    local st, _, body = get(e.port, "/metrics")
    assert.are.equal(200, st)
    assert.are.equal(0, e.stop())
    assert.is_nil(require("trace_check").utf8_invalid(body))
    assert.is_nil(body:find("[\1-\9\11-\31\127]") or body:find("\0", 1, true))
    parse(body)
    assert.matches('executable="wire\239\191\189gen"', body)
    -- Every record names another device, the HELLO lists device 0 only: two labels, one for the
    -- device the HELLO names and `other` for the rest, so a label's values stay bounded.
    local devices = {}
    for d in body:gmatch('executable="wire[^"]*",device="([^"]*)"') do devices[d] = true end
    assert.are.same({ ["0"] = true, other = true }, devices)
    assert.matches('kernel="cm_demo_matmul<16>"', body)
    local f = assert(io.open(cap .. ".prom", "wb"))
    f:write(body)
    f:close()
    if os.execute("command -v promtool >/dev/null 2>&1") ~= 0 then
      os.remove(cap)
      os.remove(cap .. ".prom")
      pending("promtool is not installed (Debian's prometheus package)")
      return
    end
    local rc, out = helpers.sh(("promtool check metrics < %s.prom"):format(cap))
    os.remove(cap)
    os.remove(cap .. ".prom")
    assert.are.equal(0, rc, out)
  end)

  it("bounds the kernel label to the top names by time plus other", function()
    local e = start({ demo }, { "--top-kernels", "1" })
    local _, _, body = get(e.port, "/metrics")
    local launches = parse(body).cuptimon_kernel_launches_total
    local kernels = {}
    for _, s in ipairs(launches.samples) do kernels[s.labels.kernel] = s.value end
    assert.are.same({ ["cm_demo_matmul<16>"] = 150, other = 150 }, kernels)
    assert.are.equal(0, e.stop())
  end)

  -- A recorded run in which the agent's lag guard shed runtime, then kernels (the fake CUPTI
  -- holds kernel records back, as in hub_spec): the exporter says which kinds were shed.
  it("exports the kinds the agent's lag guard shed, and CUPTI's held time", function()
    local app, why = helpers.agent_app()
    if not app then
      pending(why)
      return
    end
    local cap = os.tmpname()
    os.remove(cap)
    -- The exit drains the kernel records the fake still holds at 20 per flush; as in hub_spec,
    -- that can pass the default fence budget under TSan, so the budget is 10 s here.
    local rc, out = helpers.sh(("FAKE_CUPTI_NOW_STAMPS=1 CUPTIMON_EXIT_BUDGET_MS=10000 "
      .. "CUPTIMON_GUARD_LAG_MS=300 %s --record %s "
      .. "%s/spec/fixtures/guard_count.lua -- %s --records 100000 --threads 1 --kinds kernel,runtime "
      .. "--kernel-backlog 20 --rate 40000"):format(bin, cap, root, app))
    assert.are.equal(0, rc, out)
    local e = start({ cap })
    local _, _, body = get(e.port, "/metrics")
    assert.are.equal(0, e.stop())
    os.remove(cap)
    local fams = parse(body)
    assert.are.equal("gauge", fams.cuptimon_cupti_held_seconds.type, body)
    local shed = {}
    for _, smp in ipairs(fams.cuptimon_kind_shed.samples) do shed[smp.labels.kind] = smp.value end
    assert.are.same({ concurrent_kernel = 1, runtime = 1 }, shed, body)
    if os.execute("command -v promtool >/dev/null 2>&1") == 0 then
      local f = assert(io.open(cap .. ".prom", "wb"))
      f:write(body)
      f:close()
      local prc, pout = helpers.sh(("promtool check metrics < %s.prom"):format(cap))
      os.remove(cap .. ".prom")
      assert.are.equal(0, prc, pout)
    end
  end)

  it("serves a live run of two fake CUDA applications, one series set per pid", function()
    local app, why = helpers.agent_app()
    if not app then
      pending(why)
      return
    end
    local e = start({}, { "--", "sh", "-c",
      ("%s --records 1000 --kinds kernel & %s --records 500 --kinds kernel; wait"):format(app, app) })
    local _, _, body = get(e.port, "/metrics")
    local launches = parse(body).cuptimon_kernel_launches_total
    local per_pid = {}
    for _, s in ipairs(launches.samples) do
      assert.are.equal("fake_cuda_app", s.labels.executable)
      per_pid[#per_pid + 1] = sum(launches, { pid = s.labels.pid })
    end
    table.sort(per_pid)
    assert.are.equal(1500, sum(launches))
    assert.are.equal(500, per_pid[1])
    assert.are.equal(1000, per_pid[#per_pid])
    assert.are.equal(0, e.stop())
  end)

  it("labels each process of a multi-process run by pid", function()
    if not gen then
      pending("CUPTIMON_WIRE_GEN is not set (run through ctest)")
      return
    end
    local tmp = os.tmpname()
    local a, b = tmp .. ".a.cmcap", tmp .. ".b.cmcap"
    finally(function() os.remove(a); os.remove(b); os.remove(tmp) end)
    assert(os.execute(("%s capture %s --pid 111 --records 2000 --kinds kernel,runtime,memcpy"):format(gen, a)) == 0)
    assert(os.execute(("%s capture %s --pid 222 --records 1000 --kinds kernel,runtime"):format(gen, b)) == 0)
    local e = start({ a, b })
    local _, _, body = get(e.port, "/metrics")
    local fams = parse(body)
    assert.are.equal(2000, sum(fams.cuptimon_kernel_launches_total, { pid = "111", executable = "wire_gen" }))
    assert.are.equal(1000, sum(fams.cuptimon_kernel_launches_total, { pid = "222", executable = "wire_gen" }))
    assert.are.equal(2000, sum(fams.cuptimon_records_total, { pid = "111", kind = "memcpy" }))
    assert.are.equal(0, sum(fams.cuptimon_records_total, { pid = "222", kind = "memcpy" }))
    assert.are.equal(0, e.stop())
  end)
end)
