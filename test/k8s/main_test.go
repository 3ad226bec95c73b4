// Package k8s_test runs hostaccel's Kubernetes source against a real kube-apiserver and etcd,
// started on loopback by TestMain (test/k8s/testenv). The binaries come from
// scripts/k8s-build-test-bins.sh; without them the tests skip, unless HOSTACCEL_REQUIRE_K8S=1
// (CI), which makes them fail.
package k8s_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"testing"
	"time"

	"k8s.io/client-go/kubernetes"

	"github.com/hostaccel/hostaccel/test/k8s/testenv"
)

var (
	env      *testenv.Env
	admin    kubernetes.Interface
	setupErr error
)

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	bin, err := testenv.BinDir()
	if err != nil {
		setupErr = err
		return m.Run()
	}
	dir, err := os.MkdirTemp("", "hostaccel-k8s-test-")
	if err != nil {
		setupErr = err
		return m.Run()
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t0 := time.Now()
	env, err = testenv.Start(ctx, bin, dir)
	cancel()
	if err != nil {
		setupErr = fmt.Errorf("start the API server: %w", err)
		os.RemoveAll(dir)
		return m.Run()
	}
	fmt.Fprintf(os.Stderr, "test/k8s: kube-apiserver v%s + etcd v%s ready at %s in %s\n",
		testenv.K8sVersion, testenv.EtcdVersion, env.Host, time.Since(t0).Round(10*time.Millisecond))
	admin, err = env.AdminClient()
	if err != nil {
		setupErr = err
	}
	code := m.Run()
	env.Stop()
	if code == 0 {
		os.RemoveAll(dir)
	} else {
		fmt.Fprintf(os.Stderr, "test/k8s: logs kept in %s\n", dir)
	}
	return code
}

// requireEnv skips (or, with HOSTACCEL_REQUIRE_K8S=1, fails) a test without an API server.
func requireEnv(t *testing.T) {
	t.Helper()
	if setupErr == nil && env != nil {
		return
	}
	if os.Getenv(testenv.EnvRequire) == "1" {
		t.Fatalf("no API server (%s=1): %v", testenv.EnvRequire, setupErr)
	}
	t.Skipf("no API server: %v", setupErr)
}

func testLog(t *testing.T) *slog.Logger {
	if testing.Verbose() {
		return slog.New(slog.NewTextHandler(tWriter{t}, &slog.HandlerOptions{Level: slog.LevelInfo}))
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

type tWriter struct{ t *testing.T }

func (w tWriter) Write(b []byte) (int, error) {
	w.t.Log(string(b[:len(b)-1]))
	return len(b), nil
}
