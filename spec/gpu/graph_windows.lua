-- A duty cycle's windows over a CUDA-graph workload (spec/gpu/torch_compile_graphs.sh): in each
-- window, the records of each kernel of the graph. One replay of the graph launches each of its
-- kernels once, so inside a window their counts differ by at most one (a replay cut by the
-- window's opening or closing edge); a larger spread is a record lost or added inside a window.
-- The graph's kernels are told by name (GRAPH_KERNELS, a Lua pattern; by default Inductor's,
-- cuBLAS's and CUTLASS's names); the eager comparison's kernels between replays are left out.
-- Only the kernels present in a window are compared: the eager warm-up's kernels may differ.
-- Each process has its own windows (torch.compile's worker processes join the duty cycle too), so
-- the counts are kept per process. Prints a W line per window (with its pid) and "GRAPHWIN
-- windows N uneven U replays R usable K" at the end; exits 1 when a window was uneven or none
-- saw the graph.
local cm = require "cuptimon"
local patterns = os.getenv("GRAPH_KERNELS") and { os.getenv("GRAPH_KERNELS") }
  or { "gemm", "nvjet", "triton_", "cutlass", "Kernel2" }
local on_ms = tonumber(os.getenv("GRAPH_ON_MS") or "100")
local period_ms = tonumber(os.getenv("GRAPH_PERIOD_MS") or "1000")

local function in_graph(name)
  for _, p in ipairs(patterns) do
    if name:find(p) then return true end
  end
  return false
end

local counts = {} -- source -> kernel name -> records in the window open now
local windows, uneven, replays, usable = 0, 0, 0, 0
assert(cm.duty{ on_ms = on_ms, period_ms = period_ms, seed = 1,
  select = { kernel = { "name" } },
  fn = function(b)
    local c = counts[b.source] or {}
    counts[b.source] = c
    for i = 0, b.n - 1 do
      local name = b:kernel_name(i, "mangled")
      if in_graph(name) then c[name] = (c[name] or 0) + 1 end
    end
  end,
  window = function(w)
    windows = windows + 1
    local lo, hi, k = math.huge, 0, 0
    for _, c in pairs(counts[w.source] or {}) do
      k = k + 1
      if c < lo then lo = c end
      if c > hi then hi = c end
    end
    if k == 0 then lo = 0 end
    local bad = w.ok and hi - lo > 1
    if w.ok and lo >= 2 then usable = usable + 1 end
    if bad then uneven = uneven + 1 end
    replays = replays + (w.ok and lo or 0)
    print(("W pid=%d ok=%s traced_ms=%.1f graph_kernels=%d min=%d max=%d%s"):format(w.pid or 0,
      tostring(w.ok), w.traced_ms or -1, k, lo, hi, bad and "  UNEVEN" or ""))
    counts[w.source] = nil
  end })

cm.on("exit", function()
  print(("GRAPHWIN windows %d uneven %d replays %d usable %d"):format(windows, uneven, replays, usable))
  if uneven > 0 or usable == 0 then cm.exit(1) end
end)
