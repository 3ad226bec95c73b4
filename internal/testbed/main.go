package testbed

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
)

// MainRequireRoot is RequireRoot for a TestMain: as root it returns ok. Otherwise it
// prints why what (e.g. "e2e tests") does not run and the exit code: 0 (skipped), or 1
// with HOSTACCEL_REQUIRE_ROOT=1 in the environment.
func MainRequireRoot(what string) (code int, ok bool) {
	if os.Geteuid() == 0 {
		return 0, true
	}
	if os.Getenv("HOSTACCEL_REQUIRE_ROOT") == "1" {
		fmt.Printf("FAIL: %s need root\n", what)
		return 1, false
	}
	fmt.Printf("skipping %s: not root\n", what)
	return 0, false
}

// binary returns the hostaccel binary under test: $HOSTACCEL_BIN if set, else one built
// from cmd/hostaccel into a temporary directory that cleanup removes.
func binary() (bin string, cleanup func(), err error) {
	if bin := os.Getenv("HOSTACCEL_BIN"); bin != "" {
		return bin, func() {}, nil
	}
	dir, err := os.MkdirTemp("", "hostaccel-bin")
	if err != nil {
		return "", nil, err
	}
	cleanup = func() { os.RemoveAll(dir) }
	bin = filepath.Join(dir, "hostaccel")
	if out, err := exec.Command("go", "build", "-o", bin, "github.com/hostaccel/hostaccel/cmd/hostaccel").CombinedOutput(); err != nil {
		cleanup()
		return "", nil, fmt.Errorf("build hostaccel: %w\n%s", err, out)
	}
	return bin, cleanup, nil
}

// MainBinary is binary for a TestMain: it prints the error, if any, as a failure.
func MainBinary() (bin string, cleanup func(), ok bool) {
	bin, cleanup, err := binary()
	if err != nil {
		fmt.Println("FAIL:", err)
		return "", nil, false
	}
	return bin, cleanup, true
}
