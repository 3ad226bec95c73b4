#!/bin/bash
# Boots the Debian cloud kernel (.cache/kernel) under qemu TCG with the base initramfs plus a
# second cpio holding /vmtest/{run, copied files}, runs CMD in the guest and exits with its status.
#
# usage: run-in-vm.sh [-f HOSTPATH[:GUESTPATH]]... [-e K=V]... [-C DIR] [-t TIMEOUT] [-m MEM] [-s SMP]
#                     [-i] [-q] [-l LOG] -- CMD [ARGS...]
#   -f  copy a host file or directory into the guest's /vmtest (first in PATH), or to the absolute
#       GUESTPATH if given (use real paths: /usr/bin, not the /bin symlink); repeatable
#   -e  export K=V for CMD; repeatable
#   -C  CMD's working directory in the guest (created if missing; default /vmtest)
#   -t  seconds before qemu is killed (default 600); exit status 124
#   -m  guest memory (default 1G)     -s  vCPUs (default 2)
#   -i  deterministic icount mode for benchmarks: one vCPU, guest clock = instruction count
#   -q  print only CMD's output (between the START and RC markers); otherwise the whole console
#   -l  also write the whole console to LOG
# CMD runs as root under bash, stdin /dev/null, stdout/stderr on the serial console.
# Exit status: CMD's; 124 timeout; 125 guest never printed HOSTACCEL_VM_RC (panic, qemu error).
# env: VMTEST_BASE (base cpio, default .cache/vm-base.cpio, (re)built by mkinitramfs.sh as needed),
#      VMTEST_QEMU_ARGS (extra qemu args), VMTEST_APPEND (extra kernel command line).
set -euo pipefail

HERE=$(cd "$(dirname "$(readlink -f "$0")")" && pwd)
ROOT=$(dirname "$HERE")
BASE=${VMTEST_BASE:-$ROOT/.cache/vm-base.cpio}
TIMEOUT=600 MEM=1G SMP= ICOUNT= QUIET= LOG= CWD=/vmtest
FILES=() ENVS=()
usage() { sed -n '5,16p' "$HERE/run-in-vm.sh" | sed 's/^# \{0,1\}//' >&2; exit 2; }
while getopts "f:e:C:t:m:s:iql:h" o; do
	case $o in
	f) FILES+=("$OPTARG") ;;
	e) ENVS+=("$OPTARG") ;;
	C) CWD=$OPTARG ;;
	t) TIMEOUT=$OPTARG ;;
	m) MEM=$OPTARG ;;
	s) SMP=$OPTARG ;;
	i) ICOUNT=1 ;;
	q) QUIET=1 ;;
	l) LOG=$OPTARG ;;
	*) usage ;;
	esac
done
shift $((OPTIND - 1))
[ $# -ge 1 ] || usage
say() { [ -n "$QUIET" ] || echo "run-in-vm: $*" >&2; }
# kernel_report prints the kernel's complaints in the console (a BUG, a warning, a soft lockup
# or a hung task, with the stacks after them) to stderr, at most 120 lines.
kernel_report() {
	grep -aE -A 40 'BUG:|WARNING:|soft lockup|hung_task|blocked for more than|rcu_sched self-detected|Kernel panic' \
		"$W/console.log" 2>/dev/null | head -n 120 >"$W/kernel.txt" || true
	if [ -s "$W/kernel.txt" ]; then
		echo "run-in-vm: the guest kernel complained (console lines):" >&2
		cat "$W/kernel.txt" >&2
	fi
}

# no-op unless mkinitramfs.sh, init or the kernel changed; its notes are hidden under -q
if ! out=$("$HERE/mkinitramfs.sh" "$BASE" 2>&1); then echo "$out" >&2; exit 1; fi
[ -z "$out" ] || say "$out"
KVER=$(basename "$(ls -d "$ROOT"/.cache/kernel/lib/modules/*/ | head -1)")
KERNEL=$ROOT/.cache/kernel/boot/vmlinuz-$KVER

W=$(mktemp -d "${TMPDIR:-/tmp}/vmtest-run.XXXXXX")
QPID= WPID=
cleanup() {
	set +e
	if [ -n "$QPID" ]; then kill -KILL "$QPID"; fi 2>/dev/null
	if [ -n "$WPID" ]; then kill "$WPID"; fi 2>/dev/null
	wait 2>/dev/null
	rm -rf "$W"
}
trap cleanup EXIT
trap 'echo "run-in-vm: interrupted" >&2; exit 130' INT
trap 'exit 143' TERM HUP

# second cpio: /vmtest/run (exports, cd, the quoted command) and the copied files
mkdir -p "$W/x/vmtest"
for f in "${FILES[@]}"; do
	dst=/vmtest/
	case $f in *:/*) dst=${f##*:} f=${f%:*} ;; esac
	mkdir -p "$W/x$(dirname "$dst")"
	cp -rL -- "$f" "$W/x$dst"
done
{
	echo '#!/bin/bash'
	for e in "${ENVS[@]}"; do printf 'export %q\n' "$e"; done
	printf 'mkdir -p %q && cd %q || exit 126\n' "$CWD" "$CWD"
	printf 'exec'
	printf ' %q' "$@"
	echo
} >"$W/x/vmtest/run"
chmod 0755 "$W/x/vmtest/run"
(cd "$W/x" && find . -mindepth 1 | cpio -o -H newc --quiet -R 0:0) >"$W/extra.cpio"
cat "$BASE" "$W/extra.cpio" >"$W/initrd.cpio"

if [ -n "$ICOUNT" ]; then
	[ "${SMP:-1}" = 1 ] || echo "run-in-vm: -i forces -s 1 (icount needs a single vCPU)" >&2
	ACCEL=(-accel tcg,thread=single -icount shift=0,sleep=off -smp 1)
else
	ACCEL=(-accel tcg,thread=multi -smp "${SMP:-2}")
fi
# The kernel console: quiet, but loglevel=5 after it prints warnings and the stacks that come
# with a BUG (show_regs and dump_stack print at the default level, 4), and a soft lockup shows
# every CPU's stack: what a failed run needs to tell a kernel problem from ours (kernel_report).
# -M pc (microvm hung at TSC calibration under TCG); no NIC: tests build their own veth/netns.
# read -ra: VMTEST_QEMU_ARGS is split on blanks
read -ra EXTRA <<<"${VMTEST_QEMU_ARGS:-}"
QEMU=(qemu-system-x86_64 -M pc "${ACCEL[@]}" -cpu max -m "$MEM" -nodefaults -no-user-config
	-display none -monitor none -serial stdio -no-reboot
	-kernel "$KERNEL" -initrd "$W/initrd.cpio"
	-append "console=ttyS0 quiet loglevel=5 softlockup_all_cpu_backtrace=1 panic=-1 ${VMTEST_APPEND:-}" "${EXTRA[@]}")

# qemu and the watchdog are direct children that die with this shell even on SIGKILL
# (pdeathsig); the console goes through a FIFO to an unbuffered filter.
mkfifo "$W/console"
T0=$(date +%s%N)
setpriv --pdeathsig KILL -- "${QEMU[@]}" </dev/null >"$W/console" 2>&1 &
QPID=$!
setpriv --pdeathsig KILL -- sleep "$TIMEOUT" &
WPID=$!
if [ -n "$QUIET" ]; then
	# print lines after "HOSTACCEL_VM_START"; the RC marker may follow output without a newline
	sed -u 's/\r$//' <"$W/console" | tee "$W/console.log" ${LOG:+"$LOG"} |
		sed -un '/^HOSTACCEL_VM_START /,/HOSTACCEL_VM_RC=[0-9]*$/{/^HOSTACCEL_VM_START /d; /HOSTACCEL_VM_RC=[0-9]*$/{s///; /^$/d}; p}' &
else
	sed -u 's/\r$//' <"$W/console" | tee "$W/console.log" ${LOG:+"$LOG"} &
fi
FPID=$!

done_pid=
wait -n -p done_pid "$QPID" "$WPID" || true
if [ "$done_pid" = "$WPID" ]; then
	WPID=
	kill -KILL "$QPID" 2>/dev/null || true
	wait "$QPID" "$FPID" 2>/dev/null || true
	QPID=
	echo "run-in-vm: timeout after ${TIMEOUT}s, qemu killed" >&2
	kernel_report
	exit 124
fi
QPID=
wait "$FPID" || true
ms=$((($(date +%s%N) - T0) / 1000000))
rc=$(grep -ao 'HOSTACCEL_VM_RC=[0-9]*$' "$W/console.log" | tail -1 | cut -d= -f2 || true)
boot=$(sed -n 's/^HOSTACCEL_VM_START uptime=\([0-9.]*\)s.*/\1/p' "$W/console.log" | head -1)
if [ -z "$rc" ]; then
	echo "run-in-vm: no HOSTACCEL_VM_RC marker (guest panic or qemu error); last console lines:" >&2
	tail -n 15 "$W/console.log" >&2
	kernel_report
	exit 125
fi
[ "$rc" = 0 ] || kernel_report
say "rc=$rc guest-uptime-at-start=${boot:-?}s wall=$((ms / 1000)).$(printf %03d $((ms % 1000)))s"
exit "$rc"
