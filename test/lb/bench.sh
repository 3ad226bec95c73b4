#!/bin/bash
# A first benchmark of the load balancer (run as root; needs wrk): requests/s and CPU through
#   (a) hostaccel's lb, dnat topology, `weight` scheduler (numgen random, as kube-proxy)
#   (b) a kube-proxy-style nftables ruleset (its nftables mode's shape: a services verdict map,
#       a service chain doing `numgen random mod 3 vmap` to per-endpoint chains that mark
#       hairpin traffic and dnat, a filter-forward check of no-endpoint services, and a
#       postrouting masquerade of marked packets)
# in the same run, in namespaces on this host: a client (wrk), a load balancer, three Go
# net/http backends, each on its own veth to the load balancer. The two are interleaved,
# REPS times each, DURATION seconds per run; both VIPs are installed the whole time.
#
# CPU: /proc/stat deltas over each run, all CPUs (user+system+softirq), divided by the
# requests served: CPU microseconds per request for the whole host (client, load balancer
# and backends share it). Client and backends do the same work in (a) and (b), so the
# difference between the two is the load balancer's. softirq is shown separately: it is
# where the forwarding, conntrack and nftables work is done.
#
# MODE=close (default) opens a new connection per request, as the seed's benchmark (229 bytes
# per connection): the NAT decision, conntrack setup and teardown dominate. MODE=keepalive
# reuses connections: the per-packet cost of established flows.
#
# usage: test/lb/bench.sh [HOSTACCEL_BINARY]
#   env: REPS=3 DURATION=10 CONNS=64 THREADS=2 MODE=close|keepalive
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
HA=${1:-}
REPS=${REPS:-3} DURATION=${DURATION:-10} CONNS=${CONNS:-64} THREADS=${THREADS:-2} MODE=${MODE:-close}
HDR=()
[ "$MODE" = close ] && HDR=(-H 'Connection: close')
command -v wrk >/dev/null || { echo "bench.sh needs wrk (apt-get install wrk)"; exit 1; }
WORK=$(mktemp -d)
P=hab$$
ns() { local n=$1; shift; ip netns exec "$P-$n" "$@"; }
cleanup() {
	for n in cl lb b1 b2 b3; do ip netns pids "$P-$n" 2>/dev/null | xargs -r kill 2>/dev/null || true; done
	for n in cl lb b1 b2 b3; do ip netns del "$P-$n" 2>/dev/null || true; done
	rm -rf "$WORK"
}
trap cleanup EXIT
if [ -z "$HA" ]; then
	HA=$WORK/hostaccel
	(cd "$ROOT" && CGO_ENABLED=0 go build -o "$HA" ./cmd/hostaccel)
fi
(cd "$ROOT" && CGO_ENABLED=0 go build -o "$WORK/backend" ./test/lb/benchbackend)

for n in cl lb b1 b2 b3; do ip netns add "$P-$n"; ns $n ip link set lo up; done
ns lb sysctl -qw net.ipv4.ip_forward=1 net.netfilter.nf_conntrack_max=1048576 2>/dev/null || ns lb sysctl -qw net.ipv4.ip_forward=1
ip -n $P-lb link add eth0 type veth peer name eth0 netns $P-cl
ns cl ip addr add 10.0.0.2/24 dev eth0; ns cl ip link set eth0 up
ns cl ip route add 10.100.0.0/24 via 10.0.0.1
ns lb ip addr add 10.0.0.1/24 dev eth0; ns lb ip link set eth0 up
for i in 1 2 3; do
	ip -n $P-lb link add b$i type veth peer name eth0 netns $P-b$i
	ns lb ip addr add 10.1.$i.1/24 dev b$i; ns lb ip link set b$i up
	ns b$i ip addr add 10.1.$i.2/24 dev eth0; ns b$i ip link set eth0 up
	ns b$i ip route add default via 10.1.$i.1
	# No TIME_WAIT on the backends: at this connection rate client ports come back within seconds,
	# and a 4-tuple still in TIME_WAIT would stall the next connection (for both setups alike).
	ns b$i sysctl -qw net.ipv4.tcp_max_tw_buckets=0
	ns b$i "$WORK/backend" -listen 10.1.$i.2:8080 -name b$i >/dev/null 2>&1 &
done
ns cl sysctl -qw net.ipv4.ip_local_port_range="1024 65000" net.ipv4.tcp_tw_reuse=1

# (a) hostaccel: VIP 10.100.0.1:80
cat >"$WORK/lb.yaml" <<YAML
datapath: none
loadBalancer:
  api: {disabled: true}
  stateFile: $WORK/lb-services.yaml
  services:
  - name: bench
    vips: [10.100.0.1]
    port: 80
    topology: dnat
    scheduler: weight
    backends:
    - {address: 10.1.1.2, port: 8080}
    - {address: 10.1.2.2, port: 8080}
    - {address: 10.1.3.2, port: 8080}
YAML
ns lb "$HA" apply -f "$WORK/lb.yaml"

# (b) kube-proxy style: VIP 10.100.0.2:80
cat >"$WORK/kp.nft" <<'NFT'
table ip kube-proxy {
	comment "a kube-proxy nftables-mode style ruleset, for comparison"
	map service-ips {
		type ipv4_addr . inet_proto . inet_service : verdict
		elements = { 10.100.0.2 . tcp . 80 : goto service-bench-tcp }
	}
	map no-endpoint-services {
		type ipv4_addr . inet_proto . inet_service : verdict
	}
	chain nat-prerouting {
		type nat hook prerouting priority dstnat; policy accept;
		jump services
	}
	chain nat-output {
		type nat hook output priority -100; policy accept;
		jump services
	}
	chain services {
		ip daddr . meta l4proto . th dport vmap @service-ips
	}
	chain filter-forward {
		type filter hook forward priority -110; policy accept;
		ct state new jump service-endpoints-check
	}
	chain service-endpoints-check {
		ip daddr . meta l4proto . th dport vmap @no-endpoint-services
	}
	chain mark-for-masquerade {
		meta mark set meta mark | 0x4000
	}
	chain nat-postrouting {
		type nat hook postrouting priority srcnat; policy accept;
		jump masquerading
	}
	chain masquerading {
		meta mark & 0x4000 == 0 return
		meta mark set meta mark ^ 0x4000
		masquerade fully-random
	}
	chain service-bench-tcp {
		ip daddr 10.100.0.2 tcp dport 80 ip saddr != 10.244.0.0/16 jump mark-for-masquerade
		numgen random mod 3 vmap { 0 : goto endpoint-1, 1 : goto endpoint-2, 2 : goto endpoint-3 }
	}
	chain endpoint-1 {
		ip saddr 10.1.1.2 jump mark-for-masquerade
		meta l4proto tcp dnat to 10.1.1.2:8080
	}
	chain endpoint-2 {
		ip saddr 10.1.2.2 jump mark-for-masquerade
		meta l4proto tcp dnat to 10.1.2.2:8080
	}
	chain endpoint-3 {
		ip saddr 10.1.3.2 jump mark-for-masquerade
		meta l4proto tcp dnat to 10.1.3.2:8080
	}
}
NFT
# kube-proxy masquerades traffic from outside the cluster CIDR to services (the
# `ip saddr != <cluster CIDR> jump mark-for-masquerade` above); hostaccel's dnat does not.
# KP_MASQ=0 removes that rule so that both do the same NAT work.
if [ "${KP_MASQ:-0}" = 0 ]; then sed -i '/ip saddr != 10.244.0.0\/16 jump mark-for-masquerade/d' "$WORK/kp.nft"; fi
ns lb nft -f "$WORK/kp.nft"
sleep 0.5
for v in 10.100.0.1 10.100.0.2; do ns cl curl -s --max-time 2 "http://$v/" >/dev/null || { echo "no answer from $v"; exit 1; }; done

cpu() { awk '/^cpu /{print $2+$3+$4, $7+$8, $2+$3+$4+$5+$6+$7+$8+$9}' /proc/stat; } # busy(user,nice,system) softirq+irq total
run() { # name vip
	read -r b0 s0 t0 < <(cpu)
	local out; out=$(ns cl wrk -t"$THREADS" -c"$CONNS" -d"${DURATION}s" "${HDR[@]}" "http://$2/")
	read -r b1 s1 t1 < <(cpu)
	local reqs rps
	reqs=$(echo "$out" | awk '/requests in/{print $1}')
	rps=$(echo "$out" | awk '/Requests\/sec/{print $2}')
	local hz; hz=$(getconf CLK_TCK)
	awk -v n="$1" -v rps="$rps" -v reqs="$reqs" -v b=$((b1-b0)) -v s=$((s1-s0)) -v t=$((t1-t0)) -v hz="$hz" 'BEGIN{
		printf "%-10s %10.0f req/s   cpu busy %5.1f%% (softirq %5.1f%%)   %6.1f us cpu/request\n", n, rps, 100*(b+s)/t, 100*s/t, 1e6*(b+s)/hz/reqs }'
	echo "$1 $rps $(awk -v b=$((b1-b0)) -v s=$((s1-s0)) -v reqs="$reqs" -v hz="$hz" 'BEGIN{printf "%.1f", 1e6*(b+s)/hz/reqs}')" >>"$WORK/results"
}
echo "== $REPS x ${DURATION}s each, interleaved, wrk -t$THREADS -c$CONNS, mode $MODE, $(nproc) CPUs, kernel $(uname -r)"
ns cl wrk -t"$THREADS" -c"$CONNS" -d2s "${HDR[@]}" http://10.100.0.1/ >/dev/null # warm up (discarded)
ns cl wrk -t"$THREADS" -c"$CONNS" -d2s "${HDR[@]}" http://10.100.0.2/ >/dev/null
for r in $(seq "$REPS"); do
	run hostaccel 10.100.0.1
	run kube-proxy 10.100.0.2
done
echo "== median"
for n in hostaccel kube-proxy; do
	grep "^$n " "$WORK/results" | sort -k2 -n | awk -v n="$n" '{rps[NR]=$2; c[NR]=$3} END{m=int((NR+1)/2); printf "%-10s %10.0f req/s  (runs:", n, rps[m]; for(i=1;i<=NR;i++) printf " %.0f", rps[i]; printf ")\n"}'
	grep "^$n " "$WORK/results" | sort -k3 -n | awk -v n="$n" '{c[NR]=$3} END{m=int((NR+1)/2); printf "%-10s %10.1f us cpu/request (median)\n", n, c[m]}'
done
