#!/bin/bash
# Reproduces the seed benchmark tables on this machine (run as root on Debian bookworm):
# installs what is missing (scripts/setup.sh: netperf, nft, qemu, the VM kernel), builds a
# static hostaccel-bench (hostaccel with -tags bench: the agent binary leaves the benchmark
# out) and runs `hostaccel-bench bench` with the given arguments. Variants this kernel
# lacks (the nftables flowtable, here) and pktgen run in the project's VM automatically.
#   scripts/bench.sh                          # the full run, report in the current directory
#   scripts/bench.sh --out docs/benchmarks    # where the committed reports live
#   scripts/bench.sh --reps 1 --duration 1s   # a quick look
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
"$ROOT/scripts/setup.sh" >/dev/null
mkdir -p "$ROOT/.cache/bin"
(cd "$ROOT" && CGO_ENABLED=0 go build -tags bench -o .cache/bin/hostaccel-bench ./cmd/hostaccel)
cd "$ROOT"
exec "$ROOT/.cache/bin/hostaccel-bench" bench "$@"
