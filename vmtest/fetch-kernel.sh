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
	(cd "$KDIR" && apt-get download -qq "$KPKG" >/dev/null 2>&1 && dpkg -x ./*.deb . && rm -f ./*.deb)
	depmod -b "$KDIR" "$KVER" 2>/dev/null || true
fi
ln -sfn "kernel-$KVER" "$ROOT/.cache/kernel"
echo "$KVER"
