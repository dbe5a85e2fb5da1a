# shellcheck shell=bash
# Shared by the GPU scripts that drive a running `launch_loop --control PATH` (dormant.sh,
# duty_residual.sh): source it after setting ctl=PATH. The loop takes each request from the file
# PATH and acknowledges it in PATH.ack (engine/tests/window_control.h).

# wait_for SECONDS COMMAND...: runs COMMAND every 50 ms until it succeeds; fails after SECONDS.
wait_for() {
  local end=$((SECONDS + $1)); shift
  until "$@"; do [ $SECONDS -ge $end ] && return 1; sleep 0.05; done
}

# ask N: the loop launches N kernels and synchronizes; prints its acknowledgement. Fails when none
# comes within ASK_TIMEOUT_S (default 60) seconds.
# shellcheck disable=SC2154 # ctl is set by the script that sources this file
ask() {
  printf '%s\n' "$1" >"$ctl.tmp" && mv "$ctl.tmp" "$ctl"
  wait_for "${ASK_TIMEOUT_S:-60}" test -e "$ctl.ack" || { echo "no acknowledgement from the loop"; return 1; }
  cat "$ctl.ack"; rm -f "$ctl.ack"
}
