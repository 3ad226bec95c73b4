#!/bin/bash
# A real kube-apiserver + etcd on loopback, for trying the Kubernetes mode by hand and for the
# demo (the Go tests in test/k8s start their own). Certificates are generated, the admin
# authenticates with a static token (system:masters), RBAC is on, and ServiceAccount tokens can
# be minted (TokenRequest), so an agent can run with exactly the deploy/ role.
#
#   scripts/k8s-test-apiserver.sh start DIR            start (builds the binaries once, ~7 min cold); prints KUBECONFIG
#   scripts/k8s-test-apiserver.sh stop DIR             stop both servers
#   scripts/k8s-test-apiserver.sh apiserver-down DIR   stop only kube-apiserver (etcd keeps the objects)
#   scripts/k8s-test-apiserver.sh apiserver-up DIR     start it again
#   scripts/k8s-test-apiserver.sh token DIR [NS] [SA]  mint a 1h token for a ServiceAccount
#                                                      (default hostaccel-system/hostaccel)
#   scripts/k8s-test-apiserver.sh kubeconfig DIR FILE [NS] [SA]
#                                                      write a kubeconfig with that token
#
# Servers bind 127.0.0.1 of the network namespace the script runs in, on free ports.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cmd=${1:-}
DIR=${2:-}
[ -n "$cmd" ] && [ -n "$DIR" ] || { sed -n '2,17p' "$0"; exit 2; }
mkdir -p "$DIR"
DIR=$(cd "$DIR" && pwd)
PIDFILE=$DIR/testenv.pid

running() { [ -f "$PIDFILE" ] && kill -0 "$(cat "$PIDFILE")" 2>/dev/null; }
bindir() { "$ROOT/scripts/k8s-build-test-bins.sh" | tail -1; }
kubectl() { "$(bindir)/kubectl" --kubeconfig "$DIR/kubeconfig" "$@"; }
wait_ready() {
	for _ in $(seq 600); do
		[ -f "$DIR/ready" ] && return 0
		running || { echo "k8s-test-apiserver: the test environment exited; see $DIR/testenv.log" >&2; tail -20 "$DIR/testenv.log" >&2; return 1; }
		sleep 0.2
	done
	echo "k8s-test-apiserver: not ready after 120s; see $DIR/*.log" >&2
	return 1
}

case $cmd in
start)
	if running; then
		echo "already running; KUBECONFIG=$DIR/kubeconfig"
		exit 0
	fi
	BIN=$(bindir)
	mkdir -p "$ROOT/.cache/bin"
	(cd "$ROOT" && go build -o .cache/bin/k8s-testenv ./test/k8s/cmd/k8s-testenv)
	rm -f "$DIR/ready"
	setsid "$ROOT/.cache/bin/k8s-testenv" -dir "$DIR" -bin "$BIN" >"$DIR/testenv.log" 2>&1 </dev/null &
	echo $! >"$PIDFILE"
	wait_ready
	head -1 "$DIR/testenv.log"
	;;
stop)
	if running; then
		pid=$(cat "$PIDFILE")
		kill -TERM "$pid"
		for _ in $(seq 150); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
	fi
	rm -f "$PIDFILE" "$DIR/ready"
	echo "stopped"
	;;
apiserver-down)
	running || { echo "not running" >&2; exit 1; }
	[ -f "$DIR/ready" ] || { echo "kube-apiserver is already down"; exit 0; }
	kill -USR1 "$(cat "$PIDFILE")"
	for _ in $(seq 100); do [ -f "$DIR/ready" ] || break; sleep 0.1; done
	echo "kube-apiserver stopped (etcd keeps running)"
	;;
apiserver-up)
	running || { echo "not running" >&2; exit 1; }
	[ -f "$DIR/ready" ] && { echo "kube-apiserver is already up"; exit 0; }
	kill -USR1 "$(cat "$PIDFILE")"
	wait_ready
	echo "kube-apiserver ready again"
	;;
token)
	kubectl create token "${4:-hostaccel}" -n "${3:-hostaccel-system}" --duration=1h
	;;
kubeconfig)
	OUT=${3:?kubeconfig FILE}
	TOKEN=$(kubectl create token "${5:-hostaccel}" -n "${4:-hostaccel-system}" --duration=1h)
	SERVER=$(kubectl config view -o jsonpath='{.clusters[0].cluster.server}')
	cat >"$OUT" <<KC
apiVersion: v1
kind: Config
clusters:
- name: hostaccel-test
  cluster: {server: "$SERVER", certificate-authority: "$DIR/ca.crt"}
users:
- name: ${5:-hostaccel}
  user: {token: "$TOKEN"}
contexts:
- name: hostaccel-test
  context: {cluster: hostaccel-test, user: ${5:-hostaccel}}
current-context: hostaccel-test
KC
	chmod 600 "$OUT"
	echo "$OUT"
	;;
*)
	sed -n '2,17p' "$0"
	exit 2
	;;
esac
