#!/bin/sh
# check_calls.sh OBJECT...: checks that no two source files call into each other both ways
# (STYLE.md: a callback table breaks such a circle). For each object file (x.c.o), the global
# symbols it defines and the ones it leaves undefined (nm) give the calls between files: a.c calls
# b.c when a.c.o needs a symbol that b.c.o defines. Every such pair that goes both ways is reported,
# with the symbols of each direction, and the check fails. Pass the objects of the files that must
# hold this together (ctest gives the host library's and cuptimon-lua's), so that calls between
# folders count too; an argument may be a CMake list (objects separated by ';'). Prints the calls
# it found with -v as the first argument.
set -u
verbose=0
if [ "${1:-}" = "-v" ]; then verbose=1; shift; fi
[ $# -gt 0 ] || { echo "usage: check_calls.sh [-v] OBJECT..." >&2; exit 2; }
tmp=$(mktemp -d "${TMPDIR:-/tmp}/cm_calls.XXXXXX") || exit 2
trap 'rm -rf "$tmp"' EXIT

# One line per symbol: "def FILE SYMBOL" or "use FILE SYMBOL", FILE being folder/name.c.
for o in $(printf '%s\n' "$@" | tr ';' '\n'); do
  name=$(basename "$o" .o)
  dir=$(basename "$(dirname "$(dirname "$(dirname "$o")")")")
  nm -g --defined-only "$o" | awk -v f="$dir/$name" 'NF >= 3 { print "def", f, $3 }' >>"$tmp/syms" ||
    { echo "check_calls: nm failed on $o" >&2; exit 2; }
  nm -u "$o" | awk -v f="$dir/$name" 'NF >= 2 { print "use", f, $2 }' >>"$tmp/syms"
done

# "CALLER CALLEE SYMBOL" for each symbol a file uses that another file defines.
awk '$1 == "def" { def[$3] = $2 } $1 == "use" { use[NR] = $2 " " $3 }
     END { for (i in use) { split(use[i], u, " "); if ((u[2] in def) && def[u[2]] != u[1])
             print u[1], def[u[2]], u[2] } }' "$tmp/syms" | sort -u >"$tmp/calls"
if [ $verbose = 1 ]; then
  awk '{ k = $1 " -> " $2; s[k] = (k in s) ? s[k] " " $3 : $3 } END { for (k in s) print k ":", s[k] }' \
    "$tmp/calls" | sort
fi

awk '{ k = $1 " " $2; s[k] = (k in s) ? s[k] " " $3 : $3 }
     END { n = 0
           for (k in s) { split(k, p, " ")
             if (p[1] < p[2] && ((p[2] " " p[1]) in s)) {
               print "check_calls: " p[1] " and " p[2] " call into each other:"
               print "  " p[1] " -> " p[2] ": " s[k]
               print "  " p[2] " -> " p[1] ": " s[p[2] " " p[1]]
               n++ } }
           exit n > 0 }' "$tmp/calls"
status=$?
files=$(awk '{ print $2 }' "$tmp/syms" | sort -u | wc -l)
ncalls=$(awk '{ print $1, $2 }' "$tmp/calls" | sort -u | wc -l)
if [ "$ncalls" -eq 0 ]; then
  echo "check_calls: FAIL: no call between the $files files given (not the objects meant?)"
  exit 1
fi
if [ $status != 0 ]; then
  echo "check_calls: FAIL: a circle between two files (of $files)"
  exit 1
fi
echo "check_calls: $files files, $ncalls calls between them, none both ways"
exit 0
