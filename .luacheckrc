-- luacheck's configuration for the source tree (run from the root):
--   luacheck lua scripts spec examples bench
-- The specs run under busted, whose globals (describe, it, assert...) are allowed there only.
std = "luajit"
max_line_length = false
files["spec"] = { std = "+busted" }
