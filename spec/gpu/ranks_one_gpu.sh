#!/usr/bin/env bash
# ranks.lua on one GPU: three independent PyTorch processes share the GPU (no NCCL), each a rank
# by its RANK variable, each step an NVTX range "step"; rank 1 sleeps 20 ms at the start of each
# of its steps. Run under scripts/ranks.lua, rank 1 and no other must be flagged as a straggler
# within 10 steps, and every rank must have its row. Run from the repository root:
#   bash spec/gpu/ranks_one_gpu.sh BUILD_DIR
# About 20 s (PyTorch's start dominates). Logs go to $OUT (or /tmp/cuptimon-ranks); the last line
# is PASS, and the exit status is 0 only then.
set -u
B=$(cd "${1:?usage: ranks_one_gpu.sh BUILD_DIR}" && pwd)
LOGS=${OUT:-/tmp/cuptimon-ranks}
mkdir -p "$LOGS"
unset CUPTIMON_LIBCUPTI CUPTIMON_LIBCUDA
LOG=$LOGS/ranks_one_gpu.log
STEPS=${STEPS:-60}
timeout 60 "$B/cuptimon-lua" scripts/ranks.lua --interval 1000 -- sh -c "
  for r in 0 1 2; do
    RANK=\$r LOCAL_RANK=\$r WORLD_SIZE=3 python3 spec/gpu/ranks_train.py --steps $STEPS \
      --sleep-rank 1 --sleep-ms 20 &
  done
  wait" >"$LOG" 2>&1
rc=$?
tail -n 12 "$LOG"
if [ "$rc" -ne 0 ]; then
  echo "FAIL: cuptimon-lua exited $rc (log: $LOG)"
  exit 1
fi
python3 spec/gpu/ranks_check.py "$LOG" --ranks 3 --straggler 1 --within 10
