#!/bin/bash
# Smoke test of the VM harness: modules + nft flowtable + tc flower inside the guest, exit-status
# propagation, timeout cleanup, and `go test -exec vmexec.sh` (pass and fail) on a throwaway
# package in a temp dir. Prints the time of each step. Exit 0 iff every check passed.
set -euo pipefail
HERE=$(cd "$(dirname "$(readlink -f "$0")")" && pwd)
T=$(mktemp -d "${TMPDIR:-/tmp}/vmtest-selftest.XXXXXX")
trap 'rm -rf "$T"' EXIT
fails=0
now() { date +%s%N; }
secs() { local ms=$((($(now) - $1) / 1000000)); printf '%d.%01ds' $((ms / 1000)) $((ms % 1000 / 100)); }
check() { # check NAME START COMMAND...: PASS if COMMAND succeeds; prints the time since START
	local name=$1 start=$2
	shift 2
	if "$@"; then echo "PASS  $name ($(secs "$start"))"; else echo "FAIL  $name ($(secs "$start"))"; fails=$((fails + 1)); fi
}
T00=$(now)

t=$(now)
"$HERE/mkinitramfs.sh"
check "base initramfs up to date" "$t" true

# 1. guest-side checks (one boot)
cat >"$T/guest.sh" <<'EOF'
n=0
ok() { if "$@" >/tmp/out 2>&1; then echo "  ok   $*"; else echo "  FAIL $*"; sed 's/^/       /' /tmp/out; n=$((n + 1)); fi; }
ok grep -q cloud-amd64 /proc/version
ok nft add table inet autoload                      # nf_tables loaded on demand (request_module)
ok modprobe -a nf_flow_table_inet nft_flow_offload  # (without -a, the 2nd name is a module parameter)
ok sh -c 'lsmod | grep -q "^nf_flow_table_inet " && lsmod | grep -q "^nft_flow_offload "'
ok nft add table inet t
ok nft add flowtable inet t ft '{ hook ingress priority 0; devices = { lo }; }'
ok nft add table inet tc
ok nft add flowtable inet tc ft '{ hook ingress priority 0; devices = { lo }; counter; }'
ok sh -c 'nft list flowtable inet tc ft | grep -qw counter'
ok nft add chain inet t forward '{ type filter hook forward priority 0; }'
ok nft add rule inet t forward meta l4proto tcp ct state established flow add @ft counter
ok tc qdisc add dev lo clsact
ok tc filter add dev lo ingress protocol ip flower dst_ip 127.0.0.2 action gact pass
nft add flowtable inet tc ft2 '{ hook ingress priority 0; devices = { lo }; flags counter; }' >/dev/null 2>&1 &&
	echo "  info 'flags counter;' accepted by $(nft --version)" ||
	echo "  info 'flags counter;' is a syntax error in $(nft --version); use 'counter;'"
exit $n
EOF
t=$(now)
rc=0
"$HERE/run-in-vm.sh" -q -f "$T/guest.sh" -- bash guest.sh || rc=$?
check "guest: modprobe, nft flowtable (+counter), tc flower" "$t" test "$rc" = 0

# 2. exit status propagation
t=$(now)
rc=0
"$HERE/run-in-vm.sh" -q -- sh -c 'exit 3' || rc=$?
check "exit status propagates (got $rc, want 3)" "$t" test "$rc" = 3

# 3. timeout: status 124 and no qemu left behind
t=$(now)
rc=0
VMTEST_QEMU_ARGS="-name vmtest-selftest-$$" "$HERE/run-in-vm.sh" -q -t 2 -- sleep 60 2>/dev/null || rc=$?
sleep 0.5
left=$(pgrep -f "vmtest-selftest-$$" | xargs -r ps -o stat= -p | grep -vc Z || true)
check "timeout gives 124 (got $rc), qemu gone (left: $left)" "$t" test "$rc" = 124 -a "$left" = 0

# 4. go test -exec vmexec.sh on a throwaway package (static binary: CGO_ENABLED=0)
P=$T/gopkg
mkdir -p "$P/testdata"
echo hello >"$P/testdata/hello.txt"
echo extra >"$T/extra-file"
echo fixture >"$T/fixture.txt"
printf 'module vmselftest\n\ngo 1.21\n' >"$P/go.mod"
cat >"$P/vm_test.go" <<'EOF'
package vmselftest

import (
	"os"
	"strings"
	"testing"
)

func TestInVM(t *testing.T) {
	if os.Getenv("HOSTACCEL_IN_VM") != "1" {
		t.Fatal("HOSTACCEL_IN_VM != 1")
	}
	if v, _ := os.ReadFile("/proc/version"); !strings.Contains(string(v), "cloud-amd64") {
		t.Fatalf("not the VM kernel: %s", v)
	}
	if b, err := os.ReadFile("testdata/hello.txt"); err != nil || string(b) != "hello\n" {
		t.Fatalf("testdata: %q %v", b, err)
	}
	if _, err := os.Stat("/vmtest/extra-file"); err != nil {
		t.Fatal("VMEXEC_FILES:", err)
	}
	if b, err := os.ReadFile("../fixture.txt"); err != nil || string(b) != "fixture\n" {
		t.Fatalf("VMEXEC_MIRROR: %q %v", b, err)
	}
	if os.Getenv("SELFTEST_A") != "1" || os.Getenv("SELFTEST_FAIL") == "1" {
		t.Fatalf("env: SELFTEST_A=%q SELFTEST_FAIL=%q", os.Getenv("SELFTEST_A"), os.Getenv("SELFTEST_FAIL"))
	}
	t.Log("inside the VM")
}
EOF
gotest() { # gotest EXEC_PATH VMEXEC_ENV -> go test's output in $T/go.out, its status
	(cd "$P" && CGO_ENABLED=0 GOWORK=off GOTOOLCHAIN=local VMEXEC_FILES="$T/extra-file" VMEXEC_MIRROR=../fixture.txt VMEXEC_ENV="$2" \
		go test -count=1 -v -exec "$1" . >"$T/go.out" 2>&1)
}
go build -C "$P" ./... # warm the build cache so the timing below is mostly the VM
t=$(now)
rc=0
gotest "$(realpath --relative-to="$P" "$HERE/vmexec.sh")" "SELFTEST_A=1" || rc=$?
passed() { [ "$rc" = 0 ] && grep -q -- '--- PASS: TestInVM' "$T/go.out" && grep -q 'inside the VM' "$T/go.out" ||
	{ sed 's/^/    /' "$T/go.out"; return 1; }; }
check "go test -exec <relative>/vmexec.sh passes inside the VM" "$t" passed

t=$(now)
rc=0
gotest "$HERE/vmexec.sh" "SELFTEST_A=1 SELFTEST_FAIL=1" || rc=$?
failed() { [ "$rc" != 0 ] && grep -q -- '--- FAIL: TestInVM' "$T/go.out" || { sed 's/^/    /' "$T/go.out"; return 1; }; }
check "go test -exec <absolute>/vmexec.sh reports a failing test" "$t" failed

echo "selftest: $fails failure(s), total $(secs "$T00")"
[ "$fails" = 0 ]
