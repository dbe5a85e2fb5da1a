#!/usr/bin/env bash
# One GPU call, steps in priority order, each started only while the call's time allows.
set -u
B=.devbuild; O=${OUT:-/tmp/out}; mkdir -p $O
T0=$(date +%s); END=$((T0 + ${CALL_S:-560}))
left() { echo $((END - $(date +%s))); }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u
echo "=== ctest -L gpu"; ctest --test-dir $B -L gpu 2>&1 | tail -3
echo "=== torch small-op overhead (left $(left) s)"
OUT=$O/ovt WORKLOADS=torch CONFIGS=untraced,cm_top,duty05 ROUNDS=10 OPS=300000 BUDGET_S=${TORCH_S:-170} timeout 230 bash bench/duty_overhead.sh $B > $O/ov_torch.txt 2>&1; echo rc=$?
grep -iE "ratio|rounds|cm_top|duty05|PASS|FAIL|estimate" $O/ov_torch.txt | tail -14
echo "=== sustained: thread_sweep 4 threads 30 s (left $(left) s)"
(THREADS=4 SECONDS_EACH=${SWEEP_S:-30} CUPTIMON_AGENT_LOG=info timeout 90 bash bench/thread_sweep.sh $B > $O/sweep4.txt 2>&1; echo rc=$?); grep -E "RESULT|LOST|lost|exit:" $O/sweep4.txt | tail -5
echo "=== 16 threads under the default duty cycle (left $(left) s)"
OUT=$O timeout 110 python3 bench/duty_threads.py $B --threads 16 --seconds 5 --rounds ${R16:-4} 2>&1 | tail -9
echo "=== TLS scrape (left $(left) s)"
xz -dc $B/prometheus.xz > /tmp/prometheus && chmod +x /tmp/prometheus
OUT=$O/tls RUN_S=70 timeout 100 bash spec/gpu/tls_scrape.sh $B /tmp/prometheus > $O/tls.txt 2>&1; echo rc=$?; tail -25 $O/tls.txt
if [ $(left) -gt 110 ]; then echo "=== attach and leave (left $(left) s)"
OUT=$O/al DORMANT_S=25 ATTACH_S=45 AFTER_S=25 PERIOD_MS=2000 timeout 140 bash spec/gpu/attach_leave.sh $B 2>&1 | tail -8; fi
if [ $(left) -gt 45 ]; then echo "=== graphs under the default duty cycle (left $(left) s)"
(timeout $(( $(left) - 5 )) $B/cuptimon-lua scripts/count.lua --duty 0.1 --period-ms 500 --kinds kernel -- python3 spec/gpu/torch_graphs.py 200 > $O/graphs.txt 2>&1; echo rc=$?); grep -E "RESULT|estimated|note|detached|rror" $O/graphs.txt | head -6; fi
echo "done at $(date -u), left $(left) s"
