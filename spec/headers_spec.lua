-- The recipes' headers as executable documentation: for every scripts/*.lua,
-- the replay command of its header's Usage (`cuptimon-lua --replay run.cmcap scripts/X.lua ...`)
-- runs on the bundled capture, and its output has the shape of the header's "Example output":
-- every example line appears in the output, in order, token for token, where a number stands for
-- any number (so the figures may change, the columns, names and units may not). A recipe with no
-- replay command (live only) runs its Usage command on the fake CUDA application instead.
--
-- How an example block is read: the lines indented under "Example output" (blank lines and
-- "..." skipped; "..." within a token stands for any characters). A line that is
-- all "(...)" switches what is compared: "(out/kernel.csv)" the file the command wrote there (the
-- command runs in a fresh directory), a note that mentions stdout back to the command's output
-- (stdout and stderr together); any other such note is a comment.
-- luacheck: std +busted
local args = require "cuptimon.args"
local helpers = require "helpers"
local uv = require "luv"

local bin = helpers.binary()
local root = helpers.root()
local demo = root .. "/examples/demo.cmcap"

-- The captures a recipe's command reads, in the order its run*.cmcap names appear: the demo
-- capture unless the recipe needs other data (PM samples, two ranks).
local captures = {
  gpu_util = { root .. "/spec/fixtures/pm_fake.cmcap" },
  ranks = { root .. "/spec/fixtures/ranks/rank0.cmcap", root .. "/spec/fixtures/ranks/rank1.cmcap" },
}
-- What replaces "cmd args..." in the Usage command of a live-only recipe ({app}: the fake CUDA
-- application): a run in which a kernel turns slow.
local live_commands = {
  spike = "{app} --records 4000 --kinds kernel,runtime --rounds 14 --pause-ms 250 --slow-round 9 "
    .. "--linger-ms 2500",
}

local function lines_of(text)
  local t = {}
  for l in (text .. "\n"):gmatch("([^\n]*)\n") do t[#t + 1] = l end
  return t
end

-- The Usage commands of a header: each "cuptimon-lua ..." line of the Usage paragraph, with the
-- more indented lines that continue it.
local function usage_commands(header)
  local out, inside = {}, false
  for _, l in ipairs(lines_of(header)) do
    if l:match("^Usage:") then inside = true end
    if inside and l == "" then break end
    local cmd = inside and l:match("(cuptimon%-lua .*)$")
    if cmd then
      out[#out + 1] = cmd
    elseif inside and #out > 0 then
      out[#out] = out[#out] .. " " .. l:match("^%s*(.-)%s*$")
    end
  end
  return out
end

-- The example block: { { kind = "line", text = }, { kind = "note", text = }, ... }.
local function example_block(header)
  local out, inside = {}, false
  for _, l in ipairs(lines_of(header)) do
    if inside then
      if l ~= "" and not l:match("^  ") then break end
      local text = l:gsub("^  ", ""):gsub("%s+$", "")
      local note = text:match("^%s*%((.*)%)$")
      if note then
        out[#out + 1] = { kind = "note", text = note }
      elseif text:match("%S") and not text:match("^%s*%.%.%.$") then
        out[#out + 1] = { kind = "line", text = text }
      end
    elseif l:match("^Example output") then
      inside = true
    end
  end
  return out
end

-- The shape of text: its whitespace-separated tokens, each run of digits (with a decimal part)
-- replaced by "#".
local function shape(text)
  local t = {}
  for w in text:gmatch("%S+") do t[#t + 1] = (w:gsub("%d+%.?%d*", "#")) end
  return t
end

-- A token of an example matches the same token; "..." in it stands for any characters
-- ("(.../fake_cuda_app)" matches any path that ends so).
local function token_matches(want, have)
  if want == have then return true end
  if not want:find("...", 1, true) then return false end
  local pattern = want:gsub("[%^%$%(%)%%%.%[%]%*%+%-%?]", "%%%0"):gsub("%%%.%%%.%%%.", ".*")
  return have:match("^" .. pattern .. "$") ~= nil
end

-- The index after the first run of `have` from `from` on that matches `want`, or nil.
local function find_run(have, want, from)
  for i = from, #have - #want + 1 do
    local ok = true
    for j = 1, #want do
      if not token_matches(want[j], have[i + j - 1]) then
        ok = false
        break
      end
    end
    if ok then return i + #want end
  end
end

local read = helpers.read

-- Checks that `block` (an example block) has the shape of what the command printed (`out`) and
-- wrote in `dir`.
local function check_shape(name, block, out, dir)
  local sections = { stdout = { tokens = shape(out), at = 1, text = out } }
  local cur = sections.stdout
  local checked = 0
  for _, e in ipairs(block) do
    if e.kind == "note" then
      local text = read(dir .. "/" .. e.text)
      if text then
        sections[e.text] = sections[e.text] or { tokens = shape(text), at = 1, text = text }
        cur = sections[e.text]
      elseif e.text:find("stdout", 1, true) then
        cur = sections.stdout
      end
    else
      local nxt = find_run(cur.tokens, shape(e.text), cur.at)
      assert(nxt, ("%s: the header's example line\n  %s\nhas no match (in order) in what the "
        .. "command gave:\n%s"):format(name, e.text, cur.text))
      cur.at = nxt
      checked = checked + 1
    end
  end
  assert(checked > 0, name .. ": the header has no example output")
end

-- The command of a Usage line, ready for the shell: the binary, the recipe's path, the captures.
local function replay_command(name, cmd)
  local list = captures[name] or { demo }
  local n = 0
  cmd = cmd:gsub("run[%.%w]*%.cmcap", function()
    n = n + 1
    return list[math.min(n, #list)]
  end)
  cmd = cmd:gsub("^cuptimon%-lua", bin):gsub("scripts/", root .. "/scripts/")
  return cmd
end

local function live_command(name, cmd)
  local app = helpers.agent_app()
  if not app or not live_commands[name] then return nil end
  cmd = cmd:gsub("%b[]", ""):gsub("cmd args%.%.%.", (live_commands[name]:gsub("{app}", app)))
  cmd = cmd:gsub("^cuptimon%-lua", bin):gsub("scripts/", root .. "/scripts/"):gsub("%s+", " ")
  return cmd
end

-- prometheus.lua serves its output: the command runs with a free port (--port 0), and the
-- example is the body of GET /metrics while it lingers.
local function scrape(cmd)
  local argv = {}
  for w in (cmd .. " --port 0 --linger 60000"):gmatch("%S+") do argv[#argv + 1] = w end
  local exe = table.remove(argv, 1)
  local err, log, status = uv.new_pipe(false), {}, nil
  local proc = assert(uv.spawn(exe, { args = argv, stdio = { nil, nil, err } }, function(code, sig)
    status = sig ~= 0 and 128 + sig or code
  end))
  err:read_start(function(_, chunk) if chunk then log[#log + 1] = chunk end end)
  local function text() return table.concat(log) end
  helpers.run_until(function() return text():find("the run ended") or status end, 60000)
  local port = tonumber(text():match("serving http://[^:]+:(%d+)/metrics"))
  local body
  if port and not status then
    body = select(3, helpers.http(port, "GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"))
  end
  if not status then proc:kill("sigterm") end
  helpers.run_until(function() return status ~= nil end, 60000)
  if not err:is_closing() then err:close() end
  if not proc:is_closing() then proc:close() end
  return body, text(), status
end

describe("every recipe header's example command", function()
  local names = {}
  for path in io.popen("ls " .. root .. "/scripts/*.lua"):lines() do names[#names + 1] = path end
  assert.is_true(#names >= 12, "the recipes")
  for _, path in ipairs(names) do
    local name = path:match("([%w_]+)%.lua$")
    it(name .. ": the header's command gives output of the header's shape", function()
      local header = args.header(path)
      local cmds = usage_commands(header)
      assert.is_true(#cmds > 0, name .. ": no Usage command in the header")
      local replay
      for _, c in ipairs(cmds) do if c:find("--replay", 1, true) and not replay then replay = c end end
      local cmd = replay and replay_command(name, replay) or live_command(name, cmds[1])
      if not cmd then
        pending(name .. " is live only, and the agent or the fake CUDA application is not built")
        return
      end
      local block = example_block(header)
      if name == "prometheus" then
        local body, log, status = scrape(cmd)
        assert.is_truthy(body, log)
        assert.are.equal(0, status, log)
        return check_shape(name, block, body, "")
      end
      local dir = helpers.tmpdir()
      local rc, out = helpers.sh(("cd %s && %s"):format(dir, cmd))
      assert.are.equal(0, rc, cmd .. "\n" .. out)
      check_shape(name, block, out, dir)
      os.execute("rm -rf " .. dir)
    end)
  end
end)
