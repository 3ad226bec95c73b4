#!/bin/bash
# One command from a fresh Debian bookworm machine to a running demo (run as root):
# installs what is missing, builds hostaccel, and runs scripts/demo-node.sh natively when this
# kernel has the nftables flowtable, else inside the project's VM (Debian cloud kernel, qemu).
# `scripts/demo.sh tc` shows the tc datapath instead (eBPF redirect, natively where the
# kernel allows it); `scripts/demo.sh lb` the nftables load balancer.
set -euo pipefail
export DATAPATH=${1:-flowtable}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
"$ROOT/scripts/setup.sh"
mkdir -p "$ROOT/.cache/bin"
(cd "$ROOT" && CGO_ENABLED=0 go build -o .cache/bin/hostaccel ./cmd/hostaccel)
HA=$ROOT/.cache/bin/hostaccel
if [ "$DATAPATH" = lb ]; then # the load balancer demo: native, needs no flowtable
	exec "$ROOT/test/lb/demo-lb.sh" "$HA"
fi
need=flowtable; [ "$DATAPATH" = tc ] && need=bpf_redirect_neigh
if "$HA" probe -o json | grep -A1 "\"name\": \"$need\"" | grep -q '"available": true'; then
	echo "== this kernel has what datapath $DATAPATH needs ($need): running the demo natively"
	exec "$ROOT/scripts/demo-node.sh" "$HA"
fi
echo "== this kernel ($(uname -r)) lacks $need: running the demo in the VM"
exec "$ROOT/vmtest/run-in-vm.sh" -q -t 600 -e "DATAPATH=$DATAPATH" -f "$HA" -f "$ROOT/scripts/demo-node.sh" -- ./demo-node.sh ./hostaccel
