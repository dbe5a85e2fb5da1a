#!/usr/bin/env bash
# Each duty window's kernel rate on the launch loop, with and without CUPTIMON_DETACH_IDLE=1
#: when the duty cycle's estimates of the launch loop's kernels come out low, more so with the
# detach (bench/RESULTS.md, "Duty cycle"), this tells whether the windows
# after a re-attach see fewer kernels per traced millisecond (CUPTI recording only some time after
# its kinds were enabled again), and how long the traced span of records is against traced_ms.
# From the repository root on the device machine:
#   bash spec/gpu/duty_window_rate.sh BUILD_DIR     (about 40 s; LAUNCHES=6000000)
# Prints one line per window: traced_ms, kernels, kernels per traced ms, and the span from the
# first to the last kernel start in the window. Exit status 0 when both runs ran.
set -u
B=${1:?usage: spec/gpu/duty_window_rate.sh BUILD_DIR}
status=0
for det in 0 1; do
  echo "== CUPTIMON_DETACH_IDLE=$det"
  CUPTIMON_DETACH_IDLE=$det timeout 60 "$B/cuptimon-lua" "$(dirname "$0")/duty_window_rate.lua" -- \
    "$B/gpu/launch_loop" "${LAUNCHES:-6000000}" > "/tmp/duty_window_rate.$det.txt" 2>&1 || status=1
  grep -E "^W |LOST|error" "/tmp/duty_window_rate.$det.txt"
done
exit $status
