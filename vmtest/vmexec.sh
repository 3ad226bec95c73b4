#!/bin/bash
# `go test -exec` wrapper: runs a Go test binary inside the VM (see run-in-vm.sh).
#   CGO_ENABLED=0 go test -p 1 -exec "$PWD/vmtest/vmexec.sh" ./internal/flowtable/...
# go runs `vmexec.sh /tmp/go-build.../x.test -test.flags...` with cwd = the package directory.
# The binary is copied to /vmtest/ in the guest and runs in a directory with the same absolute
# path as the package directory, holding a copy of ./testdata (if any). Its output comes back on
# stdout and its exit status is ours. HOSTACCEL_IN_VM=1 is set in the guest.
# env: VMEXEC_ENV="A=1 B=2"      more variables to export in the guest
#      VMEXEC_FILES="p1 p2"      more host files/dirs to copy into /vmtest (also first in PATH)
#      VMEXEC_MIRROR="../../x"   host files/dirs (relative to the package dir) copied to the same
#                                absolute path in the guest, e.g. fixtures outside testdata/
#      VMEXEC_OPTS="-i -m 2G"    more run-in-vm.sh options (default timeout: -t 900, or go test's
#                                -timeout and a minute, so that the test binary's own timeout
#                                fires first and says where it hung)
#      VMEXEC_LOG=FILE           keep the whole console (kernel messages included)
set -euo pipefail
[ $# -ge 1 ] || { echo "usage: vmexec.sh TEST_BINARY [ARGS...]" >&2; exit 2; }
HERE=$(cd "$(dirname "$(readlink -f "$0")")" && pwd)
bin=$1
shift

limit=900
for a in "$@"; do
	case $a in -test.timeout=*)
		d=${a#-test.timeout=} s=0 # a Go duration: 40m0s, 1h0m0s, 900s
		[[ $d =~ ([0-9]+)h ]] && s=$((s + BASH_REMATCH[1] * 3600))
		[[ $d =~ ([0-9]+)m([0-9]|$) ]] && s=$((s + BASH_REMATCH[1] * 60))
		[[ $d =~ [0-9]ms$ ]] || { [[ $d =~ ([0-9]+)(\.[0-9]+)?s$ ]] && s=$((s + BASH_REMATCH[1])); }
		[ "$s" -gt 0 ] && limit=$((s + 60))
		;;
	esac
done
args=(-q -t "$limit" -e HOSTACCEL_IN_VM=1 -C "$PWD" -f "$bin")
[ -d testdata ] && args+=(-f "$PWD/testdata:$PWD/testdata")
read -ra xs <<<"${VMEXEC_FILES:-}"
for f in "${xs[@]}"; do args+=(-f "$f"); done
read -ra xs <<<"${VMEXEC_MIRROR:-}"
for f in "${xs[@]}"; do # missing ones are skipped: with ./... the paths differ per package
	f=$(realpath -s -- "$f")
	[ ! -e "$f" ] || args+=(-f "$f:$f")
done
read -ra xs <<<"${VMEXEC_ENV:-}"
for e in "${xs[@]}"; do args+=(-e "$e"); done
[ -z "${VMEXEC_LOG:-}" ] || args+=(-l "$VMEXEC_LOG")
read -ra xs <<<"${VMEXEC_OPTS:-}"
exec "$HERE/run-in-vm.sh" "${args[@]}" "${xs[@]}" -- "/vmtest/$(basename "$bin")" "$@"
