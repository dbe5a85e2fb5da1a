#!/usr/bin/env bash
# ranks.lua on two GPUs: `torchrun --nproc-per-node 2` trains a small fixed-seed model with DDP
# over NCCL (spec/gpu/ranks_train.py --ddp); rank 1 sleeps 20 ms at the start of each step.
#   1. live, under scripts/ranks.lua, also recording one capture per process (--record
#      run.%p.cmcap): both ranks have their row, rank 1 and no other is flagged within 10 steps;
#   2. the same job under torch.profiler (no cuptimon): each rank's kernel count equals the
#      kernels column of run 1;
#   3. the two captures replayed together give the same final table and straggler as run 1.
# torchrun is run as `python3 -m torch.distributed.run`. cuptimon-lua runs it with the agent in CUDA_INJECTION64_PATH; torchrun's workers inherit
# it, and each connects to the monitor when it initializes CUDA (torchrun itself never does).
# NCCL's settings are left as the environment has them; NVLink multicast must stay off, so the
# script refuses to run with NCCL_NVLS_ENABLE set to anything but 0. Run from the repository root:
#   bash spec/gpu/ranks_two_gpu.sh BUILD_DIR
# About 1 min. Logs and captures go to $OUT (or /tmp/cuptimon-ranks); the last line is PASS, and
# the exit status is 0 only then.
set -u
B=$(cd "${1:?usage: ranks_two_gpu.sh BUILD_DIR}" && pwd)
LOGS=${OUT:-/tmp/cuptimon-ranks}
mkdir -p "$LOGS"
unset CUPTIMON_LIBCUPTI CUPTIMON_LIBCUDA
if [ "${NCCL_NVLS_ENABLE:-0}" != 0 ]; then
  echo "FAIL: NCCL_NVLS_ENABLE=$NCCL_NVLS_ENABLE: NVLink multicast must stay off"
  exit 1
fi
JOB=(python3 -m torch.distributed.run --standalone --nproc-per-node 2 spec/gpu/ranks_train.py --ddp
  --steps "${STEPS:-60}"
  --sleep-rank 1 --sleep-ms 20)
rm -f "$LOGS"/run.*.cmcap

run() {
  local name=$1
  shift
  echo "=== $name: $*"
  timeout 180 "$@" >"$LOGS/$name.log" 2>&1
  local rc=$?
  tail -n 12 "$LOGS/$name.log"
  if [ "$rc" -ne 0 ]; then
    echo "FAIL: $name exited $rc (log: $LOGS/$name.log)"
    exit 1
  fi
}

run ranks_live "$B/cuptimon-lua" --record "$LOGS/run.%p.cmcap" scripts/ranks.lua --interval 1000 \
  -- "${JOB[@]}"
run ranks_profiler "${JOB[@]}" --profile
caps=()
for c in "$LOGS"/run.*.cmcap; do caps+=(--replay "$c"); done
if [ "${#caps[@]}" -ne 4 ]; then
  echo "FAIL: want 2 captures, found: ${caps[*]}"
  exit 1
fi
run ranks_replay "$B/cuptimon-lua" "${caps[@]}" scripts/ranks.lua --interval 1000
python3 spec/gpu/ranks_check.py "$LOGS/ranks_live.log" --ranks 2 --straggler 1 --within 10 \
  --expect "$LOGS/ranks_profiler.log" --same-as "$LOGS/ranks_replay.log"
