#!/usr/bin/env bash
# Does cuptiFinalize give back what CUPTI costs once it has traced? From the
# repository root on the device machine:
#   bash spec/gpu/reattach.sh BUILD_DIR     (about 4 min; LAUNCHES=200000 CYCLES=6 THREADS=16
#                                            GROWTH_SECONDS=170 REATTACH_AT=110)
#
# Two experiments of BUILD_DIR/gpu/cupti_reattach (bench/cupti_reattach.cu), with nothing of
# cuptimon inside:
#  1. --phases: cycles of untraced, traced (kernels and runtime API), disabled (every kind off,
#     CUPTI still initialized) and finalized (cuptiFinalize) phases in one process, the launching
#     thread's CPU per empty launch in each. The duty cycle turns kinds off between its windows,
#     and a launch then stays about as dear as under the full trace
#     (spec/gpu/duty_residual.sh): if "finalized" is back near the first "untraced" while
#     "disabled" is not, the duty cycle should detach CUPTI between windows. Each traced phase
#     must deliver exactly its launches' kernel records after CUPTI was initialized again, and no
#     other phase any (exit status 1 otherwise).
#  2. --growth: 16 threads launching under kernels and runtime for GROWTH_SECONDS, CUPTI finalized and
#     initialized again at REATTACH_AT; once a second, the share of a core that CUPTI's threads
#     used. Under a long run that share grows with the run's length (spec/gpu/cupti_growth.sh): if
#     it starts over after the re-attach, a re-attach could replace the lag guard's permanent
#     shed. Every launch must have its kernel record (exit status 1 otherwise).
# Output goes to $OUT (reattach_phases.txt, reattach_growth.txt), else to /tmp/cuptimon-reattach.
set -uo pipefail
cd "$(dirname "$0")/../.."
build="${1:?usage: spec/gpu/reattach.sh BUILD_DIR}"
out="${OUT:-/tmp/cuptimon-reattach}"
mkdir -p "$out"
prog="$build/gpu/cupti_reattach"
[ -x "$prog" ] || { echo "reattach: $prog is missing (a build with nvcc makes it)" >&2; exit 1; }
status=0

"$prog" --phases "${LAUNCHES:-200000}" "${CYCLES:-6}" > "$out/reattach_phases.txt" 2>&1
rc=$?
[ $rc = 77 ] && { echo "reattach: SKIP: no CUDA device"; exit 77; }
echo "== phases (exit status $rc)"
grep -E "^SUMMARY|WRONG|cupti_reattach:" "$out/reattach_phases.txt"
[ $rc = 0 ] || status=1

"$prog" --growth "${THREADS:-16}" "${GROWTH_SECONDS:-170}" "${REATTACH_AT:-110}" > "$out/reattach_growth.txt" 2>&1
rc=$?
echo "== growth (exit status $rc): the share of a core of CUPTI's threads, every 10 s"
awk '/^SHARE/ && int($3) % 10 == 0' "$out/reattach_growth.txt"
grep -E "^REATTACH|^RESULT|cupti_reattach:" "$out/reattach_growth.txt"
[ $rc = 0 ] || status=1
echo "reattach: $([ $status = 0 ] && echo PASS || echo FAIL) (logs in $out)"
exit $status
