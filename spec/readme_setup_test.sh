#!/bin/sh
# The README's first command (the set-up line) must work both as root on a machine without sudo
# and as a user with sudo. It runs here with stand-ins: `id`, `sudo`,
# `apt-get`, `cmake` and `./build/cuptimon-lua` only record that they ran, so the test checks the
# command's shape, not the network or a build.
#   readme_setup_test.sh README.md
set -u
readme=$1
line=$(grep -m1 'apt-get install' "$readme")
[ -n "$line" ] || { echo "no set-up command in $readme"; exit 1; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/bin" "$work/build"
for tool in sh grep mkdir cat true; do
  p=$(command -v $tool) && ln -s "$p" "$work/bin/$tool"
done
stub() { printf '#!/bin/sh\necho "%s $*" >> "%s/log"\n%s\n' "$1" "$work" "${2:-}" > "$work/bin/$1"; chmod +x "$work/bin/$1"; }
stub apt-get
stub cmake
printf '#!/bin/sh\necho "cuptimon-lua $*" >> "%s/log"\n' "$work" > "$work/build/cuptimon-lua"
chmod +x "$work/build/cuptimon-lua"
fail=0
# As root, without sudo.
printf '#!/bin/sh\n[ "$1" = -u ] && echo 0 || echo root\n' > "$work/bin/id"; chmod +x "$work/bin/id"
: > "$work/log"
(cd "$work" && PATH="$work/bin" sh -c "$line") || { echo "as root without sudo: the command failed"; fail=1; }
grep -q '^apt-get install' "$work/log" && grep -q '^cuptimon-lua --replay' "$work/log" ||
  { echo "as root without sudo: it did not install and run"; cat "$work/log"; fail=1; }
# As a user, with sudo.
printf '#!/bin/sh\n[ "$1" = -u ] && echo 1000 || echo user\n' > "$work/bin/id"
stub sudo 'exec "$@"'
: > "$work/log"
(cd "$work" && PATH="$work/bin" sh -c "$line") || { echo "as a user with sudo: the command failed"; fail=1; }
grep -q '^sudo apt-get install' "$work/log" && grep -q '^cuptimon-lua --replay' "$work/log" ||
  { echo "as a user with sudo: apt-get did not run through sudo"; cat "$work/log"; fail=1; }
[ $fail = 0 ] && echo "README set-up command: ok"
exit $fail
