-- cuptimon.lag: the notes that say how far behind the script's view of a process ran
-- (cm.lag_notes, cm.print_lag_notes, re-exported by cuptimon).
--
-- Design note. A view that is behind is late, not incomplete (losses have their own LOST line),
-- and a recipe prints these notes next to its table. The figures are cm.stats()'s (lag_s,
-- lag_peak_s, backlog_records, guard_shed); for a process that exited they are kept at its exit
-- (_process_exit, from cuptimon's event function), since its source then no longer lists. This
-- module owns only that record of the processes gone. Loop thread only.
local core = require "cuptimon.core"

local M = {}

-- cuptimon's public module table (_setup): cm.stats is read through it.
local cm

-- Takes what the parts share from cuptimon (init.lua): here, the public module table.
function M._setup(public)
  cm = public
end

local lag_gone = {} -- source -> { pid =, peak = } of processes that exited (process_exit)

--- Lines that say how far behind the script's view ran, for each process whose records reached
--- the script more than `min_s` seconds (default 1) late at some point: a view that is behind is
--- late, not incomplete (losses have their own LOST line). Now and at the peak, with the records
--- the agent still held (cm.stats(): lag_s, lag_peak_s, backlog_records); and one line for each
--- process whose agent's lag guard stopped tracing kinds because CUPTI fell behind (guard_shed).
function M.lag_notes(min_s)
  min_s = min_s or 1
  local out, seen = {}, {}
  local function guard_note(pid, shed, lag_s)
    if shed and #shed > 0 then
      out[#out + 1] = ("note: CUPTI fell %.1f s behind pid %d, so its agent stopped tracing %s "
        .. "(the lag guard, CUPTIMON_GUARD_LAG_MS): the counts of %s cover the run until then")
        :format(lag_s, pid, table.concat(shed, ", "), #shed > 1 and "those kinds" or "that kind")
    end
  end
  for _, s in ipairs(core.sources()) do
    seen[s.source] = true
    local st = cm.stats(s.source)
    if st and st.lag_peak_s >= min_s then
      out[#out + 1] = ("note: the records of pid %d reached the script up to %.1f s late (now %.1f "
        .. "s behind, %d records not yet sent by its agent): the view is behind the application")
        :format(s.pid, st.lag_peak_s, st.lag_s, st.backlog_records)
    end
    if st then guard_note(s.pid, st.guard_shed, st.guard_lag_s) end
  end
  local gone = {}
  for source, g in pairs(lag_gone) do
    if not seen[source] then gone[#gone + 1] = g end
  end
  table.sort(gone, function(a, b) return a.pid < b.pid end)
  for _, g in ipairs(gone) do
    if g.peak >= min_s then
      out[#out + 1] = ("note: the records of pid %d reached the script up to %.1f s late: the view "
        .. "ran behind the application"):format(g.pid, g.peak)
    end
    guard_note(g.pid, g.guard_shed, g.guard_lag_s)
  end
  return out
end

--- Prints cm.lag_notes(min_s) (to io.stdout, or `out`), if any.
function M.print_lag_notes(out, min_s)
  out = out or io.stdout
  for _, line in ipairs(cm.lag_notes(min_s)) do out:write(line, "\n") end
end

-- The host's "process_exit" event, before the hooks run: the peak lag of the process's life goes
-- into its exit table `a`, next to its losses, and is kept for cm.lag_notes.
function M._process_exit(a)
  local st = cm.stats(a.source)
  if st then
    a.lag_peak_s, a.lag_decode_peak_ns = st.lag_peak_s, st.lag_decode_peak_ns
    a.guard_shed, a.guard_lag_s = st.guard_shed, st.guard_lag_s
    lag_gone[a.source] = { pid = a.pid, peak = st.lag_peak_s, guard_shed = st.guard_shed,
      guard_lag_s = st.guard_lag_s }
  end
end

return M
