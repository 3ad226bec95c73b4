//go:build !bench

package cli

import (
	"strings"
	"testing"
)

// The agent's binary has no benchmark: `hostaccel bench` looks for hostaccel-bench and, without
// it, says how to build it instead of running anything.
func TestBenchStubWithoutBenchBinary(t *testing.T) {
	t.Setenv("PATH", t.TempDir())
	root := newRoot()
	root.SetArgs([]string{"bench", "--reps", "1"})
	err := root.Execute()
	if err == nil || !strings.Contains(err.Error(), "go build -tags bench") || !strings.Contains(err.Error(), BenchBinary) {
		t.Fatalf("hostaccel bench without %s: %v", BenchBinary, err)
	}
}
