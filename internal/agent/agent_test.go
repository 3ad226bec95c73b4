package agent

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"sigs.k8s.io/knftables"

	"github.com/hostaccel/hostaccel/internal/config"
	"github.com/hostaccel/hostaccel/internal/datapath"
	"github.com/hostaccel/hostaccel/internal/flowtable"
	"github.com/hostaccel/hostaccel/internal/probe"
)

const cfgText = `
node:
  gateways: [gw]
  transports: [eth0, eth1]
  localPodCIDRs: [10.244.1.0/24]
  peerPodCIDRs: [10.244.2.0/24]
classes: {pod-to-pod: true}
`

func caps(flowtableOK bool) func(context.Context) probe.Result {
	return func(context.Context) probe.Result {
		return probe.Result{Features: []probe.Feature{
			{Name: probe.Flowtable, Available: flowtableOK, Detail: "test kernel"},
			{Name: probe.FlowtableCounter, Available: flowtableOK},
		}}
	}
}

func newTestAgent(t *testing.T, flowtableOK bool, links *[]config.Link) (*Agent, string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "c.yaml")
	if err := os.WriteFile(path, []byte(cfgText), 0o644); err != nil {
		t.Fatal(err)
	}
	ft, _ := flowtable.NewFakeManager()
	a, err := New(Options{
		ConfigPath: path, Probe: caps(flowtableOK),
		Links: func() ([]config.Link, error) { return *links, nil },
	}, &datapath.Managers{Flowtable: ft})
	if err != nil {
		t.Fatal(err)
	}
	return a, path
}

func TestSyncPrunesVanishedDevices(t *testing.T) {
	links := []config.Link{{Name: "gw", Up: true}, {Name: "eth0", Up: true}}
	a, _ := newTestAgent(t, true, &links)
	if err := a.Sync(context.Background()); err != nil {
		t.Fatal(err)
	}
	st := a.State()
	if strings.Join(st.Devices, ",") != "eth0,gw" || st.Healthy || len(st.Degraded) != 1 ||
		!strings.Contains(st.Degraded[0], `interface "eth1" does not exist`) {
		t.Errorf("eth1 missing: %+v", st)
	}
	links = append(links, config.Link{Name: "eth1", Up: true})
	if err := a.Sync(context.Background()); err != nil {
		t.Fatal(err)
	}
	if st := a.State(); strings.Join(st.Devices, ",") != "eth0,eth1,gw" || !st.Healthy || st.LastResult.Flowtable.Reason != "spec changed" || st.LastResult.Flowtable.Drift != "" {
		t.Errorf("eth1 back: %+v", st)
	}
}

func TestBadConfigKeepsLastGood(t *testing.T) {
	links := []config.Link{{Name: "gw", Up: true}, {Name: "eth0", Up: true}, {Name: "eth1", Up: true}}
	a, path := newTestAgent(t, true, &links)
	if err := a.Sync(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(cfgText+"packetThreshold: -1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := a.Sync(context.Background()); err != nil {
		t.Fatal(err)
	}
	st := a.State()
	if st.Healthy || len(st.Degraded) != 1 || !strings.Contains(st.Degraded[0], "packetThreshold: -1") ||
		st.LastResult.Flowtable.Operations != 0 {
		t.Errorf("bad config: %+v", st)
	}
}

func TestNoFlowtableIsAnErrorNotANoop(t *testing.T) {
	links := []config.Link{{Name: "gw", Up: true}, {Name: "eth0", Up: true}, {Name: "eth1", Up: true}}
	a, _ := newTestAgent(t, false, &links)
	err := a.Sync(context.Background())
	if !errors.Is(err, ErrNoFlowtable) || !strings.Contains(err.Error(), "test kernel") {
		t.Fatalf("err = %v", err)
	}
	if st := a.State(); st.Healthy || st.SyncErrors != 1 || st.LastError == "" {
		t.Errorf("state: %+v", st)
	}
}

// auto on a kernel that runs tc but has no conntrack kfuncs keeps pod-to-pod on the flowtable:
// a choice, said in the state, not a degradation.
func TestAutoWithoutNATCheckIsHealthy(t *testing.T) {
	links := []config.Link{{Name: "gw", Up: true}, {Name: "eth0", Up: true}, {Name: "eth1", Up: true}}
	a, path := newTestAgent(t, true, &links)
	if err := os.WriteFile(path, []byte(cfgText+"datapath: auto\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	a.opts.Probe = func(context.Context) probe.Result {
		r := caps(true)(context.Background())
		r.Features = append(r.Features, probe.Feature{Name: probe.TCX, Available: true}, probe.Feature{Name: probe.RedirectNeigh, Available: true},
			probe.Feature{Name: probe.ConntrackKfuncs, Detail: "test kernel"})
		return r
	}
	if err := a.Sync(context.Background()); err != nil {
		t.Fatal(err)
	}
	st := a.State()
	if !st.Healthy || st.Plan != "flowtable: [pod-to-pod]" || len(st.PlanNotes) != 1 || !strings.Contains(st.PlanNotes[0], "bpf_skb_ct_lookup") {
		t.Errorf("state: healthy %v, plan %q, notes %q; want healthy, the flowtable, one note naming bpf_skb_ct_lookup", st.Healthy, st.Plan, st.PlanNotes)
	}
}

// A sync that finds the table changed outside hostaccel repairs it, logs a WARN saying what
// drifted and counts it (hostaccel_drift_repairs_total); syncs with nothing to repair do not.
func TestDriftRepairLoggedAndCounted(t *testing.T) {
	path := filepath.Join(t.TempDir(), "c.yaml")
	if err := os.WriteFile(path, []byte(cfgText), 0o644); err != nil {
		t.Fatal(err)
	}
	links := []config.Link{{Name: "gw", Up: true}, {Name: "eth0", Up: true}, {Name: "eth1", Up: true}}
	ft, f := flowtable.NewFakeManager()
	var log strings.Builder
	a, err := New(Options{
		ConfigPath: path, Probe: caps(true), Log: slog.New(slog.NewTextHandler(&log, nil)),
		Links: func() ([]config.Link, error) { return links, nil },
	}, &datapath.Managers{Flowtable: ft})
	if err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if err := a.Sync(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	if st := a.State(); st.DriftRepairs != nil || strings.Contains(log.String(), "drift") {
		t.Fatalf("drift without drift: %+v\n%s", st.DriftRepairs, log.String())
	}
	tx := f.NewTransaction()
	tx.Delete(&knftables.Table{})
	if err := f.Run(context.Background(), tx); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if err := a.Sync(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	if st := a.State(); st.DriftRepairs["flowtable"] != 1 || f.Table == nil {
		t.Errorf("after the table was deleted: repaired %v, counted %+v", f.Table != nil, st.DriftRepairs)
	}
	want := `level=WARN msg="drift repaired: changed outside hostaccel, restored" datapath=flowtable drift="[table missing]"`
	if strings.Count(log.String(), "drift repaired") != 1 || !strings.Contains(log.String(), want) {
		t.Errorf("log lacks one %q:\n%s", want, log.String())
	}
}

// A kernel that lacks a feature is probed again, for a module loaded later, but not at every
// sync: at most every reprobeEvery, after the sync's change (an EndpointSlice's sync must not
// wait for a probe). A probe that finds more asks for a sync. Once the feature is there, no
// more probes.
func TestReprobeAtMostEvery(t *testing.T) {
	links := []config.Link{{Name: "gw", Up: true}, {Name: "eth0", Up: true}, {Name: "eth1", Up: true}}
	a, _ := newTestAgent(t, false, &links)
	probes, loaded := 0, false
	a.opts.Probe = func(ctx context.Context) probe.Result {
		probes++
		r := caps(loaded)(ctx)
		r.Features = append(r.Features, probe.Feature{Name: probe.ConntrackKfuncs, Available: loaded})
		return r
	}
	ctx := context.Background()
	for range 3 {
		a.Sync(ctx)
	}
	if probes != 1 {
		t.Errorf("3 syncs in a row probed %d times, want 1", probes)
	}
	defer func(d time.Duration) { reprobeEvery = d }(reprobeEvery)
	reprobeEvery = 0
	loaded = true // the module is loaded
	select {      // the syncs so far asked for none
	case <-a.wake:
	default:
	}
	if err := a.Sync(ctx); err != nil || probes != 2 {
		t.Errorf("after reprobeEvery: %d probes, err %v; want 2, the flowtable found", probes, err)
	}
	select {
	case <-a.wake:
	default:
		t.Error("the probe found the flowtable and asked for no sync")
	}
	a.Sync(ctx)
	if probes != 2 {
		t.Errorf("a kernel with every feature was probed again (%d)", probes)
	}
}

// A re-probe (while the kernel lacks a feature) that fails to find one an earlier probe found
// keeps it: before, the agent took the failure as the kernel's answer, and `auto` moved the
// classes off that datapath (for sockmap: every connection drained).
func TestReprobeKeepsFeaturesFound(t *testing.T) {
	links := []config.Link{{Name: "gw", Up: true}, {Name: "eth0", Up: true}}
	a, _ := newTestAgent(t, false, &links)
	defer func(d time.Duration) { reprobeEvery = d }(reprobeEvery)
	reprobeEvery = 0
	sockmapFails := false
	a.opts.Probe = func(ctx context.Context) probe.Result {
		r := caps(false)(ctx) // no flowtable: every sync probes again
		if sockmapFails {
			r.Features = append(r.Features, probe.Feature{Name: probe.SockMap, Detail: "cannot allocate memory"})
		} else {
			r.Features = append(r.Features, probe.Feature{Name: probe.SockMap, Available: true})
		}
		return r
	}
	ctx := context.Background()
	a.Sync(ctx)
	sockmapFails = true
	a.Sync(ctx)
	a.Sync(ctx)
	if !a.caps.Has(probe.SockMap) {
		t.Errorf("after a re-probe that failed to find it, sockmap is lost: %+v", a.caps.Features)
	}
	if a.caps.Has(probe.Flowtable) {
		t.Error("a feature never found is available")
	}
}

// A healthy agent probes again after the sync's change is in the kernel, not before: the
// change of an event does not wait for the probe.
func TestReprobeAfterTheChange(t *testing.T) {
	links := []config.Link{{Name: "gw", Up: true}, {Name: "eth0", Up: true}, {Name: "eth1", Up: true}}
	path := filepath.Join(t.TempDir(), "c.yaml")
	text := "datapath: auto\n" + cfgText // auto could use the conntrack kfuncs
	if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	ft, f := flowtable.NewFakeManager()
	var probes []bool // per probe: the new peer CIDR was in the kernel
	a, err := New(Options{
		ConfigPath: path,
		Probe: func(ctx context.Context) probe.Result {
			probes = append(probes, strings.Contains(f.Dump(), "10.244.3.0/24"))
			return caps(true)(ctx) // no conntrack kfuncs: probed again every reprobeEvery
		},
		Links: func() ([]config.Link, error) { return links, nil },
	}, &datapath.Managers{Flowtable: ft})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := a.Sync(ctx); err != nil || !a.State().Healthy {
		t.Fatalf("first sync: %v, %+v", err, a.State())
	}
	defer func(d time.Duration) { reprobeEvery = d }(reprobeEvery)
	reprobeEvery = 0
	if err := os.WriteFile(path, []byte(strings.Replace(text, "[10.244.2.0/24]", "[10.244.2.0/24, 10.244.3.0/24]", 1)), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := a.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(probes, []bool{false, true}) {
		t.Errorf("probes saw the new CIDR in the kernel: %v, want [false true] (the second after the change)", probes)
	}
}

// observedSource is a Source that records the outcomes the agent tells it (SyncObserver).
type observedSource struct {
	cfg      *config.Config
	outcomes []error
	configs  []*config.Config
}

func (s *observedSource) Config() (*config.Config, error) { return s.cfg, nil }
func (s *observedSource) Changed() <-chan struct{}        { return nil }
func (s *observedSource) Notes() []string                 { return nil }
func (s *observedSource) Report() any                     { return nil }
func (s *observedSource) Synced(cfg *config.Config, err error) {
	s.outcomes = append(s.outcomes, err)
	s.configs = append(s.configs, cfg)
}

// The agent tells a SyncObserver source every sync's outcome for the Services: the Kubernetes
// source answers the Services' health check ports 503 once its changes wait too long for one
// that succeeds. A sync that failed before the load balancer part ran (the links unread) tells
// its error; one whose datapath failed after it (no flowtable in the kernel) tells the load
// balancer's: none (TestObserverToldTheServicesOutcome).
func TestSyncOutcomeToldToTheSource(t *testing.T) {
	links := []config.Link{{Name: "gw", Up: true}, {Name: "eth0", Up: true}, {Name: "eth1", Up: true}}
	cfg, err := config.Parse([]byte(cfgText))
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name               string
		flowtable, noLinks bool
		told               bool // the sync's error
	}{
		{"flowtable", true, false, false},
		{"no flowtable", false, false, false},
		{"links unread", true, true, true},
	} {
		a, _ := newTestAgent(t, c.flowtable, &links)
		if c.noLinks {
			a.opts.Links = func() ([]config.Link, error) { return nil, errors.New("netlink: no answer") }
		}
		src := &observedSource{cfg: cfg}
		a.opts.Source = src
		err := a.Sync(context.Background())
		if (err == nil) != (c.flowtable && !c.noLinks) {
			t.Errorf("%s: sync: %v", c.name, err)
		}
		want := error(nil)
		if c.told {
			want = err
		}
		if len(src.outcomes) != 1 || src.outcomes[0] != want {
			t.Errorf("%s: the source was told %v, want %v", c.name, src.outcomes, want)
		}
		if len(src.configs) != 1 || src.configs[0] != cfg {
			t.Errorf("%s: the source was told configs %v, want the one it gave (%p)", c.name, src.configs, cfg)
		}
	}
}

// A sync that does not return makes the agent not live (/livez 503), with the reason; while
// the loop comes round it is live. Before, /livez answered 200 whatever the loop did.
func TestLiveFailsWhileASyncHangs(t *testing.T) {
	defer func(d, e time.Duration) { stuckAfter, reprobeEvery = d, e }(stuckAfter, reprobeEvery)
	stuckAfter, reprobeEvery = 200*time.Millisecond, 0 // every sync probes (the test kernel lacks the kfuncs auto could use)
	links := []config.Link{{Name: "gw", Up: true}, {Name: "eth0", Up: true}}
	a, path := newTestAgent(t, true, &links)
	// a second resync period, so that the loop's own timer would come round in time
	if err := os.WriteFile(path, []byte("datapath: auto\n"+cfgText+"agent: {resyncPeriod: 1s, minSyncInterval: 0s}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	hang, hung := make(chan struct{}), make(chan struct{}, 1)
	var hanging atomic.Bool
	run := a.opts.Probe
	a.opts.Probe = func(ctx context.Context) probe.Result {
		if hanging.Load() {
			select {
			case hung <- struct{}{}:
			default:
			}
			<-hang
		}
		return run(ctx)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	defer func() { close(hang); cancel(); <-done }()
	time.Sleep(1500 * time.Millisecond) // past one resync period, the loop coming round
	if err := a.Live(); err != nil {
		t.Fatalf("a loop that comes round: %v", err)
	}
	hanging.Store(true)
	a.Trigger()
	<-hung
	deadline := time.Now().Add(5 * time.Second)
	for a.Live() == nil && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	if err := a.Live(); err == nil || !strings.Contains(err.Error(), "a sync started") {
		t.Fatalf("a sync that hangs: Live() = %v, want stuck", err)
	}
}

// The kernel is probed again only for a feature the config's datapath could use: the
// conntrack kfuncs serve the tc program, not the flowtable. Any missing feature made every
// config probe again every reprobeEvery, forever on a kernel older than 5.18.
func TestNoReprobeForFeaturesUnused(t *testing.T) {
	links := []config.Link{{Name: "gw", Up: true}, {Name: "eth0", Up: true}, {Name: "eth1", Up: true}}
	a, _ := newTestAgent(t, true, &links) // datapath flowtable, which the kernel has
	probes := 0
	a.opts.Probe = func(ctx context.Context) probe.Result {
		probes++
		r := caps(true)(ctx)
		r.Features = append(r.Features, probe.Feature{Name: probe.ConntrackKfuncs, Detail: "Linux 5.15"})
		return r
	}
	defer func(d time.Duration) { reprobeEvery = d }(reprobeEvery)
	reprobeEvery = 0
	for range 3 {
		if err := a.Sync(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	if probes != 1 {
		t.Errorf("3 syncs of datapath flowtable on a kernel without the conntrack kfuncs probed %d times, want 1", probes)
	}
}
