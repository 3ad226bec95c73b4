#!/bin/bash
# The load balancer demo (run as root; runs on any kernel with nf_tables NAT, no flowtable
# needed): a client, a load balancer running `hostaccel agent -f examples/lb-demo.yaml`, and
# three web servers (busybox httpd), in network namespaces. It shows an exact rotation, a
# 1:2:3 weighting, a killed server leaving the maps and coming back, a drained one, a service
# added through the API, and `hostaccel lb status` along the way.
# usage: test/lb/demo-lb.sh HOSTACCEL_BINARY
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
HA=$(readlink -f "${1:-$ROOT/.cache/bin/hostaccel}")
CFG=$ROOT/examples/lb-demo.yaml
P=halb
ns() { local n=$1; shift; ip netns exec "$P-$n" "$@"; }
LB() { ns lb "$HA" lb --socket /run/hostaccel/lb-demo.sock "$@"; }
get() { ns cl curl -s --max-time 2 "http://$1/" || echo "(failed)"; }
# The demo checks what it shows: a line that is not what it should be ends it.
fail() { echo "demo: $*" >&2; exit 1; }
count() { tr ' ' '\n' <<<"$2" | grep -cx "$1" || true; } # count WORD LINE
cleanup() {
	[ -n "${AGENT:-}" ] && kill "$AGENT" 2>/dev/null && wait "$AGENT" 2>/dev/null
	for n in cl lb b1 b2 b3; do ip netns pids "$P-$n" 2>/dev/null | xargs -r kill 2>/dev/null || true; ip netns del "$P-$n" 2>/dev/null || true; done
	rm -rf /tmp/halb-www /tmp/halb-agent.log /run/hostaccel/lb-demo-services.yaml /run/hostaccel/lb-demo-agent.json
}
trap cleanup EXIT
cleanup

for n in cl lb b1 b2 b3; do ip netns add "$P-$n"; ns $n ip link set lo up; done
ns lb sysctl -qw net.ipv4.ip_forward=1
ip -n $P-lb link add eth0 type veth peer name eth0 netns $P-cl
ns cl ip addr add 10.0.0.2/24 dev eth0; ns cl ip link set eth0 up; ns cl ip route add 10.100.0.0/24 via 10.0.0.1
ns lb ip addr add 10.0.0.1/24 dev eth0; ns lb ip link set eth0 up
serve() { # i
	mkdir -p /tmp/halb-www/b$1; echo "b$1" >/tmp/halb-www/b$1/index.html
	ip netns exec "$P-b$1" busybox httpd -f -p 80 -h /tmp/halb-www/b$1 &
	eval "HTTPD$1=$!"
}
for i in 1 2 3; do
	ip -n $P-lb link add b$i type veth peer name eth0 netns $P-b$i
	ns lb ip addr add 10.1.$i.1/24 dev b$i; ns lb ip link set b$i up
	ns b$i ip addr add 10.1.$i.2/24 dev eth0; ns b$i ip link set eth0 up; ns b$i ip route add default via 10.1.$i.1
	serve $i
done

echo "== config ($CFG)"; grep -v '^#' "$CFG"
ip netns exec "$P-lb" "$HA" agent -f "$CFG" --state-file /run/hostaccel/lb-demo-agent.json 2>/tmp/halb-agent.log &
AGENT=$!
for _ in $(seq 50); do LB status >/dev/null 2>&1 && break; sleep 0.2; done
sleep 1.2 # first health checks
echo "== the load balancer's NAT table (nft list table inet hostaccel-lb, in its namespace)"
ns lb nft list table inet hostaccel-lb
echo "== 6 requests to web (dnat, rr): an exact rotation"
r=$(for _ in 1 2 3 4 5 6; do get 10.100.0.10; done | paste -sd' '); echo "$r"
for b in b1 b2 b3; do [ "$(count $b "$r")" = 2 ] || fail "rotation: $b answered $(count $b "$r") of 6, want 2"; done
echo "== 600 requests to weighted (snat, weights 1:2:3)"
r=$(for _ in $(seq 600); do get 10.100.0.10:8080; done | paste -sd' ')
tr ' ' '\n' <<<"$r" | sort | uniq -c
n1=$(count b1 "$r") n2=$(count b2 "$r") n3=$(count b3 "$r")
[ $((n1 + n2 + n3)) = 600 ] && [ "$n1" -gt 0 ] && [ "$n1" -lt "$n2" ] && [ "$n2" -lt "$n3" ] || fail "weights 1:2:3: b1 $n1, b2 $n2, b3 $n3 of 600"
echo "== b3 killed: out of the maps after fall (2) x interval (500ms)"
kill "$HTTPD3"; sleep 1.5
r=$(for _ in 1 2 3 4; do get 10.100.0.10; done | paste -sd' '); echo "$r"
[ "$(count b3 "$r")" = 0 ] && [ "$(count '(failed)' "$r")" = 0 ] || fail "b3 killed: $r"
LB status
echo "== b3 back, b1 drained (hostaccel lb backend drain web 10.1.1.2:80)"
serve 3; sleep 1.5
LB backend drain web 10.1.1.2:80 >/dev/null
r=$(for _ in 1 2 3 4; do get 10.100.0.10; done | paste -sd' '); echo "$r"
[ "$(count b1 "$r")" = 0 ] && [ "$(count '(failed)' "$r")" = 0 ] && [ "$(count b3 "$r")" -gt 0 ] || fail "b3 back, b1 drained: $r"
echo "== a service added through the API (kept in the state file: a restart keeps it)"
LB add api --vip 10.100.0.20 --port 80 --topology snat --backend 10.1.2.2:80 --backend 10.1.3.2:80 --check tcp
r=$(get 10.100.0.20); echo "$r"
[ "$r" = b2 ] || [ "$r" = b3 ] || fail "the service added through the API answered $r"
LB list
echo "== hostaccel cleanup"
kill "$AGENT"; wait "$AGENT" 2>/dev/null || true; AGENT=
ns lb "$HA" cleanup
rules=$(ns lb nft list ruleset) # (taken first: grep -q closing the pipe early failed the pipeline)
grep -q hostaccel-lb <<<"$rules" && fail "cleanup left the load balancer's tables"
echo "demo: OK"
