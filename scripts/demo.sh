#!/bin/bash
# One command from a fresh Debian bookworm machine to a running demo (run as root):
# installs what is missing, builds hostaccel, and runs scripts/demo-node.sh natively when this
# kernel has the nftables flowtable, else inside the project's VM (Debian cloud kernel, qemu).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
"$ROOT/scripts/setup.sh"
mkdir -p "$ROOT/.cache/bin"
(cd "$ROOT" && CGO_ENABLED=0 go build -o .cache/bin/hostaccel ./cmd/hostaccel)
HA=$ROOT/.cache/bin/hostaccel
if "$HA" probe -o json | grep -A1 '"name": "flowtable"' | grep -q '"available": true'; then
	echo "== this kernel has the flowtable: running the demo natively"
	exec "$ROOT/scripts/demo-node.sh" "$HA"
fi
echo "== this kernel ($(uname -r)) has no nftables flowtable: running the demo in the VM"
exec "$ROOT/vmtest/run-in-vm.sh" -q -t 600 -f "$HA" -f "$ROOT/scripts/demo-node.sh" -- ./demo-node.sh ./hostaccel
