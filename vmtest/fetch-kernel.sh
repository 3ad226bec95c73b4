#!/bin/bash
# Downloads (never installs) the Debian cloud kernel that linux-image-cloud-amd64 points at and
# unpacks it under .cache/kernel-<ver>/. Prints nothing on success but the version on stdout.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
KPKG=$(apt-cache depends linux-image-cloud-amd64 2>/dev/null | awk '/Depends: linux-image-/{print $2; exit}')
if [ -z "$KPKG" ]; then apt-get update -qq; KPKG=$(apt-cache depends linux-image-cloud-amd64 | awk '/Depends: linux-image-/{print $2; exit}'); fi
KVER=${KPKG#linux-image-}
KDIR=$ROOT/.cache/kernel-$KVER
if [ ! -f "$KDIR/boot/vmlinuz-$KVER" ]; then
	rm -rf "$KDIR" && mkdir -p "$KDIR"
	if ! (cd "$KDIR" && apt-get download -qq "$KPKG" >/dev/null 2>&1); then
		# Stale package lists: the mirror moved to a newer kernel ABI since they were read.
		rmdir "$KDIR"
		apt-get -o DPkg::Lock::Timeout=600 update -qq
		KPKG=$(apt-cache depends linux-image-cloud-amd64 | awk '/Depends: linux-image-/{print $2; exit}')
		KVER=${KPKG#linux-image-}
		KDIR=$ROOT/.cache/kernel-$KVER
		rm -rf "$KDIR" && mkdir -p "$KDIR"
		(cd "$KDIR" && apt-get download -qq "$KPKG" >/dev/null) || { echo "fetch-kernel: could not download $KPKG" >&2; exit 1; }
	fi
	(cd "$KDIR" && dpkg -x ./*.deb . && rm -f ./*.deb)
	depmod -b "$KDIR" "$KVER" 2>/dev/null || true
fi
ln -sfn "kernel-$KVER" "$ROOT/.cache/kernel"
echo "$KVER"
