//go:build !bench

package cli

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"

	"github.com/spf13/cobra"
)

// BenchBinary is the name of the build with the benchmark (go build -tags bench).
const BenchBinary = "hostaccel-bench"

func init() { commands = append(commands, benchStubCmd) }

// benchStubCmd keeps `hostaccel bench` working in the lean agent: it runs hostaccel-bench
// (the same CLI built with -tags bench) from beside this binary or from PATH.
func benchStubCmd(*globals) *cobra.Command {
	return &cobra.Command{
		Use:                "bench",
		Short:              "Reproduce the seed benchmark tables on this machine (runs " + BenchBinary + ")",
		DisableFlagParsing: true,
		RunE: func(c *cobra.Command, args []string) error {
			bin, err := findBench()
			if err != nil {
				return err
			}
			return syscall.Exec(bin, append([]string{bin, "bench"}, args...), os.Environ())
		},
	}
}

// findBench looks for hostaccel-bench next to the running binary, then in PATH.
func findBench() (string, error) {
	if exe, err := os.Executable(); err == nil {
		if exe, err = filepath.EvalSymlinks(exe); err == nil {
			p := filepath.Join(filepath.Dir(exe), BenchBinary)
			if st, err := os.Stat(p); err == nil && !st.IsDir() && st.Mode()&0o111 != 0 {
				return p, nil
			}
		}
	}
	if p, err := exec.LookPath(BenchBinary); err == nil {
		return p, nil
	} else if !errors.Is(err, exec.ErrNotFound) {
		return "", err
	}
	return "", fmt.Errorf("this hostaccel is the agent without the benchmark (it keeps the agent small); "+
		"`hostaccel bench` runs %s, found neither beside this binary nor in PATH: build it with "+
		"`CGO_ENABLED=0 go build -tags bench -o %s ./cmd/hostaccel` (scripts/bench.sh does)", BenchBinary, BenchBinary)
}
