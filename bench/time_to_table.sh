#!/usr/bin/env bash
# Time to a table on a PyTorch training loop, cuptimon beside torch.profiler's key_averages, from
# the repository root of a GPU machine with PyTorch:
#   bash bench/time_to_table.sh BUILD_DIR     (ROUNDS_200=5 ROUNDS_2000=3)
# Prints a table of medians with bootstrap 95% intervals and RESULT: PASS; runs in
# $OUT/time_to_table.json. See bench/time_to_table.py.
set -euo pipefail
cd "$(dirname "$0")/.."
exec python3 bench/time_to_table.py "$@"
