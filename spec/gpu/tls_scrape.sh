#!/usr/bin/env bash
# A real Prometheus scrapes the exporter over TLS with basic auth, attached to a running PyTorch
# job, on a GPU machine. From the repository root on the device machine:
#   bash spec/gpu/tls_scrape.sh BUILD_DIR PROMETHEUS_BIN     (about 60 s; RUN_S=120 the job's length)
#
# The job (spec/gpu/duty_train.py, a small MLP training loop) starts with the agent dormant
# (CUDA_INJECTION64_PATH and CUPTIMON_LISTEN=1, as examples/systemd/cuptimon-job.env sets them);
# once it listens, scripts/prometheus.lua attaches to it (--attach PID) and serves over TLS with
# basic auth (--web-config spec/fixtures/tls/web-tls-auth.yml: the test-only certificates and
# password of spec/fixtures/tls, which need no openssl command here). Prometheus (PROMETHEUS_BIN,
# e.g. Debian's static /usr/bin/prometheus carried over) scrapes it with the test CA twice: as job
# "cuptimon" with the right password and as "cuptimon_wrong_password" with a wrong one. The
# script prints one scrape of /metrics (abridged), the series Prometheus stored, and up for both
# jobs. Needs python3 with torch and a CUDA device; no curl, no openssl, no network.
# TLS_SCRAPE_JOB="cmd args" runs that command as the job instead (the specs' fake CUDA app with
# the fake CUPTI, to try the script on a machine without a GPU).
# Logs go to $OUT when set, else to /tmp/cuptimon-tls-scrape.
# Exit status: 0 when up == 1 with the job's kernels in Prometheus and up == 0 for the wrong
# password; 1 otherwise; 77 when there is no CUDA device or no torch.
set -u
B=$(cd "${1:?usage: spec/gpu/tls_scrape.sh BUILD_DIR PROMETHEUS_BIN}" && pwd)
PROM=${2:?usage: spec/gpu/tls_scrape.sh BUILD_DIR PROMETHEUS_BIN}
LOG=${OUT:-/tmp/cuptimon-tls-scrape}
mkdir -p "$LOG"
cd "$(dirname "$0")/../.."
SRC=$(pwd)
LUA=$B/cuptimon-lua
AGENT=$B/libcuptimon-agent.so
FX=$SRC/spec/fixtures/tls
RUN_S=${RUN_S:-120}
[ -n "${TLS_SCRAPE_JOB:-}" ] || unset CUPTIMON_LIBCUPTI CUPTIMON_LIBCUDA
for f in "$LUA" "$AGENT" "$PROM"; do
  [ -x "$f" ] || [ -f "$f" ] || { echo "tls_scrape.sh: $f is missing"; exit 1; }
done
if [ -z "${TLS_SCRAPE_JOB:-}" ]; then
  python3 -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null ||
    { echo "tls_scrape.sh: SKIP: no torch with a CUDA device"; exit 77; }
fi

RT=$(mktemp -d)
chmod 700 "$RT"
export XDG_RUNTIME_DIR=$RT
job="" exporter="" prom=""
cleanup() {
  [ -n "$exporter" ] && kill -INT "$exporter" 2>/dev/null && wait "$exporter" 2>/dev/null
  [ -n "$prom" ] && kill "$prom" 2>/dev/null && wait "$prom" 2>/dev/null
  [ -n "$job" ] && kill "$job" 2>/dev/null && wait "$job" 2>/dev/null
  rm -rf "$RT"
}
trap cleanup EXIT
trap 'exit 1' INT TERM
fail() {
  echo "FAIL: $*"
  echo "--- exporter:"; tail -n 20 "$LOG/exporter.log" 2>/dev/null
  echo "--- job:"; tail -n 5 "$LOG/job.log" 2>/dev/null
  echo "--- prometheus:"; tail -n 5 "$LOG/prometheus.log" 2>/dev/null
  echo "tls_scrape.sh: FAIL (logs in $LOG)"
  exit 1
}
# wait_for SECONDS cmd...: runs cmd every 0.2 s until it succeeds or the time is up.
wait_for() {
  local end=$(( $(date +%s) + $1 )); shift
  until "$@"; do [ "$(date +%s)" -lt "$end" ] || return 1; sleep 0.2; done
}

# 1. The PyTorch job, agent dormant.
JOB=(python3 spec/gpu/duty_train.py "$RUN_S")
# shellcheck disable=SC2206 # TLS_SCRAPE_JOB is a command line, split on purpose
[ -n "${TLS_SCRAPE_JOB:-}" ] && JOB=($TLS_SCRAPE_JOB)
env CUDA_INJECTION64_PATH="$AGENT" CUPTIMON_LISTEN=1 CUPTIMON_AGENT_LOG=info \
  "${JOB[@]}" >"$LOG/job.log" 2>&1 &
job=$!
wait_for 90 test -S "$RT/cuptimon/$job.sock" || fail "the job's agent is not listening ($RT/cuptimon/$job.sock)"
echo "job: pid $job, agent dormant and listening"

# 2. The exporter, attached, over TLS with basic auth.
"$LUA" --attach "$job" scripts/prometheus.lua --port 0 --web-config "$FX/web-tls-auth.yml" \
  >"$LOG/exporter.out" 2>"$LOG/exporter.log" &
exporter=$!
port_of() { sed -n 's|^prometheus.lua: serving https://127.0.0.1:\([0-9]*\)/metrics$|\1|p' "$LOG/exporter.log"; }
has_port() { [ -n "$(port_of)" ]; }
wait_for 30 has_port || fail "the exporter did not serve"
eport=$(port_of)
echo "exporter: $(grep -E '^prometheus.lua: (serving|TLS)' "$LOG/exporter.log" | tr '\n' ' ')"

# 3. Prometheus, on a free port, scraping with the right and a wrong password.
printf '%s' prometheus-test-password >"$RT/password"
printf '%s' not-the-password >"$RT/wrong"
# job NAME PASSWORD_FILE: a scrape job over TLS (the test CA) with basic auth.
job() {
  printf '  - job_name: %s\n    scheme: https\n    tls_config:\n      ca_file: %s\n' "$1" "$FX/ca.pem"
  printf '    basic_auth:\n      username: prometheus\n      password_file: %s\n' "$2"
  printf '    static_configs:\n      - targets: ["127.0.0.1:%s"]\n' "$eport"
}
{
  printf 'global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\nscrape_configs:\n'
  job cuptimon "$RT/password"
  job cuptimon_wrong_password "$RT/wrong"
} >"$RT/prometheus.yml"
pport=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
"$PROM" --config.file="$RT/prometheus.yml" --storage.tsdb.path="$RT/data" \
  --web.listen-address="127.0.0.1:$pport" >"$LOG/prometheus.log" 2>&1 &
prom=$!

# Queries Prometheus's HTTP API (python3: no curl needed); prints "labels value" per series.
query() {
  python3 - "$pport" "$1" <<'PY'
import json, sys, urllib.parse, urllib.request
url = "http://127.0.0.1:%s/api/v1/query?%s" % (sys.argv[1], urllib.parse.urlencode({"query": sys.argv[2]}))
try:
    res = json.load(urllib.request.urlopen(url, timeout=5))["data"]["result"]
except Exception:
    sys.exit(0)
for r in res:
    m = r["metric"]
    print(m.get("__name__", ""), ",".join('%s="%s"' % kv for kv in sorted(m.items()) if kv[0] != "__name__"),
          r["value"][1])
PY
}
value() { query "$1" | awk 'NR == 1 { print $NF }'; }
is() { [ "$(value "$1")" = "$2" ]; }
some() { [ -n "$(value "$1")" ]; }
wait_for 60 is 'up{job="cuptimon"}' 1 || fail "up{job=\"cuptimon\"} is not 1: '$(value 'up{job="cuptimon"}')'"
wait_for 60 some 'sum(cuptimon_kernel_launches_total) > 0' || fail "no kernel launches in Prometheus"
wait_for 30 some 'up{job="cuptimon_wrong_password"}' || fail "the wrong password's job was never scraped"

# 4. What was scraped: one scrape of /metrics as Prometheus gets it (TLS, basic auth), abridged.
echo "=== GET https://127.0.0.1:$eport/metrics (test CA, user prometheus), abridged:"
python3 - "$eport" "$FX/ca.pem" <<'PY' | tee "$LOG/scrape.txt" | grep -E '^(HTTP|cuptimon_(kernel_launches_total|records_dropped_total|lag_seconds|exporter_refused_requests_total\{reason="wrong_password"))' | head -n 12
import base64, ssl, sys, urllib.request
ctx = ssl.create_default_context(cafile=sys.argv[2])
req = urllib.request.Request("https://127.0.0.1:%s/metrics" % sys.argv[1], headers={
    "Authorization": "Basic " + base64.b64encode(b"prometheus:prometheus-test-password").decode()})
with urllib.request.urlopen(req, context=ctx, timeout=10) as r:
    print("HTTP %d %s (%s)" % (r.status, r.reason, r.headers["Content-Type"]))
    print(r.read().decode())
PY
echo "=== in Prometheus:"
query 'topk(5, cuptimon_kernel_launches_total)' | tee "$LOG/series.txt"
query 'sum(cuptimon_records_dropped_total)'
query 'up'
up_ok=$(value 'up{job="cuptimon"}')
up_wrong=$(value 'up{job="cuptimon_wrong_password"}')
echo "up{job=\"cuptimon\"} == $up_ok; up{job=\"cuptimon_wrong_password\"} == $up_wrong"
[ "$up_ok" = 1 ] || fail "up{job=\"cuptimon\"} = $up_ok"
[ "$up_wrong" = 0 ] || fail "up{job=\"cuptimon_wrong_password\"} = $up_wrong"
grep -q "refused wrong user or password" "$LOG/exporter.log" || fail "the exporter did not log the refusal"
echo "tls_scrape.sh: PASS (logs in $LOG)"
