#!/usr/bin/env bash
# Builds the mesh-cni node agent image offline with buildah (no registry pull, no base image):
# a scratch root file system holding
#   /usr/bin/node                     the Node 24 runtime of node_modules (debug info stripped)
#   /lib/..., /lib64/...              the shared libraries it links (from ldd) and the loader
#   /opt/mesh-cni/install-cni.js      the bundled agent (entrypoint)
#   /opt/mesh-cni/compile-cache/      its V8 code cache, made by the build (scripts/compile-cache.ts)
#   /opt/mesh-cni/mesh-validation.cjs  the validation check, for an init container using this image
#   /opt/mesh-cni/native/seqpacket.node  the SOCK_SEQPACKET + SCM_RIGHTS addon (ambient: ztunnel's socket)
#   /opt/mesh-cni/bin/mesh-cni        the plugin executable (its runtime embedded: Bun by default,
#                                     MESH_PLUGIN_RUNTIME at build), in install-cni's
#                                     --cni-binaries-dir default: what it copies to the host
#   /etc/passwd, /etc/group           root and nobody, so user lookups work
#   /usr/bin/nsenter, /usr/sbin/ip,   the tools repair in place runs in a pod's netns (below):
#   /usr/sbin/xtables-*-multi + links nsenter, iptables/ip6tables of both flavours, iproute2,
#   /usr/lib/<triplet>/xtables/       the iptables extensions they dlopen
#   /usr/sbin/ipset                   ambient mode's probe set on the node (libipset from ldd)
#   /usr/sbin/nft                     nftables (Debian bookworm's 1.0.6), for --native-nftables:
#                                     the start-up probe, ambient's and repair's nft tables
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

for f in dist/install-cni.js dist/compile-cache dist/mesh-validation.cjs dist/bin/mesh-cni dist/native/seqpacket.node "$NODE_BIN"; do
  if [[ ! -e $f ]]; then
    echo "image: $f is missing; run npm run build first (npm run image does)" >&2
    exit 1
  fi
done

# Repair in place (--repair-repair-pods, the repair-in-place component of deploy/) applies the
# redirect rules inside a running pod's netns: `nsenter --net=/proc/self/fd/3 -- iptables-...-restore`
# with the netns fd the agent holds, and `ip -j addr` / `ip rule` / `ip route` there. The image
# carries its own copies of these tools (this machine's, Debian's) rather than running the host's
# through `nsenter --mount=/host/proc/1/ns/mnt`: the host may have no iptables or iproute2 at all
# (Talos, Bottlerocket-like nodes), /proc/1 may be unreadable to the agent, and entering the host's
# mount namespace would need more capabilities and would run host binaries we never tested. Both
# iptables flavours, since the pod's rules must go where the host's kernel users put theirs (the
# plugin picks the flavour; see cni-plugin/netns/iptables.ts). No unflavoured `iptables` link: every
# caller names its flavour. Extensions: every libxt_/libipt_/libip6t_ one (about 280 KB compressed),
# not only those our rules use, because iptables-save must also print whatever foreign rules a pod's
# netns holds; no ebtables/arptables ones (nothing runs those).
IPT_LEGACY=$(readlink -f "$(PATH=/usr/sbin:/sbin:$PATH command -v xtables-legacy-multi || true)")
IPT_NFT=$(readlink -f "$(PATH=/usr/sbin:/sbin:$PATH command -v xtables-nft-multi || true)")
NSENTER=$(readlink -f "$(PATH=/usr/bin:/bin:$PATH command -v nsenter || true)")
IPROUTE=$(readlink -f "$(PATH=/usr/sbin:/sbin:$PATH command -v ip || true)")
# Ambient mode (the ambient component of deploy/) keeps the node's kubelet-probe set
# (mesh-inpod-probes-v4/-v6, hash:ip with the pod UID as comment) with ipset; NET_ADMIN is all it needs.
IPSET=$(readlink -f "$(PATH=/usr/sbin:/sbin:$PATH command -v ipset || true)")
# --native-nftables (the native-nftables component of deploy/): the agent probes `nft` at start
# (version, JSON, `nft list tables` in the node's netns), and ambient mode and in-place repair
# write their tables with it. Debian bookworm's nftables package, nft 1.0.6, on purpose an old
# one. nft reads back everything in a netns, whoever wrote it, and a newer nft may write what an
# older one cannot read: nft 1.1.2 began storing user data with each set, and a host's nft of
# 1.1.1 or older then crashed (segfault) listing or changing that netns's ruleset; Istio's ambient
# nftables mode hit it on users' nodes, its image's nft being newer than theirs. An image nft no
# newer than the nodes' keeps what the agent writes readable by the host's nft, the one the
# plugin runs (the plugin never uses this copy) and the one node admins and kube-proxy use; 1.0.6
# is older than the nft of most current node systems. The build takes the machine's nft only if
# it is at least 1.0.1 (the agent's own floor) and older than 1.1.2 (known to break older nodes).
NFT=$(readlink -f "$(PATH=/usr/sbin:/sbin:$PATH command -v nft || true)")
# libxtables dlopens its extensions from the dir compiled into it (Debian: /usr/lib/<triplet>/xtables).
XT_STANDARD=$(find /usr/lib -maxdepth 3 -path '*/xtables/libxt_standard.so' -print -quit)
XT_DIR=$(dirname "${XT_STANDARD:-/nonexistent/xtables/libxt_standard.so}")
for f in "$IPT_LEGACY" "$IPT_NFT" "$NSENTER" "$IPROUTE" "$IPSET" "$NFT" "$XT_DIR/libxt_standard.so"; do
  if [[ ! -f $f ]]; then
    echo "image: ${f:-a tool} is missing: install iptables (>= 1.8, both flavours), util-linux, iproute2, ipset and nftables" >&2
    exit 1
  fi
done
NFT_VERSION=$("$NFT" --version | sed -n 's/^nftables v\([0-9][0-9.]*\).*/\1/p')
if ! printf '1.0.1\n%s\n' "$NFT_VERSION" | sort -C -V || printf '1.1.2\n%s\n' "$NFT_VERSION" | sort -C -V; then
  echo "image: $NFT is nftables ${NFT_VERSION:-of unknown version}; the image needs >= 1.0.1 and < 1.1.2 (Debian bookworm's 1.0.6): an older one lacks what the agent checks for, and 1.1.2 and later write sets that older nft on the nodes crashes on" >&2
  exit 1
fi

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
# The repair-in-place tools (see above) and their extensions; symlinks stay symlinks.
XT_FS=$FS$XT_DIR
mkdir -p "$XT_FS" "$FS/usr/sbin"
cp -P "$XT_DIR"/libxt_*.so "$XT_DIR"/libipt_*.so "$XT_DIR"/libip6t_*.so "$XT_FS/"
install -m 0755 "$IPT_LEGACY" "$FS/usr/sbin/xtables-legacy-multi"
install -m 0755 "$IPT_NFT" "$FS/usr/sbin/xtables-nft-multi"
install -m 0755 "$NSENTER" "$FS/usr/bin/nsenter"
install -m 0755 "$IPROUTE" "$FS/usr/sbin/ip"
install -m 0755 "$IPSET" "$FS/usr/sbin/ipset"
install -m 0755 "$NFT" "$FS/usr/sbin/nft"
for fam in iptables ip6tables; do
  for what in '' -restore -save; do
    ln -s xtables-legacy-multi "$FS/usr/sbin/$fam-legacy$what"
    ln -s xtables-nft-multi "$FS/usr/sbin/$fam-nft$what"
  done
done
# Every library the runtime, the plugin executable, the tools and the extensions load, at the
# path the loader looks for it.
# (ldd prints `name => /path (addr)` for libraries and `/path (addr)` for the loader.)
mapfile -t xt_real < <(find "$XT_FS" -type f -name '*.so' -printf "$XT_DIR/%f\n")
loaded=("$NODE_BIN" dist/bin/mesh-cni dist/native/seqpacket.node
  "$IPT_LEGACY" "$IPT_NFT" "$NSENTER" "$IPROUTE" "$IPSET" "$NFT" "${xt_real[@]}")
libs=$(ldd "${loaded[@]}" | awk '$2 == "=>" && $3 ~ /^\// { print $3 } $1 ~ /^\// && $2 ~ /^\(/ { print $1 }' | sort -u)
for lib in $libs; do
  mkdir -p "$FS$(dirname "$lib")"
  cp -L "$lib" "$FS$lib"
done
install -m 0644 dist/install-cni.js "$FS/opt/mesh-cni/install-cni.js"
# The bundle's V8 code cache (scripts/compile-cache.ts): read-only in the image, used through the
# NODE_COMPILE_CACHE* variables below; readable by nobody too, for `version`.
cp -r dist/compile-cache "$FS/opt/mesh-cni/compile-cache"
find "$FS/opt/mesh-cni/compile-cache" -type d -exec chmod 0755 {} + -o -type f -exec chmod 0644 {} +
install -D -m 0644 dist/native/seqpacket.node "$FS/opt/mesh-cni/native/seqpacket.node" # ztunnel socket addon
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
  --env PATH=/usr/sbin:/usr/bin \
  --env NODE_COMPILE_CACHE=/opt/mesh-cni/compile-cache \
  --env NODE_COMPILE_CACHE_PORTABLE=1 \
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
