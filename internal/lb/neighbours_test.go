package lb

import (
	"context"
	"fmt"
	"maps"
	"net"
	"net/netip"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/knftables"
)

// withNeighbour returns a copy of testEnv where backend a's neighbour entry on eth1 is mac (nil:
// absent), or FAILED.
func withNeighbour(a netip.Addr, mac net.HardwareAddr, failed bool) Env {
	env := testEnv
	env.Neighbors = maps.Clone(testEnv.Neighbors)
	env.Neighbors["eth1"] = maps.Clone(testEnv.Neighbors["eth1"])
	delete(env.Neighbors["eth1"], a)
	if mac != nil {
		env.Neighbors["eth1"][a] = mac
	}
	if failed {
		env.Failed = map[string]map[netip.Addr]bool{"eth1": {a: true}}
	}
	return env
}

// dsrMACs is the dsr service web's map of backend MACs in the Fake: backend id -> MAC.
func dsrMACs(f *knftables.Fake) map[string]string {
	f.RLock()
	defer f.RUnlock()
	out := map[string]string{}
	if m := f.Tables[knftables.NetDevFamily][IngressTable("eth1")].Maps["web-macs"]; m != nil {
		for _, e := range m.Elements {
			out[strings.Join(e.Key, " . ")] = strings.Join(e.Value, " . ")
		}
	}
	return out
}

// A dsr backend whose neighbour entry vanished (the kernel's garbage collection deletes a
// stale entry, and dsr forwarding never refreshes it) keeps the MAC the agent last saw while
// the agent solicits it again: it stays in the maps, and its flows (no conntrack) on it.
// Before, it left the maps until the solicitation brought the entry back, and its flows moved
// to other backends. A FAILED entry (the kernel asked, the host did not answer) takes it out,
// as does another MAC; a backend no longer configured is forgotten.
func TestDSRBackendKeepsItsMACWhileItsNeighbourIsGone(t *testing.T) {
	r, _, f := wakingRuntime()
	t.Cleanup(func() { r.stop(false) })
	env := testEnv
	r.Env = func([]string) (Env, error) { return env, nil }
	var solicited []netip.Addr
	r.Solicit = func(addrs []netip.Addr) { solicited = append(solicited, addrs...) }
	svc := fixture(DSR, RoundRobin)
	cfg := Config{API: &API{Disabled: true}, StateFile: filepath.Join(t.TempDir(), "state.yaml"), Services: []Service{svc}}
	b11 := netip.MustParseAddr("10.1.0.11")
	sync := func(step string, e Env, cfg Config) (mac string, out bool) {
		t.Helper()
		env, solicited, r.solicited = e, nil, time.Time{}
		if err := r.Sync(context.Background(), cfg); err != nil {
			t.Fatalf("%s: %v", step, err)
		}
		for _, b := range r.desired.Services[0].Backends {
			if b.Addr == b11 {
				return dsrMACs(f)[idMAC(b)], !b.Known
			}
		}
		return "", true
	}
	check := func(step string, e Env, wantMAC string, wantSolicit bool) {
		t.Helper()
		mac, _ := sync(step, e, cfg)
		if mac != wantMAC {
			t.Errorf("%s: 10.1.0.11 in the maps as %q, want %q", step, mac, wantMAC)
		}
		if got := slices.Contains(solicited, b11); got != wantSolicit {
			t.Errorf("%s: solicited %v, want 10.1.0.11 solicited: %v", step, solicited, wantSolicit)
		}
	}
	check("learned", testEnv, "02:00:00:00:01:11", false)
	check("neighbour gone", withNeighbour(b11, nil, false), "02:00:00:00:01:11", true)
	check("gone again", withNeighbour(b11, nil, false), "02:00:00:00:01:11", true)
	if n := len(testEnv.Neighbors["eth1"]); n != 3 {
		t.Fatalf("the Env's neighbours were changed: %d on eth1", n)
	}
	check("back", testEnv, "02:00:00:00:01:11", false)
	check("another MAC", withNeighbour(b11, mac("02:00:00:00:01:99"), false), "02:00:00:00:01:99", false)
	check("gone after another MAC", withNeighbour(b11, nil, false), "02:00:00:00:01:99", true)
	check("failed", withNeighbour(b11, nil, true), "", true)
	check("failed entry gone too", withNeighbour(b11, nil, false), "", true)
	check("resolved", testEnv, "02:00:00:00:01:11", false)
	if n := len(dsrMACs(f)); n != 3 {
		t.Fatalf("web-macs holds %d backends, want 3", n)
	}

	// Removed from the config: forgotten. Configured again without a neighbour entry, it is
	// not in the maps.
	less := svc.Clone()
	less.Backends = slices.DeleteFunc(less.Backends, func(b Backend) bool { return b.Address == "10.1.0.11" })
	if _, out := sync("removed", testEnv, Config{API: cfg.API, StateFile: cfg.StateFile, Services: []Service{less}}); !out {
		t.Errorf("removed: 10.1.0.11 still in the maps")
	}
	if mac, ok := r.macs["eth1"][b11]; ok {
		t.Errorf("removed: 10.1.0.11's MAC %s is still remembered", mac)
	}
	if n := len(r.macs["eth1"]); n != 2 {
		t.Errorf("removed: %d MACs remembered, want 2: %v", n, r.macs)
	}
	again := Config{API: cfg.API, StateFile: cfg.StateFile, Services: []Service{svc.Clone()}}
	if mac, out := sync("configured again, no entry", withNeighbour(b11, nil, false), again); !out || mac != "" {
		t.Errorf("configured again without a neighbour entry: in the maps as %q", mac)
	}
	if !slices.Contains(solicited, b11) {
		t.Errorf("configured again without a neighbour entry: not solicited (%v)", solicited)
	}
}

// An agent restarted remembers nothing of the last process: at its first sync, a dsr backend
// whose neighbour entry is gone (not FAILED) keeps the MAC the kernel's map holds for it, and
// remembers it for the syncs after (the entry still gone). Before, it left the maps until the
// solicitation brought the entry back.
func TestRestartedAgentKeepsInstalledMACs(t *testing.T) {
	r, _, f := wakingRuntime()
	t.Cleanup(func() { r.stop(false) })
	b11 := netip.MustParseAddr("10.1.0.11")
	gone := withNeighbour(b11, nil, false)
	r.Env = func([]string) (Env, error) { return gone, nil }
	m, _ := r.NewManager()
	svcs := []Service{fixture(DSR, RoundRobin)}
	if _, err := m.Apply(context.Background(), Render(Resolve(svcs, nil, testEnv))); err != nil { // the last process's
		t.Fatal(err)
	}
	cfg := Config{API: &API{Disabled: true}, StateFile: filepath.Join(t.TempDir(), "state.yaml"), Services: svcs}
	for _, step := range []string{"first sync", "second sync"} {
		if err := r.Sync(context.Background(), cfg); err != nil {
			t.Fatal(err)
		}
		for _, b := range r.desired.Services[0].Backends {
			if b.Addr == b11 && (!b.Known || dsrMACs(f)[idMAC(b)] != "02:00:00:00:01:11") {
				t.Errorf("%s: 10.1.0.11 in the maps: %v, as %q; want 02:00:00:00:01:11", step, b.Known, dsrMACs(f)[idMAC(b)])
			}
		}
	}
}

// A one-shot apply remembers nothing of the last: a dsr backend whose neighbour entry is gone
// (not FAILED) keeps the MAC the kernel's map holds for it.
func TestOneShotKeepsInstalledMACs(t *testing.T) {
	ctx := context.Background()
	m, _ := NewFakeManager()
	svcs := []Service{fixture(DSR, RoundRobin)}
	b11 := netip.MustParseAddr("10.1.0.11")
	gone := withNeighbour(b11, nil, false)
	if _, ok := m.installedMACs(ctx, Resolve(svcs, nil, gone), gone); ok {
		t.Fatal("nothing installed yet, but a MAC is kept")
	}
	if _, err := m.Apply(ctx, Render(Resolve(svcs, nil, testEnv))); err != nil {
		t.Fatal(err)
	}
	kept, ok := m.installedMACs(ctx, Resolve(svcs, nil, gone), gone)
	if got := kept.Neighbors["eth1"][b11].String(); !ok || got != "02:00:00:00:01:11" {
		t.Errorf("kept %v %q, want 02:00:00:00:01:11", ok, got)
	}
	if _, there := gone.Neighbors["eth1"][b11]; there {
		t.Errorf("the Env given was changed")
	}
	for _, b := range Resolve(svcs, nil, kept).Services[0].Backends {
		if !b.Active {
			t.Errorf("%s: not active with the MAC kept: %s", b.Key, b.Reason)
		}
	}
	failed := withNeighbour(b11, nil, true)
	if _, ok := m.installedMACs(ctx, Resolve(svcs, nil, failed), failed); ok {
		t.Errorf("a FAILED neighbour keeps the installed MAC")
	}
}

// installedMACs reads the MAC of a backend from the kernel's map as nft lists it.
func TestInstalledMACsFromTheKernel(t *testing.T) {
	ns := testEnvNS(t, "macs")
	ctx := context.Background()
	svcs := []Service{fixture(DSR, RoundRobin)}
	b11 := netip.MustParseAddr("10.1.0.11")
	gone := withNeighbour(b11, nil, false)
	var m *Manager
	if err := ns.Do(func() (err error) { m, err = NewManager(); return err }); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(m.Close)
	var kept Env
	var ok bool
	if err := ns.Do(func() error {
		if _, err := m.Apply(ctx, Render(Resolve(svcs, nil, testEnv))); err != nil {
			return err
		}
		kept, ok = m.installedMACs(ctx, Resolve(svcs, nil, gone), gone)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if got := kept.Neighbors["eth1"][b11].String(); !ok || got != "02:00:00:00:01:11" {
		t.Errorf("kept %v %q, want 02:00:00:00:01:11", ok, got)
	}
}

// installedMACs lists a service's MAC map only where a backend that may be in it has no
// neighbour entry: not for an admin-down one (never in the maps), and where the tables are not
// there at all (an agent's first sync after a boot), one listing of the tables, not a failing
// one per service. Before, 50 services gave 50 listings in both cases.
func TestInstalledMACsListsOnlyWhatMayHelp(t *testing.T) {
	ctx := context.Background()
	var svcs []Service
	for i := range 50 {
		s := fixture(DSR, RoundRobin)
		s.Name, s.VIPs = fmt.Sprintf("web%d", i), []string{fmt.Sprintf("192.0.2.%d", i+1)}
		s.Backends[0].State = StateDown // 10.1.0.11, without a neighbour entry
		svcs = append(svcs, s)
	}
	gone := withNeighbour(netip.MustParseAddr("10.1.0.11"), nil, false)
	counted := func(m *Manager) *int {
		n := 0
		list, tables := m.List, m.Tables
		m.List = func(ctx context.Context, args ...string) ([]byte, error) { n++; return list(ctx, args...) }
		m.Tables = func(ctx context.Context) ([]TableRef, error) { n++; return tables(ctx) }
		return &n
	}
	m, _ := NewFakeManager()
	if _, err := m.Apply(ctx, Render(Resolve(svcs, nil, gone))); err != nil {
		t.Fatal(err)
	}
	n := counted(m)
	if _, ok := m.installedMACs(ctx, Resolve(svcs, nil, gone), gone); ok || *n != 0 {
		t.Errorf("only a down backend lacks its entry: kept %v, %d nft listings; want none", ok, *n)
	}
	for i := range svcs {
		svcs[i].Backends[0].State = ""
	}
	empty, _ := NewFakeManager() // no tables yet
	n = counted(empty)
	if _, ok := empty.installedMACs(ctx, Resolve(svcs, nil, gone), gone); ok || *n != 1 {
		t.Errorf("no tables: kept %v, %d nft listings; want one", ok, *n)
	}
}
