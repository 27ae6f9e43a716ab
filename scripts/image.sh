#!/usr/bin/env bash
# Builds the mesh-cni node agent image offline with buildah (no registry pull, no base image):
# a scratch root file system holding
#   /usr/bin/node                     the Node 24 runtime of node_modules (debug info stripped)
#   /lib/..., /lib64/...              the shared libraries it links (from ldd) and the loader
#   /opt/mesh-cni/install-cni.js      the bundled agent (entrypoint)
#   /opt/mesh-cni/mesh-validation.cjs  the validation check, for an init container using this image
#   /opt/mesh-cni/bin/mesh-cni        the plugin executable (its runtime embedded: Bun by default,
#                                     MESH_PLUGIN_RUNTIME at build), in install-cni's
#                                     --cni-binaries-dir default: what it copies to the host
#   /etc/passwd, /etc/group           root and nobody, so user lookups work
# The default user is nobody (65534): `version` and friends need nothing more. The DaemonSet
# runs it as root with every capability dropped, because the host's CNI dirs belong to root.
# Saved as an OCI archive (default dist/mesh-cni-image.tar, or $1) named
# localhost/mesh-cni:<package version>.
#
#   npm run image            (builds first)
#   bash scripts/image.sh /tmp/x.tar
#
# buildah keeps its working state in a temp --root/--runroot removed at exit, so the machine's
# container storage is never touched.
set -euo pipefail

cd "$(dirname "$0")/.."
ROOT=$PWD
OUT=${1:-$ROOT/dist/mesh-cni-image.tar}
case $OUT in /*) ;; *) OUT=$ROOT/$OUT ;; esac
VERSION=$(node_modules/.bin/node -p 'require("./package.json").version')
IMAGE=localhost/mesh-cni:$VERSION
NODE_BIN=$(readlink -f node_modules/node/bin/node)
COMMIT=$(git rev-parse HEAD 2>/dev/null || echo unknown)

for f in dist/install-cni.js dist/mesh-validation.cjs dist/bin/mesh-cni "$NODE_BIN"; do
  if [[ ! -f $f ]]; then
    echo "image: $f is missing; run npm run build first (npm run image does)" >&2
    exit 1
  fi
done

WORK=$(mktemp -d "${TMPDIR:-/tmp}/mcni-image-XXXXXX")
CTR=
cleanup() {
  if [[ -n $CTR ]]; then buildah "${STORE[@]}" rm "$CTR" >/dev/null 2>&1 || true; fi
  # vfs layers may hold read-only dirs; buildah's own rm above frees what it can.
  rm -rf "$WORK" 2>/dev/null || { chmod -R u+w "$WORK" && rm -rf "$WORK"; }
}
trap cleanup EXIT
STORE=(--root "$WORK/storage" --runroot "$WORK/run" --storage-driver vfs)

# The root file system, laid out in a staging dir and copied in with one `buildah copy` (one layer).
FS=$WORK/rootfs
mkdir -p "$FS/usr/bin" "$FS/opt/mesh-cni/bin" "$FS/etc" "$FS/tmp"
chmod 1777 "$FS/tmp"
strip -o "$FS/usr/bin/node" "$NODE_BIN"
chmod 0755 "$FS/usr/bin/node"
# Every library the runtime and the plugin executable load, at the path the loader looks for it.
# (ldd prints `name => /path (addr)` for libraries and `/path (addr)` for the loader.)
libs=$(ldd "$NODE_BIN" dist/bin/mesh-cni | awk '$2 == "=>" && $3 ~ /^\// { print $3 } $1 ~ /^\// && $2 ~ /^\(/ { print $1 }' | sort -u)
for lib in $libs; do
  mkdir -p "$FS$(dirname "$lib")"
  cp -L "$lib" "$FS$lib"
done
install -m 0644 dist/install-cni.js "$FS/opt/mesh-cni/install-cni.js"
install -m 0644 dist/mesh-validation.cjs "$FS/opt/mesh-cni/mesh-validation.cjs"
install -m 0755 dist/bin/mesh-cni "$FS/opt/mesh-cni/bin/mesh-cni"
printf 'root:x:0:0:root:/root:/sbin/nologin\nnobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin\n' >"$FS/etc/passwd"
printf 'root:x:0:\nnogroup:x:65534:\n' >"$FS/etc/group"

CTR=$(buildah "${STORE[@]}" from --quiet scratch)
buildah "${STORE[@]}" copy --quiet "$CTR" "$FS" / >/dev/null
buildah "${STORE[@]}" config \
  --entrypoint '["/usr/bin/node", "/opt/mesh-cni/install-cni.js"]' \
  --cmd '[]' \
  --user 65534:65534 \
  --workingdir / \
  --port 15014/tcp \
  --os linux --arch amd64 \
  --label org.opencontainers.image.title=mesh-cni \
  --label org.opencontainers.image.description="mesh-cni node agent: install-cni, the mesh-cni plugin, mesh-validation" \
  --label org.opencontainers.image.version="$VERSION" \
  --label org.opencontainers.image.revision="$COMMIT" \
  --label org.opencontainers.image.licenses=Apache-2.0 \
  "$CTR"
mkdir -p "$(dirname "$OUT")"
rm -f "$OUT.tmp"
buildah "${STORE[@]}" commit --quiet --format oci --disable-compression=false --rm "$CTR" "oci-archive:$OUT.tmp:$IMAGE" >/dev/null
CTR=
mv "$OUT.tmp" "$OUT"

rootfs_bytes=$(du -sb "$FS" | cut -f1)
archive_bytes=$(stat -c %s "$OUT")
echo "image: $IMAGE -> $OUT"
echo "image: archive $archive_bytes bytes ($((archive_bytes / 1048576)) MiB), root file system $rootfs_bytes bytes ($((rootfs_bytes / 1048576)) MiB)"
