#!/usr/bin/env bash
# Proves that `npm run test:unit` needs no root and none of scripts/setup-host.sh's Debian
# packages, on a host that has them: as root, copies the work tree (not .git or node_modules,
# which is linked) to a temp dir owned by an unprivileged uid, then in a private mount namespace
# hides every executable of those packages (and /usr/lib/cni, the python module dir) behind an
# empty, non-executable file, and runs `npm run test:unit` as that uid, HOME a temp dir, PATH
# without /usr/sbin or /sbin. util-linux is part of every Linux: only its nsenter is hidden.
#
#   sudo bash scripts/test-unit-proof.sh [uid]      (default uid 1000; exit status is test:unit's)
set -euo pipefail

uid=${1:-1000}
root=$(cd "$(dirname "$0")/.." && pwd)
if [[ $(id -u) != 0 ]]; then
  echo "test-unit-proof: run as root (it makes a mount namespace, then drops to uid $uid)" >&2
  exit 2
fi
[[ -d $root/node_modules ]] || { echo "test-unit-proof: run npm ci first" >&2; exit 2; }

work=$(mktemp -d /tmp/mesh-cni-unit-proof.XXXXXX)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/tree" "$work/home" "$work/empty-dir"
: >"$work/empty-file"
chmod 0644 "$work/empty-file"
tar -C "$root" --exclude=./.git --exclude=./node_modules --exclude=./.sandbox --exclude=./dist -cf - . |
  tar -C "$work/tree" -xf -
ln -s "$root/node_modules" "$work/tree/node_modules"
chown -R "$uid:$uid" "$work/tree" "$work/home"
chmod 0755 "$work"

# What to hide: each command's file (symlinks resolved) and every executable of its package.
hide=()
while IFS=: read -r cmd pkg; do
  if [[ $cmd == /* ]]; then
    [[ -e $cmd ]] && hide+=("$(readlink -f "$cmd")")
  elif path=$(command -v "$cmd" 2>/dev/null); then
    hide+=("$(readlink -f "$path")")
  fi
  [[ $pkg == util-linux ]] && continue
  while read -r f; do
    f=$(readlink -f "$f")
    [[ -f $f && -x $f ]] && hide+=("$f")
  done < <(dpkg -L "$pkg" 2>/dev/null || true)
done < <(sed -n 's/^  \([^ :]*\):\([^ ]*\)$/\1:\2/p' "$root/scripts/setup-host.sh")
hide+=(/usr/lib/cni)
mapfile -t hide < <(printf '%s\n' "${hide[@]}" | sort -u)
echo "test-unit-proof: hiding ${#hide[@]} files of setup-host.sh's packages; running as uid $uid" >&2

export WORK=$work UID_TO=$uid
# shellcheck disable=SC2016 # expanded by the inner bash, from the exported WORK and UID_TO
unshare --mount --propagation private bash -c '
  set -euo pipefail
  for f in "$@"; do
    if [[ -d $f ]]; then
      mount --bind "$WORK/empty-dir" "$f"
    elif [[ -e $f ]]; then
      mount --bind "$WORK/empty-file" "$f"
    fi
  done
  cd "$WORK/tree"
  exec setpriv --reuid="$UID_TO" --regid="$UID_TO" --clear-groups \
    env -i HOME="$WORK/home" PATH=/usr/local/bin:/usr/bin:/bin LANG=C.UTF-8 TMPDIR=/tmp npm run test:unit
' proof "${hide[@]}"
