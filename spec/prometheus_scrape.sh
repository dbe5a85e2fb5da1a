#!/bin/sh
# spec/prometheus_scrape.sh LUA_BIN SOURCE_DIR: a real Prometheus server (Debian's `prometheus`)
# scrapes scripts/prometheus.lua serving a replay of examples/demo.cmcap, and its HTTP API must
# return the demo's numbers: 300 kernels in all (count.lua's figure), 150 of cm_demo_matmul<16>,
# the histogram's count equal to the launches, and up == 1.
#
# Both servers run on loopback on free ports: the exporter binds port 0 and prints the port;
# Prometheus gets a port found free by binding port 0 (retried if it lost the race). Every
# process started here is killed on every exit path. Bounded: about 10 s, at most 50 s.
# Without prometheus the test is skipped (status 77), unless CI=true: then it fails.
#
# spec/prometheus_scrape.sh LUA_BIN SOURCE_DIR tls: the demo's replay served over TLS with basic
# auth (--web-config spec/fixtures/tls/web-tls-auth.yml, test-only certificates): Prometheus
# scrapes it with the test CA and the right password (up == 1 and the demo's numbers), with a
# wrong password (up == 0) and over plain HTTP (up == 0); the exporter counts the refusals.
#
# spec/prometheus_scrape.sh LUA_BIN SOURCE_DIR duty: the same with the exporter's duty cycle
# (--duty 0.25 --period-ms 400) over fake_cuda_app --steady-ms (CUPTIMON_FAKE_APP and the fake
# CUPTI from the environment, as ctest sets them): /metrics passes `promtool check metrics`, and
# Prometheus sees windows, the estimated launch rate of steady_kernel near the app's 2000 per
# second, and its bounds on either side of it.
set -u
lua=$1
src=$2
mode=${3:-demo}
if ! command -v prometheus >/dev/null 2>&1; then
  if [ "${CI:-}" = true ]; then
    echo "prometheus is not installed: CI must install it (prometheus in .ci/run)" >&2
    exit 1
  fi
  echo "prometheus is not installed: skipped (apt-get install prometheus)"
  exit 77
fi
command -v curl >/dev/null 2>&1 || { echo "curl is not installed" >&2; exit 1; }

tmp=$(mktemp -d)
exporter=""
prom=""
cleanup() {
  [ -n "$prom" ] && kill "$prom" 2>/dev/null && wait "$prom" 2>/dev/null
  [ -n "$exporter" ] && kill "$exporter" 2>/dev/null && wait "$exporter" 2>/dev/null
  rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 1' INT TERM
start=$(date +%s)
deadline=$((start + 50))
fail() {
  echo "FAIL: $*" >&2
  echo "--- exporter:" >&2; cat "$tmp/exporter.log" >&2
  echo "--- prometheus (tail):" >&2; tail -n 20 "$tmp/prom.log" >&2 2>/dev/null
  exit 1
}

# The exporter serves until it is killed (--linger -1), after the replay ended.
if [ "$mode" = duty ]; then
  [ -n "${CUPTIMON_FAKE_APP:-}" ] || { echo "CUPTIMON_FAKE_APP is not set: skipped"; exit 77; }
  "$lua" "$src/scripts/prometheus.lua" --port 0 --linger 0 --duty 0.25 --period-ms 400 --seed 3 \
    -- "$CUPTIMON_FAKE_APP" --steady-ms 30000 --kernel-rate 2000 \
    >"$tmp/exporter.out" 2>"$tmp/exporter.log" &
elif [ "$mode" = tls ]; then
  "$lua" --replay "$src/examples/demo.cmcap" "$src/scripts/prometheus.lua" --port 0 --linger -1 \
    --web-config "$src/spec/fixtures/tls/web-tls-auth.yml" \
    >"$tmp/exporter.out" 2>"$tmp/exporter.log" &
else
  "$lua" --replay "$src/examples/demo.cmcap" "$src/scripts/prometheus.lua" --port 0 --linger -1 \
    >"$tmp/exporter.out" 2>"$tmp/exporter.log" &
fi
exporter=$!
eport=""
while [ -z "$eport" ]; do
  eport=$(sed -n 's|^prometheus.lua: serving https*://127.0.0.1:\([0-9]*\)/metrics$|\1|p' "$tmp/exporter.log")
  [ -n "$eport" ] && break
  kill -0 "$exporter" 2>/dev/null || fail "the exporter exited before serving"
  [ "$(date +%s)" -lt "$deadline" ] || fail "the exporter did not say its port"
  sleep 0.1
done

free_port() {
  "$lua" -e 'local uv = require "luv"; local s = uv.new_tcp(); assert(s:bind("127.0.0.1", 0));
    print(s:getsockname().port); s:close()'
}

cat >"$tmp/prometheus.yml" <<YML
global:
  scrape_interval: 1s
  scrape_timeout: 1s
scrape_configs:
  - job_name: cuptimon
    static_configs:
      - targets: ["127.0.0.1:$eport"]
YML
if [ "$mode" = tls ]; then
  # The test-only password of spec/fixtures/tls/web-tls-auth.yml, and a wrong one.
  printf '%s' prometheus-test-password >"$tmp/password"
  printf '%s' not-the-password >"$tmp/wrong"
  # job NAME PASSWORD_FILE: a scrape job over TLS (the test CA) with basic auth.
  job() {
    printf '  - job_name: %s\n    scheme: https\n    tls_config:\n      ca_file: %s\n' "$1" \
      "$src/spec/fixtures/tls/ca.pem"
    printf '    basic_auth:\n      username: prometheus\n      password_file: %s\n' "$2"
    printf '    static_configs:\n      - targets: ["127.0.0.1:%s"]\n' "$eport"
  }
  {
    printf 'global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\nscrape_configs:\n'
    job cuptimon "$tmp/password"
    job cuptimon_wrong_password "$tmp/wrong"
    printf '  - job_name: cuptimon_plain_http\n    static_configs:\n      - targets: ["127.0.0.1:%s"]\n' "$eport"
  } >"$tmp/prometheus.yml"
  promtool check config "$tmp/prometheus.yml" >/dev/null || fail "promtool check config on the TLS scrape configuration"
fi

pport=""
for attempt in 1 2 3; do
  pport=$(free_port) || fail "no free port"
  prometheus --config.file="$tmp/prometheus.yml" --storage.tsdb.path="$tmp/data" \
    --web.listen-address="127.0.0.1:$pport" >"$tmp/prom.log" 2>&1 &
  prom=$!
  ready=""
  while [ "$(date +%s)" -lt "$deadline" ]; do
    if curl -sf "http://127.0.0.1:$pport/-/ready" >/dev/null 2>&1; then ready=1; break; fi
    kill -0 "$prom" 2>/dev/null || break
    sleep 0.2
  done
  [ -n "$ready" ] && break
  kill "$prom" 2>/dev/null; wait "$prom" 2>/dev/null; prom=""
  grep -q "address already in use" "$tmp/prom.log" || fail "prometheus did not start"
done
[ -n "$prom" ] || fail "prometheus did not start (attempt $attempt)"

# The value of an instant query that returns one series (empty while there is none).
query() {
  curl -sf -G "http://127.0.0.1:$pport/api/v1/query" --data-urlencode "query=$1" |
    sed -n 's/.*"result":\[{"metric":{[^}]*},"value":\[[0-9.]*,"\([^"]*\)"\]}\].*/\1/p'
}

# Wait for the first scrape.
while [ "$(query 'up{job="cuptimon"}')" != 1 ]; do
  [ "$(date +%s)" -lt "$deadline" ] || fail "prometheus never scraped the exporter: up=$(query 'up{job="cuptimon"}')"
  sleep 0.5
done

check() {
  got=$(query "$1")
  [ "$got" = "$2" ] || fail "$1 = '$got', expected $2"
  echo "ok: $1 = $got"
}

if [ "$mode" = duty ]; then
  # Until DUTY_WINDOWS (3) windows have closed, then the exposition must pass promtool's checks.
  # With every subscription after the first blocked (FAKE_CUPTI_RESUBSCRIBE_DELAY_MS), the
  # process's estimate rests on the two windows traced before its first detach.
  w=${DUTY_WINDOWS:-3}
  while [ "$(query "sum(cuptimon_duty_windows_total) >= $w")" = "" ]; do
    [ "$(date +%s)" -lt "$deadline" ] || fail "no $w windows: $(query 'sum(cuptimon_duty_windows_total)')"
    sleep 0.5
  done
  curl -sf "http://127.0.0.1:$eport/metrics" >"$tmp/metrics.txt" || fail "cannot fetch /metrics"
  promtool check metrics <"$tmp/metrics.txt" || fail "promtool check metrics failed on /metrics"
  echo "ok: promtool check metrics"
  sleep 1.5 # a scrape after the fetch, so Prometheus holds the same windows or later ones
  k='{kernel="steady_kernel"}'
  # (The 95% coverage is checked over many runs in spec/estimate_spec.lua and duty_spec.lua;
  # here the value must be sane on a loaded machine, and between its bounds.)
  check "abs(cuptimon_estimated_kernel_launches_per_second$k / 2000 - 1) < bool 0.25" 1
  check "cuptimon_estimated_kernel_launches_lower_bound_per_second$k <= bool cuptimon_estimated_kernel_launches_per_second$k" 1
  check "cuptimon_estimated_kernel_launches_upper_bound_per_second$k >= bool cuptimon_estimated_kernel_launches_per_second$k" 1
  check 'cuptimon_duty_target_ratio' 0.25
  check 'count(cuptimon_estimated_memcpy_bytes_per_second{copy_kind="HtoD"})' 1
  echo "prometheus scraped the duty-cycled exporter in $(( $(date +%s) - start )) s"
  exit 0
fi
if [ "$mode" = tls ]; then
  for job in cuptimon_wrong_password cuptimon_plain_http; do
    while [ "$(query "up{job=\"$job\"}")" = "" ]; do
      [ "$(date +%s)" -lt "$deadline" ] || fail "prometheus never tried job $job"
      sleep 0.5
    done
  done
  check 'up{job="cuptimon"}' 1
  check 'up{job="cuptimon_wrong_password"}' 0
  check 'up{job="cuptimon_plain_http"}' 0
  # The refusals reach Prometheus with the right job's next scrape after them.
  for reason in wrong_password plain_http_on_tls; do
    q="cuptimon_exporter_refused_requests_total{reason=\"$reason\"} > bool 0"
    while [ "$(query "$q")" != 1 ]; do
      [ "$(date +%s)" -lt "$deadline" ] || fail "$q = '$(query "$q")', expected 1"
      sleep 0.5
    done
    echo "ok: $q"
  done
  # The first refusal is logged at once (the others with the next line, 10 s later at most).
  grep -q "prometheus.lua: refused \(wrong user or password\|plain HTTP on the TLS port\)" \
    "$tmp/exporter.log" || fail "the refusal was not logged"
  echo "ok: the refusals were counted and logged"
fi
check 'sum(cuptimon_kernel_launches_total)' 300
check 'cuptimon_kernel_launches_total{kernel="cm_demo_matmul<16>"}' 150
check 'count(cuptimon_kernel_launches_total)' 5
check 'sum(cuptimon_kernel_duration_seconds_count)' 300
check 'sum(cuptimon_kernel_duration_seconds_bucket{le="+Inf"})' 300
check 'cuptimon_records_total{kind="concurrent_kernel",pid="601",executable="cuptimon_demo_cuda"}' 300
check 'sum(cuptimon_records_dropped_total)' 0
check 'sum(cuptimon_memcpy_bytes_total)' 20119672
check 'count(cuptimon_kernel_launches_total{host="vm",device="0"})' 5
echo "prometheus scraped the exporter ($mode) in $(( $(date +%s) - start )) s"
