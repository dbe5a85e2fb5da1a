-- Specs checking lua/cuptimon/cdef.lua against the C headers: struct members by parsing the
-- header text, sizes and offsets through cm_testing_layout (the C compiler's own layout, from the
-- test-only libcuptimon_testing.so), function prototypes, and the enum values. The test-only
-- declarations (spec/testing.lua) are checked against their own header the same way.
-- luacheck: std +busted
local ffi = require "ffi"
local cdef = require "cuptimon.cdef"
local helpers = require "helpers"
local testing = require "testing"
local C = ffi.C
local T = testing.lib()

local function read(path)
  local f = assert(io.open(path, "rb"))
  local s = f:read("*a")
  f:close()
  return s
end

-- Comments out, macro lines out, CM_EXTERN (the export marker, which the FFI does not need) out.
local function clean(text)
  text = text:gsub("/%*.-%*/", " "):gsub("//[^\n]*", " ")
  text = text:gsub("\n#[^\n]*", "\n")
  text = text:gsub("\nCM_EXTERN ", "\n")
  return text
end

local function norm(s)
  return (s:gsub("%s+", " "):gsub(" ?([%*%(%),;%[%]]) ?", "%1"):gsub("^ ", ""):gsub(" $", ""))
end

-- The member declarations of `typedef struct name { ... } name;` in text, normalized, in order.
local function members(text, name)
  local body = text:match("typedef struct " .. name .. "%s*(%b{})%s*" .. name .. "%s*;")
  if not body then return nil end
  body = body:sub(2, -2):gsub("CM_KIND_MAX", "64")
  local out = {}
  for decl in body:gmatch("([^;]+);") do
    if decl:match("%S") then out[#out + 1] = norm(decl) end
  end
  return out
end

local header = clean(read(helpers.root() .. "/engine/include/cuptimon.h"))
local host_header = clean(read(helpers.root() .. "/engine/include/cuptimon_host.h"))
local source = clean(cdef.source)

describe("cuptimon.cdef", function()
  for _, name in ipairs(cdef.structs) do
    it("declares struct " .. name .. " with the header's members", function()
      local want = members(header, name)
      assert.is_table(want, "struct " .. name .. " not found in cuptimon.h")
      assert.are.same(want, members(source, name))
    end)

    it("lays out struct " .. name .. " as the C compiler does", function()
      assert.are.equal(tonumber(T.cm_testing_layout(name)), ffi.sizeof(name))
    end)
  end

  it("matches the compiler's offsets of the fields Lua reads", function()
    local checked = 0
    for _, name in ipairs(cdef.structs) do
      for field in read(helpers.root() .. "/engine/host/host_testing.c")
          :gmatch('L_%("' .. name .. '%.([%w_]+)"') do
        assert.are.equal(tonumber(T.cm_testing_layout(name .. "." .. field)),
          ffi.offsetof(name, field), name .. "." .. field)
        checked = checked + 1
      end
    end
    assert.is_true(checked >= 15, "too few offsets checked: " .. checked)
    assert.are.equal(-1, tonumber(T.cm_testing_layout("no_such_struct")))
  end)

  it("declares every function exactly as the headers do", function()
    local n = 0
    for proto in source:gmatch("\n([%w_ %*]-cm_[%w_]+%b());") do
      local fname = proto:match("(cm_[%w_]+)%(")
      local text = fname:match("^cm_host_") and host_header or header
      local found
      for cand in text:gmatch("\n([%w_ %*]-" .. fname .. "%b());") do
        found = norm(cand)
      end
      assert.are.equal(found, norm(proto), fname)
      n = n + 1
    end
    assert.are.equal(29, n, "prototypes found")
  end)

  it("declares the test-only hooks exactly as their header does", function()
    local text = clean(read(helpers.root() .. "/" .. testing.header))
    local n = 0
    for proto in clean("\n" .. testing.source):gmatch("\n([%w_ %*]-cm_[%w_]+%b());") do
      local fname = proto:match("(cm_[%w_]+)%(")
      local found
      for cand in text:gmatch("\n([%w_ %*]-" .. fname .. "%b());") do found = norm(cand) end
      assert.are.equal(found, norm(proto), fname)
      n = n + 1
    end
    assert.are.equal(1, n, "prototypes found")
  end)

  it("keeps the test-only hooks out of the public headers and the production cdef", function()
    for _, h in ipairs({ "cuptimon.h", "cuptimon_host.h", "cuptimon_wire.h" }) do
      local text = read(helpers.root() .. "/engine/include/" .. h)
      assert.is_nil(text:find("layout%("), h)
    end
    assert.is_nil(cdef.source:find("layout"), "lua/cuptimon/cdef.lua")
    assert.is_false(pcall(function() return C.cm_testing_layout end), "the binary exports a test hook")
  end)

  it("does not declare the calls that deliver batches", function()
    for _, fname in ipairs({ "cm_observe", "cm_unobserve", "cm_flush", "cm_engine_new",
      "cm_engine_free" }) do
      assert.is_nil(source:find(fname .. "%("), fname .. " must not be callable through the FFI")
    end
  end)

  it("has the header's error and type values", function()
    local enum = header:match("CM_ERRNO_MAP%(XX%)(.-)typedef enum cm_errno")
      or read(helpers.root() .. "/engine/include/cuptimon.h"):match("#define CM_ERRNO_MAP(.-)typedef")
    local n = 0
    for name, value in enum:gmatch("XX%((E[%u]+), (%-%d+),") do
      assert.are.equal(tonumber(value), tonumber(C["CM_" .. name]), name)
      assert.are.equal(name, ffi.string(C.cm_err_name(tonumber(value))))
      n = n + 1
    end
    assert.are.equal(16, n)
    for name, value in header:gmatch("(CM_TYPE_%u%d*) = (%d+)") do
      assert.are.equal(tonumber(value), tonumber(C[name]), name)
    end
  end)
end)
