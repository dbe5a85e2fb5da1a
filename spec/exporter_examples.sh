#!/bin/sh
# spec/exporter_examples.sh SOURCE_DIR: the node exporter's shipped files (examples/systemd/) are
# valid: the scrape configuration passes `promtool check config`, the unit passes
# `systemd-analyze verify` (where systemd is there to ask), the unit runs the documented command
# and the jobs' environment sets what a dormant agent needs. Exit 77 (skipped) without promtool,
# unless CI=true.
set -u
src=$1
d=$src/examples/systemd
fail() { echo "FAIL: $*" >&2; exit 1; }
grep -q -- '--attach all "$CUPTIMON_PREFIX/share/cuptimon/scripts/prometheus.lua" --duty 0.05' \
  "$d/cuptimon-exporter.service" || fail "the unit does not run --attach all prometheus.lua --duty 0.05"
grep -qx 'CUPTIMON_LISTEN=1' "$d/cuptimon-job.env" || fail "cuptimon-job.env lacks CUPTIMON_LISTEN=1"
grep -q '^CUDA_INJECTION64_PATH=/.*libcuptimon-agent.so$' "$d/cuptimon-job.env" ||
  fail "cuptimon-job.env lacks an absolute CUDA_INJECTION64_PATH"
if command -v systemd-analyze >/dev/null 2>&1; then
  systemd-analyze verify "$d/cuptimon-exporter.service" || fail "systemd-analyze verify"
  echo "ok: systemd-analyze verify"
fi
if ! command -v promtool >/dev/null 2>&1; then
  [ "${CI:-}" = true ] && fail "promtool is not installed: CI must install prometheus"
  echo "promtool is not installed: skipped"
  exit 77
fi
promtool check config "$d/prometheus-scrape.yml" || fail "promtool check config"
echo "ok: the exporter's examples"
