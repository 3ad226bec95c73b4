package agent

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hostaccel/hostaccel/internal/config"
	"github.com/hostaccel/hostaccel/internal/datapath"
	"github.com/hostaccel/hostaccel/internal/flowtable"
	"github.com/hostaccel/hostaccel/internal/lb"
)

// --cleanup-on-exit: SIGTERM (ctx cancelled) while a sync is on its way through the load
// balancer. The tables are removed after that sync returned, not beside it (it installed them
// again after the removal, and Run returned with them in the kernel).
func TestCleanupOnExitAfterTheLastSync(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "c.yaml")
	cfg := fmt.Sprintf(`datapath: none
loadBalancer:
  api: {socket: %s/lb.sock}
  stateFile: %s/svcs.yaml
  services:
  - name: web
    vips: [10.100.0.10]
    port: 80
    backends:
    - {address: 10.1.1.2, port: 80}
`, dir, dir)
	if err := os.WriteFile(path, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	ft, _ := flowtable.NewFakeManager()
	a, err := New(Options{
		ConfigPath: path, CleanupOnExit: true, Probe: caps(true),
		Log:   slog.New(slog.NewTextHandler(io.Discard, nil)),
		Links: func() ([]config.Link, error) { return []config.Link{{Name: "eth0", Up: true}}, nil },
	}, &datapath.Managers{Flowtable: ft})
	if err != nil {
		t.Fatal(err)
	}
	m, f := lb.NewFakeManager()
	var calls atomic.Int32
	listed := make(chan struct{})
	var listedOnce sync.Once
	rt := a.LB()
	rt.NewManager = func() (*lb.Manager, error) {
		if calls.Add(1) == 1 {
			return m, nil // the syncs' manager
		}
		// Remove's fresh manager, on the same (fake) kernel
		tables := lb.FakeTables(f)
		return &lb.Manager{NFT: f, List: lb.FakeLister(f), ReadCounter: lb.FakeCounters(lb.FakeLister(f)),
			Tables: func(ctx context.Context) ([]lb.TableRef, error) {
				refs, err := tables(ctx)
				listedOnce.Do(func() { close(listed) })
				return refs, err
			}}, nil
	}
	entered := make(chan struct{})
	var enteredOnce sync.Once
	rt.Env = func([]string) (lb.Env, error) {
		enteredOnce.Do(func() { close(entered) })
		select { // the sync is slow (thousands of services, a busy node): Remove runs meanwhile
		case <-listed:
		case <-time.After(500 * time.Millisecond):
		}
		return lb.Env{Local: []netip.Addr{netip.MustParseAddr("10.1.0.1")}}, nil
	}
	rt.FlushConntrack = func([]netip.Addr, []int, string, netip.Addr, int) error { return nil }
	rt.Solicit = func([]netip.Addr) {}

	ctx, cancel := context.WithCancel(context.Background())
	go func() { <-entered; cancel() }() // SIGTERM during the first sync
	if err := a.Run(ctx); err != nil {
		t.Logf("Run: %v", err)
	}
	refs, _ := lb.FakeTables(f)(context.Background())
	if len(refs) > 0 {
		t.Errorf("--cleanup-on-exit: Run returned with the load balancer's tables still installed: %v", refs)
	}
}

// --cleanup-on-exit, SIGTERM between syncs: the tables go.
func TestCleanupOnExitBetweenSyncs(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "c.yaml")
	cfg := fmt.Sprintf(`datapath: none
loadBalancer:
  api: {socket: %s/lb.sock}
  stateFile: %s/svcs.yaml
  services:
  - name: web
    vips: [10.100.0.10]
    port: 80
    backends:
    - {address: 10.1.1.2, port: 80}
`, dir, dir)
	if err := os.WriteFile(path, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	ft, _ := flowtable.NewFakeManager()
	a, err := New(Options{
		ConfigPath: path, CleanupOnExit: true, Probe: caps(true),
		Log:   slog.New(slog.NewTextHandler(io.Discard, nil)),
		Links: func() ([]config.Link, error) { return []config.Link{{Name: "eth0", Up: true}}, nil },
	}, &datapath.Managers{Flowtable: ft})
	if err != nil {
		t.Fatal(err)
	}
	m, f := lb.NewFakeManager()
	var calls atomic.Int32
	listed := make(chan struct{})
	var listedOnce sync.Once
	rt := a.LB()
	rt.NewManager = func() (*lb.Manager, error) {
		if calls.Add(1) == 1 {
			return m, nil // the syncs' manager
		}
		// Remove's fresh manager, on the same (fake) kernel
		tables := lb.FakeTables(f)
		return &lb.Manager{NFT: f, List: lb.FakeLister(f), ReadCounter: lb.FakeCounters(lb.FakeLister(f)),
			Tables: func(ctx context.Context) ([]lb.TableRef, error) {
				refs, err := tables(ctx)
				listedOnce.Do(func() { close(listed) })
				return refs, err
			}}, nil
	}
	entered := make(chan struct{})
	var enteredOnce sync.Once
	rt.Env = func([]string) (lb.Env, error) {
		enteredOnce.Do(func() { close(entered) })
		return lb.Env{Local: []netip.Addr{netip.MustParseAddr("10.1.0.1")}}, nil
	}
	rt.FlushConntrack = func([]netip.Addr, []int, string, netip.Addr, int) error { return nil }
	rt.Solicit = func([]netip.Addr) {}

	ctx, cancel := context.WithCancel(context.Background())
	a.opts.OnSync = func(time.Duration, State, error) { go cancel() } // SIGTERM between syncs
	if err := a.Run(ctx); err != nil {
		t.Logf("Run: %v", err)
	}
	refs, _ := lb.FakeTables(f)(context.Background())
	if len(refs) > 0 {
		t.Errorf("--cleanup-on-exit: Run returned with the load balancer's tables still installed: %v", refs)
	}
}
