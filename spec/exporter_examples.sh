#!/bin/sh
# spec/exporter_examples.sh SOURCE_DIR [LUA_BIN]: the node exporter's shipped files are valid.
#   examples/systemd: the unit passes `systemd-analyze verify` (where systemd is there to ask),
#     runs the documented command, and serves on all addresses only with --web-config; the jobs'
#     environment sets what a dormant agent needs; the web configuration is refused as shipped
#     (its password placeholder, named) and loads once given a hash and a certificate (LUA_BIN);
#     the local scrape configuration passes `promtool check config`.
#   examples/prometheus: the cluster's scrape configuration passes `promtool check config` (with
#     its rule file), the alerting rules pass their unit tests (`promtool test rules`), the
#     dashboard is JSON, and every cuptimon_ metric the rules and the dashboard name is one the
#     exporter writes.
# Exit 77 (skipped) without promtool, unless CI=true.
set -u
src=$1
lua=${2:-}
d=$src/examples/systemd
p=$src/examples/prometheus
fail() { echo "FAIL: $*" >&2; exit 1; }
grep -q -- '--attach all "$CUPTIMON_PREFIX/share/cuptimon/scripts/prometheus.lua" --duty 0.05' \
  "$d/cuptimon-exporter.service" || fail "the unit does not run --attach all prometheus.lua --duty 0.05"
grep -q -- '--listen 0.0.0.0:9464 --web-config "%E/cuptimon/web-config.yml"' "$d/cuptimon-exporter.service" ||
  fail "the unit does not serve all addresses with --web-config"
grep -q '^ExecReload=/bin/kill -HUP $MAINPID$' "$d/cuptimon-exporter.service" || fail "the unit has no ExecReload"
grep -q '^MemoryDenyWriteExecute' "$d/cuptimon-exporter.service" &&
  fail "MemoryDenyWriteExecute stops LuaJIT's compiler"
grep -q '^PrivateTmp=no$' "$d/cuptimon-exporter.service" || fail "the unit must keep /tmp (agents listen there)"
grep -qx 'CUPTIMON_LISTEN=1' "$d/cuptimon-job.env" || fail "cuptimon-job.env lacks CUPTIMON_LISTEN=1"
grep -q '^CUDA_INJECTION64_PATH=/.*libcuptimon-agent.so$' "$d/cuptimon-job.env" ||
  fail "cuptimon-job.env lacks an absolute CUDA_INJECTION64_PATH"
if command -v systemd-analyze >/dev/null 2>&1; then
  systemd-analyze verify "$d/cuptimon-exporter.service" || fail "systemd-analyze verify"
  echo "ok: systemd-analyze verify"
fi
if [ -n "$lua" ]; then
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  load='local c, e = require("cuptimon.webconfig").load(os.getenv("WEB_CONFIG")); if not c then print(e) os.exit(1) end
    print((c.tls and "tls" or "plain") .. " " .. (c.users and "users" or "nobody"))'
  cp "$d/web-config.yml" "$tmp/web-config.yml"
  cp "$src/spec/fixtures/tls/server.pem" "$tmp/exporter.pem"
  cp "$src/spec/fixtures/tls/server.key" "$tmp/exporter.key"
  out=$(WEB_CONFIG="$tmp/web-config.yml" "$lua" -e "$load" 2>&1) && fail "the shipped web-config.yml loads with its placeholder: $out"
  echo "$out" | grep -q "basic_auth_users.prometheus: a bcrypt hash" || fail "the placeholder is not named: $out"
  hash=$("$lua" -e "print(require'cuptimon.passwd'.hash('x', 4))") || fail "no hash"
  sed "s|REPLACE-WITH-A-BCRYPT-HASH|$hash|" "$d/web-config.yml" >"$tmp/web-config.yml"
  out=$(WEB_CONFIG="$tmp/web-config.yml" "$lua" -e "$load" 2>&1) || fail "web-config.yml with a hash: $out"
  [ "$out" = "tls users" ] || fail "web-config.yml read as: $out"
  echo "ok: web-config.yml (refused as shipped, read with a hash and a certificate)"
fi
python3 -c 'import json, sys; d = json.load(open(sys.argv[1])); assert d["panels"], "no panels"' \
  "$p/dashboard.json" || fail "dashboard.json is not a dashboard"
# The metric names the rules and the dashboard use, against the names the exporter writes (a
# histogram's _sum, _count and _bucket come from its family's name).
names=$(grep -oh 'cuptimon_[a-z_]*' "$p/rules.yml" "$p/dashboard.json" | sort -u)
for n in $names; do
  base=$(echo "$n" | sed 's/_\(sum\|count\|bucket\)$//')
  grep -rq -- "$n\|$base" "$src/scripts/prometheus.lua" "$src/lua/cuptimon/sampling.lua" ||
    fail "$n (rules.yml or dashboard.json) is no metric the exporter writes"
done
echo "ok: the rules and the dashboard name $(echo "$names" | wc -l) metrics the exporter writes"
if ! command -v promtool >/dev/null 2>&1; then
  [ "${CI:-}" = true ] && fail "promtool is not installed: CI must install prometheus"
  echo "promtool is not installed: skipped"
  exit 77
fi
promtool check config "$d/prometheus-scrape.yml" || fail "promtool check config (systemd)"
(cd "$p" && promtool check config scrape.yml) || fail "promtool check config scrape.yml"
(cd "$p" && promtool test rules rules_test.yml) || fail "promtool test rules"
echo "ok: the exporter's examples"
