#!/bin/bash
# Installs everything hostaccel needs to build, run its demo and run its whole test suite on a
# fresh Debian bookworm machine (run as root). Idempotent: re-running only fills in what is missing.
#   - Debian packages: nftables, conntrack, iproute2, iperf3, netperf (non-free), qemu, busybox, clang,
#     and for the container image (scripts/image.sh, test/image): podman, runc, skopeo, mmdebstrap, umoci
#   - the Debian cloud kernel (unpacked under .cache/, NOT installed on the host) for the VM tests
#   - Go modules
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
export DEBIAN_FRONTEND=noninteractive

# netperf lives in bookworm's non-free component.
if ! grep -rqs 'non-free' /etc/apt/sources.list /etc/apt/sources.list.d/; then
	cat >/etc/apt/sources.list.d/hostaccel-nonfree.sources <<'SRC'
Types: deb
URIs: http://deb.debian.org/debian
Suites: bookworm
Components: non-free
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
SRC
fi

PKGS="nftables conntrack iproute2 iperf3 netperf ethtool kmod cpio busybox-static
      qemu-system-x86 clang llvm libbpf-dev tcpdump procps wrk curl jq"
# The container image's tools: optional (scripts/test.sh skips the image and says so without them).
IMAGE_PKGS="podman runc skopeo mmdebstrap umoci"
missing="" image_missing=""
for p in $PKGS; do dpkg -s "$p" >/dev/null 2>&1 || missing="$missing $p"; done
for p in $IMAGE_PKGS; do dpkg -s "$p" >/dev/null 2>&1 || image_missing="$image_missing $p"; done
if [ -n "$missing$image_missing" ]; then
	apt-get update -qq
fi
if [ -n "$missing" ]; then
	apt-get install -y -qq --no-install-recommends $missing >/dev/null
fi
if [ -n "$image_missing" ] && ! apt-get install -y -qq --no-install-recommends $image_missing >/dev/null; then
	echo "setup: could not install$image_missing: no container image build or test here" >&2
fi

# The VM kernel: newest linux-image-*-cloud-amd64 the metapackage points at, unpacked only.
"$ROOT/vmtest/fetch-kernel.sh"

# Go modules.
(cd "$ROOT" && go mod download)
echo "setup: done"
