#!/bin/bash
# The Kubernetes mode in one command (root, Debian bookworm): a real kube-apiserver + etcd on
# loopback with a few Node, Service and EndpointSlice objects, the deploy/ manifests applied, and
# `hostaccel agent --kubernetes` against it with a token of the deploy/ ServiceAccount (exactly
# its read-only role). Then `hostaccel status` shows what the agent derived, while Nodes come
# and go, an endpoint goes not ready, and the API server stops and comes back.
#
# Everything runs in a network namespace of its own (servers on its loopback, a dummy gateway
# and transport), so the host's network is left alone. The first run builds kube-apiserver,
# kubectl and etcd from the Go module proxy (about 7 minutes on 2 cores; cached after).
#
#   scripts/k8s-demo.sh            DATAPATH=flowtable|tc|auto (default auto: what this kernel can)
#   HOSTACCEL_BIN=path             use this hostaccel binary instead of building one
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
NS=hostaccel-k8s-demo
DATAPATH=${DATAPATH:-auto}
[ "$(id -u)" = 0 ] || { echo "k8s-demo: run as root (network namespaces)" >&2; exit 1; }

step() { printf '\n== %s\n' "$*"; }
in_ns() { ip netns exec "$NS" "$@"; }

step "building (kube-apiserver, kubectl and etcd are cached under ~/.cache/hostaccel-k8s)"
BIN=$("$ROOT/scripts/k8s-build-test-bins.sh" | tail -1)
HA=${HOSTACCEL_BIN:-}
if [ -z "$HA" ]; then
	mkdir -p "$ROOT/.cache/bin"
	(cd "$ROOT" && CGO_ENABLED=0 go build -o .cache/bin/hostaccel ./cmd/hostaccel)
	HA=$ROOT/.cache/bin/hostaccel
fi
WIRED=1
"$HA" agent --help 2>/dev/null | grep -q -- '--kubernetes ' || WIRED=0

WORK=$(mktemp -d /tmp/hostaccel-k8s-demo.XXXXXX)
AGENT_PID=
cleanup() {
	set +e
	[ -n "$AGENT_PID" ] && kill -TERM "$AGENT_PID" 2>/dev/null && wait "$AGENT_PID" 2>/dev/null
	in_ns "$ROOT/scripts/k8s-test-apiserver.sh" stop "$WORK/api" >/dev/null 2>&1
	ip netns del "$NS" 2>/dev/null
	rm -rf "$WORK"
}
trap cleanup EXIT
kubectl() { in_ns "$BIN/kubectl" --kubeconfig "$WORK/api/kubeconfig" "$@"; }

step "network namespace $NS: node-a with gateway antrea-gw0 (Pods 10.244.0.0/24) and transport eth0 (172.18.0.2/24)"
ip netns del "$NS" 2>/dev/null || true
ip netns add "$NS"
in_ns ip link set lo up
# veth pairs (this kernel may lack dummy); the peers stay down, so `transports: auto` is eth0.
in_ns ip link add antrea-gw0 type veth peer name gw0-peer
in_ns ip link add eth0 type veth peer name eth0-peer
in_ns ip addr add 10.244.0.1/24 dev antrea-gw0
in_ns ip addr add 172.18.0.2/24 dev eth0
in_ns ip -6 addr add fc00::2/64 dev eth0 nodad
in_ns ip link set antrea-gw0 up
in_ns ip link set eth0 up

step "kube-apiserver + etcd on the namespace's loopback"
in_ns "$ROOT/scripts/k8s-test-apiserver.sh" start "$WORK/api"

step "kubectl apply -k deploy/ (namespace, ServiceAccount, read-only ClusterRole, ConfigMap, DaemonSet)"
kubectl apply -k "$ROOT/deploy"

step "Nodes (node-c is in another subnet: tunnelled under Antrea's hybrid rule), Services, EndpointSlices"
kubectl apply -f - <<'YAML'
apiVersion: v1
kind: Node
metadata: {name: node-a}
spec: {podCIDR: 10.244.0.0/24, podCIDRs: [10.244.0.0/24, "fd00:10:244::/64"]}
status:
  addresses: [{type: InternalIP, address: 172.18.0.2}, {type: InternalIP, address: "fc00::2"}]
---
apiVersion: v1
kind: Node
metadata: {name: node-b}
spec: {podCIDR: 10.244.1.0/24, podCIDRs: [10.244.1.0/24, "fd00:10:244:1::/64"]}
status:
  addresses: [{type: InternalIP, address: 172.18.0.3}, {type: InternalIP, address: "fc00::3"}]
---
apiVersion: v1
kind: Node
metadata: {name: node-c}
spec: {podCIDR: 10.244.2.0/24, podCIDRs: [10.244.2.0/24]}
status:
  addresses: [{type: InternalIP, address: 192.168.50.4}]
---
apiVersion: v1
kind: Namespace
metadata: {name: shop}
---
# Balanced by hostaccel (the service-proxy-name label hands it over from kube-proxy).
apiVersion: v1
kind: Service
metadata:
  name: web
  namespace: shop
  labels: {service.kubernetes.io/service-proxy-name: hostaccel}
spec:
  type: LoadBalancer
  selector: {app: web}
  sessionAffinity: ClientIP
  sessionAffinityConfig: {clientIP: {timeoutSeconds: 600}}
  ports: [{name: http, port: 80, targetPort: 8080, protocol: TCP}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: web-1
  namespace: shop
  labels: {kubernetes.io/service-name: web, endpointslice.kubernetes.io/managed-by: k8s-demo}
addressType: IPv4
ports: [{name: http, port: 8080, protocol: TCP}]
endpoints:
- addresses: [10.244.0.10]
  nodeName: node-a
  conditions: {ready: true, serving: true, terminating: false}
- addresses: [10.244.1.10]
  nodeName: node-b
  conditions: {ready: true, serving: true, terminating: false}
---
# Left to kube-proxy; its external IP still feeds the external-to-loadbalancer class.
apiVersion: v1
kind: Service
metadata: {name: dns, namespace: shop}
spec:
  externalIPs: [203.0.113.53]
  ports: [{name: dns, port: 53, protocol: UDP}]
YAML
kubectl -n shop patch service web --subresource=status --type=merge \
	-p '{"status":{"loadBalancer":{"ingress":[{"ip":"172.18.0.151"}]}}}' >/dev/null
kubectl get nodes -o wide
kubectl -n shop get services,endpointslices

# The agent's base config is the ConfigMap, as the DaemonSet mounts it; the datapath follows
# what this kernel can do.
kubectl -n hostaccel-system get configmap hostaccel-config -o jsonpath='{.data.config\.yaml}' |
	sed "s/^datapath: .*/datapath: $DATAPATH/" >"$WORK/config.yaml"
in_ns "$ROOT/scripts/k8s-test-apiserver.sh" kubeconfig "$WORK/api" "$WORK/agent.kubeconfig" >/dev/null
KUBEFLAGS=(--kubeconfig "$WORK/agent.kubeconfig" --node-name node-a --kubernetes-peers same-subnet --kubernetes-services labeled)

step "hostaccel k8s render: the config the agent derives for node-a (with the agent's token)"
in_ns "$HA" k8s render -f "$WORK/config.yaml" "${KUBEFLAGS[@]}"

if [ "$WIRED" = 0 ]; then
	step "this hostaccel build has no \`agent --kubernetes\` yet; the derivation, explained:"
	in_ns "$HA" k8s render -f "$WORK/config.yaml" "${KUBEFLAGS[@]}" -o summary
	echo
	echo "k8s-demo: OK (render only)"
	exit 0
fi

status() { in_ns "$HA" status --state-file "$WORK/agent.json" | sed -n '/^agent:/,/^$/p;/^kubernetes:/,/^$/p' | awk '!seen[$0]++'; }
syncs() { in_ns cat "$WORK/agent.json" 2>/dev/null | sed -n 's/^  "syncs": \([0-9]*\),/\1/p'; }
wait_status() { # wait until `hostaccel status` matches a pattern
	for _ in $(seq 100); do status | grep -q -- "$1" && return 0; sleep 0.1; done
	echo "k8s-demo: status never showed '$1'" >&2
	status >&2
	return 1
}

step "hostaccel agent --kubernetes (datapath $DATAPATH, the ServiceAccount's token, metrics on 127.0.0.1:9464)"
# Not through in_ns: a shell function run with & is a subshell whose child the agent is, and
# SIGTERM to that subshell left the agent running (holding /run/hostaccel's lock). `ip netns
# exec` execs, so $! is the agent itself.
ip netns exec "$NS" "$HA" agent --kubernetes -f "$WORK/config.yaml" "${KUBEFLAGS[@]}" --state-file "$WORK/agent.json" \
	--metrics-address 127.0.0.1:9464 --cleanup-on-exit >"$WORK/agent.log" 2>&1 &
AGENT_PID=$!
for _ in $(seq 300); do [ -n "$(syncs)" ] && break; sleep 0.1; done
[ -n "$(syncs)" ] || { echo "k8s-demo: the agent did not sync" >&2; cat "$WORK/agent.log" >&2; exit 1; }

step "hostaccel status"
in_ns "$HA" status --state-file "$WORK/agent.json"

step "node-d joins (same subnet): the peer set follows"
kubectl apply -f - <<'YAML'
apiVersion: v1
kind: Node
metadata: {name: node-d}
spec: {podCIDR: 10.244.3.0/24, podCIDRs: [10.244.3.0/24]}
status: {addresses: [{type: InternalIP, address: 172.18.0.5}]}
YAML
wait_status 'node-d .*10.244.3.0/24.* yes'
status | grep -E '^  (PEER|node-)'

step "10.244.1.10 goes not ready: its backend is down (established connections finish; new ones and affinity clients go elsewhere)"
kubectl -n shop patch endpointslice web-1 --type=json \
	-p '[{"op":"replace","path":"/endpoints/1/conditions/ready","value":false},{"op":"replace","path":"/endpoints/1/conditions/serving","value":false}]' >/dev/null
wait_status '10.244.1.10:8080 down'
status | grep -E '^  (SERVICE|shop/)'

step "the API server stops: the agent keeps the last applied state and says so"
in_ns "$ROOT/scripts/k8s-test-apiserver.sh" apiserver-down "$WORK/api"
wait_status 'DISCONNECTED'
status | sed -n '1,4p'
in_ns curl -s 127.0.0.1:9464/metrics | grep -E '^hostaccel_(kubernetes_connected|healthy) '

step "the API server comes back: the agent reconnects, and follows again (node-b leaves)"
in_ns "$ROOT/scripts/k8s-test-apiserver.sh" apiserver-up "$WORK/api"
wait_status 'API .* connected'
kubectl delete node node-b >/dev/null
for _ in $(seq 100); do status | grep -q '^  node-b ' || break; sleep 0.1; done
status | grep -q '^  node-b ' && { echo "k8s-demo: node-b did not leave" >&2; exit 1; }
in_ns "$HA" status --state-file "$WORK/agent.json" | sed -n '/^kubernetes:/,/^$/p'
in_ns curl -s 127.0.0.1:9464/metrics | grep -E '^hostaccel_kubernetes_(connected|peers|lb_backends)'

echo
echo "k8s-demo: OK"
