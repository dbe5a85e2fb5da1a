#!/usr/bin/env bash
# install_test.sh BUILD_DIR [FAKE_CUPTI FAKE_APP]: checks that `cmake --install` gives a complete,
# relocatable tree. It installs BUILD_DIR to a temporary prefix and then moves the tree, so that
# nothing can refer to where it was installed. From the moved tree alone (pkg-config with
# PKG_CONFIG_PATH=<tree>/lib/pkgconfig, plain cc command lines) it builds examples/embed_c and
# examples/embed_script and runs them on the fake CUPTI; it runs the installed cuptimon-lua on the
# bundled capture with an installed recipe, and on the fake CUDA application with the installed
# agent (found relative to the binary). Every step's exit status is checked; the first failure
# ends the test with status 1. Registered as the ctest test `install` (label "install").
set -euo pipefail
src=$(cd "$(dirname "$0")/.." && pwd)
build=$(cd "${1:?usage: install_test.sh BUILD_DIR [FAKE_CUPTI FAKE_APP]}" && pwd)
fake=${2:-$build/engine/tests/libfake_cupti.so}
app=${3:-$build/engine/agent/fake_cuda_app}

fail() { echo "install_test: FAIL: $*" >&2; exit 1; }
command -v pkg-config >/dev/null || fail "pkg-config is not installed"
[ -f "$fake" ] || fail "the fake CUPTI $fake is not built"

tmp=$(mktemp -d "${TMPDIR:-/tmp}/cuptimon-install.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
cmake --install "$build" --prefix "$tmp/staging" >"$tmp/install.log" 2>&1 ||
  { cat "$tmp/install.log"; fail "cmake --install"; }
mv "$tmp/staging" "$tmp/moved"
P=$tmp/moved
echo "install_test: installed, then moved to $P"

# The tree: the binary, the agent, both libraries, the headers, the Lua modules, the recipes and
# the pkg-config files.
pc=$(find "$P" -name cuptimon.pc -path '*/pkgconfig/*' | head -n 1)
[ -n "$pc" ] || fail "no cuptimon.pc in the install"
libdir=$(dirname "$(dirname "$pc")")
for f in bin/cuptimon-lua include/cuptimon.h include/cuptimon_wire.h include/cuptimon_host.h \
    share/lua/5.1/cuptimon/init.lua share/cuptimon/scripts/top.lua \
    share/cuptimon/scripts/count.lua share/cuptimon/demo.cmcap; do
  [ -f "$P/$f" ] || fail "$f is not installed"
done
for f in libcuptimon-agent.so libcuptimon.so libcuptimon.a libcuptimon_host.a \
    pkgconfig/cuptimon.pc pkgconfig/cuptimon-host.pc; do
  [ -e "$libdir/$f" ] || fail "${libdir#$P/}/$f is not installed"
done
# grep reads whole files here, never a pipe: with pipefail, `cmd | grep -q` fails at random when
# grep exits early and cmd dies of SIGPIPE.
find "$P" -name '*testing*' >"$tmp/testing.txt"
if [ -s "$tmp/testing.txt" ]; then fail "a test-only file is installed: $(cat "$tmp/testing.txt")"; fi

export PKG_CONFIG_PATH=$libdir/pkgconfig
for m in cuptimon cuptimon-host; do
  pkg-config --exists "$m" || fail "pkg-config cannot read $m.pc"
  case "$(pkg-config --variable=prefix "$m")" in
    "$libdir"/pkgconfig/*) ;;
    *) fail "$m.pc: the prefix does not follow the install: $(pkg-config --variable=prefix "$m")" ;;
  esac
done
case "$(pkg-config --cflags cuptimon cuptimon-host)" in
  *"$src"* | *"$build"*) fail "the pkg-config flags point into the source or build tree" ;;
esac

# The embedding examples, built from the installed tree alone.
cd "$tmp"
# shellcheck disable=SC2046
cc -std=gnu11 -O2 -o embed_c "$src/examples/embed_c/embed_c.c" \
  $(pkg-config --cflags --libs cuptimon) -ldl -Wl,-rpath,"$libdir" || fail "building embed_c"
# shellcheck disable=SC2046
cc -std=gnu11 -O2 -o embed_script "$src/examples/embed_script/embed_script.c" \
  $(pkg-config --cflags --libs cuptimon-host) || fail "building embed_script"
ldd ./embed_c >"$tmp/ldd.txt" || fail "ldd embed_c"
grep -q "libcuptimon.so.0 => $libdir/" "$tmp/ldd.txt" ||
  { cat "$tmp/ldd.txt"; fail "embed_c does not load the installed libcuptimon.so"; }

export CUPTIMON_LIBCUPTI=$fake CUPTIMON_LIBCUDA=$fake
unset CUPTIMON_LUA_PATH CUPTIMON_AGENT

# run NAME PATTERN CMD...: runs CMD, which must exit 0 and print a line matching PATTERN.
run() {
  local name=$1 pattern=$2 rc=0
  shift 2
  "$@" >"$tmp/$name.out" 2>&1 || rc=$?
  if [ "$rc" != 0 ] || ! grep -q -E "$pattern" "$tmp/$name.out"; then
    cat "$tmp/$name.out"
    fail "$name: exit status $rc, expected 0 and output matching /$pattern/"
  fi
  echo "install_test: $name: ok"
}

run embed_c "written 20000, observed 20000 kernels" ./embed_c 20000
run embed_script "script: observed 5000 kernel records" \
  ./embed_script "$src/examples/embed_script/script.lua"
grep -q "wrote 5000 kernel records" "$tmp/embed_script.out" || fail "embed_script: program output"

run replay "cm_demo_matmul" "$P/bin/cuptimon-lua" --replay "$src/examples/demo.cmcap" \
  "$P/share/cuptimon/scripts/top.lua"
# A recipe by its name, on the installed demo capture.
run recipe_by_name "cm_demo_matmul" "$P/bin/cuptimon-lua" --replay "$P/share/cuptimon/demo.cmcap" top
run recipe_by_name_lua "concurrent_kernel +300" "$P/bin/cuptimon-lua" \
  --replay "$P/share/cuptimon/demo.cmcap" count.lua

# The installed binary injects the installed agent (CUPTIMON_AGENT is unset): every kernel the
# fake application writes reaches the script.
if [ -x "$app" ]; then
  cat >"$tmp/kernels.lua" <<'LUA'
local cm = require "cuptimon"
local n = 0
cm.observe({ kernel = { "start" } }, function(b) n = n + b.n end)
cm.on("exit", function() print(("installed agent: %d kernels"):format(n)) end)
LUA
  run agent "installed agent: 2000 kernels" "$P/bin/cuptimon-lua" "$tmp/kernels.lua" -- \
    "$app" --records 2000 --kinds kernel
  grep -q "concurrent_kernel=2000" "$tmp/agent.out" || fail "agent: the application's own count"
else
  fail "the fake CUDA application $app is not built"
fi
echo "install_test: passed"
