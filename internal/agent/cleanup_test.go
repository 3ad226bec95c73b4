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

// --cleanup-on-exit with a load balancer service: SIGTERM (ctx cancelled) during the first
// sync, on its way through the load balancer, or between syncs. The tables go either way:
// they are removed after the last sync returned, not beside it (a sync still running
// installed them again after the removal, and Run returned with them in the kernel).
func TestCleanupOnExitRemovesTheLoadBalancer(t *testing.T) {
	for _, during := range []bool{true, false} {
		dir := t.TempDir()
		path := filepath.Join(dir, "c.yaml")
		cfg := fmt.Sprintf("datapath: none\nloadBalancer:\n  api: {socket: %s/lb.sock}\n  stateFile: %s/svcs.yaml\n"+
			"  services:\n  - name: web\n    vips: [10.100.0.10]\n    port: 80\n    backends:\n    - {address: 10.1.1.2, port: 80}\n", dir, dir)
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
		listed, entered := make(chan struct{}), make(chan struct{})
		var listedOnce, enteredOnce sync.Once
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
		rt.Env = func([]string) (lb.Env, error) {
			enteredOnce.Do(func() { close(entered) })
			if during { // a slow sync (thousands of services): a removal beside it runs meanwhile
				select {
				case <-listed:
				case <-time.After(500 * time.Millisecond):
				}
			}
			return lb.Env{Local: []netip.Addr{netip.MustParseAddr("10.1.0.1")}}, nil
		}
		rt.FlushConntrack = func([]lb.ConntrackFlush) error { return nil }
		rt.Solicit = func([]netip.Addr) {}
		ctx, cancel := context.WithCancel(context.Background())
		if during {
			go func() { <-entered; cancel() }()
		} else {
			a.opts.OnSync = func(time.Duration, State, error) { go cancel() }
		}
		if err := a.Run(ctx); err != nil {
			t.Logf("Run: %v", err)
		}
		if refs, _ := lb.FakeTables(f)(context.Background()); len(refs) > 0 {
			t.Errorf("SIGTERM during a sync %v: Run returned with the load balancer's tables still installed: %v", during, refs)
		}
	}
}
