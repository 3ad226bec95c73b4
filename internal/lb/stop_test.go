package lb

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// checkedConfig is one service with a health check (interval 1h: its probe only waits) and the
// API on a unix socket in dir.
func checkedConfig(dir string) Config {
	s := fixture(DNAT, RoundRobin)
	s.HealthCheck = &HealthCheck{Type: "tcp", Interval: Duration{Duration: time.Hour}}
	return Config{API: &API{Socket: filepath.Join(dir, "lb.sock")}, StateFile: filepath.Join(dir, "state.yaml"),
		Services: []Service{s}}
}

// running counts the goroutines of health probes and of API servers, once they had 0.5 s to
// end.
func running() (probes, servers int) {
	for range 50 {
		probes, servers = 0, 0
		buf := make([]byte, 1<<22)
		buf = buf[:runtime.Stack(buf, true)]
		for _, g := range strings.Split(string(buf), "\n\n") {
			if strings.Contains(g, "(*Checker).run(") {
				probes++
			}
			if strings.Contains(g, "net/http.(*Server).Serve(") {
				servers++
			}
		}
		if probes == 0 && servers == 0 {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	return
}

// A sync that ends after Stop (Run's, when ctx ends: a caller's sync still under way) starts
// no API and no health check again, and the socket is gone. Before, it started both anew, and
// nothing stopped them.
func TestSyncAfterStopStartsNothing(t *testing.T) {
	cfg := checkedConfig(t.TempDir())
	r, _, _ := wakingRuntime()
	r.Env = func([]string) (Env, error) { return testEnv, nil }
	if err := r.Sync(context.Background(), cfg); err != nil {
		t.Fatal(err)
	}
	if p, s := running(); p == 0 || s == 0 {
		t.Fatalf("a running load balancer: %d probes, %d API servers", p, s)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	r.Run(ctx)
	defer r.stop(false)
	if err := r.Sync(ctx, cfg); !errors.Is(err, errStopped) {
		t.Errorf("sync after Stop: %v, want %v", err, errStopped)
	}
	if p, s := running(); p != 0 || s != 0 {
		t.Errorf("after Stop and a sync: %d health probes and %d API servers running", p, s)
	}
	if c, err := net.Dial("unix", cfg.API.Socket); err == nil {
		c.Close()
		t.Errorf("the API still accepts connections on %s", cfg.API.Socket)
	}
}

// The same with Stop concurrent with the sync: where it lands between the sync's taking the
// checker and its Update, the probes do not start on the stopped Checker (before, nothing could
// end them, not even a second stop).
func TestStopDuringSyncLeavesNoProbe(t *testing.T) {
	cfg := checkedConfig(t.TempDir())
	cfg.API = &API{Disabled: true}
	for i := range 300 {
		r, _, _ := wakingRuntime()
		r.Env = func([]string) (Env, error) { return testEnv, nil }
		if err := r.Sync(context.Background(), cfg); err != nil {
			t.Fatal(err)
		}
		var wg sync.WaitGroup
		wg.Add(2)
		go func() { defer wg.Done(); r.Stop() }()
		go func() { defer wg.Done(); r.Sync(context.Background(), cfg) }()
		wg.Wait()
		if p, _ := running(); p != 0 {
			t.Fatalf("iteration %d: %d health probes running after Stop", i, p)
		}
	}
}

// A change whose sync fails before the caller begins to wait for it (the agent's loop, woken at
// once, can finish first) is answered as failed and rolled back at once. Before, the caller
// waited for a sync nothing asked for, until applyTimeout, and the change stayed.
func TestChangeWhoseSyncFailedFirstIsRolledBack(t *testing.T) {
	r, _, fail, cfg := failingRuntime(t)
	defer r.stop(false)
	ctx := context.Background()
	if err := r.Sync(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	r.Trigger = func() { // the agent's loop at its fastest: the sync ends before Trigger returns
		if fail.Load() {
			r.Sync(ctx, cfg)
		}
	}
	defer func(d time.Duration) { applyTimeout = d }(applyTimeout)
	applyTimeout = time.Second
	fail.Store(true)
	start := time.Now()
	err := r.change(ctx, drainFirstBackend)
	if err == nil || !strings.Contains(err.Error(), "rolled back") || time.Since(start) >= applyTimeout {
		t.Fatalf("after %v: a change whose sync failed: %v; want it rolled back at once", time.Since(start).Round(time.Millisecond), err)
	}
}

// An API change whose sync is under way when the agent is told to stop: the caller gets an
// answer. Stopped as the agent stops it (after its loop's last sync), the change is applied and
// the answer says so; stopped when ctx ends (Run), the answer says it is saved and applied
// when the agent starts again. Before, the API was closed under the caller: EOF, for a change
// saved and applied.
func TestChangeUnderWayAtStop(t *testing.T) {
	for _, agentOrder := range []bool{true, false} {
		t.Run(map[bool]string{true: "after the last sync", false: "when ctx ends"}[agentOrder], func(t *testing.T) {
			cfg := checkedConfig(t.TempDir())
			cfg.Services[0].HealthCheck = nil
			r, wake, _ := wakingRuntime()
			var slow atomic.Bool
			inSync, release := make(chan struct{}, 1), make(chan struct{})
			r.Env = func([]string) (Env, error) {
				if slow.Load() {
					inSync <- struct{}{}
					<-release
				}
				return testEnv, nil
			}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			if err := r.Sync(ctx, cfg); err != nil {
				t.Fatal(err)
			}
			select { // a trigger left by the first sync's full read
			case <-wake:
			case <-time.After(100 * time.Millisecond):
			}
			loopDone := make(chan struct{})
			go func() { // the agent's loop: the change's sync, then shutdown
				defer close(loopDone)
				<-wake
				r.Sync(ctx, cfg)
				r.Stop()
			}()
			runDone := make(chan struct{})
			go func() {
				defer close(runDone)
				if !agentOrder {
					r.Run(ctx)
				}
			}()
			defer r.stop(false)
			slow.Store(true)
			errc := make(chan error, 1)
			go func() {
				errc <- NewClient(cfg.API.Socket, "", "").Do(context.Background(), "PATCH", BackendPath("web", "10.1.0.11:8080"), []byte(`{"state":"drain"}`), nil)
			}()
			<-inSync // the change's sync is under way
			cancel() // SIGTERM
			<-runDone
			close(release)
			<-loopDone
			err := <-errc
			saved, _ := os.ReadFile(cfg.StateFile)
			if !strings.Contains(string(saved), "drain") {
				t.Errorf("the state file lost the change:\n%s", saved)
			}
			if agentOrder && err != nil {
				t.Errorf("the caller got %v for a change saved and applied by the last sync", err)
			}
			if !agentOrder && (err == nil || !strings.Contains(err.Error(), "applied when it starts again")) {
				t.Errorf("the caller got %v, want the change saved and applied when the agent starts again", err)
			}
		})
	}
}

// failingRuntime is wakingRuntime whose syncs fail (listing links) while fail is set, with a
// config of one service, its state file in a directory of the test's.
func failingRuntime(t *testing.T) (*Runtime, chan struct{}, *atomic.Bool, Config) {
	r, wake, _ := wakingRuntime()
	fail := new(atomic.Bool)
	r.Env = func([]string) (Env, error) {
		if fail.Load() {
			return Env{}, errors.New("cannot list links")
		}
		return testEnv, nil
	}
	cfg := Config{API: &API{Disabled: true}, StateFile: filepath.Join(t.TempDir(), "state.yaml"),
		Services: []Service{fixture(DNAT, RoundRobin)}}
	return r, wake, fail, cfg
}

// drainFirstBackend is an API change: the first service's first backend drained.
func drainFirstBackend(svcs []Service, o *Overlay) error {
	s := svcs[0]
	s.Backends = append([]Backend(nil), s.Backends...)
	s.Backends[0].State = StateDrain
	o.put(s)
	return nil
}

// A sync that restarts the API (its socket moved) while an API call waits for that very sync
// does not stall: the old API closes at once (a graceful close would wait for the handler, and
// the handler for the sync, apiCloseWait). The caller's connection is closed under it, as
// before the graceful close existed.
func TestAPIRestartWhileCallWaitsDoesNotStall(t *testing.T) {
	dir := t.TempDir()
	cfg := checkedConfig(dir)
	cfg.Services[0].HealthCheck = nil
	r, wake, _ := wakingRuntime()
	r.Env = func([]string) (Env, error) { return testEnv, nil }
	ctx := context.Background()
	if err := r.Sync(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	defer r.Stop()
	select { // a trigger the first sync may leave
	case <-wake:
	case <-time.After(100 * time.Millisecond):
	}
	moved := cfg
	moved.API = &API{Socket: filepath.Join(dir, "lb2.sock")}
	took := make(chan time.Duration, 1)
	go func() { // the agent's loop: the change's sync reads the new config
		<-wake
		start := time.Now()
		r.Sync(ctx, moved)
		took <- time.Since(start)
	}()
	errc := make(chan error, 1)
	go func() {
		errc <- NewClient(cfg.API.Socket, "", "").Do(ctx, "PATCH", BackendPath("web", "10.1.0.11:8080"), []byte(`{"state":"drain"}`), nil)
	}()
	if d := <-took; d >= apiCloseWait/2 {
		t.Errorf("the sync that restarted the API took %v (held by the close of a handler waiting for it)", d.Round(time.Millisecond))
	}
	<-errc
}
