-- cuptimon.table: aligned text tables for recipes.
--
--   local tabulate = require "cuptimon.table"
--   local t = tabulate.new {
--     { "kernel", width = 40, max = 40 },   -- the first column is left-aligned
--     { "count", "%d", width = 8 },         -- the others right-aligned
--     { "total_us", "%.1f", width = 11 },
--   }
--   t:add("cm_demo_matmul<16>", 150, 2863.2)
--   t:print()                               -- or io.write(tostring(t))
--
-- Design note. A column is { title, format, width =, max =, align = }: `format` is a
-- string.format pattern for one value ("%s" when omitted), `width` the least width, `max` the
-- most (a longer cell is cut and ends in "..."), `align` "left" or "right" (default: left for
-- the first column, right for the others). Rows are kept until printing, so a column grows to fit
-- its widest cell and the table stays aligned whatever the values; with widths as wide as the
-- values, the output is what string.format("%-40s %8d ...") would give. Cells are separated by
-- `sep` (one space by default); the last cell of a line is never padded, so lines carry no
-- trailing blanks. A nil value prints as "-".
--
-- Machine-readable output (a recipe's --format csv|json, M.set_output): the same tables go out
-- as CSV (the header once for each new set of columns, then one line per row) or as JSON Lines
-- (one object per row, keyed by the column titles), with the table's context (`opts.context`,
-- such as { pid = 601, device = 0 }) first in every row, and values unformatted (numbers as
-- numbers, nil as empty or null). The lines around the tables that a recipe prints with M.note
-- (process titles, totals) appear only in text output, so the output is data alone.
local M = {}

local output = "text" -- "text", "csv" or "json"
local last_header     -- the CSV header written last

local Table = {}
Table.__index = Table

local function cut(s, max)
  if max and #s > max then return s:sub(1, max - 3) .. "..." end
  return s
end

--- Sets how every table prints: "text" (the default: aligned columns), "csv" or "json" (JSON
--- Lines). Returns true, or nil and a message naming the valid choices.
function M.set_output(fmt)
  if fmt ~= "text" and fmt ~= "csv" and fmt ~= "json" then
    return nil, ("the output format must be text, csv or json, got %q"):format(tostring(fmt))
  end
  output, last_header = fmt, nil
  return true
end

--- The output format set by set_output.
function M.output() return output end

--- Writes a line that goes with the tables (a title, a total) in text output only.
function M.note(text)
  if output == "text" then io.stdout:write(text, "\n") end
end

-- The order of the context columns that recipes use; others follow by name.
local context_rank = { pid = 1, rank = 2, device = 3, refresh = 4 }

--- A table with the columns `cols` and options `opts` ({ sep = " ", context = { k = v } }; the
--- context is written in every row of machine-readable output).
function M.new(cols, opts)
  if type(cols) ~= "table" or #cols == 0 then
    error("cuptimon.table.new: expected a list of columns { { title, format, width = n }, ... }", 2)
  end
  local c = {}
  for i, col in ipairs(cols) do
    if type(col) == "string" then col = { col } end
    if type(col) ~= "table" or type(col[1]) ~= "string" then
      error(("cuptimon.table.new: column %d must be { title, format, width = n, max = n, "
        .. "align = \"left\"|\"right\" }"):format(i), 2)
    end
    local align = col.align or (i == 1 and "left" or "right")
    if align ~= "left" and align ~= "right" then
      error(("cuptimon.table.new: column %d: align must be \"left\" or \"right\", got %q")
        :format(i, tostring(align)), 2)
    end
    c[i] = { title = col[1], format = col[2] or "%s", width = col.width or 0, max = col.max,
      align = align }
  end
  local ctx = {}
  for k, v in pairs(opts and opts.context or {}) do ctx[#ctx + 1] = { k, v } end
  table.sort(ctx, function(a, b)
    local ra, rb = context_rank[a[1]] or 99, context_rank[b[1]] or 99
    if ra ~= rb then return ra < rb end
    return a[1] < b[1]
  end)
  return setmetatable({ cols = c, rows = {}, raw = {}, sep = opts and opts.sep or " ",
    context = ctx }, Table)
end

--- Adds a row: one value per column, formatted with the column's format.
function Table:add(...)
  local row = {}
  for i, col in ipairs(self.cols) do
    local v = select(i, ...)
    row[i] = cut(v == nil and "-" or col.format:format(v), col.max)
  end
  self.rows[#self.rows + 1] = row
  self.raw[#self.raw + 1] = { n = #self.cols, ... }
  return self
end

--- The number of rows added.
function Table:count() return #self.rows end

--- Forgets the rows (the columns keep their widths only through the rows printed later).
function Table:clear() self.rows, self.raw = {}, {} end

local function csv_cell(v)
  if v == nil then return "" end
  if type(v) == "number" then return v == math.floor(v) and ("%d"):format(v) or ("%.10g"):format(v) end
  local s = tostring(v)
  if s:find('[,"\r\n]') then return '"' .. s:gsub('"', '""') .. '"' end
  return s
end

local json_escapes = { ['"'] = '\\"', ["\\"] = "\\\\", ["\n"] = "\\n", ["\r"] = "\\r", ["\t"] = "\\t" }
local function json_value(v)
  if v == nil or v ~= v then return "null" end
  if type(v) == "number" then
    if v == math.huge or v == -math.huge then return "null" end
    return v == math.floor(v) and ("%d"):format(v) or ("%.10g"):format(v)
  end
  return '"' .. tostring(v):gsub('[%c"\\]', function(ch)
    return json_escapes[ch] or ("\\u%04x"):format(ch:byte())
  end) .. '"'
end

-- The table as CSV or JSON Lines (see the design note).
local function machine(self)
  local out = {}
  if output == "csv" then
    local titles = {}
    for _, c in ipairs(self.context) do titles[#titles + 1] = csv_cell(c[1]) end
    for _, col in ipairs(self.cols) do titles[#titles + 1] = csv_cell(col.title) end
    local header = table.concat(titles, ",")
    if header ~= last_header then
      out[#out + 1] = header
      last_header = header
    end
    for _, r in ipairs(self.raw) do
      local cells = {}
      for _, c in ipairs(self.context) do cells[#cells + 1] = csv_cell(c[2]) end
      for i = 1, r.n do cells[#cells + 1] = csv_cell(r[i]) end
      out[#out + 1] = table.concat(cells, ",")
    end
  else
    for _, r in ipairs(self.raw) do
      local cells = {}
      for _, c in ipairs(self.context) do cells[#cells + 1] = json_value(c[1]) .. ":" .. json_value(c[2]) end
      for i, col in ipairs(self.cols) do cells[#cells + 1] = json_value(col.title) .. ":" .. json_value(r[i]) end
      out[#out + 1] = "{" .. table.concat(cells, ",") .. "}"
    end
  end
  return #out > 0 and table.concat(out, "\n") .. "\n" or ""
end

local function line(cols, cells, widths, sep)
  local parts, n = {}, #cols
  for i = 1, n do
    local s, w = cells[i], widths[i]
    if cols[i].align == "right" then
      s = (" "):rep(w - #s) .. s
    elseif i < n then
      s = s .. (" "):rep(w - #s)
    end
    parts[i] = s
  end
  return table.concat(parts, sep)
end

--- The table as text: the header line, then one line per row, each ending in a newline (or as
--- CSV or JSON Lines, after set_output).
function Table:format()
  if output ~= "text" then return machine(self) end
  local cols, widths, titles = self.cols, {}, {}
  for i, col in ipairs(cols) do
    titles[i] = cut(col.title, col.max)
    local w = math.max(col.width, #titles[i])
    for _, row in ipairs(self.rows) do
      if #row[i] > w then w = #row[i] end
    end
    widths[i] = w
  end
  local out = { line(cols, titles, widths, self.sep) }
  for _, row in ipairs(self.rows) do out[#out + 1] = line(cols, row, widths, self.sep) end
  return table.concat(out, "\n") .. "\n"
end

Table.__tostring = Table.format

--- Writes the table to `out` (io.stdout by default).
function Table:print(out)
  (out or io.stdout):write(self:format())
  return self
end

return M
