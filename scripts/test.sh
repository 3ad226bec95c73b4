#!/bin/bash
# The whole test suite (run as root on Debian bookworm): installs what is missing, then
#  0. go vet; where clang is present, the generated BPF objects match their source,
#  1. unit tests (golden renders with the knftables Fake, config validation, parsers), then
#     every fuzz target for 10 s (scripts/fuzz.sh; 8 targets, one at a time),
#  2. host tests in network namespaces with the real nft, conntrack and netlink; the container
#     image (scripts/image.sh) run under podman as the DaemonSet runs it (test/image),
#  3. kernel tests that need the nftables flowtable, inside the project's VM (qemu TCG, Debian
#     cloud kernel) when this kernel lacks it, natively otherwise.
# Tests that need root fail (not skip) here: HOSTACCEL_REQUIRE_ROOT=1.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
"$ROOT/scripts/setup.sh" >/dev/null
export HOSTACCEL_REQUIRE_ROOT=1 CGO_ENABLED=0
T0=$(date +%s)

echo "== go vet"
go vet ./...
# The benchmark is built only with -tags bench (hostaccel-bench; the agent leaves it out).
go vet -tags bench ./internal/cli/ ./cmd/...
go test -count=1 -tags bench ./internal/cli/

# The BPF objects bpf2go generated from internal/tc/bpf and internal/sockmap/bpf are committed;
# they must be what the source compiles to (where clang is here to say so).
if command -v clang >/dev/null && git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
	echo "== generated BPF objects are current"
	for pkg in internal/tc internal/sockmap; do
		go generate "./$pkg"
		if ! git diff --exit-code --stat -- "$pkg" || [ -n "$(git ls-files --others --exclude-standard -- "$pkg")" ]; then
			echo "$pkg: the committed BPF objects are not what $pkg/bpf compiles to: run 'go generate ./$pkg' and commit the result" >&2
			exit 1
		fi
	done
fi

mkdir -p .cache/bin
go build -o .cache/bin/hostaccel ./cmd/hostaccel
go build -tags bench -o .cache/bin/hostaccel-bench ./cmd/hostaccel
# A real kube-apiserver + etcd for test/k8s, built from the Go module proxy (cached per machine).
"$ROOT/scripts/k8s-build-test-bins.sh" >/dev/null

# The agent's container image (scripts/image.sh: mmdebstrap + umoci, no Docker), which test/image
# runs with podman as deploy/'s DaemonSet runs it. Where podman or mmdebstrap could not be
# installed, test/image skips and says why.
if command -v podman >/dev/null && command -v mmdebstrap >/dev/null && command -v umoci >/dev/null && command -v skopeo >/dev/null; then
	echo "== the container image (scripts/image.sh)"
	t=$(date +%s)
	IMAGE=localhost/hostaccel:test "$ROOT/scripts/image.sh" | sed 's/^/   /'
	echo "   (built in $(($(date +%s) - t)) s)"
	export HOSTACCEL_IMAGE=localhost/hostaccel:test HOSTACCEL_REQUIRE_IMAGE=1
else
	echo "== skipping the container image and test/image: podman, mmdebstrap, umoci or skopeo is not installed (scripts/setup.sh could not install them)"
fi

# Where this kernel has the flowtable, its tests run natively in the run below, required;
# elsewhere in the VM, after it.
native=
probe=$(.cache/bin/hostaccel probe -o json)
if grep -A1 '"name": "flowtable"' <<<"$probe" | grep -q '"available": true'; then
	native=1
fi
echo "== unit and host tests (and the Kubernetes tests against a real API server, the image under podman)"
# (the sockmap bound's read counter attaches on this host's kernel and the VM's: its tests fail,
# not skip, where it does not)
HOSTACCEL_REQUIRE_FLOWTABLE=$native HOSTACCEL_REQUIRE_K8S=1 HOSTACCEL_REQUIRE_SOCKMAP_BOUND=1 HOSTACCEL_REQUIRE_TC=1 \
	HOSTACCEL_BIN=$ROOT/.cache/bin/hostaccel go test -count=1 -p 1 ./...
echo "== fuzzing: every target for 10 s (scripts/fuzz.sh DURATION runs them longer)"
"$ROOT/scripts/fuzz.sh" 10s
if [ -n "$native" ]; then
	echo "== kernel tests: ran natively above (this kernel has the flowtable)"
else
	echo "== kernel tests in the VM ($(cat .cache/kernel/VERSION 2>/dev/null || basename "$(readlink -f .cache/kernel)"))"
	# deploy/grafana: test/e2e checks the dashboard's flowtable metrics against the agent's here;
	# examples: internal/flowtable renders them against its goldens.
	VMEXEC_MIRROR="../../deploy/grafana ../../examples" VMEXEC_FILES="$ROOT/.cache/bin/hostaccel" VMEXEC_ENV="HOSTACCEL_REQUIRE_ROOT=1 HOSTACCEL_REQUIRE_FLOWTABLE=1 HOSTACCEL_REQUIRE_KTLS=1 HOSTACCEL_REQUIRE_SOCKMAP_BOUND=1 HOSTACCEL_REQUIRE_TC=1 HOSTACCEL_BIN=/vmtest/hostaccel" \
		go test -count=1 -p 1 -timeout 40m -exec "$ROOT/vmtest/vmexec.sh" ./test/e2e/ ./test/reliability/ ./internal/probe/ ./internal/conntrack/ ./internal/tc/ ./internal/flowtable/ ./internal/sockmap/
	# The kernel accepts the flowtable and the load balancer of every config validation
	# accepted (the fuzz corpus).
	VMEXEC_MIRROR="../lb/testdata" VMEXEC_ENV="HOSTACCEL_REQUIRE_ROOT=1 HOSTACCEL_REQUIRE_FLOWTABLE=1" \
		go test -count=1 -p 1 -timeout 30m -exec "$ROOT/vmtest/vmexec.sh" -run '^TestFuzzCorpusKernelAccepts$' ./internal/config/
	# The load balancer's flow and client tables on 6.1 (dsr, stateless-dnat, persistence, a full
	# table), with traffic; every golden loads. (The rest of test/lb runs natively above: ~15 min
	# in the VM.)
	VMEXEC_MIRROR="../../internal/lb/testdata ../../examples" VMEXEC_FILES="$ROOT/.cache/bin/hostaccel" VMEXEC_ENV="HOSTACCEL_REQUIRE_ROOT=1 HOSTACCEL_BIN=/vmtest/hostaccel" \
		go test -count=1 -p 1 -timeout 20m -exec "$ROOT/vmtest/vmexec.sh" -run '^(TestGoldenRendersLoad|TestHashAndPersistence|TestDSRRepliesBypassTheLoadBalancer|TestDSRBackendOutlivesItsNeighbourEntry|TestStatelessIsUntracked|TestPersistenceParallelFirstConnections|TestPersistenceForgetsDownBackends)$' ./test/lb/
	VMEXEC_ENV="HOSTACCEL_REQUIRE_ROOT=1" \
		go test -count=1 -p 1 -timeout 10m -exec "$ROOT/vmtest/vmexec.sh" -run '^(TestFlowTableFullKeepsEachFlowOnOneBackend|TestForgetSparesAFlowAnotherCPURecorded)$' ./internal/lb/
fi
echo "== all tests passed in $(($(date +%s) - T0)) s"
