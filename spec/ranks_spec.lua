-- Specs of scripts/ranks.lua on jobs of several fake CUDA applications (engine/tests/
-- fake_cuda_app.c --steps) run under the real agent, live and recorded: each process is a rank
-- (RANK, LOCAL_RANK and WORLD_SIZE reach the script through the agent's HELLO), one of them is
-- made slower on purpose, and the straggler line must name that rank and no other.
-- luacheck: std +busted
local helpers = require "helpers"

local bin = helpers.binary()
local root = helpers.root()
local recipe = root .. "/scripts/ranks.lua"

-- A shell command running one fake rank per entry of `ranks` ({ rank, "extra options" }) with
-- WORLD_SIZE set to their number, all at once.
local function job(app, ranks)
  local parts = {}
  for _, r in ipairs(ranks) do
    parts[#parts + 1] = ("RANK=%d LOCAL_RANK=%d %s --steps 12 --device %d %s &")
      :format(r[1], r[1], app, r[1], r[2] or "")
  end
  return ("sh -c 'export WORLD_SIZE=%d; %s wait'"):format(#ranks, table.concat(parts, " "))
end

-- The straggler lines of an output.
local function straggler_lines(out)
  local list = {}
  for line in out:gmatch("[^\n]+") do
    if line:match("^straggler: ") then list[#list + 1] = line end
  end
  return list
end

-- The final table's rows, by rank, without the pid column (it differs between runs).
local function final_rows(out)
  local rows = {}
  local tail = out:match("== at exit\n(.*)$") or out
  for line in tail:gmatch("[^\n]+") do
    local rank, loc, _, rest = line:match("^%s*(%d+)%s+(%S+)%s+(%d+)%s+(.*)$")
    if rank then rows[tonumber(rank)] = (loc .. " " .. rest):gsub("%s+", " ") end
  end
  return rows
end

-- The recipes over two recorded fake ranks (spec/fixtures/ranks/rank0.cmcap and rank1.cmcap:
-- fake_cuda_app --steps 8, WORLD_SIZE=2, rank 0 on device 0 waiting 1 ms a step for rank 1 on
-- device 1, which computes 1 ms longer): each output must equal the reviewed one in
-- spec/fixtures/ranks/NAME.out byte for byte; regenerate with
--   build/cuptimon-lua --replay spec/fixtures/ranks/rank0.cmcap \
--     --replay spec/fixtures/ranks/rank1.cmcap scripts/RECIPE.lua ARGS > spec/fixtures/ranks/NAME.out
describe("recipes on two recorded ranks", function()
  local dir = root .. "/spec/fixtures/ranks/"
  local replay = ("%s --replay %srank0.cmcap --replay %srank1.cmcap %s/scripts/"):format(bin, dir,
    dir, root)
  for _, c in ipairs { { "top", "top.lua" }, { "idle_top_2", "idle.lua --top 2" },
      { "ranks", "ranks.lua" } } do
    it(c[1] .. ": " .. c[2], function()
      local rc, out = helpers.sh(replay .. c[2])
      assert.are.equal(0, rc, out)
      local f = assert(io.open(dir .. c[1] .. ".out", "rb"))
      local want = f:read("*a")
      f:close()
      assert.are.equal(want, out)
    end)
  end

  it("timeline: one trace process per rank, named by rank, holding its device's work", function()
    local path = os.tmpname() -- (an empty file already: --force replaces it)
    local rc, out = helpers.sh(replay .. "timeline.lua --force -o " .. path)
    assert.are.equal(0, rc, out)
    local f = assert(io.open(path, "rb"))
    local text = f:read("*a")
    f:close()
    os.remove(path)
    local names, gpu = {}, {}
    for pid, name in text:gmatch('"name":"process_name","pid":(%d+),"tid":0,"args":{"name":"([^"]*)"}') do
      names[#names + 1] = name
      gpu[name] = text:match('"pid":' .. pid .. ',"tid":%d+,"args":{"name":"(GPU %d+) stream')
    end
    table.sort(names)
    assert.are.same({ "fake_cuda_app (rank 0)", "fake_cuda_app (rank 1)" }, names)
    assert.are.equal("GPU 0", gpu["fake_cuda_app (rank 0)"])
    assert.are.equal("GPU 1", gpu["fake_cuda_app (rank 1)"])
  end)
end)

describe("ranks.lua", function()
  it("--help prints the header, a bad option exits 2 naming the valid ones", function()
    local rc, out = helpers.sh(("%s %s --help"):format(bin, recipe))
    assert.are.equal(0, rc, out)
    assert.matches("straggler", out)
    assert.matches("%-%-step%-kernel NAME", out)
    rc, out = helpers.sh(("%s %s --bogus"):format(bin, recipe))
    assert.are.equal(2, rc, out)
    assert.matches("valid options: .*%-%-consecutive", out)
  end)

  it("replays the demo capture: one rank without RANK, no straggler", function()
    local rc, out = helpers.sh(("%s --replay %s/examples/demo.cmcap %s --interval 0"):format(bin,
      root, recipe))
    assert.are.equal(0, rc, out)
    assert.matches("\n%s+%-%s+%-%s+%d+%s+0%s+30%s+300%s", out) -- the demo's 30 NVTX steps
    assert.matches("no straggler\n$", out)
  end)

  it("flags the slow rank of a synchronous job, live, and only it", function()
    local app, why = helpers.agent_app()
    if not app then
      pending(why)
      return
    end
    -- Rank 1 computes 1 ms longer each step; the others wait for it in their collectives, so
    -- every rank's step lasts as long: only the waiting tells the straggler.
    local rc, out = helpers.sh(("%s %s -- %s"):format(bin, recipe, job(app, {
      { 0, "--wait-us 1000" }, { 1, "--extra-us 1000" }, { 2, "--wait-us 1000" } })))
    assert.are.equal(0, rc, out)
    local lines = straggler_lines(out)
    assert.are.equal(1, #lines, out)
    assert.matches("^straggler: rank 1 %(pid %d+, device 1%) steps 1%-3: own time 3%.00 ms, 50%% "
      .. "over the median 2%.00 ms", lines[1])
    local rows = final_rows(out)
    for r = 0, 2 do
      assert.matches(("^%d %d 12 24 3%%.000 3%%.000 "):format(r, r), rows[r])
    end
    -- Ranks 0 and 2 waited 1 ms in each of their 12 collectives (0.4 ms of transfer each), rank 1
    -- never.
    assert.matches(" 16%.80 12%.00$", rows[0])
    assert.matches(" 4%.80 0%.00$", rows[1])
    assert.matches("stragglers: rank 1 %(pid %d+, device 1%) 1 time\n$", out)
  end)

  it("waits for every rank of the node before judging: a late slow rank without NCCL", function()
    local app, why = helpers.agent_app()
    if not app then
      pending(why)
      return
    end
    -- Independent processes (no collectives), as on one GPU: ranks 0 and 2 are done before
    -- rank 1, the slow one, starts; WORLD_SIZE says three ranks are coming.
    local cmd = ("sh -c 'export WORLD_SIZE=3; RANK=0 LOCAL_RANK=0 %s --steps 30 --no-comm & "
      .. "RANK=2 LOCAL_RANK=2 %s --steps 30 --no-comm & wait; sleep 0.5; RANK=1 LOCAL_RANK=1 %s --steps 30 "
      .. "--no-comm --extra-us 2000'"):format(app, app, app)
    -- The live table is judged every 100 ms, several times before rank 1 connects.
    local rc, out = helpers.sh(("%s %s --interval 100 -- %s"):format(bin, recipe, cmd))
    assert.are.equal(0, rc, out)
    local lines = straggler_lines(out)
    assert.are.equal(1, #lines, out)
    assert.matches("^straggler: rank 1 %(pid %d+, device 0%) steps 1%-3: ", lines[1])
  end)

  it("flags a rank whose steps are longer, with --step-kernel instead of NVTX", function()
    local app, why = helpers.agent_app()
    if not app then
      pending(why)
      return
    end
    local rc, out = helpers.sh(("%s %s --step-kernel fake_train_kernel --interval 0 -- %s")
      :format(bin, recipe, job(app, { { 0 }, { 1 }, { 2, "--extra-us 600" }, { 3 } })))
    assert.are.equal(0, rc, out)
    local lines = straggler_lines(out)
    assert.are.equal(1, #lines, out)
    assert.matches("^straggler: rank 2 ", lines[1])
    -- 12 launches make 11 steps.
    assert.matches("\n%s+3%s+3%s+%d+%s+3%s+11%s+24%s", out)
  end)

  it("flags nobody when the ranks are alike, or the slowness is under --threshold", function()
    local app, why = helpers.agent_app()
    if not app then
      pending(why)
      return
    end
    local rc, out = helpers.sh(("%s %s --interval 0 -- %s"):format(bin, recipe,
      job(app, { { 0 }, { 1 } })))
    assert.are.equal(0, rc, out)
    assert.are.same({}, straggler_lines(out))
    assert.matches("no straggler\n$", out)
    -- 10% slower, threshold 15%.
    rc, out = helpers.sh(("%s %s --interval 0 -- %s"):format(bin, recipe,
      job(app, { { 0 }, { 1, "--extra-us 200" } })))
    assert.are.equal(0, rc, out)
    assert.are.same({}, straggler_lines(out))
  end)

  it("gives the same tables and straggler replayed from one capture per process", function()
    local app, why = helpers.agent_app()
    if not app then
      pending(why)
      return
    end
    local ranks = { { 0, "--wait-us 1000" }, { 1, "--extra-us 1000" } }
    local rc, live = helpers.sh(("%s %s -- %s"):format(bin, recipe, job(app, ranks)))
    assert.are.equal(0, rc, live)
    local rec, caps, dir, ncaps
    rc, rec, caps, dir, ncaps = helpers.record(job(app, ranks), "run")
    assert.are.equal(0, rc, rec)
    assert.are.equal(2, ncaps, rec)
    local replayed
    rc, replayed = helpers.sh(("%s %s %s"):format(bin, caps, recipe))
    os.execute("rm -rf " .. dir)
    assert.are.equal(0, rc, replayed)
    assert.are.same(final_rows(live), final_rows(replayed))
    local a, b = straggler_lines(live), straggler_lines(replayed)
    assert.are.equal(1, #a, live)
    assert.are.equal(1, #b, replayed)
    assert.are.equal(a[1]:gsub("pid %d+", "pid N"), (b[1]:gsub("pid %d+", "pid N")))
  end)
end)
