#!/bin/sh
# check_exports.sh FILE ALLOWED [REQUIRED...]: checks the dynamic symbols FILE defines (nm -D
# --defined-only). Every one must match the extended regular expression ^(ALLOWED), or be one of
# the few the toolchain may add (_init, _fini, _edata, _end, __bss_start); none may be internal
# (cm__*), whatever ALLOWED says; each REQUIRED symbol must be there. Prints the counts and every
# offending symbol; exits 0 when all holds, 1 otherwise.
set -u
file=$1
allowed=$2
shift 2
syms=$(nm -D --defined-only "$file") || { echo "check_exports: nm failed on $file" >&2; exit 1; }
# The symbol is the last field; a version suffix (sym@@VER) is not part of its name.
syms=$(printf '%s\n' "$syms" | awk 'NF { s = $NF; sub(/@.*/, "", s); print s }' | sort -u)
total=$(printf '%s\n' "$syms" | grep -c .)
bad=$(printf '%s\n' "$syms" | grep -v -E "^(${allowed})" |
  grep -v -x -E '_init|_fini|_edata|_end|__bss_start')
internal=$(printf '%s\n' "$syms" | grep -E '^cm__')
missing=""
for want in "$@"; do
  printf '%s\n' "$syms" | grep -q -x -F "$want" || missing="$missing $want"
done
echo "check_exports: $file exports $total symbols"
status=0
if [ -n "$bad" ]; then
  echo "check_exports: exported but not allowed by ^($allowed):"; printf '  %s\n' $bad; status=1
fi
if [ -n "$internal" ]; then
  echo "check_exports: internal symbols exported:"; printf '  %s\n' $internal; status=1
fi
if [ -n "$missing" ]; then
  echo "check_exports: not exported:$missing"; status=1
fi
exit $status
