#!/bin/bash
# Builds the agent's container image without Docker, from Debian packages (run as root on
# Debian bookworm; scripts/setup.sh installs mmdebstrap, umoci, skopeo and podman):
#   1. mmdebstrap extracts a minimal bookworm root with nft and its libraries only (no shell,
#      no package manager, no dpkg: the agent runs nothing but nft),
#   2. the static agent binary (the lean build: no benchmark) goes into a second layer,
#   3. umoci writes an OCI image layout under $OUT/oci, and skopeo copies it into podman's storage as $IMAGE.
# Reproducible: every timestamp is SOURCE_DATE_EPOCH (default: the last commit's time), the tar
# streams are sorted and owned by root, so the same commit and the same Debian packages give
# the same digest. Prints the image's size and digest on its last lines.
#
#   scripts/image.sh                                    # localhost/hostaccel:dev
#   IMAGE=ghcr.io/you/hostaccel:v1 scripts/image.sh     # then: podman push ghcr.io/you/hostaccel:v1
#   NO_LOAD=1 scripts/image.sh                          # the OCI layout only (skopeo copy oci:... docker://...)
#
#   IMAGE            the name podman gets (default localhost/hostaccel:dev)
#   OUT              work and output directory (default .cache/image)
#   IMAGE_PACKAGES   Debian packages in the image (default nftables; e.g. "nftables iproute2
#                    conntrack" for debugging tools, which adds about 10 MB)
#   MIRROR           Debian mirror (default http://deb.debian.org/debian; a
#                    snapshot.debian.org URL pins the packages for bit-identical rebuilds)
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
IMAGE=${IMAGE:-localhost/hostaccel:dev}
OUT=${OUT:-$ROOT/.cache/image}
IMAGE_PACKAGES=${IMAGE_PACKAGES:-nftables}
MIRROR=${MIRROR:-http://deb.debian.org/debian}
if [ -z "${SOURCE_DATE_EPOCH:-}" ]; then
	SOURCE_DATE_EPOCH=$(git -C "$ROOT" log -1 --format=%ct 2>/dev/null || echo 0)
fi
export SOURCE_DATE_EPOCH
CREATED=$(date -u -d "@$SOURCE_DATE_EPOCH" +%Y-%m-%dT%H:%M:%SZ)
log() { echo "image: $*" >&2; }
for tool in mmdebstrap umoci; do
	command -v "$tool" >/dev/null || { echo "image: $tool is missing (scripts/setup.sh installs it)" >&2; exit 1; }
done
[ "$(id -u)" = 0 ] || { echo "image: run as root (mmdebstrap --mode=root)" >&2; exit 1; }

rm -rf "$OUT"
mkdir -p "$OUT/layer/usr/local/bin"
t0=$(date +%s)

# The agent: static, no VCS-dependent paths (-trimpath), no benchmark (-tags bench is not set).
(cd "$ROOT" && CGO_ENABLED=0 go build -trimpath -ldflags="-s -w" -o "$OUT/layer/usr/local/bin/hostaccel" ./cmd/hostaccel)

# The Debian layer. extract: the packages' files and their dependencies', unpacked without
# running maintainer scripts (nothing here needs them), so no shell and no dpkg come along.
log "mmdebstrap bookworm: $IMAGE_PACKAGES"
# shellcheck disable=SC2016 # the hooks' $1 is mmdebstrap's root directory
mmdebstrap --quiet --mode=root --variant=extract --format=tar --skip=output/dev \
	--include="${IMAGE_PACKAGES// /,}" \
	--customize-hook='rm -rf "$1"/usr/share/doc "$1"/usr/share/man "$1"/usr/share/lintian "$1"/usr/share/info "$1"/etc/hostname "$1"/var/cache/apt "$1"/var/lib/apt "$1"/var/log/apt "$1"/etc/apt' \
	bookworm "$OUT/debian.tar" "$MIRROR"

tar --sort=name --mtime="@$SOURCE_DATE_EPOCH" --owner=0 --group=0 --numeric-owner \
	-cf "$OUT/agent.tar" -C "$OUT/layer" usr

umoci init --layout "$OUT/oci"
umoci new --image "$OUT/oci:latest"
umoci raw add-layer --image "$OUT/oci:latest" --history.created="$CREATED" \
	--history.created_by="mmdebstrap --variant=extract --include=$IMAGE_PACKAGES bookworm" "$OUT/debian.tar"
umoci raw add-layer --image "$OUT/oci:latest" --history.created="$CREATED" \
	--history.created_by="hostaccel agent (CGO_ENABLED=0 go build -trimpath)" "$OUT/agent.tar"
umoci config --image "$OUT/oci:latest" --created="$CREATED" --author="hostaccel" --no-history \
	--config.entrypoint=/usr/local/bin/hostaccel \
	--config.env=PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
	--config.label=org.opencontainers.image.source=https://github.com/hostaccel/hostaccel
umoci gc --layout "$OUT/oci"
rm -rf "$OUT/layer" "$OUT/debian.tar" "$OUT/agent.tar"

# The manifest's digest and the compressed size (what a node pulls: config + layers).
blob() { echo "$OUT/oci/blobs/sha256/${1#sha256:}"; }
manifest=$(jq -r '.manifests[0].digest' "$OUT/oci/index.json")
size=$(jq '[.config.size] + [.layers[].size] | add' "$(blob "$manifest")")
layers=$(jq '.layers | length' "$(blob "$manifest")")
if [ -z "${NO_LOAD:-}" ]; then
	command -v skopeo >/dev/null || { echo "image: skopeo is missing (scripts/setup.sh installs it)" >&2; exit 1; }
	skopeo copy --quiet "oci:$OUT/oci:latest" "containers-storage:$IMAGE" 2>"$OUT/skopeo.log" ||
		{ cat "$OUT/skopeo.log" >&2; exit 1; }
	log "loaded into podman as $IMAGE (uncompressed $(podman image inspect --format '{{.Size}}' "$IMAGE") bytes)"
fi
log "built in $(($(date +%s) - t0)) s, $layers layers"
echo "size: $size bytes compressed ($((size / 1024 / 1024)) MiB)"
echo "digest: $manifest"
echo "layout: $OUT/oci:latest"
