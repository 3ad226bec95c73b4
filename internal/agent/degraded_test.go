package agent

import (
	"context"
	"io"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/hostaccel/hostaccel/internal/config"
	"github.com/hostaccel/hostaccel/internal/datapath"
	"github.com/hostaccel/hostaccel/internal/flowtable"
	"github.com/hostaccel/hostaccel/internal/lb"
	"github.com/hostaccel/hostaccel/internal/probe"
	"github.com/hostaccel/hostaccel/internal/tc"
	"github.com/hostaccel/hostaccel/internal/testbed"
)

// Kubernetes mode on a kernel without the nftables flowtable (deploy/'s default datapath):
// the sync fails (nothing of the plan can run), yet it put the load balancer's change in the
// kernel, and the source (SyncObserver) is told the Services' outcome: no error. It was told
// the sync's, so it never served the Services' health check ports for the config, and its
// kube-proxy /healthz turned 503 after the timeout.
func TestObserverToldTheServicesOutcome(t *testing.T) {
	y := cfgText + "loadBalancer:\n  services:\n  - name: web\n    vips: [10.100.0.10]\n    port: 80\n    backends:\n    - {address: 10.1.1.2, port: 80}\n"
	path := filepath.Join(t.TempDir(), "c.yaml")
	if err := os.WriteFile(path, []byte(y), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Parse([]byte(y))
	if err != nil {
		t.Fatal(err)
	}
	links := []config.Link{{Name: "gw", Up: true}, {Name: "eth0", Up: true}, {Name: "eth1", Up: true}}
	ft, _ := flowtable.NewFakeManager()
	a, err := New(Options{ConfigPath: path, Probe: caps(false), Log: slog.New(slog.NewTextHandler(io.Discard, nil)),
		Links: func() ([]config.Link, error) { return links, nil }}, &datapath.Managers{Flowtable: ft})
	if err != nil {
		t.Fatal(err)
	}
	src := &observedSource{cfg: cfg}
	a.opts.Source = src
	rt := a.LB()
	m, f := lb.NewFakeManager()
	rt.NewManager = func() (*lb.Manager, error) { return m, nil }
	rt.Env = func([]string) (lb.Env, error) {
		return lb.Env{Local: []netip.Addr{netip.MustParseAddr("10.1.0.1")}}, nil
	}
	rt.FlushConntrack = func([]lb.ConntrackFlush) error { return nil }
	rt.Solicit = func([]netip.Addr) {}
	defer rt.Stop()
	serr := a.Sync(context.Background())
	refs, _ := lb.FakeTables(f)(context.Background())
	if serr == nil || len(refs) == 0 {
		t.Fatalf("sync: %v, load balancer tables %v: want the flowtable's error and the load balancer's tables", serr, refs)
	}
	if len(src.outcomes) != 1 || src.outcomes[0] != nil {
		t.Errorf("the load balancer's change is in the kernel, but the source was told %v", src.outcomes)
	}
}

// datapath tc on a kernel without the conntrack kfuncs runs the program without its NAT
// check, as README says: degraded, not failed. Every sync failed (backed off, counted in
// hostaccel_sync_errors_total, the alert raised) while the program ran.
func TestPartOfThePlanIsDegradedNotFailed(t *testing.T) {
	topo := testbed.NewTopoT(t, testbed.TopoOptions{})
	y := "datapath: tc\nnode:\n  gateways: [" + topo.GatewayName + "]\n  transports: [" + topo.TransportName + "]\n" +
		"  localPodCIDRs: [" + topo.V4.PodCIDR.String() + "]\n  peerPodCIDRs: [" + topo.V4.RemotePodCIDR.String() + "]\nclasses: {pod-to-pod: true}\n"
	path := filepath.Join(t.TempDir(), "c.yaml")
	if err := os.WriteFile(path, []byte(y), 0o644); err != nil {
		t.Fatal(err)
	}
	links := []config.Link{{Name: topo.GatewayName, Up: true}, {Name: topo.TransportName, Up: true}}
	noKfuncs := func(context.Context) probe.Result {
		return probe.Result{Features: []probe.Feature{{Name: probe.TCX, Available: true}, {Name: probe.ClsBPF, Available: true},
			{Name: probe.RedirectNeigh, Available: true}, {Name: probe.ConntrackKfuncs, Detail: "test kernel"}}}
	}
	m := tc.NewManager()
	a, err := New(Options{ConfigPath: path, Probe: noKfuncs, Log: slog.New(slog.NewTextHandler(io.Discard, nil)),
		Links: func() ([]config.Link, error) { return links, nil }}, &datapath.Managers{TC: m})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { topo.Node.Do(func() error { return m.Remove(context.Background()) }) })
	var serr error
	if err := topo.Node.Do(func() error { serr = a.Sync(context.Background()); return nil }); err != nil {
		t.Fatal(err)
	}
	st := a.State()
	if serr != nil || st.SyncErrors != 0 || st.Healthy || len(st.Degraded) != 1 || !strings.Contains(st.Degraded[0], "has no NAT check") {
		t.Errorf("sync: %v; state: healthy %v, sync errors %d, degraded %q; want no error, degraded by the missing NAT check", serr, st.Healthy, st.SyncErrors, st.Degraded)
	}
	if st.LastResult.TC == nil || len(st.LastResult.TC.Attached) == 0 {
		t.Errorf("the tc program was not attached: %+v", st.LastResult.TC)
	}
}
