#!/bin/sh
# Checks the include graph of the engine's tiers (docs/architecture.md): arrows point one way,
# monitor -> host -> wire -> core and agent -> wire -> core; the host and the monitor reach the
# core and the wire through the public headers only, the monitor reaches the host through
# cuptimon_host.h and the host's one interface for sources, host_source.h (never the host's private
# host_internal.h or apicb.h), and the agent reaches the core's internals through cm_agent.h only.
# Each tier may include the headers listed for it below, plus the C library's; anything else is
# reported with its file and line, and the check fails.
#
# Usage: check_tiers.sh [SOURCE_ROOT]
root=${1:-$(dirname "$0")/../..}
cd "$root/engine" || exit 2

# tier | headers of other tiers it may include with "..." (its own folder's headers are always
# allowed) | headers it must not include
rules='
core|cuptimon.h|uv.h lua.h lauxlib.h lualib.h luajit.h luv/luv.h cuptimon_wire.h cuptimon_host.h
wire|cuptimon.h cuptimon_wire.h|uv.h lua.h lauxlib.h lualib.h luajit.h luv/luv.h cuptimon_host.h cm_internal.h cm_agent.h cm_cupti.h
agent|cuptimon.h cuptimon_wire.h cm_agent.h|uv.h lua.h lauxlib.h lualib.h luajit.h luv/luv.h cuptimon_host.h cm_internal.h engine.h
host|cuptimon.h cuptimon_wire.h cuptimon_host.h|cm_internal.h cm_agent.h cm_cupti.h engine.h
monitor|cuptimon.h cuptimon_wire.h cuptimon_host.h host_source.h|cm_internal.h cm_agent.h cm_cupti.h engine.h host_internal.h apicb.h
'
echo "$rules" | while IFS='|' read -r tier allowed banned; do
  [ -n "$tier" ] || continue
  for f in "$tier"/*.c "$tier"/*.h; do
    [ -f "$f" ] || continue
    grep -n '^[[:space:]]*#[[:space:]]*include' "$f" | while IFS= read -r line; do
      inc=$(printf '%s\n' "$line" | sed -n 's/.*#[[:space:]]*include[[:space:]]*[<"]\([^">]*\)[">].*/\1/p')
      quoted=$(printf '%s\n' "$line" | grep -c '#[[:space:]]*include[[:space:]]*"')
      for b in $banned; do
        if [ "$inc" = "$b" ]; then
          echo "tier violation: $f:${line%%:*} includes <$inc>, which the $tier tier must not use"
          echo x >>"${TMPDIR:-/tmp}/cm_tiers.$$"
        fi
      done
      if [ "$quoted" = 1 ]; then
        ok=0
        [ -f "$tier/$inc" ] && ok=1
        for a in $allowed; do
          [ "$inc" = "$a" ] && ok=1
        done
        if [ $ok = 0 ]; then
          echo "tier violation: $f:${line%%:*} includes \"$inc\"; the $tier tier may include only its own headers and: $allowed"
          echo x >>"${TMPDIR:-/tmp}/cm_tiers.$$"
        fi
      fi
    done
  done
done
if [ -s "${TMPDIR:-/tmp}/cm_tiers.$$" ]; then
  n=$(wc -l <"${TMPDIR:-/tmp}/cm_tiers.$$")
  rm -f "${TMPDIR:-/tmp}/cm_tiers.$$"
  echo "check_tiers: $n violation(s)"
  exit 1
fi
rm -f "${TMPDIR:-/tmp}/cm_tiers.$$"
for t in core wire agent host monitor; do
  [ -n "$(ls "$t"/*.c 2>/dev/null)" ] || { echo "check_tiers: no sources in engine/$t"; exit 1; }
done
echo "check_tiers: core, wire, agent, host and monitor include only what their tier allows"
exit 0
