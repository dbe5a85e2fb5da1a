#!/usr/bin/env bash
# Device call 2: the sustained run (and, with R16=N, the duty cycle at 16 threads) on the split tree.
set -u
B=.devbuild
T1=$(date +%s)
R=$OUT
mkdir -p $R/sweep
THREADS=4 SECONDS_EACH=60 OUT=$R/sweep bash bench/thread_sweep.sh $B > $R/sweep/sweep.txt 2>&1
echo "sweep rc=$? in $(( $(date +%s) - T1 )) s"
tail -n 15 $R/sweep/sweep.txt
if [ "${R16:-0}" -gt 0 ]; then
  OUT=$R/sweep python3 bench/duty_threads.py $B --threads 16 --seconds 3 --rounds $R16 > $R/sweep/duty16.txt 2>&1
  echo "duty16 rc=$?"; tail -n 25 $R/sweep/duty16.txt
fi
cd $R && tar czf sweep.tgz sweep && rm -rf sweep
