package lb

import (
	"net/netip"
	"strings"
	"testing"
)

func names(bs []*BackendState) string {
	var s []string
	for _, b := range bs {
		s = append(s, b.Address)
	}
	return strings.Join(s, " ")
}

// Weights become proportional slot entries, interleaved (smooth weighted round robin), and
// are divided by their greatest common divisor.
func TestSlots(t *testing.T) {
	s := fixture(DNAT, RoundRobin)
	d := Resolve([]Service{s}, nil, testEnv)
	got := names(d.Services[0].slots(false))
	if want := "10.1.0.13 10.1.0.12 10.1.0.11 10.1.0.13 10.1.0.12 10.1.0.13"; got != want {
		t.Errorf("1:2:3 slots: %s, want %s", got, want)
	}
	for i := range s.Backends {
		s.Backends[i].Weight = new(10)
	}
	if got := names(Resolve([]Service{s}, nil, testEnv).Services[0].slots(true)); got != "fd00:b::11 fd00:b::12 fd00:b::13" {
		t.Errorf("equal weights: %s", got)
	}
}

// Backups are used only when no backend with a lower priority number is eligible; drained
// backends keep established flows; down or failed ones keep nothing.
func TestPick(t *testing.T) {
	s := fixture(DNAT, RoundRobin)
	s.Backends = s.Backends[:3]
	s.VIPs = s.VIPs[:1]
	s.Backends[2].Priority = 1
	check := func(what string, health map[string]Health, want map[string][2]bool) {
		t.Helper()
		for _, b := range Resolve([]Service{s}, health, testEnv).Services[0].Backends {
			if w := want[b.Address]; b.Active != w[0] || b.Known != w[1] {
				t.Errorf("%s: %s active=%v known=%v (%s), want %v", what, b.Address, b.Active, b.Known, b.Reason, w)
			}
		}
	}
	check("primaries up", nil, map[string][2]bool{"10.1.0.11": {true, true}, "10.1.0.12": {true, true}, "10.1.0.13": {false, true}})
	down := map[string]Health{HealthKey("web", "10.1.0.11:8080"): {State: HealthDown}, HealthKey("web", "10.1.0.12:8080"): {State: HealthDown}}
	check("primaries failed", down, map[string][2]bool{"10.1.0.11": {false, false}, "10.1.0.12": {false, false}, "10.1.0.13": {true, true}})
	s.Backends[0].State, s.Backends[1].State = StateDrain, StateDown
	check("drain and down", nil, map[string][2]bool{"10.1.0.11": {false, true}, "10.1.0.12": {false, false}, "10.1.0.13": {true, true}})
	// Priorities are per family: IPv4 backups serve IPv4 while only IPv6 has a primary.
	dual := fixture(DNAT, RoundRobin)
	dual.Backends = []Backend{{Address: "10.1.0.11", Port: 8080, Priority: 1}, {Address: "fd00:b::11", Port: 8080}, {Address: "fd00:b::12", Port: 8080, Priority: 1}}
	for _, b := range Resolve([]Service{dual}, nil, testEnv).Services[0].Backends {
		if b.Active != (b.Address != "fd00:b::12") {
			t.Errorf("per family: %s active=%v (%s)", b.Address, b.Active, b.Reason)
		}
	}
	// dsr: a backend whose MAC is unknown cannot be used.
	dsr := fixture(DSR, RoundRobin)
	dsr.Backends = append(dsr.Backends, Backend{Address: "10.1.0.99"})
	for _, b := range Resolve([]Service{dsr}, nil, testEnv).Services[0].Backends {
		if b.Active != (b.Address != "10.1.0.99") || (!b.Active && !strings.Contains(b.Reason, "MAC address unknown")) {
			t.Errorf("dsr %s: active=%v %s", b.Address, b.Active, b.Reason)
		}
	}
	// A missing interface keeps the whole service out.
	dsr.Interface = "eth9"
	if ss := Resolve([]Service{dsr}, nil, testEnv).Services[0]; ss.Skipped != `interface "eth9" does not exist` {
		t.Errorf("missing interface: %q", ss.Skipped)
	}
}

// Backend ids are stable: they do not depend on the order or on other backends.
func TestBackendIDs(t *testing.T) {
	s := fixture(DSR, RoundRobin)
	ids := map[string]uint32{}
	for _, b := range Resolve([]Service{s}, nil, testEnv).Services[0].Backends {
		ids[b.Address] = b.ID
	}
	s.Backends = []Backend{s.Backends[2], s.Backends[0]}
	for _, b := range Resolve([]Service{s}, nil, testEnv).Services[0].Backends {
		if ids[b.Address] != b.ID || b.ID == 0 {
			t.Errorf("%s: id %d, was %d", b.Address, b.ID, ids[b.Address])
		}
	}
}

// Equal weights (after dividing by their gcd) give every backend one slot, in order: what the
// smooth weighted rotation gives them, taken as a shortcut.
func TestSlotsOfEqualWeightsAreTheBackendsInOrder(t *testing.T) {
	for _, weight := range []int{1, 7} {
		ss := &ServiceState{Topology: DNAT}
		for i := range 5 {
			ss.Backends = append(ss.Backends, &BackendState{Active: true, Weight: weight, Addr: netip.AddrFrom4([4]byte{10, 0, 0, byte(i)})})
		}
		got := ss.slots(false)
		if len(got) != 5 {
			t.Fatalf("weight %d: %d slots", weight, len(got))
		}
		for i, b := range got {
			if b != ss.Backends[i] {
				t.Errorf("weight %d: slot %d is %s", weight, i, b.Addr)
			}
		}
	}
	ss := &ServiceState{Topology: DNAT, Backends: []*BackendState{
		{Active: true, Weight: 2, Addr: netip.MustParseAddr("10.0.0.1")}, {Active: true, Weight: 1, Addr: netip.MustParseAddr("10.0.0.2")},
	}}
	if got := ss.slots(false); len(got) != 3 || got[0] != ss.Backends[0] || got[1] != ss.Backends[1] || got[2] != ss.Backends[0] {
		t.Errorf("weights 2, 1: %v", got)
	}
}
