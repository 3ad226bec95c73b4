//go:build bench

package cli

import (
	"strings"
	"testing"
)

// A VM-only run has no host part, so --duration (the host's run length) would change
// nothing: the command refuses it and names the flag that sets the VM's. (--pin bogus is
// invalid too: were the check gone, the test would fail on it, not start a bench.)
func TestBenchVMOnlyRefusesHostDuration(t *testing.T) {
	for _, args := range [][]string{
		{"bench", "--vm-only", "--duration", "5s", "--pin", "bogus"},
		{"bench", "--vm", "only", "--duration", "5s", "--pin", "bogus"},
	} {
		root := newRoot()
		root.SetArgs(args)
		err := root.Execute()
		if err == nil || !strings.Contains(err.Error(), "--duration") || !strings.Contains(err.Error(), "--vm-duration") {
			t.Errorf("%v: %v", args, err)
		}
	}
}
