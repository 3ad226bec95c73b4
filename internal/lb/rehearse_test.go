package lb

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"maps"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/knftables"

	"github.com/hostaccel/hostaccel/internal/testbed"
)

// A rehearsal makes the chain, its rules and what they name, and nothing else: not the other
// family's map, not the other service's objects. Base chains and chains whose rules name a
// device are not rehearsed.
func TestRehearsalScript(t *testing.T) {
	shop := rename(fixture(DNAT, Weighted), "shop", "192.0.2.20", "2001:db8::20")
	dsr := rename(fixture(DSR, RoundRobin), "dsr", "192.0.2.11")
	r := Render(Resolve([]Service{fixture(DNAT, RoundRobin), shop, dsr}, nil, testEnv))
	nat := tableOf(r, TableRef{"inet", NATTable})
	s, ok := rehearsal(nat, []string{"svc-web-v4"})
	if !ok {
		t.Fatal("svc-web-v4 not rehearsed")
	}
	var adds []string
	for _, line := range strings.Split(strings.TrimSpace(s.text), "\n") {
		f := strings.Fields(line)
		adds = append(adds, strings.Join(f[:min(len(f), 5)], " "))
	}
	want := []string{
		"add table inet hostaccel-lb {",
		"add chain inet hostaccel-lb svc-web-v4",
		"add map inet hostaccel-lb web-backends-v4",
		"add counter inet hostaccel-lb svc-web-v4",
		"add rule inet hostaccel-lb svc-web-v4",
		"add rule inet hostaccel-lb svc-web-v4",
	}
	if !slices.Equal(adds, want) || !maps.Equal(s.rules, map[string]int{"svc-web-v4": 2}) {
		t.Fatalf("rehearsal of svc-web-v4 (rules %v):\n%s\nwant the lines beginning\n%s", s.rules, s.text, strings.Join(want, "\n"))
	}
	// Of several chains, those that can be: not a base chain, not one that is not there.
	s, ok = rehearsal(nat, []string{"svc-web-v6", "prerouting", "svc-shop-v4", "no-such-chain"})
	if !ok || !maps.Equal(s.rules, map[string]int{"svc-web-v6": 2, "svc-shop-v4": 2}) {
		t.Fatalf("rehearsal of four chains: rules %v\n%s", s.rules, s.text)
	}
	for _, name := range []string{"web-backends-v6", "shop-backends-v4"} {
		if !strings.Contains(s.text, "add map inet hostaccel-lb "+name+" ") {
			t.Errorf("the rehearsal of four chains lacks map %s:\n%s", name, s.text)
		}
	}
	if _, ok := rehearsal(nat, []string{"prerouting", "no-such-chain"}); ok {
		t.Error("a base chain or a missing chain rehearsed")
	}
	// Most of a large table's chains are listed from the kernel instead: cheaper.
	var many []Service
	for i := range 80 {
		many = append(many, Service{Name: fmt.Sprintf("s%d", i), VIPs: []string{fmt.Sprintf("198.18.0.%d", i+1)}, Port: 80,
			Backends: []Backend{{Address: fmt.Sprintf("10.0.0.%d", i+1), Port: 8080}}})
	}
	big := tableOf(Render(Resolve(many, nil, testEnv)), TableRef{"inet", NATTable})
	var svcChains []string
	for _, c := range big.Chains {
		if strings.HasPrefix(c.Name, "svc-") {
			svcChains = append(svcChains, c.Name)
		}
	}
	if s, ok := rehearsal(big, svcChains[:maxRehearsed]); !ok || len(s.rules) != maxRehearsed {
		t.Errorf("%d chains of %d not rehearsed", maxRehearsed, len(big.Chains))
	}
	if _, ok := rehearsal(big, svcChains); ok {
		t.Errorf("%d chains of %d rehearsed", len(svcChains), len(big.Chains))
	}
	var ingress *Table
	for _, tb := range r.Tables {
		if slices.ContainsFunc(tb.Chains, func(c *knftables.Chain) bool { return c.Name == "dsr-dsr-v4" }) {
			ingress = tb
		}
	}
	if ingress == nil {
		t.Fatal("no table with chain dsr-dsr-v4")
	}
	if _, ok := rehearsal(ingress, []string{"dsr-dsr-v4"}); ok {
		t.Error("a chain whose rule forwards to a device rehearsed")
	}
}

// Settle rehearses what it can: no listing of the kernel's chain; a rehearsal that fails or
// lists other rules is read from the kernel instead. Either way a full read then finds no
// drift.
func TestSettleRehearses(t *testing.T) {
	for _, tc := range []struct {
		name  string
		fault func(out []byte, err error) ([]byte, error)
		lists int // chains listed from the kernel
	}{
		{"rehearsed", nil, 0},
		{"rehearsal failed", func([]byte, error) ([]byte, error) { return nil, errors.New("no namespace") }, 1},
		{"rehearsal lists no rules", func([]byte, error) ([]byte, error) {
			return []byte(`{"nftables": [{"chain": {"family": "inet", "table": "hostaccel-lb", "name": "svc-web-v4"}}]}`), nil
		}, 1},
		{"no namespace", func([]byte, error) ([]byte, error) {
			return nil, fmt.Errorf("%w: operation not permitted", ErrNoScratchNS)
		}, 1},
		{"rehearsal lists other rules", func(out []byte, err error) ([]byte, error) {
			return bytes.ReplaceAll(out, []byte(`: count [`), []byte(`: counted [`)), err
		}, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m, svcs := unsettled(t)
			kernel := m.List
			lists := countChainLists(m)
			rehearsals := 0
			m.Rehearse = func(ctx context.Context, script string, list ...string) ([]byte, error) {
				rehearsals++
				if !strings.Contains(script, "add chain inet hostaccel-lb svc-web-v4") {
					t.Errorf("script without the chain:\n%s", script)
				}
				out, err := kernel(ctx, append([]string{"list"}, list...)...) // the Fake holds what the script makes
				if tc.fault != nil {
					return tc.fault(out, err)
				}
				return out, err
			}
			before := *lists
			if err := m.Settle(context.Background()); err != nil || m.Unsettled() {
				t.Fatalf("Settle: %v, unsettled %v", err, m.Unsettled())
			}
			if rehearsals != 1 || *lists-before != tc.lists {
				t.Fatalf("%d rehearsals (want 1), %d chains listed (want %d)", rehearsals, *lists-before, tc.lists)
			}
			if want := (ReadCounts{Full: 1, ChainsListed: uint64(tc.lists), ChainsRehearsed: uint64(1 - tc.lists)}); m.Reads != want { // Full: the first apply
				t.Errorf("reads counted %+v, want %+v", m.Reads, want)
			}
			if off := m.Rehearse == nil; off != (tc.name == "no namespace") {
				t.Errorf("rehearsals turned off: %v", off)
			}
			m.FullEvery, m.Generation = 0, nil
			if res, _ := apply(t, m, svcs, nil); len(res.Drift) > 0 || res.Changed() || m.Reads.Full != 2 {
				t.Fatalf("full read: %+v (full reads counted: %d, want 2)", res, m.Reads.Full)
			}
		})
	}
}

// TestRehearsalIsTheKernelsRendering, on the real kernel: every chain a rehearsal makes, of
// every topology, scheduler and rendered variant, lists as the kernel's own chain does (rule
// by rule, the expressions Settle remembers), and a Manager's Settle of a drained chain
// rehearses it without listing the kernel's.
func TestRehearsalIsTheKernelsRendering(t *testing.T) {
	ns := testEnvNS(t, "rehearse")
	cases := renderVariants()
	for _, topo := range topologies {
		for _, sched := range schedulers {
			cases[topo+"-"+sched] = []Service{fixture(topo, sched)}
		}
	}
	cases["shapes"] = shapeServices()
	ctx := context.Background()
	rehearsed := 0
	for name, svcs := range cases {
		var m *Manager
		if err := ns.Do(func() (err error) { m, err = NewManager(); return err }); err != nil {
			t.Fatal(err)
		}
		r := Render(Resolve(svcs, nil, testEnv))
		if err := ns.Do(func() error { _, err := m.Apply(ctx, r); return err }); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		for _, tb := range r.Tables {
			var chains []string
			for _, ch := range tb.Chains {
				chains = append(chains, ch.Name)
			}
			s, ok := rehearsal(tb, chains) // all at once, as Settle does
			if !ok {
				continue
			}
			out, err := NFTRehearse(ctx, s.text, "table", string(tb.Family), tb.Name)
			if err != nil {
				t.Fatalf("%s: rehearse %s: %v\n%s", name, tb.Name, err, s.text)
			}
			got, err := parseTable(tb.ref(), out)
			if err != nil {
				t.Fatal(err)
			}
			for c := range s.rules {
				rehearsed++
				var kernel *kernelTable
				if err := ns.Do(func() (err error) { kernel, err = m.list(ctx, tb.ref(), "chain", c); return err }); err != nil {
					t.Fatal(err)
				}
				if a, b := rulesOf(kernel, c), rulesOf(got, c); a != b {
					t.Errorf("%s: chain %s of %s:\nkernel:\n%s\nrehearsed:\n%s", name, c, tb.Name, a, b)
				}
			}
		}
		if err := ns.Do(func() error { _, err := m.Remove(ctx); return err }); err != nil {
			t.Fatal(err)
		}
		m.Close()
	}
	if rehearsed < 50 {
		t.Fatalf("only %d chains rehearsed", rehearsed)
	}
	// The rehearsals ran from this thread's namespace (the host's): none of their tables may
	// be here.
	if out, err := exec.Command("nft", "list", "tables").CombinedOutput(); err != nil || strings.Contains(string(out), "hostaccel") {
		t.Fatalf("the host's ruleset after the rehearsals (%v): %s", err, out)
	}

	// A Manager's Settle rehearses the chain a drain rewrote on the lane.
	var m *Manager
	if err := ns.Do(func() (err error) { m, err = NewManager(); return err }); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(m.Close)
	m.FullEvery = time.Hour
	lists := countChainLists(m)
	svcs := shapeServices()
	var rv Resolver
	var rr Renderer
	for _, state := range []string{StateUp, StateDrain} {
		svcs[0].Backends[1].State = state
		if err := ns.Do(func() error { _, err := m.ApplyChanges(ctx, rr.Render(rv.Resolve(svcs, nil, testEnv))); return err }); err != nil {
			t.Fatal(err)
		}
	}
	if !m.Unsettled() {
		t.Fatal("the drain left nothing for Settle")
	}
	if err := ns.Do(func() error { return m.Settle(ctx) }); err != nil || m.Unsettled() || *lists != 0 {
		t.Fatalf("Settle: %v, unsettled %v, %d chains listed from the kernel (want 0)", err, m.Unsettled(), *lists)
	}
	m.FullEvery, m.Generation = 0, nil
	var res Result
	if err := ns.Do(func() (err error) { res, err = m.Apply(ctx, rr.Render(rv.Resolve(svcs, nil, testEnv))); return err }); err != nil {
		t.Fatal(err)
	}
	if !res.FullRead || len(res.Drift) > 0 || res.Changed() {
		t.Fatalf("full read after a rehearsed Settle: %+v", res)
	}
}

// rulesOf is each rule of chain in kt, its comment and expressions, a line each.
func rulesOf(kt *kernelTable, chain string) string {
	ch := kt.Chains[chain]
	if ch == nil {
		return "(no chain)"
	}
	var b strings.Builder
	for _, rl := range ch.Rules {
		fmt.Fprintf(&b, "%s: %s\n", rl.Comment, normExpr(rl.Expr))
	}
	return b.String()
}

// testEnvNS is a network namespace (removed at the test's end) with testEnv's devices: eth0
// and eth1, a veth pair. It needs root.
func testEnvNS(t *testing.T, name string) *testbed.NS {
	t.Helper()
	testbed.RequireRoot(t)
	ns, err := testbed.NewNS(name)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ns.Close() })
	if out, err := ns.Exec("ip", "link", "add", "eth0", "type", "veth", "peer", "name", "eth1"); err != nil {
		t.Fatal(err, out)
	}
	return ns
}
