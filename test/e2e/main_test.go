// Package e2e drives the hostaccel binary against a real kernel with the nftables flowtable:
// natively where the kernel has it, else inside the project's VM (scripts/test.sh). Traffic
// crosses a namespace mini-cluster (internal/testbed); conntrack [OFFLOAD] and rule counters
// are the proof.
package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/hostaccel/hostaccel/internal/probe"
	"github.com/hostaccel/hostaccel/internal/testbed"
)

var (
	hostaccel string       // path of the binary under test
	caps      probe.Result // what this kernel can do
	// lockFile is this run's, not the node's (/run/hostaccel/hostaccel.lock): other runs
	// may share the machine, each in namespaces of its own.
	lockFile string
)

// needFlowtable skips tests that need the nftables flowtable on kernels without it
// (scripts/test.sh runs them again in the VM, where HOSTACCEL_REQUIRE_FLOWTABLE=1).
func needFlowtable(t *testing.T) {
	t.Helper()
	if !caps.Has(probe.Flowtable) {
		t.Skip("this kernel has no nftables flowtable; scripts/test.sh runs this test in the VM")
	}
}

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	if code, ok := testbed.MainRequireRoot("e2e tests"); !ok {
		return code
	}
	caps = probe.Run(context.Background())
	if !caps.Has(probe.Flowtable) && (os.Getenv("HOSTACCEL_REQUIRE_FLOWTABLE") == "1" || os.Getenv("HOSTACCEL_IN_VM") == "1") {
		fmt.Println("FAIL: this kernel has no flowtable:", caps.Get(probe.Flowtable).Detail)
		return 1
	}
	bin, cleanup, ok := testbed.MainBinary()
	if !ok {
		return 1
	}
	defer cleanup()
	hostaccel = bin
	dir, err := os.MkdirTemp("", "hostaccel-e2e")
	if err != nil {
		fmt.Println("FAIL:", err)
		return 1
	}
	defer os.RemoveAll(dir)
	lockFile = filepath.Join(dir, "hostaccel.lock")
	return m.Run()
}

// withLock adds this run's lock file to the commands that take the lock.
func withLock(args []string) []string {
	if len(args) > 0 && slices.Contains([]string{"agent", "apply", "cleanup"}, args[0]) && !slices.Contains(args, "--lock-file") {
		return append(slices.Clone(args), "--lock-file", lockFile)
	}
	return args
}

// ha runs the hostaccel binary inside network namespace ns.
func ha(ns string, args ...string) (string, error) {
	args = withLock(args)
	out, err := exec.Command("ip", append([]string{"netns", "exec", ns, hostaccel}, args...)...).CombinedOutput()
	return string(out), err
}

func mustHA(t *testing.T, ns string, args ...string) string {
	t.Helper()
	out, err := ha(ns, args...)
	if err != nil {
		t.Fatalf("hostaccel %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return out
}

func writeConfig(t *testing.T, body string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "hostaccel.yaml")
	if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}
