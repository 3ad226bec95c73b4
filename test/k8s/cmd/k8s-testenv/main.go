// Command k8s-testenv runs the tests' etcd + kube-apiserver (test/k8s/testenv) on loopback
// until it is stopped, for scripts/k8s-test-apiserver.sh and the demo.
//
//	k8s-testenv -dir DIR [-bin BINDIR]
//
// It writes DIR/kubeconfig (admin, system:masters) and, once the API server is ready,
// DIR/ready. SIGUSR1 stops the API server (etcd stays), the next SIGUSR1 starts it again:
// a way to watch an agent lose its API server and resync. SIGTERM or SIGINT stops both.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"github.com/hostaccel/hostaccel/test/k8s/testenv"
)

func main() {
	dir := flag.String("dir", "", "state directory (certificates, data, logs, kubeconfig); required")
	bin := flag.String("bin", "", "directory with kube-apiserver, etcd, kubectl (default: $HOSTACCEL_K8S_BIN, else the build script's cache)")
	flag.Parse()
	if err := run(*dir, *bin); err != nil {
		fmt.Fprintln(os.Stderr, "k8s-testenv:", err)
		os.Exit(1)
	}
}

func run(dir, bin string) error {
	if dir == "" {
		return fmt.Errorf("-dir is required")
	}
	if bin == "" {
		var err error
		if bin, err = testenv.BinDir(); err != nil {
			return err
		}
	}
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT, syscall.SIGUSR1)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t0 := time.Now()
	env, err := testenv.Start(ctx, bin, dir)
	cancel()
	if err != nil {
		return err
	}
	defer env.Stop()
	ready := filepath.Join(dir, "ready")
	if err := os.WriteFile(ready, []byte(env.Host+"\n"), 0o644); err != nil {
		return err
	}
	fmt.Printf("kube-apiserver v%s + etcd v%s ready at %s in %s; KUBECONFIG=%s\n",
		testenv.K8sVersion, testenv.EtcdVersion, env.Host, time.Since(t0).Round(10*time.Millisecond), env.Kubeconfig)
	up := true
	for sig := range sigs {
		if sig != syscall.SIGUSR1 {
			break
		}
		if up {
			env.KillAPIServer()
			os.Remove(ready)
			fmt.Println("kube-apiserver stopped (SIGUSR1 starts it again)")
		} else {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			err := env.StartAPIServer(ctx)
			cancel()
			if err != nil {
				return err
			}
			_ = os.WriteFile(ready, []byte(env.Host+"\n"), 0o644)
			fmt.Println("kube-apiserver ready again")
		}
		up = !up
	}
	fmt.Println("stopping")
	os.Remove(ready)
	return nil
}
