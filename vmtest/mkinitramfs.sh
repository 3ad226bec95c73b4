#!/bin/bash
# Builds the base initramfs (uncompressed newc cpio) for the hostaccel test VM from the
# Debian cloud kernel unpacked under .cache/kernel (fetch-kernel.sh is run if it is missing).
#
# usage: mkinitramfs.sh [OUT]          (default: <repo>/.cache/vm-base.cpio)
# env:   VMTEST_EXTRA_BINS="a b"  extra host programs to copy (with their shared libraries)
#        VMTEST_EXTRA_MODS="m n"  extra kernel modules (with their dependency closure)
#        VMTEST_REBUILD=1         rebuild even if the stamp matches
#
# Rebuilds only when OUT.stamp differs from a hash of this script, ./init, the kernel version
# and the two VMTEST_EXTRA_* lists. Safe to run concurrently (flock; OUT replaced atomically).
set -euo pipefail

HERE=$(cd "$(dirname "$(readlink -f "$0")")" && pwd)
ROOT=$(dirname "$HERE")
OUT=${1:-$ROOT/.cache/vm-base.cpio}
KDIR=$ROOT/.cache/kernel

[ -d "$KDIR/lib/modules" ] || bash "$HERE/fetch-kernel.sh" >/dev/null
KVER=$(basename "$(ls -d "$KDIR"/lib/modules/*/ | head -1)")
MD=$KDIR/lib/modules/$KVER

# Programs: required ones fail the build when missing, optional ones only warn.
REQ_BINS="bash nft conntrack ip tc iperf3 netperf netserver ethtool kmod tcpdump taskset"
OPT_BINS="ss bridge nstat strace ${VMTEST_EXTRA_BINS:-}"
# Modules (a name that is built in or absent is skipped with a warning). nft_objref carries
# the load balancer's named counters (a module in the Debian cloud kernel, autoloaded); tls
# and the AES-GCM modules give kernel TLS (internal/sockmap's TestKernelTLS...).
MODS="nf_tables nf_flow_table nf_flow_table_inet nft_flow_offload nft_ct nft_nat nft_chain_nat
	nft_masq nft_redir nft_numgen nft_hash nft_fwd_netdev nft_dup_netdev nft_reject_inet
	nft_fib_inet nft_limit nft_counter nft_log nft_quota nft_socket nft_objref nft_reject_ipv4
	nf_conntrack nf_conntrack_netlink nf_nat veth dummy bridge br_netfilter macvlan
	sch_ingress sch_clsact cls_flower cls_u32 cls_bpf cls_matchall
	act_mirred act_gact act_bpf act_vlan act_tunnel_key act_csum act_pedit act_skbedit act_ct
	pktgen 8021q vxlan geneve
	tls gf128mul ghash-generic ctr gcm aes_ti cryptd ${VMTEST_EXTRA_MODS:-}"

mkdir -p "$(dirname "$OUT")"
exec 9>"$OUT.lock"
flock 9
stamp=$( { cat "$HERE/mkinitramfs.sh" "$HERE/init"; echo "$KVER|${VMTEST_EXTRA_BINS:-}|${VMTEST_EXTRA_MODS:-}"; } | sha256sum | cut -c1-16)
if [ -z "${VMTEST_REBUILD:-}" ] && [ -f "$OUT" ] && [ "$(cat "$OUT.stamp" 2>/dev/null)" = "$stamp" ]; then
	exit 0
fi

T0=$(date +%s%N)
S=$(mktemp -d "${TMPDIR:-/tmp}/vmtest-initramfs.XXXXXX")
trap 'rm -rf "$S"' EXIT

# merged-/usr layout like the host, so ldd paths and /sbin/modprobe resolve
mkdir -p "$S"/{usr/bin,usr/sbin,usr/lib/x86_64-linux-gnu,usr/lib64,busybox,etc,proc,sys,dev,run,tmp,root,var,vmtest}
for d in bin sbin lib lib64; do ln -s "usr/$d" "$S/$d"; done
ln -s ../run "$S/var/run"
chmod 1777 "$S/tmp"

# busybox applets live in /busybox, last in PATH, so the real tools win. /bin/sh is bash:
# Debian's busybox sh runs its own applets (ip, modprobe, ...) even when PATH has real ones.
cp /bin/busybox "$S/busybox/busybox"
for a in $(/bin/busybox --list); do [ "$a" = busybox ] || ln -s busybox "$S/busybox/$a"; done

copy_file() { # copy host path $1 to the same path under $S/usr (dereferenced: /lib/x -> /usr/lib/x)
	local rel=${1#/}
	local dst=$S/usr/${rel#usr/}
	[ -e "$dst" ] || install -D -m 0755 "$(readlink -f "$1")" "$dst"
}
copy_bin() {
	local p lib
	p=$(command -v "$1") || return 1
	copy_file "$p"
	for lib in $(ldd "$p" 2>/dev/null | grep -oE '/[^ ]+'); do copy_file "$lib"; done
}
for b in $REQ_BINS; do copy_bin "$b" || { echo "mkinitramfs: required program $b not found" >&2; exit 1; }; done
for b in $OPT_BINS; do copy_bin "$b" || echo "mkinitramfs: warning: optional program $b not found, skipped" >&2; done
ln -sf bash "$S/usr/bin/sh"
for a in modprobe insmod rmmod lsmod depmod modinfo; do ln -sf ../bin/kmod "$S/usr/sbin/$a"; done
[ -d /usr/lib/x86_64-linux-gnu/tc ] && cp -r /usr/lib/x86_64-linux-gnu/tc "$S/usr/lib/x86_64-linux-gnu/" # netem tables

# /etc: what nft, ip, tc, tcpdump and glibc look up
cp /etc/protocols /etc/services /etc/ethertypes "$S/etc/" 2>/dev/null || true
[ -d /etc/iproute2 ] && cp -r /etc/iproute2 "$S/etc/"
[ -d /usr/share/iproute2 ] && mkdir -p "$S/usr/share" && cp -r /usr/share/iproute2 "$S/usr/share/"
printf 'root:x:0:0:root:/root:/bin/sh\ntcpdump:x:104:104::/nonexistent:/bin/false\nnobody:x:65534:65534::/nonexistent:/bin/false\n' >"$S/etc/passwd"
printf 'root:x:0:\ntcpdump:x:104:\nnogroup:x:65534:\n' >"$S/etc/group"
printf '127.0.0.1\tlocalhost vm\n::1\tlocalhost ip6-localhost\n' >"$S/etc/hosts"
printf 'passwd: files\ngroup: files\nhosts: files\nprotocols: files\nservices: files\n' >"$S/etc/nsswitch.conf"
echo vm >"$S/etc/hostname"

# kernel modules: dependency closure resolved by the host's modprobe against the unpacked tree
[ -f "$MD/modules.dep" ] || depmod -b "$KDIR" "$KVER"
nmod=0
for m in $MODS; do
	if ! deps=$(modprobe -d "$KDIR" -S "$KVER" --show-depends "$m" 2>/dev/null); then
		echo "mkinitramfs: warning: module $m not found in $KVER, skipped" >&2
		continue
	fi
	if ! grep -q '^insmod ' <<<"$deps"; then
		echo "mkinitramfs: note: module $m is built into $KVER, skipped" >&2
		continue
	fi
	for ko in $(awk '$1 == "insmod" { print $2 }' <<<"$deps"); do
		dst=$S/usr/lib/modules/$KVER/${ko#"$MD"/}
		[ -e "$dst" ] || { install -D -m 0644 "$ko" "$dst"; nmod=$((nmod + 1)); }
	done
done
cp "$MD"/modules.order "$MD"/modules.builtin "$MD"/modules.builtin.modinfo "$S/usr/lib/modules/$KVER/"
depmod -b "$S/usr" "$KVER" # modules.dep/alias for modprobe and kernel autoload (request_module)

install -m 0755 "$HERE/init" "$S/init"

(cd "$S" && find . -mindepth 1 | LC_ALL=C sort | cpio -o -H newc --quiet -R 0:0) >"$OUT.tmp"
mv -f "$OUT.tmp" "$OUT"
echo "$stamp" >"$OUT.stamp"
ms=$((($(date +%s%N) - T0) / 1000000))
printf 'mkinitramfs: wrote %s (%s, kernel %s, %d modules) in %d.%03ds\n' "$OUT" "$(du -h "$OUT" | cut -f1)" \
	"$KVER" "$nmod" $((ms / 1000)) $((ms % 1000)) >&2
