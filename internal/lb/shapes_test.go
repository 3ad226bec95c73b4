package lb

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/knftables"

	"github.com/hostaccel/hostaccel/internal/testbed"
)

// shapeServices are five services of each of several shapes (rr over tcp, weight over udp,
// two ports, IPv6 with source NAT), named so that one name begins with a digit (its maps'
// names get a '_': a shape of its own) and one ("ip") also occurs in the rules' text.
func shapeServices() []Service {
	be := func(addr string, port int) Backend { return Backend{Address: addr, Port: port} }
	var svcs []Service
	for i, name := range []string{"web", "shop", "cart", "1st", "ip"} {
		svcs = append(svcs,
			Service{Name: name, VIPs: []string{fmt.Sprintf("198.18.0.%d", 10+i)}, Port: 80,
				Backends: []Backend{be(fmt.Sprintf("10.0.%d.1", i), 8080), be(fmt.Sprintf("10.0.%d.2", i), 8080)}},
			Service{Name: name + "-dns", VIPs: []string{fmt.Sprintf("198.18.1.%d", 10+i)}, Port: 53, Protocol: "udp", Scheduler: Weighted,
				Backends: []Backend{be(fmt.Sprintf("10.1.%d.1", i), 53), be(fmt.Sprintf("10.1.%d.2", i), 53)}},
			Service{Name: name + "-two", VIPs: []string{fmt.Sprintf("198.18.2.%d", 10+i)}, Ports: []int{80, 443},
				Backends: []Backend{be(fmt.Sprintf("10.2.%d.1", i), 0), be(fmt.Sprintf("10.2.%d.2", i), 0)}},
			Service{Name: name + "-six", VIPs: []string{fmt.Sprintf("fd00:18::%d", 10+i)}, Port: 443, Topology: SNAT,
				Backends: []Backend{be(fmt.Sprintf("fd00:1:%d::1", i), 8443), be(fmt.Sprintf("fd00:1:%d::2", i), 8443)}})
	}
	return svcs
}

// TestShapesPredictTheKernel, on the real kernel: services of each shape are drained one
// after another (2 slots -> 1: their chains rewritten). The first two of a shape are read
// back (Settle: learnt, then confirmed); the others are predicted and need no reading, except
// the shapes of their own ("1st", "ip"). A full read then finds every
// predicted rule as the kernel renders it (no drift), and an undrain (back to read shapes)
// needs no reading either.
func TestShapesPredictTheKernel(t *testing.T) {
	testbed.RequireRoot(t)
	ns, err := testbed.NewNS("shape")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ns.Close() })
	var m *Manager
	if err := ns.Do(func() (err error) { m, err = NewManager(); return err }); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(m.Close)
	m.FullEvery = time.Hour
	m.Rehearse = nil // the kernel's chains are read (rehearse_test.go has rehearsals)
	ctx := context.Background()
	lists := countChainLists(m)
	run := func(what string, fn func() error) {
		t.Helper()
		if err := ns.Do(fn); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
	svcs := shapeServices()
	var rv Resolver
	var rr Renderer
	applyNow := func() Result {
		t.Helper()
		var res Result
		run("apply", func() (err error) {
			res, err = m.ApplyChanges(ctx, rr.Render(rv.Resolve(svcs, nil, testEnv)))
			return err
		})
		return res
	}
	applyNow()
	for i := range svcs {
		svcs[i].Backends[1].State = StateDrain
		res := applyNow()
		if len(res.ChainsRewritten) == 0 {
			t.Fatalf("%s: no chain rewritten: %+v", svcs[i].Name, res)
		}
		name := svcs[i].Name
		read := name == "ip" || !strings.HasPrefix(name, "cart") && !strings.HasPrefix(name, "ip")
		if m.Unsettled() != read {
			t.Errorf("%s drained: left for Settle %v, want %v", name, m.Unsettled(), read)
		}
		before := *lists
		run("settle", func() error { return m.Settle(ctx) })
		if got := *lists > before; got != read {
			t.Errorf("%s drained: Settle listed chains %v, want %v", name, got, read)
		}
	}
	m.FullEvery, m.Generation = 0, nil // a full read, though the ruleset is as we left it
	var res Result
	run("full read", func() (err error) { res, err = m.Apply(ctx, rr.Render(rv.Resolve(svcs, nil, testEnv))); return err })
	if !res.FullRead || len(res.Drift) > 0 || res.Changed() {
		t.Fatalf("full read after the predictions: %+v", res)
	}
	m.FullEvery = time.Hour
	for i := range svcs {
		svcs[i].Backends[1].State = StateUp
		applyNow()
		if m.Unsettled() {
			t.Errorf("%s back to two slots: left for Settle", svcs[i].Name)
		}
	}
}

// A predicted rule that someone edits (keeping its comment) is drift at the next full read,
// and its shape is predicted no more: the next chain of that shape is read back.
func TestShapeEditedIsDriftAndReadAgain(t *testing.T) {
	m, f := NewFakeManager()
	m.FullEvery = time.Hour
	svcs := shapeServices()
	apply(t, m, svcs, nil)
	drain := func(name string) {
		t.Helper()
		i := slices.IndexFunc(svcs, func(s Service) bool { return s.Name == name })
		svcs[i].Backends[1].State = StateDrain
		if _, err := m.Apply(context.Background(), Render(Resolve(svcs, nil, testEnv))); err != nil {
			t.Fatal(err)
		}
	}
	for _, name := range []string{"web", "shop"} {
		drain(name)
		if err := m.Settle(context.Background()); err != nil || m.Unsettled() {
			t.Fatalf("settle %s: %v", name, err)
		}
	}
	drain("cart")
	if m.Unsettled() {
		t.Fatal("cart drained: not predicted")
	}
	// Someone rewrites cart's scheduler rule, keeping its comment.
	editSchedule(t, f, "svc-cart-v4")
	m.FullEvery = 0
	res, d := apply(t, m, svcs, nil)
	if !slices.Contains(res.Drift, "inet hostaccel-lb: chain svc-cart-v4: rules changed") {
		t.Fatalf("an edit of a predicted rule not seen: %+v", res)
	}
	checkKernel(t, f, freshDump(t, d), "edit repaired")
	m.FullEvery = time.Hour
	drain("web-dns")
	if err := m.Settle(context.Background()); err != nil {
		t.Fatal(err)
	}
	drain("shop-dns")
	if err := m.Settle(context.Background()); err != nil {
		t.Fatal(err)
	}
	drain("cart-dns") // another shape: still predicted
	if m.Unsettled() {
		t.Error("another shape is no longer predicted")
	}
	// A new service of the edited shape (one slot over tcp) is read back, not predicted.
	svcs = append(svcs, Service{Name: "extra", VIPs: []string{"198.18.9.1"}, Port: 80,
		Backends: []Backend{{Address: "10.9.0.1", Port: 8080}, {Address: "10.9.0.2", Port: 8080, State: StateDrain}}})
	if _, err := m.Apply(context.Background(), Render(Resolve(svcs, nil, testEnv))); err != nil {
		t.Fatal(err)
	}
	if !m.Unsettled() {
		t.Error("a new service of the edited shape predicted")
	}
	if err := m.Settle(context.Background()); err != nil {
		t.Fatal(err)
	}
	drain("ip") // ip's own shape
	if !m.Unsettled() {
		t.Error("ip's shape predicted")
	}
}

// A Settle reading keeps the chains no apply rewrote while nft listed: under a steady stream
// of changes (each listing seconds at thousands of services) a reading was dropped after any
// apply, so none was ever kept. The chain rewritten meanwhile stays for the next Settle.
func TestSettleKeepsChainsNotRewrittenMeanwhile(t *testing.T) {
	natRef := TableRef{knftables.InetFamily, NATTable}
	m, _ := NewFakeManager()
	m.FullEvery = time.Hour
	svcs := shapeServices()
	apply(t, m, svcs, nil)
	drain := func(i int) {
		t.Helper()
		svcs[i].Backends[1].State = StateDrain
		if _, err := m.Apply(context.Background(), Render(Resolve(svcs, nil, testEnv))); err != nil {
			t.Fatal(err)
		}
	}
	drain(0) // web: unread
	s := m.StartSettle()
	if err := s.Read(context.Background()); err != nil {
		t.Fatal(err)
	}
	drain(1) // web-dns, while the reading ran
	m.FinishSettle(s)
	if got := m.cache.unread[natRef]; !slices.Equal(got, []string{"svc-web-dns-v4"}) {
		t.Fatalf("unread after the reading: %v, want only the chain rewritten meanwhile", got)
	}
	if err := m.Settle(context.Background()); err != nil || m.Unsettled() {
		t.Fatalf("Settle: %v, unsettled %v", err, m.Unsettled())
	}
	// The kept reading is the kernel's: a full read finds no drift.
	m.FullEvery, m.Generation = 0, nil
	if res, _ := apply(t, m, svcs, nil); len(res.Drift) > 0 || res.Changed() {
		t.Fatalf("full read: %+v", res)
	}
}

// A reading of a chain rewritten while nft listed is not kept for the chain, but still
// teaches its rules' shape (a drain undone within seconds, as an endpoint that is not ready
// and then is: otherwise no such reading would ever teach one).
func TestSettleLearnsFromAChainRewrittenMeanwhile(t *testing.T) {
	m, _ := NewFakeManager()
	m.FullEvery = time.Hour
	svcs := shapeServices() // web, web-dns, ..., shop, ..., cart
	apply(t, m, svcs, nil)
	set := func(name, state string) {
		t.Helper()
		i := slices.IndexFunc(svcs, func(s Service) bool { return s.Name == name })
		svcs[i].Backends[1].State = state
		if _, err := m.Apply(context.Background(), Render(Resolve(svcs, nil, testEnv))); err != nil {
			t.Fatal(err)
		}
	}
	set("web", StateDrain)
	s := m.StartSettle()
	if err := s.Read(context.Background()); err != nil {
		t.Fatal(err)
	}
	set("web", StateUp) // back to rules read at the first apply
	m.FinishSettle(s)
	if m.Unsettled() {
		t.Fatal("unsettled")
	}
	set("shop", StateDrain) // the shape learnt from web's reading: confirmed by shop's
	if err := m.Settle(context.Background()); err != nil || m.Unsettled() {
		t.Fatalf("Settle: %v", err)
	}
	set("cart", StateDrain)
	if m.Unsettled() {
		t.Error("cart drained: not predicted (web's reading taught nothing)")
	}
}
