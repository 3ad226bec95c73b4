package cli

import (
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// `--flag false` for a bool flag: pflag takes "--flag" as true and "false" as an argument,
// which no command refused: `agent --cleanup-on-exit false` removed every rule at each
// restart, `render --flowtable-counter false` rendered the counter. Every command that takes
// no argument refuses one, before it does anything.
func TestStrayArgumentsRefused(t *testing.T) {
	cfg := filepath.Join(t.TempDir(), "c.yaml")
	if err := os.WriteFile(cfg, []byte("datapath: none\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{
		{"probe", "x"},
		{"render", "-f", cfg, "--flowtable-counter", "false"},
		{"apply", "-f", cfg, "x"},
		{"agent", "-f", cfg, "--cleanup-on-exit", "false"},
		{"status", "x"},
		{"cleanup", "x"},
		{"k8s", "render", "x"},
	} {
		root := newRoot()
		root.SetOut(io.Discard)
		root.SetErr(io.Discard)
		root.SetArgs(args)
		err := root.Execute()
		stray := args[len(args)-1]
		if err == nil || !strings.Contains(err.Error(), `"`+stray+`"`) {
			t.Errorf("hostaccel %s: %v, want the stray %q refused", strings.Join(args, " "), err, stray)
		}
	}
}
