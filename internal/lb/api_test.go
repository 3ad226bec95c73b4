package lb

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"sigs.k8s.io/knftables"

	"github.com/hostaccel/hostaccel/internal/testbed"
)

// testRuntime is a Runtime on a fake kernel whose syncs run on their own goroutine, as the
// agent's loop would run them.
func testRuntime(t testing.TB, cfg Config) (*Runtime, *Client, func() string) {
	t.Helper()
	r, wake, f := wakingRuntime()
	r.Env = func([]string) (Env, error) { return testEnv, nil }
	ctx, cancel := context.WithCancel(context.Background())
	done := syncLoop(ctx, r, wake, cfg)
	if err := r.Sync(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(r.Handler())
	t.Cleanup(func() { srv.Close(); cancel(); <-done; r.stop(false) })
	return r, &Client{HTTP: srv.Client(), Base: srv.URL}, func() string { return f.Dump() }
}

// wakingRuntime is a Runtime on the Fake (returned too) whose Trigger wakes the returned
// channel (the agent's loop: syncLoop, or a test's own); its Env is the caller's to set.
func wakingRuntime() (*Runtime, chan struct{}, *knftables.Fake) {
	m, f := NewFakeManager()
	wake := make(chan struct{}, 1)
	r := NewRuntime(slog.New(slog.NewTextHandler(io.Discard, nil)), func() {
		select {
		case wake <- struct{}{}:
		default:
		}
	})
	r.NewManager = func() (*Manager, error) { return m, nil }
	r.FlushConntrack = func([]ConntrackFlush) error { return nil }
	r.Solicit = func([]netip.Addr) {}
	return r, wake, f
}

// syncLoop syncs cfg whenever wake fires, until ctx ends (then the returned channel closes),
// as the agent's loop does.
func syncLoop(ctx context.Context, r *Runtime, wake <-chan struct{}, cfg Config) <-chan struct{} {
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case <-ctx.Done():
				return
			case <-wake:
				r.Sync(ctx, cfg)
			}
		}
	}()
	return done
}

func TestAPI(t *testing.T) {
	dir := t.TempDir()
	state := filepath.Join(dir, "lb-services.yaml")
	cfg := Config{API: &API{Disabled: true}, StateFile: state, Services: []Service{fixture(DNAT, RoundRobin)}}
	_, c, kernel := testRuntime(t, cfg)
	ctx := context.Background()

	api := fixture(SNAT, Weighted)
	api.Name, api.VIPs = "api", []string{"192.0.2.20"}
	api.Backends = api.Backends[:3]
	var out ServiceStatus
	if err := c.Do(ctx, http.MethodPost, "/v1/services", api, &out); err != nil || out.Name != "api" || out.Origin != "api" || len(out.Backends) != 3 {
		t.Fatalf("add: %v %+v", err, out)
	}
	if !strings.Contains(kernel(), "192.0.2.20 . tcp . 80 : goto svc-api-v4") {
		t.Error("the new service is not in the kernel")
	}
	saved, _ := os.ReadFile(state)
	for _, bad := range []struct {
		method, path string
		body         any
		want         string
	}{
		{http.MethodPost, "/v1/services", []byte("name: bad\nvips: [192.0.2.30]\nport: 0\nbackends: [{address: 10.1.0.11}]\n"), "services[bad].port: 0 is not a valid port"},
		{http.MethodPost, "/v1/services", []byte("name: bad\nbogus: 1\n"), `service: unknown field "bogus"`},
		{http.MethodPost, "/v1/services", []byte("name: nob\nvips: [192.0.2.31]\nport: 80\ntopology: dsr\ninterface: eth0\n"), "services[nob].backends: a dsr service needs at least one backend"},
		{http.MethodPost, "/v1/services", api, `service "api" exists`},
		{http.MethodPatch, ServicePath("api"), map[string]any{"vips": []string{"192.0.2.10"}}, `services[api].vips[0]: 192.0.2.10 tcp/80 is already used by service "web"`},
		{http.MethodPatch, ServicePath("api"), map[string]any{"name": "other"}, "cannot be renamed"},
		{http.MethodPatch, BackendPath("api", "10.1.0.99:8080"), map[string]any{"state": "drain"}, "has no backend 10.1.0.99:8080"},
		{http.MethodPatch, BackendPath("api", "10.1.0.11:8080"), map[string]any{"state": "sleeping"}, `services[api].backends[0].state: "sleeping" is not one of up, drain, down`},
		{http.MethodDelete, ServicePath("nope"), nil, `no service "nope"`},
	} {
		before := kernel()
		err := c.Do(ctx, bad.method, bad.path, bad.body, nil)
		if err == nil || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("%s %s: %v, want %q", bad.method, bad.path, err, bad.want)
		}
		if kernel() != before {
			t.Errorf("%s %s: a rejected change changed the kernel", bad.method, bad.path)
		}
		if now, _ := os.ReadFile(state); string(now) != string(saved) {
			t.Errorf("%s %s: a rejected change changed the state file", bad.method, bad.path)
		}
	}

	if err := c.Do(ctx, http.MethodPatch, BackendPath("api", "10.1.0.11:8080"), map[string]any{"state": "drain"}, &out); err != nil || out.Backends[0].State != StateDrain || out.Backends[0].Active {
		t.Errorf("drain: %v %+v", err, out.Backends[0])
	}
	if err := c.Do(ctx, http.MethodPost, ServicePath("api")+"/backends", Backend{Address: "10.1.0.14", Port: 8080}, &out); err != nil || len(out.Backends) != 4 {
		t.Errorf("backend add: %v %+v", err, out)
	}
	if err := c.Do(ctx, http.MethodDelete, BackendPath("api", "10.1.0.12:8080"), nil, nil); err != nil {
		t.Error(err)
	}
	if err := c.Do(ctx, http.MethodPatch, ServicePath("web"), map[string]any{"scheduler": "hash", "hashFields": []string{"src-ip"}}, &out); err != nil || out.Scheduler != Hash || out.Origin != "api" {
		t.Errorf("patch a config service: %v %+v", err, out)
	}
	if err := c.Do(ctx, http.MethodDelete, ServicePath("web"), nil, nil); err != nil {
		t.Error(err)
	}
	var st Status
	c.Do(ctx, http.MethodGet, "/v1/status", nil, &st)
	if len(st.Services) != 1 || st.Services[0].Name != "api" || st.Services[0].Packets == 0 {
		t.Errorf("status after deleting web: %+v", st.Services)
	}

	// A restart (a new runtime on the same state file) keeps the changes.
	_, c2, kernel2 := testRuntime(t, cfg)
	c2.Do(ctx, http.MethodGet, "/v1/status", nil, &st)
	if len(st.Services) != 1 || len(st.Services[0].Backends) != 3 || st.Services[0].Backends[0].State != StateDrain ||
		!strings.Contains(kernel2(), "goto svc-api-v4") || strings.Contains(kernel2(), "svc-web-v4") {
		t.Errorf("after restart: %+v", st.Services)
	}
	// reset brings the config's web back.
	if err := c2.Do(ctx, http.MethodPost, ServicePath("web")+"/reset", nil, nil); err != nil {
		t.Fatal(err)
	}
	c2.Do(ctx, http.MethodGet, ServicePath("web"), nil, &out)
	if out.Origin != "config" || out.Scheduler != RoundRobin {
		t.Errorf("after reset: %+v", out)
	}
	// Metrics.
	resp, err := c2.HTTP.Get(c2.Base + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, want := range []string{`hostaccel_lb_backend_active{backend="10.1.0.11:8080",service="api"} 0`, `hostaccel_lb_service_packets_total{service="api"} 7`,
		`hostaccel_lb_backend_health{backend="10.1.0.13:8080",service="api",state="unknown"} 1`} {
		if !strings.Contains(string(body), want) {
			t.Errorf("metrics lack %q:\n%s", want, body)
		}
	}
}

// A reset of a service that does not exist is 404 (it was 200 with an empty object); a body
// over 1 MiB is 413 (it was cut at 1 MiB and answered 400 "unexpected end of stream").
func TestAPIStatusCodes(t *testing.T) {
	state := filepath.Join(t.TempDir(), "lb-services.yaml")
	_, c, kernel := testRuntime(t, Config{API: &API{Disabled: true}, StateFile: state, Services: []Service{fixture(DNAT, RoundRobin)}})
	before := kernel()
	big := fixture(SNAT, Weighted)
	big.Name, big.VIPs = "big", []string{"192.0.2.20"}
	body, _ := json.Marshal(big)
	body = append(body[:len(body)-1], []byte(`,"backends":[`+strings.Repeat(`{"address":"10.1.0.11"},`, 100000)+`{"address":"10.1.0.12"}]}`)...)
	for _, tc := range []struct {
		method, path string
		body         []byte
		code         int
		want         string
	}{
		{http.MethodPost, ServicePath("nope") + "/reset", nil, http.StatusNotFound, `no service \"nope\"`},
		{http.MethodPost, "/v1/services", body, http.StatusRequestEntityTooLarge, "the request body is larger than 1 MiB, the API's limit"},
		{http.MethodPut, ServicePath("big"), body, http.StatusRequestEntityTooLarge, "larger than 1 MiB"},
		{http.MethodPost, ServicePath("web") + "/reset", nil, http.StatusOK, `"name": "web"`},
	} {
		req, _ := http.NewRequest(tc.method, c.Base+tc.path, bytes.NewReader(tc.body))
		resp, err := c.HTTP.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		got, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != tc.code || !strings.Contains(string(got), tc.want) {
			t.Errorf("%s %s: %d %.200s, want %d with %q", tc.method, tc.path, resp.StatusCode, got, tc.code, tc.want)
		}
		if _, err := os.Stat(state); err == nil && tc.code != http.StatusOK {
			t.Errorf("%s %s: the state file was written", tc.method, tc.path)
		}
	}
	if kernel() != before {
		t.Error("the kernel changed")
	}
}

// The statuses of a change's outcome: a PUT that creates a service 201 (200 when it replaces
// one); a change saved whose sync does not come in time 504 (it is applied later); a change
// refused because an earlier one is still not applied 503 with Retry-After. Before, the first
// answered 200 and the others 500, as for a change the kernel refused.
func TestAPIChangeOutcomeStatuses(t *testing.T) {
	r, wake, _ := wakingRuntime()
	r.Env = func([]string) (Env, error) { return testEnv, nil }
	cfg := Config{API: &API{Disabled: true}, StateFile: filepath.Join(t.TempDir(), "lb-services.yaml"), Services: []Service{fixture(DNAT, RoundRobin)}}
	if err := r.Sync(context.Background(), cfg); err != nil {
		t.Fatal(err)
	}
	defer r.stop(false)
	defer func(d time.Duration) { applyTimeout = d }(applyTimeout)
	applyTimeout = 200 * time.Millisecond
	h := r.Handler()
	ctx, cancel := context.WithCancel(context.Background())
	loop := syncLoop(ctx, r, wake, cfg) // the agent's loop, for the first two steps
	do := func(method, path, body string) *httptest.ResponseRecorder {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(method, path, strings.NewReader(body)))
		return rec
	}
	api := fixture(SNAT, Weighted)
	api.Name, api.VIPs = "api", []string{"192.0.2.20"}
	body, _ := json.Marshal(api)
	for _, step := range []struct {
		name, method, path, body string
		code                     int
	}{
		{"PUT of a new service", http.MethodPut, ServicePath("api"), string(body), http.StatusCreated},
		{"PUT of a service that exists", http.MethodPut, ServicePath("api"), string(body), http.StatusOK},
	} {
		rec := do(step.method, step.path, step.body)
		if rec.Code != step.code {
			t.Errorf("%s: %d %.300s, want %d", step.name, rec.Code, rec.Body, step.code)
		}
	}
	cancel() // from here nothing syncs
	<-loop
	rec := do(http.MethodPatch, BackendPath("web", "10.1.0.11:8080"), `{"state": "drain"}`)
	if rec.Code != http.StatusGatewayTimeout || !strings.Contains(rec.Body.String(), "saved, but not applied yet") {
		t.Errorf("a change whose sync does not come: %d %.300s, want 504, saved but not applied yet", rec.Code, rec.Body)
	}
	rec = do(http.MethodPatch, BackendPath("web", "10.1.0.12:8080"), `{"state": "drain"}`)
	if rec.Code != http.StatusServiceUnavailable || rec.Header().Get("Retry-After") == "" || !strings.Contains(rec.Body.String(), "not saved: an earlier change is not applied yet") {
		t.Errorf("a change behind one not applied: %d %v %.300s, want 503 with Retry-After, not saved", rec.Code, rec.Header(), rec.Body)
	}
}

func TestAPIKey(t *testing.T) {
	s := &apiServer{}
	h := requireKey(&s.key, http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {}))
	check := func(what string, want map[string]int) {
		t.Helper()
		for key, code := range want {
			rec := httptest.NewRecorder()
			req := httptest.NewRequest(http.MethodGet, "/v1/status", nil)
			if key != "" {
				req.Header.Set("Authorization", "Bearer "+key)
			}
			h.ServeHTTP(rec, req)
			if rec.Code != code {
				t.Errorf("%s: key %q: %d, want %d", what, key, rec.Code, code)
			}
		}
	}
	a := API{Listen: "127.0.0.1:0", KeyFile: filepath.Join(t.TempDir(), "key")}
	os.WriteFile(a.KeyFile, []byte("0123456789abcdef\n"), 0o600)
	if err := s.reloadKey(a); err != nil {
		t.Fatal(err)
	}
	check("first key", map[string]int{"": 401, "wrong": 401, "0123456789abcdef": 200})
	// A rotated key takes effect at the next sync (reloadKey), without a restart; before, the
	// old key kept working until the agent restarted (found by a helper's review).
	os.WriteFile(a.KeyFile, []byte("fedcba9876543210"), 0o600)
	if err := s.reloadKey(a); err != nil {
		t.Fatal(err)
	}
	check("rotated key", map[string]int{"0123456789abcdef": 401, "fedcba9876543210": 200})
	// A key file removed or too short revokes the key: every request is refused.
	os.WriteFile(a.KeyFile, []byte("short"), 0o600)
	if err := s.reloadKey(a); err == nil || !strings.Contains(err.Error(), "loadBalancer.api.keyFile") {
		t.Errorf("a short key: %v, want an error naming loadBalancer.api.keyFile", err)
	}
	check("short key", map[string]int{"fedcba9876543210": 401, "short": 401})
	os.Remove(a.KeyFile)
	os.WriteFile(a.KeyFile+"x", nil, 0o600)
	if err := s.reloadKey(a); err == nil {
		t.Error("a missing key file: no error")
	}
	check("no key file", map[string]int{"fedcba9876543210": 401})
}

func TestMerge(t *testing.T) {
	a, b, c := Service{Name: "a"}, Service{Name: "b"}, Service{Name: "c", Port: 1}
	b2 := Service{Name: "b", Port: 2}
	var o Overlay
	o.put(b2)
	o.put(c)
	o.remove("a", true)
	got := Merge([]Service{a, b}, o)
	if len(got) != 2 || got[0].Port != 2 || got[1].Name != "c" {
		t.Errorf("merge: %+v", got)
	}
	o.reset("a")
	if got := Merge([]Service{a, b}, o); len(got) != 3 || got[0].Name != "a" {
		t.Errorf("after reset: %+v", got)
	}
	path := filepath.Join(t.TempDir(), "x", "state.yaml")
	if err := o.Save(path); err != nil {
		t.Fatal(err)
	}
	back, err := LoadOverlay(path)
	if err != nil || len(back.Services) != 2 {
		t.Errorf("load: %v %+v", err, back)
	}
	if _, err := LoadOverlay(filepath.Join(t.TempDir(), "missing")); err != nil {
		t.Error(err)
	}
}

// A sync does not validate again the merge an API change validated (or the last sync did),
// but a reloaded config (a new slice) or a replaced overlay is validated again: a config that
// now conflicts with the API's services is refused, not applied from the memo.
func TestServicesValidatedOnce(t *testing.T) {
	state := filepath.Join(t.TempDir(), "lb-services.yaml")
	cfg := Config{API: &API{Disabled: true}, StateFile: state, Services: []Service{fixture(DNAT, RoundRobin)}}
	r, c, _ := testRuntime(t, cfg)
	ctx := context.Background()
	api := fixture(SNAT, Weighted)
	api.Name, api.VIPs = "api", []string{"192.0.2.20"}
	if err := c.Do(ctx, http.MethodPost, "/v1/services", api, nil); err != nil {
		t.Fatal(err)
	}
	r.mu.Lock()
	memo := r.valid.svcs
	r.mu.Unlock()
	if len(memo) != 2 {
		t.Fatalf("the API change left no valid merge: %+v", memo)
	}
	got, err := r.services(cfg)
	if err != nil || len(got) != 2 || &got[0] != &memo[0] {
		t.Errorf("the same config and overlay: %v, %d services, memo used %v", err, len(got), err == nil && &got[0] == &memo[0])
	}

	// The config reloaded with a service on the API service's VIP and port: a new slice.
	reloaded := cfg
	clash := fixture(DNAT, RoundRobin)
	clash.Name, clash.VIPs = "clash", []string{"192.0.2.20"}
	reloaded.Services = []Service{fixture(DNAT, RoundRobin), clash}
	if _, err := r.services(reloaded); err == nil || !strings.Contains(err.Error(), "192.0.2.20 tcp/80 is already used") {
		t.Errorf("a reloaded config that conflicts with the API's service: %v", err)
	}
	// The overlay replaced (the API service deleted) under the same config: validated anew.
	if err := c.Do(ctx, http.MethodDelete, ServicePath("api"), nil, nil); err != nil {
		t.Fatal(err)
	}
	if got, err := r.services(cfg); err != nil || len(got) != 1 {
		t.Errorf("after the API service's delete: %v, %d services", err, len(got))
	}
}

// An API change waits for a sync that carries it: one that began before the change was
// saved, and failed (a transient error), neither applied it nor may roll it back; the next
// sync applies it.
func TestChangeNotRolledBackByAnEarlierSyncsFailure(t *testing.T) {
	r, wake, _ := wakingRuntime()
	var fail atomic.Bool
	inEnv, release := make(chan struct{}), make(chan struct{})
	r.Env = func([]string) (Env, error) {
		if fail.Load() {
			close(inEnv)
			<-release
			return Env{}, errors.New("transient: cannot list links")
		}
		return testEnv, nil
	}
	defer r.stop(false)
	ctx := context.Background()
	cfg := Config{API: &API{Disabled: true}, StateFile: filepath.Join(t.TempDir(), "state.yaml"),
		Services: []Service{fixture(DNAT, RoundRobin)}}
	if err := r.Sync(ctx, cfg); err != nil {
		t.Fatal(err)
	}

	// S1 starts (the agent's loop, an EndpointSlice event, a resync ...) and will fail.
	fail.Store(true)
	s1 := make(chan error, 1)
	go func() { s1 <- r.Sync(ctx, cfg) }()
	<-inEnv
	fail.Store(false)
	go func() { // the agent's loop: the next sync, once S1 is done
		<-s1
		<-wake
		r.Sync(ctx, cfg)
	}()

	// Meanwhile an API call drains a backend: valid, saved, waits for its sync.
	changed := make(chan error, 1)
	go func() {
		changed <- r.change(ctx, func(svcs []Service, o *Overlay) error {
			s := svcs[0]
			s.Backends = append([]Backend(nil), s.Backends...)
			s.Backends[0].State = StateDrain
			o.put(s)
			return nil
		})
	}()
	for deadline := time.Now().Add(5 * time.Second); ; {
		r.mu.Lock()
		saved := r.gen > 0
		r.mu.Unlock()
		if saved {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("change not saved")
		}
		time.Sleep(time.Millisecond)
	}
	close(release) // S1 fails: it never carried the change
	if err := <-changed; err != nil {
		t.Errorf("a valid change was rolled back because a sync that began before it failed: %v", err)
	}
}

// A change whose own sync fails is rolled back: the state file and the services are as
// before it, and the caller is told.
func TestChangeRolledBackWhenItsSyncFails(t *testing.T) {
	r, wake, fail, cfg := failingRuntime(t)
	defer r.stop(false)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if err := r.Sync(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	syncLoop(ctx, r, wake, cfg)
	fail.Store(true)
	err := r.change(ctx, drainFirstBackend)
	if err == nil || !strings.Contains(err.Error(), "rolled back") {
		t.Fatalf("a change whose sync failed: %v", err)
	}
	r.mu.Lock()
	svcs := Merge(r.cfg.Services, r.overlay)
	r.mu.Unlock()
	if svcs[0].Backends[0].State == StateDrain {
		t.Error("the change is still in the services after its rollback")
	}
}

// Two API changes made at once are applied one after the other: one whose sync fails is
// rolled back alone, and one made meanwhile is applied. Before, both were saved before the next
// sync, which carried both and failed: both callers were told "rolled back", the failing change
// stayed in the state file (every later sync failed with it) and the valid one was undone.
func TestConcurrentChangesRollBackOnlyTheFailedOne(t *testing.T) {
	r, wake, c, cfg := failingDSRRuntime(t)
	ctx, state := context.Background(), cfg.StateFile
	gen := func() uint64 { r.mu.Lock(); defer r.mu.Unlock(); return r.gen }
	waitFor := func(what string, ok func() bool) {
		t.Helper()
		for deadline := time.Now().Add(5 * time.Second); !ok(); time.Sleep(time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("%s: timed out", what)
			}
		}
	}
	bad := fixture(DSR, RoundRobin) // its interface does not exist: the sync fails
	bad.Name, bad.VIPs, bad.Interface = "bad", []string{"192.0.2.50"}, "eth9"
	errA, errB := make(chan error, 1), make(chan error, 1)
	go func() { errA <- c.Do(ctx, http.MethodPost, "/v1/services", bad, nil) }()
	waitFor("A saved", func() bool { return gen() >= 1 })
	go func() {
		errB <- c.Do(ctx, http.MethodPatch, BackendPath("web", "10.1.0.11:8080"), map[string]any{"state": "drain"}, nil)
	}()
	time.Sleep(50 * time.Millisecond) // B waits for A (before: B was saved too, gen 2)
	// The agent's loop: a sync per wake-up, until both callers have their answer.
	var ea, eb error
	for got := 0; got < 2; {
		select {
		case ea = <-errA:
			got++
		case eb = <-errB:
			got++
		case <-wake:
			_ = r.Sync(ctx, cfg)
		case <-time.After(5 * time.Second):
			t.Fatal("no answer")
		}
	}
	if ea == nil || !strings.Contains(ea.Error(), "rolled back") {
		t.Errorf("A (a service on a missing interface): %v, want its failure, rolled back", ea)
	}
	if eb != nil {
		t.Errorf("B (a drain): %v, want applied", eb)
	}
	o, err := LoadOverlay(state)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	drained := false
	for _, s := range o.Services {
		names = append(names, s.Name)
		for _, b := range s.Backends {
			drained = drained || s.Name == "web" && b.Address == "10.1.0.11" && b.State == StateDrain
		}
	}
	if slices.Contains(names, "bad") || !drained {
		t.Errorf("state file: services %v, web's 10.1.0.11 drained %v; want no bad, the drain kept", names, drained)
	}
	if err := r.Sync(ctx, cfg); err != nil {
		t.Errorf("the next sync: %v", err)
	}
}

// The API serves whatever else fails: a state file that conflicts with the config (edited
// while the agent was down) fails every sync, and `hostaccel lb reset` through the API is the
// way out; a key file that cannot be read (api.listen's) leaves the unix socket serving, and
// the TCP listener is tried again at the next sync. Before, the first sync failed before it
// started the API, and the key file's error closed the unix socket too.
func TestAPIServesThroughConflictsAndABadKeyFile(t *testing.T) {
	dir := t.TempDir()
	state := filepath.Join(dir, "state.yaml")
	api := fixture(DNAT, RoundRobin)
	api.Name, api.VIPs = "api", []string{"192.0.2.20"}
	if err := (Overlay{Services: []Service{api}}).Save(state); err != nil {
		t.Fatal(err)
	}
	clash := fixture(DNAT, RoundRobin)
	clash.Name, clash.VIPs = "clash", []string{"192.0.2.20"}
	sock, key := filepath.Join(dir, "lb.sock"), filepath.Join(dir, "lb.key")
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	listen := ln.Addr().String()
	ln.Close()
	cfg := Config{API: &API{Socket: sock, Listen: listen, KeyFile: key}, StateFile: state, Services: []Service{fixture(DNAT, RoundRobin), clash}}
	r, wake, _ := wakingRuntime()
	r.Env = func([]string) (Env, error) { return testEnv, nil }
	defer r.Stop()
	ctx := context.Background()
	if err := r.Sync(ctx, cfg); err == nil || !strings.Contains(err.Error(), "conflict") {
		t.Fatalf("sync with a conflicting state file: %v", err)
	}
	reset := make(chan error, 1)
	go func() {
		reset <- NewClient(sock, "", "").Do(ctx, http.MethodPost, ServicePath("api")+"/reset", nil, nil)
	}()
	select {
	case <-wake:
	case err := <-reset:
		t.Fatalf("lb reset api over the unix socket: %v", err)
	case <-time.After(5 * time.Second):
		t.Fatal("the reset asked for no sync")
	}
	if err := r.Sync(ctx, cfg); err != nil {
		t.Fatalf("sync after the reset: %v", err)
	}
	if err := <-reset; err != nil {
		t.Errorf("lb reset api: %v", err)
	}
	if err := os.WriteFile(key, []byte("0123456789abcdef0123"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := r.Sync(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	if err := NewClient("", listen, "0123456789abcdef0123").Do(ctx, http.MethodGet, "/v1/status", nil, nil); err != nil {
		t.Errorf("the TCP listener once its key file is there: %v", err)
	}
}

// Changes stay one per sync even when callers give up (from the review of today's diff):
//   - a change whose caller left before its sync is still waited for, and rolled back when
//     that sync fails: the next change is not saved beside it (before, it was, and the valid
//     next change was rolled back while the failing one stayed for good);
//   - a change that waits for the one before it and whose request ends is not saved (before, it
//     was saved and applied after its caller was told it failed).
func TestChangesStayOnePerSyncWhenCallersGiveUp(t *testing.T) {
	r, wake, c, cfg := failingDSRRuntime(t)
	ctx, state := context.Background(), cfg.StateFile
	gen := func() uint64 { r.mu.Lock(); defer r.mu.Unlock(); return r.gen }
	for deadline := time.Now().Add(100 * time.Millisecond); time.Now().Before(deadline); {
		select { // (the first sync's wake-up)
		case <-wake:
		case <-time.After(10 * time.Millisecond):
		}
	}
	bad := fixture(DSR, RoundRobin) // its interface does not exist: its sync fails
	bad.Name, bad.VIPs, bad.Interface = "bad", []string{"192.0.2.50"}, "eth9"
	ctxA, cancelA := context.WithCancel(ctx)
	errA := make(chan error, 1)
	go func() { errA <- c.Do(ctxA, http.MethodPost, "/v1/services", bad, nil) }()
	for gen() < 1 {
		time.Sleep(time.Millisecond)
	}
	cancelA() // A's client gives up before the agent's sync
	<-errA
	// C waits for A, and its request ends (its caller gave up): never saved. (Called on the
	// handler: whether a server sees a client leave depends on the connection.)
	ctxC, cancelC := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancelC()
	reqC := httptest.NewRequestWithContext(ctxC, http.MethodPatch, BackendPath("web", "10.1.0.12:8080"), strings.NewReader(`{"state": "drain"}`))
	recC := httptest.NewRecorder()
	r.Handler().ServeHTTP(recC, reqC)
	if recC.Code == http.StatusOK || !strings.Contains(recC.Body.String(), "not saved") {
		t.Errorf("C (its request ended while it waited for A): %d %s, want not saved", recC.Code, recC.Body)
	}
	errB := make(chan error, 1)
	go func() {
		errB <- c.Do(ctx, http.MethodPatch, BackendPath("web", "10.1.0.11:8080"), map[string]any{"state": "drain"}, nil)
	}()
	var eb error
	for done := false; !done; { // the agent's loop: a sync per wake-up
		select {
		case eb = <-errB:
			done = true
		case <-wake:
			_ = r.Sync(ctx, cfg)
		case <-time.After(5 * time.Second):
			t.Fatal("no answer")
		}
	}
	if eb != nil {
		t.Errorf("B (a valid drain): %v, want applied", eb)
	}
	o, err := LoadOverlay(state)
	if err != nil {
		t.Fatal(err)
	}
	drained := map[string]bool{}
	for _, s := range o.Services {
		if s.Name == "bad" {
			t.Errorf("the failing change A is still in the state file")
		}
		for _, b := range s.Backends {
			drained[b.Address] = b.State == StateDrain
		}
	}
	if !drained["10.1.0.11"] || drained["10.1.0.12"] {
		t.Errorf("state file drains %v; want B's (10.1.0.11), not C's (10.1.0.12)", drained)
	}
	if err := r.Sync(ctx, cfg); err != nil {
		t.Errorf("the next sync: %v", err)
	}
}

// A state file that does not parse fails every sync; an API change then says so (503, naming
// the file) and writes nothing. Before (since the API started before the state file was
// read), it was saved to the path "" (a stray .tmp in the agent's working directory).
func TestChangeRefusedWhileTheStateFileIsNotLoaded(t *testing.T) {
	dir := t.TempDir()
	wd, _ := os.Getwd()
	if err := os.Chdir(dir); err != nil {
		t.Fatal(err)
	}
	defer os.Chdir(wd)
	state := filepath.Join(dir, "state.yaml")
	if err := os.WriteFile(state, []byte("services: [ {name: x\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(dir, "lb.sock")
	cfg := Config{API: &API{Socket: sock}, StateFile: state, Services: []Service{fixture(DNAT, RoundRobin)}}
	r, _, _ := wakingRuntime()
	r.Env = func([]string) (Env, error) { return testEnv, nil }
	defer r.Stop()
	ctx := context.Background()
	if err := r.Sync(ctx, cfg); err == nil {
		t.Fatal("sync with an unparseable state file succeeded")
	}
	cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	err := NewClient(sock, "", "").Do(cctx, http.MethodPost, ServicePath("web")+"/reset", nil, nil)
	if err == nil || !strings.Contains(err.Error(), "not saved: loadBalancer.stateFile "+state+" is not loaded") {
		t.Errorf("lb reset web: %v, want refused, naming the state file", err)
	}
	if _, e := os.Stat(filepath.Join(dir, ".tmp")); e == nil {
		t.Errorf("a stray .tmp in the working directory")
	}
}

// failingDSRRuntime is a runtime whose syncs fail once a service names interface eth9 (its
// neighbours cannot be listed), synced once with the fixture's service and a state file, and
// a client of its API's handler.
func failingDSRRuntime(t *testing.T) (*Runtime, chan struct{}, *Client, Config) {
	t.Helper()
	r, wake, _ := wakingRuntime()
	r.Env = func(devs []string) (Env, error) {
		if slices.Contains(devs, "eth9") {
			return Env{}, errors.New("list neighbours on eth9: no such device")
		}
		return testEnv, nil
	}
	t.Cleanup(func() { r.stop(false) })
	cfg := Config{API: &API{Disabled: true}, StateFile: filepath.Join(t.TempDir(), "state.yaml"), Services: []Service{fixture(DNAT, RoundRobin)}}
	if err := r.Sync(context.Background(), cfg); err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(r.Handler())
	t.Cleanup(srv.Close)
	return r, wake, &Client{HTTP: srv.Client(), Base: srv.URL}, cfg
}

// A client waits longer than the server may take to answer, so that it does not give up on a
// change the agent then applies (before: 30 s against the server's 45 s, found by a helper's
// review).
func TestClientOutwaitsTheServer(t *testing.T) {
	for _, c := range []*Client{NewClient("/run/x.sock", "", ""), NewClient("", "127.0.0.1:1", "k")} {
		if c.HTTP.Timeout <= writeTimeout() {
			t.Errorf("client timeout %v, server's write timeout %v", c.HTTP.Timeout, writeTimeout())
		}
	}
}

// The status (lb status, GET /v1/status, the metrics) shows the health checks as they run,
// not as the last sync saw them: checks go on between syncs, and only a transition syncs, so
// the checks' count, last time and failures stayed frozen at the last transition (a backend
// failing fewer than fall checks in a row showed no error).
func TestStatusShowsTheChecksSinceTheLastSync(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	testbed.CloseAccepted(ln)
	closed, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed.Close() // refused: down at its first check, and no transition after
	_, up := addrPort(t, ln.Addr())
	_, down := addrPort(t, closed.Addr())
	svc := Service{Name: "web", VIPs: []string{"192.0.2.10"}, Port: 80, Topology: DNAT,
		Backends:    []Backend{{Address: "127.0.0.1", Port: up}, {Address: "127.0.0.1", Port: down}},
		HealthCheck: &HealthCheck{Type: "tcp", Interval: Duration{Duration: 50 * time.Millisecond}, Fall: 3}}
	r, c, _ := testRuntime(t, Config{API: &API{Disabled: true}, StateFile: filepath.Join(t.TempDir(), "lb-services.yaml"), Services: []Service{svc}})
	time.Sleep(time.Second) // ~20 checks each; the first ones' transitions synced
	r.mu.Lock()
	checker := r.checker
	r.mu.Unlock()
	before := checker.Health() // the status is read after: it has at least these
	var st Status
	if err := c.Do(context.Background(), http.MethodGet, "/v1/status", nil, &st); err != nil || len(st.Services) != 1 || len(st.Services[0].Backends) != 2 {
		t.Fatalf("status: %v %+v", err, st)
	}
	one, _ := r.ServiceStatus(context.Background(), "web", false)
	resp, err := c.HTTP.Get(c.Base + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	metrics, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for i, b := range st.Services[0].Backends {
		h := before[HealthKey("web", b.Key)]
		if h.Checks < 10 {
			t.Fatalf("%s: %d checks in a second", b.Key, h.Checks)
		}
		for what, got := range map[string]Health{"status": b.Health, "service status": one.Backends[i].Health} {
			if got.Checks < h.Checks || got.LastCheck.Before(h.LastCheck) || got.Failures < h.Failures {
				t.Errorf("%s's %s: %d checks (%d failed), last %s; the checker's: %d (%d failed), last %s", b.Key, what,
					got.Checks, got.Failures, got.LastCheck.Format(time.StampMilli), h.Checks, h.Failures, h.LastCheck.Format(time.StampMilli))
			}
		}
		if b.Port == down && (b.Health.State != HealthDown || b.Health.LastError == "" || b.Active) {
			t.Errorf("%s: %+v", b.Key, b)
		}
		var n int
		for line := range strings.Lines(string(metrics)) {
			if strings.HasPrefix(line, `hostaccel_lb_backend_checks_total{backend="`+b.Key+`",service="web"} `) {
				fmt.Sscan(line[strings.LastIndexByte(line, ' ')+1:], &n)
			}
		}
		if n < h.Checks {
			t.Errorf("%s: hostaccel_lb_backend_checks_total %d, the checker has run %d", b.Key, n, h.Checks)
		}
	}
}

// A backend added without a port is the one of the service's port already there: the API
// answers 409, as for the same key (10.1.0.11 was added beside 10.1.0.11:80 of a port-80
// service: twice the weight, checked twice, and draining one left it in).
func TestBackendAddedWithoutItsPortConflicts(t *testing.T) {
	svc := fixture(DNAT, RoundRobin)
	svc.Backends[0].Port = 80
	r, _, kernel := testRuntime(t, Config{API: &API{Disabled: true}, StateFile: filepath.Join(t.TempDir(), "lb-services.yaml"), Services: []Service{svc}})
	before := kernel()
	h := r.Handler()
	for _, body := range []string{`{"address": "10.1.0.11"}`, `{"address": "10.1.0.11", "port": 80}`} {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, ServicePath("web")+"/backends", strings.NewReader(body)))
		if rec.Code != http.StatusConflict || !strings.Contains(rec.Body.String(), `service \"web\" already has backend 10.1.0.11:80`) {
			t.Errorf("add %s: %d %.300s, want 409, already has backend 10.1.0.11:80", body, rec.Code, rec.Body)
		}
	}
	if kernel() != before {
		t.Error("the kernel changed")
	}
}
