#!/usr/bin/env bash
# The overhead harness in one command, on a GPU machine, from the repository root:
#   bash bench/overhead.sh BUILD_DIR          (ROUNDS=10 LAUNCHES=100000 OPS=20000 by default)
# BUILD_DIR is a build with nvcc (gpu/launch_loop, gpu/libcupti_floor.so); PyTorch is needed for
# the torch workload (WORKLOADS=launch runs the C++ one alone). Tables on stdout and in
# $OUT/overhead.md, every run in $OUT/overhead_runs.{csv,json}. See bench/overhead.py.
set -euo pipefail
cd "$(dirname "$0")/.."
exec python3 bench/overhead.py "$@"
