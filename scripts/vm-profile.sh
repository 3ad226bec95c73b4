#!/bin/bash
# Counts the kernel functions a bench cell calls, per variant, in the project's VM (icount):
# the function tracer on the netfilter, flowtable, conntrack, NAT, routing and receive/transmit
# paths (the modules loaded first, so that their functions can be traced), one `hostaccel-bench
# bench --here` run per variant and traffic type, then calls per function, most first. Divide by
# the run's transactions (printed as "value", 1 s cells) for calls per transaction; tracing
# slows the guest about fourfold, the counts are exact.
#   scripts/vm-profile.sh "hostaccel-flowtable antrea" "pod-to-service" TCP_CRR > /tmp/profile.txt
# Needs root and .cache/bin/hostaccel-bench (scripts/bench.sh builds it); about 10 min per variant.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
VARIANTS=${1:?variants} TRAFFICS=${2:?traffic types} TEST=${3:-TCP_CRR}
GUEST=$(mktemp)
trap 'rm -f "$GUEST"' EXIT
cat > "$GUEST" <<'GUEST_EOF'
set -u
T=/sys/kernel/tracing
[ -e $T/trace ] || mount -t tracefs nodev $T
for m in nf_tables nft_ct nft_counter nf_conntrack nf_nat nft_chain_nat nft_nat nf_flow_table \
	nf_flow_table_inet nft_flow_offload nft_numgen nft_objref nft_reject_inet nft_fib_inet nft_masq; do
	modprobe $m 2>/dev/null || true
done
echo 0 > $T/tracing_on
echo 131072 > $T/buffer_size_kb
: > $T/set_ftrace_filter
for g in 'nft_*' 'nf_flow_*' 'flow_offload_*' 'nf_nat_*' 'nf_conntrack_*' 'nf_ct_*' '__nf_ct_*' \
	'nf_hook_slow' 'ip_forward*' 'ip_rcv*' 'tcp_v4_rcv' 'nf_confirm' '__nf_conntrack_*' 'ipv4_conntrack*' \
	'fib_*' 'ip_route_*' 'neigh_*' '__dev_queue_xmit' '__netif_receive_skb*'; do
	echo "$g" >> $T/set_ftrace_filter 2>/dev/null || true
done
echo function > $T/current_tracer
for tr in $TRAFFICS; do for v in $VARIANTS; do
	echo > $T/trace
	echo 1 > $T/tracing_on
	/vmtest/hostaccel bench --here --env vm --variants $v --tests $TEST --traffic $tr --reps 1 \
		--duration 1s --pin auto --pktgen=false --json-out /tmp/out.json > /tmp/bench.log 2>&1
	echo 0 > $T/tracing_on
	echo "== $v $tr $(grep -o '"value":[0-9.]*' /tmp/out.json | head -1) overruns: $(grep -m1 overrun $T/per_cpu/cpu0/stats)"
	awk '!/^#/ {for (i = 2; i <= NF; i++) if (substr($i, 1, 2) == "<-") {print $(i-1); break}}' $T/trace |
		sort | uniq -c | sort -rn | head -200
done; done
GUEST_EOF
VMTEST_BASE=$ROOT/.cache/vm-bench.cpio exec "$ROOT/vmtest/run-in-vm.sh" -q -i -t 5400 -m 1G \
	-f "$ROOT/.cache/bin/hostaccel-bench:/vmtest/hostaccel" -f "$GUEST:/vmtest/profile.sh" \
	-e "VARIANTS=$VARIANTS" -e "TRAFFICS=$TRAFFICS" -e "TEST=$TEST" -- bash /vmtest/profile.sh
