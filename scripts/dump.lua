-- dump.lua: chosen kinds and fields to CSV or JSON Lines, one file per kind, for pandas, DuckDB
-- or Polars.
--
-- Usage: cuptimon-lua scripts/dump.lua [--kinds LIST] [--fields LIST] [--select SPEC]
--          [--format csv|jsonl] [-o PATH] -- cmd args...
--        cuptimon-lua --replay run.cmcap scripts/dump.lua --fields name,start,stop,device,stream -o out/
--
-- Arguments:
--   --kinds LIST     comma-separated kinds to write (default kernel,memcpy,memset,runtime)
--   --fields LIST    comma-separated fields to write of each kind that has them, in that order
--                    (default: all, in the kind's field order); a field no chosen kind has is a
--                    usage error
--   --select SPEC    kinds and fields in cm_selection syntax, "kernel:name,start;memcpy:all";
--                    replaces --kinds and --fields
--   --format FMT     csv (default) or jsonl
--   --raw            write enum values and runtime cbids as numbers, not names
--   --filter REGEX   write only the kernel rows whose name (demangled, as the `name` column
--                    shows it) matches REGEX, a POSIX extended regular expression
--                    ("^cm_demo_(matmul|relu)"); the rows of other kinds are not kernels and
--                    are all written
--   --exclude REGEX  leave out the kernel rows whose name matches REGEX
--   --output PATH    (or -o PATH) where to write: PATH/KIND.EXT when PATH is a directory or ends in "/" (it is
--                    created), else the prefix PATHKIND.EXT (default "./": kernel.csv, ...);
--                    files are created, never written through a symlink: one that exists is
--                    refused
--   --force          replace output files that exist and are regular files
--
-- Enum fields (copy_kind, src_kind, ...; docs/lua-api.md lists them) and runtime cbids are written
-- as names ("HtoD", "cudaLaunchKernel"), or with --raw as their numbers. In JSON Lines a 64-bit
-- integer above 2^53, every timestamp among them, is a string of its exact digits, since most
-- JSON readers hold numbers as doubles.
--
-- Each row starts with process_pid (the process that made the record: several processes share a
-- file), then the chosen fields in the order asked. Strings (kernel names, marker names) are
-- resolved; a kernel's `name` is demangled as the tables show it (cm_demo_matmul<16>), and the
-- compiler's mangled name is the field mangled_name (after `name` among all fields); timestamps are integer nanoseconds on the trace clock, CLOCK_REALTIME, which the
-- file names first: a CSV opens with the comment line "# clock: CLOCK_REALTIME ns" (pandas:
-- read_csv(path, comment="#")), a JSONL file with a metadata object. Rows are written per batch,
-- so memory stays bounded whatever the length of the run. At exit the script prints the rows
-- written per file. A write that fails (a full disk, a file-size limit) is reported at once with
-- the path and the system's reason, the rows that did not reach the file are counted and printed
-- as "dump.lua: LOST N rows not written: ..." after the table, and the run exits 1.
--
-- Example output:
--   (out/kernel.csv)
--   # clock: CLOCK_REALTIME ns
--   process_pid,name,start,stop,device,stream
--   601,cm_demo_matmul<16>,1796230814380253094,1796230814380280806,0,14
--   601,cm_demo_bias_relu,1796230814380288262,1796230814380289734,0,14
--   (and on stdout:)
--   kind                     rows file
--   concurrent_kernel         300 out/kernel.csv
--   memcpy                     66 out/memcpy.csv
--   memset                     61 out/memset.csv
--   runtime                   629 out/runtime.csv
local cm = require "cuptimon"
local args = require "cuptimon.args"
local cbid = require "cuptimon.cbid"
local enums = require "cuptimon.enums"
local tabulate = require "cuptimon.table"
local ffi = require "ffi"

local opts = args.parse(arg, args.with_filter({
  kinds = { "kernel,memcpy,memset,runtime", "comma-separated kinds to write" },
  fields = { "", "comma-separated fields to write (default: all)" },
  select = { "", "kinds and fields in cm_selection syntax (replaces --kinds and --fields)" },
  format = { "csv", "csv or jsonl" },
  output = { "./", "output directory (ending in /) or file prefix", short = "o" },
  force = { false, "replace output files that exist (regular files only)" },
  raw = { false, "write enum values and runtime cbids as numbers" },
}, "kernel rows"))
if opts.format ~= "csv" and opts.format ~= "jsonl" then
  args.usage_error(("dump.lua: --format must be csv or jsonl, got %q"):format(opts.format))
end

local kernel_filter = args.filter(opts, "dump.lua")

local function kind_or_fail(name)
  local k = cm.registry.kind(name)
  if not k then
    args.usage_error(("dump.lua: unknown kind %q; valid kinds: %s")
      :format(name, table.concat(cm.registry.kind_names(), ", ")))
  end
  return k
end

-- The kinds whose `name` is a kernel's, which the compiler mangles: `name` is written demangled,
-- as the tables show it (cm_demo_matmul<16>), and the compiler's name is the column mangled_name.
local KERNEL_KINDS = { concurrent_kernel = true, kernel_serial = true }
local MANGLED = "mangled_name"

local function has_field(k, f) return k.by_name[f] ~= nil or (f == MANGLED and KERNEL_KINDS[k.name]) end

-- Every field of kind k in field order, mangled_name right after name.
local function all_fields(k)
  local out = {}
  for _, f in ipairs(cm.registry.field_names(k)) do
    out[#out + 1] = f
    if f == "name" and KERNEL_KINDS[k.name] then out[#out + 1] = MANGLED end
  end
  return out
end

-- The fields of `names` that kind k has, in the order asked, each once ("all" or nil: every one).
local function field_list(k, names)
  if names == nil or names == "all" then return all_fields(k) end
  local out, seen = {}, {}
  for _, f in ipairs(names) do
    if has_field(k, f) and not seen[f] then
      out[#out + 1] = f
      seen[f] = true
    end
  end
  return out
end

-- kind name (as written) -> the kind record and its field names in field order.
local chosen, order = {}, {}
local function choose(name, names)
  local k = kind_or_fail(name)
  if chosen[k.name] then return end
  local fields = field_list(k, names)
  if names ~= nil and names ~= "all" then
    for _, f in ipairs(names) do
      if not has_field(k, f) then
        args.usage_error(("dump.lua: kind %q has no field %q; valid fields: %s")
          :format(name, f, table.concat(all_fields(k), ", ")))
      end
    end
  end
  chosen[k.name] = { kind = k, label = name, fields = fields }
  order[#order + 1] = k.name
end

if opts.select ~= "" then
  for part in opts.select:gmatch("[^;]+") do
    local kname, list = part:match("^%s*([%w_]+)%s*:%s*(.-)%s*$")
    if not kname then kname, list = part:match("^%s*([%w_]+)%s*$"), "all" end
    if not kname then
      args.usage_error(("dump.lua: --select: cannot read %q; expected KIND:FIELD,FIELD;KIND:all")
        :format(part))
    end
    choose(kname, list == "all" and "all" or args.list(list))
  end
else
  local fields = opts.fields ~= "" and args.list(opts.fields) or nil
  local kinds = args.list(opts.kinds)
  if fields then
    for _, f in ipairs(fields) do
      local found = false
      for _, name in ipairs(kinds) do found = found or has_field(kind_or_fail(name), f) end
      if not found then
        args.usage_error(("dump.lua: no chosen kind has the field %q"):format(f))
      end
    end
  end
  for _, name in ipairs(kinds) do
    local k = kind_or_fail(name)
    choose(name, fields and field_list(k, fields) or nil)
  end
end

local ext = opts.format == "csv" and ".csv" or ".jsonl"
local prefix = opts.output
do
  local uv = require "luv"
  local st = uv.fs_stat(prefix)
  if st and st.type == "directory" then
    if prefix:sub(-1) ~= "/" then prefix = prefix .. "/" end
  elseif prefix:sub(-1) == "/" then
    local path = prefix:sub(1, 1) == "/" and "" or "."
    for part in prefix:gmatch("[^/]+") do -- mkdir -p, mode 0755
      path = path .. "/" .. part
      local ok, err = uv.fs_mkdir(path, 493)
      if not ok and (uv.fs_stat(path) or {}).type ~= "directory" then
        args.usage_error(("dump.lua: cannot create %s: %s"):format(path, err))
      end
    end
  end
end

local function csv_cell(s)
  if s:find('[,"\r\n]') then return '"' .. s:gsub('"', '""') .. '"' end
  return s
end

local json_escapes = { ['"'] = '\\"', ["\\"] = "\\\\", ["\n"] = "\\n", ["\r"] = "\\r", ["\t"] = "\\t" }
local function json_string(s)
  return '"' .. s:gsub('[%c"\\]', function(c)
    return json_escapes[c] or ("\\u%04x"):format(c:byte())
  end) .. '"'
end

-- An integer of any width as exact decimal text (a 64-bit value is a cdata: tostring gives
-- "123ULL").
local function int_text(v)
  if type(v) == "number" then return ("%d"):format(v) end
  return (tostring(v):gsub("U?LL$", ""))
end

-- JSON numbers are doubles to most readers (jq, pandas, Python's json): a 64-bit integer above
-- 2^53 (every CLOCK_REALTIME timestamp) goes as a string of its exact decimal digits.
local EXACT = ffi.new("uint64_t", 2 ^ 53)

-- kind name -> { file =, path =, rows =, unwritten =, err = }: rows counts the rows that
-- reached the file (each batch is flushed after its rows), unwritten those that did not, and err
-- is the first failure (the file could not be created, or a write failed), reported once.
local outs = {}
local left_out = 0 -- kernel rows --filter/--exclude left out

local function open(c)
  local path = prefix .. c.label .. ext
  local o = { path = path, rows = 0, unwritten = 0 }
  local f, err = require("cuptimon.output").open(path, opts.force, false, "dump.lua")
  if not f then
    o.err = ("cannot write %s: %s"):format(path, err)
    cm.report("dump.lua", o.err)
    return o
  end
  o.file = f
  if opts.format == "csv" then
    f:write("# clock: CLOCK_REALTIME ns\n", "process_pid,", table.concat(c.fields, ","), "\n")
  else
    local names = {}
    for i, n in ipairs(c.fields) do names[i] = json_string(n) end
    f:write(('{"clock":"CLOCK_REALTIME","unit":"ns","kind":%s,"fields":["process_pid",%s]}\n')
      :format(json_string(c.kind.name), table.concat(names, ",")))
  end
  return o
end

-- Writes a batch's lines and flushes them: they count as written only once they reached the file.
local function put(o, lines)
  if o.file and o.file:write(table.concat(lines)) and o.file:flush() then
    o.rows = o.rows + #lines
  else
    o.err = o.err or o.file:failure()
    o.unwritten = o.unwritten + #lines
  end
end

-- What each kind observes: its fields, with `name` standing in for mangled_name (and a kernel
-- kind's `name` for --filter even when it is not written).
local sel = {}
for name, c in pairs(chosen) do
  local list, seen = {}, {}
  local fields = c.fields
  if kernel_filter.active and KERNEL_KINDS[c.kind.name] then
    fields = { "name", unpack(c.fields) }
  end
  for _, f in ipairs(fields) do
    local real = f == MANGLED and "name" or f
    if not seen[real] then
      list[#list + 1] = real
      seen[real] = true
    end
  end
  sel[name] = list
end

cm.observe(sel, function(b)
  local c = chosen[b.kind]
  local o = outs[b.kind]
  if not o then
    o = open(c)
    outs[b.kind] = o
  end
  local p = b:process()
  local pid = tostring(p and p.pid or 0)
  local fields, kind = c.fields, c.kind
  -- How each column is read: "kernel" (the demangled kernel name), "str" (a string: the mangled
  -- name is the string of `name`), or a number column, written as the name of its value when it
  -- is an enum or a runtime cbid (names[j]: value -> name), unless --raw.
  local cols, strs, keys, names, wide = {}, {}, {}, {}, {}
  for j, f in ipairs(fields) do
    if f == MANGLED then
      strs[j] = "name"
    elseif f == "name" and KERNEL_KINDS[kind.name] then
      strs[j] = "kernel"
    elseif kind.by_name[f].is_string then
      strs[j] = f
    else
      cols[j] = b.cols[f]
      local fi = kind.by_name[f]
      wide[j] = fi.width == 8
      if not opts.raw then
        local e = enums.of(fi.doc)
        if e then names[j] = enums.values[e]
        elseif f == "cbid" and kind.name == "runtime" then names[j] = cbid.runtime end
      end
    end
    keys[j] = json_string(f) .. ":"
  end
  local csv = opts.format == "csv"
  local lines, cells = {}, {}
  local filtered = kernel_filter.active and KERNEL_KINDS[kind.name]
  for i = 0, b.n - 1 do
    if filtered and not kernel_filter:keep(b:kernel_name(i)) then
      left_out = left_out + 1
      goto next_row
    end
    cells[1] = csv and pid or '{"process_pid":' .. pid
    for j = 1, #fields do
      local v
      if strs[j] then
        local s = (strs[j] == "kernel" and b:kernel_name(i) or b:str(strs[j], i)) or ""
        v = csv and csv_cell(s) or json_string(s)
      else
        local x = cols[j][i]
        local name = names[j] and names[j][tonumber(x)]
        if name then
          v = csv and csv_cell(name) or json_string(name)
        else
          v = int_text(x)
          if not csv and wide[j] and x > EXACT then v = '"' .. v .. '"' end
        end
      end
      cells[j + 1] = csv and v or keys[j] .. v
    end
    lines[#lines + 1] = table.concat(cells, ",", 1, #fields + 1) .. (csv and "\n" or "}\n")
    ::next_row::
  end
  put(o, lines)
end)

cm.on("exit", function()
  if cm.command_failed() then return end -- the one-line error says it all; no empty files
  local t = tabulate.new { { "kind", width = 20 }, { "rows", "%d", width = 8 },
    { "file", align = "left" } }
  local failed = {}
  for _, name in ipairs(order) do
    -- A kind with no records gets an empty file with its header.
    local o = outs[name] or open(chosen[name])
    if o.file and not o.file:close() then
      -- The close flushes the header of a kind with no rows: the file is incomplete anyway.
      o.err = o.err or o.file:failure()
    end
    t:add(name, o.rows, o.path)
    if o.err then failed[#failed + 1] = o end
  end
  t:print()
  if left_out > 0 then
    tabulate.note(("%d kernel rows left out by --filter/--exclude"):format(left_out))
  end
  -- The rows that did not reach their file, per file, after the table (which counts only the
  -- rows written); the failure itself was reported when it happened, and fails the run.
  for _, o in ipairs(failed) do
    io.stderr:write(("dump.lua: LOST %d rows not written: %s; the file is incomplete\n")
      :format(o.unwritten, o.err))
  end
end)
