#!/bin/bash
# Builds the binaries the Kubernetes tests and demo run (kube-apiserver, kubectl, etcd) from the
# Go module proxy, once per machine, into
#     ${HOSTACCEL_K8S_CACHE:-~/.cache/hostaccel-k8s}/k8s-v$K8S_VERSION-etcd-v$ETCD_VERSION/
# and prints that directory on its last line of stdout. A finished build is marked by a stamp
# file; later runs return at once. Concurrent runs wait for each other (flock).
#
# Cold (no k8s modules downloaded yet), on 2 cores, this took 408 s (kube-apiserver and kubectl
# 350 s, etcd 58 s); with warm Go caches 12 s. Nothing but Go modules is downloaded.
#
#   K8S_VERSION   k8s.io/kubernetes tag without the v (default 1.37.1; the proxy refuses 1.37.2's zip)
#   ETCD_VERSION  go.etcd.io/etcd/server/v3 tag without the v (default 3.7.3; Debian's etcd is too old)
set -euo pipefail

K8S_VERSION=${K8S_VERSION:-1.37.1}
ETCD_VERSION=${ETCD_VERSION:-3.7.3}
CACHE=${HOSTACCEL_K8S_CACHE:-$HOME/.cache/hostaccel-k8s}
DEST=$CACHE/k8s-v$K8S_VERSION-etcd-v$ETCD_VERSION
STAMP=$DEST/.complete

log() { echo "k8s-build-test-bins: $*" >&2; }

if [ -f "$STAMP" ]; then
	echo "$DEST"
	exit 0
fi
mkdir -p "$CACHE"
exec 9>"$CACHE/.build.lock"
flock 9
if [ -f "$STAMP" ]; then # another run finished it while we waited
	echo "$DEST"
	exit 0
fi

TMP=$(mktemp -d "$CACHE/.build.XXXXXX")
trap 'rm -rf "$TMP"' EXIT
export GOFLAGS=-mod=mod GOWORK=off CGO_ENABLED=0

# pin_local_replaces MODFILE VERSION: for every "X => ./path" or "X => ../path" replace in MODFILE
# (modules a monorepo publishes separately), pin X to VERSION from the proxy in the current module.
pin_local_replaces() {
	local modfile=$1 version=$2 mod
	go mod edit -json "$modfile" |
		jq -r '.Replace[]? | select(.New.Path | startswith("./") or startswith("../")) | .Old.Path' |
		while read -r mod; do
			case $mod in k8s.io/sample-*) continue ;; esac # examples, never published
			go mod edit -replace "$mod=$mod@$version"
		done
}

start=$(date +%s)

# build_pinned NAME MODULE VERSION PIN LDFLAGS OUT PKG...: in a scratch module NAME that requires
# MODULE@vVERSION with MODULE's local replaces pinned to PIN, builds PKG... into OUT.
build_pinned() {
	local name=$1 module=$2 version=$3 pin=$4 ldflags=$5 out=$6
	shift 6
	mkdir "$TMP/$name"
	(
		cd "$TMP/$name"
		go mod init "hostaccel.local/$name" >/dev/null 2>&1
		go mod edit -go=1.26 -require="$module@v$version"
		pin_local_replaces "$(go mod download -json "$module@v$version" | jq -r .GoMod)" "$pin"
		go build -trimpath -ldflags "$ldflags" -o "$out" "$@"
	)
}

# kube-apiserver and kubectl: k8s.io/kubernetes requires its staging modules at v0.0.0 and
# replaces them with ./staging; a consumer pins them to the published v0.<minor>.<patch>.
log "building kube-apiserver and kubectl v$K8S_VERSION"
minor=${K8S_VERSION#*.}
minor=${minor%%.*}
ldflags="-s -w"
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
	ldflags="$ldflags -X $pkg.gitVersion=v$K8S_VERSION -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor -X $pkg.gitTreeState=clean"
done
build_pinned k8sbins k8s.io/kubernetes "$K8S_VERSION" "v0.${K8S_VERSION#*.}" "$ldflags" "$TMP/out/" \
	k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kubectl
mid=$(date +%s)
log "kube-apiserver and kubectl built in $((mid - start))s"

# etcd: the server module replaces its sibling modules with ../ paths, so `go install
# module@version` refuses it; pin the siblings to the same tag instead.
log "building etcd v$ETCD_VERSION"
build_pinned etcdbin go.etcd.io/etcd/server/v3 "$ETCD_VERSION" "v$ETCD_VERSION" "-s -w" "$TMP/out/etcd" go.etcd.io/etcd/server/v3
end=$(date +%s)
log "etcd built in $((end - mid))s; total $((end - start))s"

"$TMP/out/kube-apiserver" --version >&2
"$TMP/out/etcd" --version >&2
rm -rf "$DEST"
mv "$TMP/out" "$DEST"
echo "built in $((end - start))s on $(nproc) cores, $(date -u +%FT%TZ)" >"$STAMP"
echo "$DEST"
