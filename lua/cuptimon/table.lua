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
local M = {}

local Table = {}
Table.__index = Table

local function cut(s, max)
  if max and #s > max then return s:sub(1, max - 3) .. "..." end
  return s
end

--- A table with the columns `cols` and options `opts` ({ sep = " " }).
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
  return setmetatable({ cols = c, rows = {}, sep = opts and opts.sep or " " }, Table)
end

--- Adds a row: one value per column, formatted with the column's format.
function Table:add(...)
  local row = {}
  for i, col in ipairs(self.cols) do
    local v = select(i, ...)
    row[i] = cut(v == nil and "-" or col.format:format(v), col.max)
  end
  self.rows[#self.rows + 1] = row
  return self
end

--- The number of rows added.
function Table:count() return #self.rows end

--- Forgets the rows (the columns keep their widths only through the rows printed later).
function Table:clear() self.rows = {} end

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

--- The table as text: the header line, then one line per row, each ending in a newline.
function Table:format()
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
