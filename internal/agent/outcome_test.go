package agent

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"sigs.k8s.io/knftables"

	"github.com/hostaccel/hostaccel/internal/config"
	"github.com/hostaccel/hostaccel/internal/datapath"
	"github.com/hostaccel/hostaccel/internal/flowtable"
	"github.com/hostaccel/hostaccel/internal/lb"
)

// An API that does not serve (here loadBalancer.api.socket is a regular file) makes the agent
// degraded, naming the field: /healthz and hostaccel_healthy say so. Before, the error was only
// logged and the agent reported healthy while `hostaccel lb` failed (found by a helper's
// review). When the file goes, the next sync serves and the agent is healthy again.
func TestAPIErrorIsDegraded(t *testing.T) {
	dir := t.TempDir()
	sock := filepath.Join(dir, "lb.sock")
	if err := os.WriteFile(sock, []byte("not a socket"), 0o644); err != nil {
		t.Fatal(err)
	}
	a := lbAPIAgent(t, dir, sock)
	if err := a.Sync(context.Background()); err != nil {
		t.Fatal(err)
	}
	st := a.State()
	if st.Healthy || !slices.ContainsFunc(st.Degraded, func(d string) bool { return strings.Contains(d, "loadBalancer.api.socket") }) {
		t.Errorf("the API does not serve: healthy %v, degraded %q; want degraded, naming loadBalancer.api.socket", st.Healthy, st.Degraded)
	}
	os.Remove(sock)
	if err := a.Sync(context.Background()); err != nil {
		t.Fatal(err)
	}
	if st := a.State(); !st.Healthy {
		t.Errorf("the API serves again: healthy %v, degraded %q", st.Healthy, st.Degraded)
	}
}

// On a kernel without any datapath the config can use (here: no flowtable), no device is
// served: State.Devices (hostaccel_devices) is empty. Before, it listed every desired device
// (found by a helper's review).
func TestNoDevicesServedWithoutADatapath(t *testing.T) {
	links := []config.Link{{Name: "gw", Up: true}, {Name: "eth0", Up: true}, {Name: "eth1", Up: true}}
	a, _ := newTestAgent(t, false, &links)
	_ = a.Sync(context.Background()) // the plan cannot run: an error
	if st := a.State(); len(st.Devices) > 0 {
		t.Errorf("no datapath runs, yet State.Devices (hostaccel_devices) = %v", st.Devices)
	}
	b, _ := newTestAgent(t, true, &links)
	if err := b.Sync(context.Background()); err != nil {
		t.Fatal(err)
	}
	if st := b.State(); len(st.Devices) == 0 {
		t.Error("the flowtable runs, yet State.Devices is empty: this test shows nothing")
	}
}

// failingNFT fails every transaction, as a kernel that refuses one would.
type failingNFT struct{ knftables.Interface }

func (failingNFT) Run(context.Context, *knftables.Transaction) error {
	return errors.New("netlink: Error: Could not process rule: No such file or directory")
}

// The load balancer is applied before the datapaths: when the flowtable's transaction then
// fails, the error says that the load balancer part was applied, not only the flowtable's
// "nothing was changed" (found by a helper's review).
func TestDatapathFailureAfterTheLoadBalancerSaysSo(t *testing.T) {
	cfg, err := config.Parse([]byte(cfgText + "loadBalancer:\n  services:\n  - {name: web, vips: [192.0.2.10], port: 80, backends: [{address: 10.1.0.2}]}\n"))
	if err != nil {
		t.Fatal(err)
	}
	links := []config.Link{{Name: "gw", Up: true}, {Name: "eth0", Up: true}, {Name: "eth1", Up: true}}
	ft, _ := flowtable.NewFakeManager()
	ft.NFT = failingNFT{ft.NFT}
	_, err = Apply(context.Background(), cfg, Inputs{Links: links, Strict: true, Caps: caps(true)(context.Background()),
		Mgrs: &datapath.Managers{Flowtable: ft},
		LB:   func(context.Context, lb.Config) (string, error) { return "", nil }})
	if err == nil || !strings.Contains(err.Error(), "the load balancer part was applied") {
		t.Errorf("the flowtable failed after the load balancer was applied: %v, want it said", err)
	}
}

// The agent's state names the load balancer API's socket, where `hostaccel status` asks for
// the load balancer's status: before, status asked the default path only and left out a load
// balancer whose loadBalancer.api.socket was elsewhere (found by a helper's review).
func TestStateNamesTheLBSocket(t *testing.T) {
	dir := t.TempDir()
	sock := filepath.Join(dir, "elsewhere.sock")
	a := lbAPIAgent(t, dir, sock)
	if err := a.Sync(context.Background()); err != nil {
		t.Fatal(err)
	}
	if got := a.State().LBSocket; got != sock {
		t.Errorf("state names the load balancer socket %q, want %q", got, sock)
	}
}

// lbAPIAgent is an agent on a fake flowtable and load balancer whose config (in dir) serves
// the load balancer's API on sock; stopped with the test.
func lbAPIAgent(t *testing.T, dir, sock string) *Agent {
	t.Helper()
	path := filepath.Join(dir, "c.yaml")
	cfg := cfgText + "loadBalancer:\n  stateFile: " + filepath.Join(dir, "lbstate.json") + "\n  api: {socket: " + sock + "}\n"
	if err := os.WriteFile(path, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	links := []config.Link{{Name: "gw", Up: true}, {Name: "eth0", Up: true}, {Name: "eth1", Up: true}}
	ft, _ := flowtable.NewFakeManager()
	a, err := New(Options{ConfigPath: path, Probe: caps(true),
		Links: func() ([]config.Link, error) { return links, nil }}, &datapath.Managers{Flowtable: ft})
	if err != nil {
		t.Fatal(err)
	}
	rt := a.LB()
	m, _ := lb.NewFakeManager()
	rt.NewManager = func() (*lb.Manager, error) { return m, nil }
	rt.Env = func([]string) (lb.Env, error) { return lb.Env{}, nil }
	t.Cleanup(rt.Stop)
	return a
}
