package sockmap

import (
	"fmt"
	"os"
	"testing"

	"golang.org/x/sys/unix"
)

// TestMain gives the host tests a BPF filesystem of their own (BPFFS finds it first), so that
// they never mount one at /sys/fs/bpf of the host.
func TestMain(m *testing.M) {
	if os.Geteuid() != 0 {
		os.Exit(m.Run())
	}
	dir, err := os.MkdirTemp("", "hostaccel-bpffs")
	if err == nil {
		err = unix.Mount("bpf", dir, "bpf", 0, "mode=0700")
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "bpffs for the tests:", err)
		os.Exit(1)
	}
	code := m.Run()
	unix.Unmount(dir, unix.MNT_DETACH)
	os.Remove(dir)
	os.Exit(code)
}
