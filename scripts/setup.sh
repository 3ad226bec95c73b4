#!/bin/bash
# Installs everything hostaccel needs to build, run its demo and run its whole test suite on a
# fresh Debian bookworm machine (run as root). Idempotent: re-running only fills in what is missing.
#   - Debian packages: nftables, conntrack, iproute2, iperf3, netperf (non-free), qemu, busybox, clang,
#     and for the container image (scripts/image.sh, test/image): podman, runc, skopeo, mmdebstrap, umoci
#   - the Debian cloud kernel (unpacked under .cache/, NOT installed on the host) for the VM tests
#   - Go (go.mod's version, from go.dev, checked against its published SHA-256) where no Go of
#     1.21 or later is here to fetch it itself; then Go modules
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
export DEBIAN_FRONTEND=noninteractive

# apt waits for a dpkg lock (unattended-upgrades on a machine just booted) instead of failing.
APT_OPTS="-o DPkg::Lock::Timeout=600"

# netperf lives in bookworm's non-free component (the word alone: the installer's default
# sources have non-free-firmware, which is not it).
if ! grep -rqsE '(^|[[:space:]])non-free([[:space:]]|$)' /etc/apt/sources.list /etc/apt/sources.list.d/; then
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
	apt-get $APT_OPTS update -qq
fi
if [ -n "$missing" ]; then
	apt-get $APT_OPTS install -y -qq --no-install-recommends $missing >/dev/null
fi
if [ -n "$image_missing" ] && ! apt-get $APT_OPTS install -y -qq --no-install-recommends $image_missing >/dev/null; then
	echo "setup: could not install$image_missing: no container image build or test here" >&2
fi

# The VM kernel: newest linux-image-*-cloud-amd64 the metapackage points at, unpacked only.
"$ROOT/vmtest/fetch-kernel.sh"

# Go: go.mod names the version. A Go of 1.21 or later fetches it itself (GOTOOLCHAIN=auto, checked
# by the Go checksum database); bookworm's golang-go is 1.19, too old for that, so without a
# newer one this installs go.mod's release from go.dev into /usr/local/go, checked against the
# SHA-256 go.dev publishes for it.
export PATH=/usr/local/go/bin:$PATH # (before bookworm's /usr/bin/go, 1.19, once installed)
want_go=$(awk '/^go /{print $2; exit}' "$ROOT/go.mod")
go_ok() {
	local v
	v=$(go env GOVERSION 2>/dev/null) || return 1 # go1.26.8
	v=${v#go}
	[ "${v%%.*}" -gt 1 ] || { v=${v#*.}; [ "${v%%.*}" -ge 21 ]; }
}
if ! command -v go >/dev/null || ! go_ok; then
	tgz=go$want_go.linux-amd64.tar.gz
	sum=$(curl -fsSL --retry 3 'https://go.dev/dl/?mode=json&include=all' |
		jq -r --arg f "$tgz" '.[].files[] | select(.filename == $f) | .sha256' | head -1) || sum=
	[ -n "$sum" ] || { echo "setup: no Go of 1.21 or later here, and go.dev (unreachable?) lists no $tgz: install Go $want_go (https://go.dev/dl/) and run this again" >&2; exit 1; }
	tmp=$(mktemp -d)
	curl -fsSL --retry 3 -o "$tmp/$tgz" "https://go.dev/dl/$tgz"
	echo "$sum  $tmp/$tgz" | sha256sum -c --quiet - || { echo "setup: $tgz does not match go.dev's SHA-256" >&2; exit 1; }
	rm -rf /usr/local/go && tar -C /usr/local -xzf "$tmp/$tgz" && rm -rf "$tmp"
	echo "setup: installed Go $want_go in /usr/local/go (add /usr/local/go/bin to your PATH)" >&2
fi

# Go modules.
(cd "$ROOT" && go mod download)
echo "setup: done"
