#!/usr/bin/env bash
# Installs the Debian packages the tests and benchmarks use, once: each is installed only when
# its command is missing, so a second run does nothing and needs no network.
# Run as root (the tests create network namespaces and iptables rules anyway). Recommended
# packages come too: podman's (crun, catatonit, fuse-overlayfs...) are what it was tested with.
set -euo pipefail

# command-to-check:debian-package
needs=(
  iptables:iptables
  nft:nftables
  ip:iproute2
  nsenter:util-linux
  /usr/lib/cni/bridge:containernetworking-plugins
  podman:podman
  runc:runc
  containerd:containerd
  buildah:buildah
  strip:binutils
  busybox:busybox-static
  zsh:zsh
  fish:fish
  promtool:prometheus
  /usr/lib/python3/dist-packages/prometheus_client:python3-prometheus-client
  shellcheck:shellcheck
  yamllint:yamllint
  hyperfine:hyperfine
  chromium:chromium
  kubectl:kubernetes-client
  openssl:openssl
  /usr/bin/python3:python3
  /usr/bin/qemu-x86_64:qemu-user
  cc:gcc
  /usr/include/stdio.h:libc6-dev
  ipset:ipset
  /usr/include/uv.h:libuv1-dev
)

missing=()
for pair in "${needs[@]}"; do
  cmd=${pair%%:*}
  pkg=${pair#*:}
  if [[ $cmd == /* ]]; then [[ -e $cmd ]] && continue; else command -v "$cmd" >/dev/null 2>&1 && continue; fi
  missing+=("$pkg")
done

if ((${#missing[@]} == 0)); then
  exit 0
fi
if [[ $(id -u) -ne 0 ]]; then
  echo "setup-host: missing Debian packages: ${missing[*]}; run as root or install them: apt-get install ${missing[*]}" >&2
  exit 1
fi
echo "setup-host: installing ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq "${missing[@]}" >/dev/null
