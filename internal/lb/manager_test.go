package lb

import (
	"context"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"sigs.k8s.io/knftables"

	"github.com/hostaccel/hostaccel/internal/golden"
)

func apply(t *testing.T, m *Manager, svcs []Service, health map[string]Health) (Result, *Desired) {
	t.Helper()
	if errs := ValidateServices(svcs, fieldByName(svcs)); len(errs) > 0 {
		t.Fatal(errs)
	}
	d := Resolve(svcs, health, testEnv)
	res, err := m.Apply(context.Background(), Render(d))
	if err != nil {
		t.Fatal(err)
	}
	return res, d
}

// dumpOf is the fake kernel's content (lines sorted: element order is insertion order),
// which must equal a fresh render's.
func dumpOf(f *knftables.Fake) string { return sortLines(f.Dump()) }

// freshDump is a fresh render's dump, sorted, with the slots of free slot maps
// (Table.Slots, whose order the manager may change) written as "*".
func freshDump(t *testing.T, d *Desired) string {
	r := Render(d)
	s, err := r.Dump()
	if err != nil {
		t.Fatal(err)
	}
	free := map[string]bool{}
	for _, tb := range r.Tables {
		for name := range tb.Slots {
			free[name] = true
		}
	}
	return sortLines(anySlot(s, free))
}

var elemLine = regexp.MustCompile(`^(add element \S+ \S+ (\S+) \{ )\d+ : `)

// anySlot writes the slot of every element of the maps free as "*".
func anySlot(dump string, free map[string]bool) string {
	l := strings.Split(dump, "\n")
	for i, line := range l {
		if m := elemLine.FindStringSubmatch(line); m != nil && free[m[2]] {
			l[i] = m[1] + "* : " + line[len(m[0]):]
		}
	}
	return strings.Join(l, "\n")
}

// checkKernel fails t with a diff unless the fake kernel holds want (a sorted dump from
// freshDump: the free slot maps are compared as multisets).
func checkKernel(t *testing.T, f *knftables.Fake, want, what string) {
	t.Helper()
	free := map[string]bool{}
	for _, line := range strings.Split(want, "\n") {
		if m := elemLine.FindStringSubmatch(strings.Replace(line, "{ * : ", "{ 0 : ", 1)); m != nil && strings.Contains(line, "{ * : ") {
			free[m[2]] = true
		}
	}
	if diff := golden.Diff(want, sortLines(anySlot(f.Dump(), free))); diff != "" {
		t.Errorf("%s: the kernel differs from the render:\n%s", what, diff)
	}
}

func sortLines(s string) string {
	l := strings.Split(strings.TrimSpace(s), "\n")
	slices.Sort(l)
	return strings.Join(l, "\n")
}

func addElem(t *testing.T, f *knftables.Fake, fam knftables.Family, table, m string, key, value []string) {
	t.Helper()
	tx := f.NewTransaction()
	tx.Add(&knftables.Element{Family: fam, Table: table, Map: m, Key: key, Value: value})
	if err := f.Run(context.Background(), tx); err != nil {
		t.Fatal(err)
	}
}

func hasElem(f *knftables.Fake, fam knftables.Family, table, m, key string) bool {
	f.RLock()
	defer f.RUnlock()
	for _, e := range f.Tables[fam][table].Maps[m].Elements {
		if strings.Join(e.Key, " . ") == key {
			return true
		}
	}
	return false
}

// eachReadMode runs test on a new Fake manager that reads the kernel whole on every apply
// (full), and on one that diffs against what its last apply left.
func eachReadMode(t *testing.T, test func(t *testing.T, full bool, m *Manager, f *knftables.Fake)) {
	for _, full := range []bool{true, false} {
		t.Run(fmt.Sprintf("full=%v", full), func(t *testing.T) {
			m, f := NewFakeManager()
			if !full {
				m.FullEvery = time.Hour
			}
			test(t, full, m, f)
		})
	}
}

func svcSet() []Service {
	return []Service{fixture(SNAT, RoundRobin), rename(fixture(DSR, RoundRobin), "dsr", "192.0.2.11", "2001:db8::11"),
		rename(fixture(StatelessDNAT, Hash), "sl", "192.0.2.12")}
}

func TestManagerFirstApplyAndNoop(t *testing.T) {
	eachReadMode(t, func(t *testing.T, full bool, m *Manager, f *knftables.Fake) {
		res, d := apply(t, m, svcSet(), nil)
		if len(res.Rebuilt) != 3 || !res.Changed() {
			t.Errorf("first apply: %+v", res)
		}
		checkKernel(t, f, freshDump(t, d), "first apply")
		res, _ = apply(t, m, svcSet(), nil)
		if res.Changed() || res.FullRead != full {
			t.Errorf("second apply (full read %v) changed something: %+v", full, res)
		}
	})
}

// Backend changes are element updates: a swap (same number of slots) touches only
// elements; a backend leaving rewrites its service's chain (numgen mod N) in the same
// transaction, never a table.
func TestManagerBackendChangesAreElementUpdates(t *testing.T) {
	eachReadMode(t, func(t *testing.T, full bool, m *Manager, f *knftables.Fake) {
		svcs := svcSet()
		apply(t, m, svcs, nil)
		svcs[0].Backends[0].Address = "10.1.0.21"
		res, d := apply(t, m, svcs, nil)
		if len(res.Rebuilt)+len(res.ChainsRewritten)+len(res.MapsReplaced) > 0 || res.ElementsAdded == 0 || res.ElementsRemoved == 0 {
			t.Errorf("swap (full %v): %+v", full, res)
		}
		checkKernel(t, f, freshDump(t, d), fmt.Sprintf("swap (full %v)", full))
		svcs[0].Backends[1].State = StateDown
		res, d = apply(t, m, svcs, nil)
		if len(res.Rebuilt) > 0 || !slices.Equal(res.ChainsRewritten, []string{"hostaccel-lb svc-web-v4"}) {
			t.Errorf("a backend down (full %v): %+v", full, res)
		}
		checkKernel(t, f, freshDump(t, d), fmt.Sprintf("backend down (full %v)", full))
	})
}

// Persistent clients keep their entries, except those of backends that are down or gone;
// drained backends keep theirs. The dsr and stateless-dnat flow tables are the datapath's:
// the manager leaves them alone (their chains forget flows whose backend is gone).
func TestManagerForgetsFlowsOfDownBackends(t *testing.T) {
	eachReadMode(t, func(t *testing.T, full bool, m *Manager, f *knftables.Fake) {
		svcs := svcSet()
		svcs[0].Persistence = D(time.Minute)
		_, d := apply(t, m, svcs, nil)
		be := func(svc, addr string) *BackendState {
			for _, ss := range d.Services {
				for _, b := range ss.Backends {
					if ss.Service.Name == svc && b.Address == addr {
						return b
					}
				}
			}
			t.Fatalf("no backend %s %s", svc, addr)
			return nil
		}
		mac := func(svc, addr string) []string { return []string{idMAC(be(svc, addr))} }
		ip := func(svc, addr string) []string { return []string{idAddr(be(svc, addr), fam(false))} }
		nd, inet := knftables.NetDevFamily, knftables.InetFamily
		dsrTab := IngressTablePrefix + "eth1"
		addElem(t, f, nd, dsrTab, "dsr-flows-v4", []string{"198.51.100.1", "40000"}, mac("dsr", "10.1.0.11"))
		addElem(t, f, nd, dsrTab, "dsr-flows-v4", []string{"198.51.100.2", "40000"}, mac("dsr", "10.1.0.12"))
		addElem(t, f, nd, dsrTab, "dsr-flows-v4", []string{"198.51.100.3", "40000"}, mac("dsr", "10.1.0.13"))
		addElem(t, f, inet, NATTable, "web-persist-v4", []string{"198.51.100.1"}, ip("web", "10.1.0.11"))
		addElem(t, f, inet, NATTable, "web-persist-v4", []string{"198.51.100.2"}, ip("web", "10.1.0.12"))
		addElem(t, f, inet, NATTable, "web-persist-v4", []string{"198.51.100.3"}, ip("web", "10.1.0.13"))

		svcs[1].Backends[0].State = StateDown  // dsr 10.1.0.11: its flow goes
		svcs[1].Backends[1].State = StateDrain // dsr 10.1.0.12: its flow stays
		svcs[0].Backends[0].State = StateDown  // web 10.1.0.11: its persistent client goes
		svcs[0].Backends[1].State = StateDrain // web 10.1.0.12: its persistent client stays
		res, _ := apply(t, m, svcs, nil)
		if res.FlowsForgotten != 1 {
			t.Errorf("full %v: forgot %d entries, want 1: %+v", full, res.FlowsForgotten, res)
		}
		for _, c := range []struct {
			fam           knftables.Family
			table, m, key string
			want          bool
		}{
			{nd, dsrTab, "dsr-flows-v4", "198.51.100.1 . 40000", true},
			{nd, dsrTab, "dsr-flows-v4", "198.51.100.2 . 40000", true},
			{nd, dsrTab, "dsr-flows-v4", "198.51.100.3 . 40000", true},
			{inet, NATTable, "web-persist-v4", "198.51.100.1", false},
			{inet, NATTable, "web-persist-v4", "198.51.100.2", true},
			{inet, NATTable, "web-persist-v4", "198.51.100.3", true},
		} {
			if hasElem(f, c.fam, c.table, c.m, c.key) != c.want {
				t.Errorf("full %v: %s %s present=%v", full, c.m, c.key, !c.want)
			}
		}
	})
}

// Services and tables come and go; a table layout that differs is rebuilt; drift (an element
// deleted, a foreign rule) is repaired on a full read; Remove leaves foreign tables alone.
func TestManagerServicesDriftAndRemove(t *testing.T) {
	m, f := NewFakeManager() // FullEvery 0: every apply reads the kernel
	svcs := svcSet()
	apply(t, m, svcs, nil)
	res, d := apply(t, m, svcs[:1], nil)
	if !slices.Equal(res.Removed, []string{"netdev hostaccel-lb-eth0", "netdev hostaccel-lb-eth1"}) || res.Drift != nil {
		t.Errorf("services removed: %+v", res)
	}
	checkKernel(t, f, freshDump(t, d), "services removed")
	res, d = apply(t, m, svcs, nil)
	if len(res.Rebuilt) != 2 || res.Drift != nil {
		t.Errorf("services back: %+v", res)
	}
	checkKernel(t, f, freshDump(t, d), "services back")

	tx := f.NewTransaction()
	tx.Delete(&knftables.Element{Family: knftables.InetFamily, Table: NATTable, Map: "web-backends-v4", Key: []string{"1"}})
	tx.Add(&knftables.Rule{Family: knftables.InetFamily, Table: NATTable, Chain: "svc-web-v4", Rule: "drop"})
	tx.Add(&knftables.Chain{Family: knftables.InetFamily, Table: NATTable, Name: "foreign"})
	if err := f.Run(context.Background(), tx); err != nil {
		t.Fatal(err)
	}
	res, _ = apply(t, m, svcs, nil)
	if res.ElementsAdded != 1 || !slices.Equal(res.ChainsRewritten, []string{"hostaccel-lb svc-web-v4"}) {
		t.Errorf("drift not repaired: %+v", res)
	}
	if want := []string{"inet hostaccel-lb: map web-backends-v4: 1 elements removed or changed, 0 added",
		"inet hostaccel-lb: chain svc-web-v4: rules changed", "inet hostaccel-lb: chain foreign added"}; !slices.Equal(res.Drift, want) {
		t.Errorf("drift reported:\n%q\nwant\n%q", res.Drift, want)
	}
	checkKernel(t, f, freshDump(t, d), "drift")
	if res, _ = apply(t, m, svcs, nil); res.Drift != nil {
		t.Errorf("drift reported again after the repair: %+v", res)
	}

	tx = f.NewTransaction()
	tx.Delete(&knftables.Set{Family: knftables.InetFamily, Table: NATTable, Name: layoutSet})
	tx.Add(&knftables.Set{Family: knftables.InetFamily, Table: NATTable, Name: layoutSet, Type: "mark", Comment: knftables.PtrTo("an older layout")})
	tx.Add(&knftables.Table{Family: knftables.IPv4Family, Name: "foreign"})
	if err := f.Run(context.Background(), tx); err != nil {
		t.Fatal(err)
	}
	res, _ = apply(t, m, svcs, nil)
	if !slices.Equal(res.Rebuilt, []string{"inet hostaccel-lb: layout changed"}) || !slices.Equal(res.Drift, []string{"inet hostaccel-lb: layout changed"}) {
		t.Errorf("layout change: %+v", res)
	}
	checkKernel(t, f, sortLines(freshDump(t, d)+"\nadd table ip foreign"), "layout change")
	refs, err := m.Remove(context.Background())
	if err != nil || len(refs) != 3 {
		t.Fatal(refs, err)
	}
	if got := strings.TrimSpace(dumpOf(f)); got != "add table ip foreign" {
		t.Errorf("Remove left:\n%s", got)
	}
	if res, _ = apply(t, m, svcs, nil); len(res.Rebuilt) != 3 || res.Drift != nil {
		t.Errorf("apply after Remove: %+v", res)
	}
}

// Drift is reported where an apply reads the kernel: a table gone (nft flush ruleset) on
// every apply, a map emptied on a full read, and on the full read that follows a partial
// apply that failed on what someone changed. Never on the first apply or on our own changes.
func TestManagerReportsDrift(t *testing.T) {
	eachReadMode(t, func(t *testing.T, full bool, m *Manager, f *knftables.Fake) {
		svcs := svcSet()
		if res, _ := apply(t, m, svcs, nil); res.Drift != nil {
			t.Errorf("first apply: %+v", res)
		}
		svcs[0].Backends[0].Address = "10.1.0.21"
		if res, _ := apply(t, m, svcs, nil); res.Drift != nil || !res.Changed() {
			t.Errorf("our own change (full %v): %+v", full, res)
		}

		tx := f.NewTransaction()
		tx.Delete(&knftables.Table{Family: knftables.InetFamily, Name: NATTable})
		if err := f.Run(context.Background(), tx); err != nil {
			t.Fatal(err)
		}
		res, d := apply(t, m, svcs, nil)
		if !slices.Equal(res.Drift, []string{"inet hostaccel-lb: table missing"}) {
			t.Errorf("table deleted (full %v): %+v", full, res)
		}
		checkKernel(t, f, freshDump(t, d), "table deleted")

		// A map emptied: a partial apply does not read it; the periodic full read does.
		tx = f.NewTransaction()
		tx.Flush(&knftables.Map{Family: knftables.InetFamily, Table: NATTable, Name: "web-backends-v4"})
		if err := f.Run(context.Background(), tx); err != nil {
			t.Fatal(err)
		}
		m.FullEvery = 0
		res, d = apply(t, m, svcs, nil)
		if len(res.Drift) != 1 || !strings.HasPrefix(res.Drift[0], "inet hostaccel-lb: map web-backends-v4: ") || res.ElementsAdded == 0 {
			t.Errorf("map emptied (full %v): %+v", full, res)
		}
		checkKernel(t, f, freshDump(t, d), "map emptied")
		if res, _ := apply(t, m, svcs, nil); res.Drift != nil {
			t.Errorf("after the repair (full %v): %+v", full, res)
		}
	})

	// A partial apply that must delete an element someone already deleted fails; the full
	// read it retries with reports the drift.
	m, f := NewFakeManager()
	m.FullEvery = time.Hour
	svcs := svcSet()
	apply(t, m, svcs, nil)
	tx := f.NewTransaction()
	tx.Flush(&knftables.Map{Family: knftables.InetFamily, Table: NATTable, Name: "web-backends-v4"})
	if err := f.Run(context.Background(), tx); err != nil {
		t.Fatal(err)
	}
	svcs[0].Backends[0].Address = "10.1.0.21"
	d := Resolve(svcs, nil, testEnv)
	res, err := m.ApplyChanges(context.Background(), Render(d))
	if err != nil || !res.FullRead || len(res.Drift) != 1 {
		t.Errorf("partial apply on an emptied map: %+v %v", res, err)
	}
	checkKernel(t, f, freshDump(t, d), "partial apply on an emptied map")
}

// One backend drained or down in a large service is a handful of operations (its slot takes
// the last slot's backend, the last slot goes, the chain's scheduler is rewritten), not one
// per slot after it; the kernel still holds every remaining backend once. A backend added
// is one element and the rewritten chain. Weighted (random) services likewise.
func TestManagerOneBackendChangeIsAHandfulOfOperations(t *testing.T) {
	for _, sched := range []string{RoundRobin, Weighted} {
		t.Run(sched, func(t *testing.T) {
			eachReadMode(t, func(t *testing.T, full bool, m *Manager, f *knftables.Fake) {
				svc := Service{Name: "big", VIPs: []string{"192.0.2.10"}, Port: 80, Topology: DNAT, Scheduler: sched}
				for i := range 1000 {
					svc.Backends = append(svc.Backends, Backend{Address: fmt.Sprintf("10.1.%d.%d", i/250, 1+i%250), Port: 8080})
				}
				svcs := []Service{svc}
				apply(t, m, svcs, nil)
				for _, step := range []struct {
					what   string
					change func()
				}{
					{"drain the 11th", func() { svcs[0].Backends[10].State = StateDrain }},
					{"the 501st down", func() { svcs[0].Backends[500].State = StateDown }},
					{"the 11th back", func() { svcs[0].Backends[10].State = "" }},
					{"one added", func() {
						svcs[0].Backends = append(svcs[0].Backends, Backend{Address: "10.1.9.9", Port: 8080})
					}},
				} {
					step.change()
					res, d := apply(t, m, svcs, nil)
					if res.Operations > 8 || res.ElementsAdded+res.ElementsRemoved > 3 {
						t.Errorf("%s (full %v): %d operations, +%d -%d elements, want a handful: %+v",
							step.what, full, res.Operations, res.ElementsAdded, res.ElementsRemoved, res)
					}
					checkKernel(t, f, freshDump(t, d), step.what)
				}
			})
		})
	}
}

// ApplyChanges trusts its cache for which tables exist (no listing): a table deleted behind
// its back fails the transaction, and the retry reads the kernel and rebuilds it.
func TestApplyChangesRepairsATableDeletedBehindIt(t *testing.T) {
	m, f := NewFakeManager()
	m.FullEvery = time.Hour
	svcs := svcSet()
	apply(t, m, svcs, nil)
	tx := f.NewTransaction()
	tx.Delete(&knftables.Table{Family: knftables.InetFamily, Name: NATTable})
	if err := f.Run(context.Background(), tx); err != nil {
		t.Fatal(err)
	}
	svcs[0].Backends[1].State = StateDrain
	if errs := ValidateServices(svcs, fieldByName(svcs)); len(errs) > 0 {
		t.Fatal(errs)
	}
	d := Resolve(svcs, nil, testEnv)
	res, err := m.ApplyChanges(context.Background(), Render(d))
	if err != nil {
		t.Fatal(err)
	}
	if !res.FullRead || len(res.Rebuilt) != 1 {
		t.Errorf("want a full read and %s rebuilt: %+v", NATTable, res)
	}
	checkKernel(t, f, freshDump(t, d), "table deleted behind ApplyChanges")
}

// A change someone waits for (ApplyChanges) does not read the chains it rewrote back: with
// thousands of services nft lists the whole ruleset for one chain. Settle reads them later,
// and from then on someone's edit of such a chain's rules is drift again.
func TestApplyChangesLeavesTheReadBackToSettle(t *testing.T) {
	m, f := NewFakeManager()
	m.FullEvery = time.Hour
	chainLists := countChainLists(m)
	svcs := svcSet()
	apply(t, m, svcs, nil)
	if m.Unsettled() {
		t.Fatal("unsettled after a plain Apply")
	}
	svcs[0].Backends[1].State = StateDrain
	d := Resolve(svcs, nil, testEnv)
	res, err := m.ApplyChanges(context.Background(), Render(d))
	if err != nil {
		t.Fatal(err)
	}
	if len(res.ChainsRewritten) == 0 || *chainLists != 0 || !m.Unsettled() {
		t.Fatalf("ApplyChanges: %d chain listings, unsettled %v, want 0 and true: %+v", *chainLists, m.Unsettled(), res)
	}
	checkKernel(t, f, freshDump(t, d), "drain")
	if err := m.Settle(context.Background()); err != nil {
		t.Fatal(err)
	}
	if *chainLists == 0 || m.Unsettled() {
		t.Fatalf("Settle: %d chain listings, unsettled %v", *chainLists, m.Unsettled())
	}

	editSeenAfterSettle(t, m, f, svcs)
}

// editSeenAfterSettle rewrites svc-web-v4's scheduler rule, keeping its comment (someone's
// edit), and checks that the next full read sees it as drift and repairs it.
func editSeenAfterSettle(t *testing.T, m *Manager, f *knftables.Fake, svcs []Service) {
	t.Helper()
	editSchedule(t, f, "svc-web-v4")
	m.FullEvery = 0
	res, d := apply(t, m, svcs, nil)
	if !slices.Contains(res.Drift, "inet hostaccel-lb: chain svc-web-v4: rules changed") {
		t.Errorf("an edit after Settle not seen: %+v", res)
	}
	checkKernel(t, f, freshDump(t, d), "edit repaired")
}

// A plain Apply that rewrites a chain of a table it keeps does not read it back either (an
// EndpointSlice event's sync waited ~2 s for nft at 5,000 services): Settle does.
func TestApplyLeavesTheReadBackToSettle(t *testing.T) {
	m, _ := NewFakeManager()
	m.FullEvery = time.Hour
	chainLists := countChainLists(m)
	svcs := svcSet()
	apply(t, m, svcs, nil)
	svcs[0].Backends[1].State = StateDrain
	res, err := m.Apply(context.Background(), Render(Resolve(svcs, nil, testEnv)))
	if err != nil {
		t.Fatal(err)
	}
	if len(res.ChainsRewritten) == 0 || *chainLists != 0 || !m.Unsettled() {
		t.Fatalf("Apply: %d chain listings, unsettled %v, want 0 and true: %+v", *chainLists, m.Unsettled(), res)
	}
	if err := m.Settle(context.Background()); err != nil || m.Unsettled() {
		t.Fatalf("Settle: %v, unsettled %v", err, m.Unsettled())
	}
}

// With DeferReadBack (the agent) an Apply that creates a table whole does not list it back:
// at 2,000 services that listing held the agent's first sync, and the first change after
// its start, ~0.4 s. Its chains are left to Settle, and from then on an edit of their rules
// is drift, as after a read-back. Without it (a one-shot apply) the table is read back.
func TestDeferredReadBackOfARebuiltTable(t *testing.T) {
	m, _ := NewFakeManager()
	m.FullEvery = time.Hour
	read := countLists(m, "table")
	res, _ := apply(t, m, svcSet(), nil)
	if len(res.Rebuilt) == 0 || *read == 0 || m.Unsettled() {
		t.Fatalf("without DeferReadBack: %d table listings, unsettled %v, want > 0 and false: %+v", *read, m.Unsettled(), res)
	}

	m, f := NewFakeManager()
	m.FullEvery, m.DeferReadBack = time.Hour, true
	read = countLists(m, "table")
	svcs := svcSet()
	res, d := apply(t, m, svcs, nil)
	if len(res.Rebuilt) == 0 || *read != 0 || !m.Unsettled() {
		t.Fatalf("DeferReadBack: %d table listings, unsettled %v, want 0 and true: %+v", *read, m.Unsettled(), res)
	}
	checkKernel(t, f, freshDump(t, d), "rebuilt, not read back")
	// A change meanwhile diffs against what the apply wrote.
	svcs[0].Backends[1].State = StateDrain
	res, d = apply(t, m, svcs, nil)
	if len(res.Rebuilt) != 0 || *read != 0 {
		t.Fatalf("a drain before Settle: %d table listings, want 0, and no rebuild: %+v", *read, res)
	}
	checkKernel(t, f, freshDump(t, d), "drain before Settle")
	if err := m.Settle(context.Background()); err != nil || m.Unsettled() || *read == 0 {
		t.Fatalf("Settle: %v, unsettled %v, %d table listings", err, m.Unsettled(), *read)
	}
	editSeenAfterSettle(t, m, f, svcs)
}

// Settle's reading runs without the manager (the agent lets syncs through meanwhile). A
// reading taken before another apply is dropped, not remembered: it may hold the rules that
// apply replaced, which would later look like someone's edit and be "repaired".
func TestSettleDropsAReadingOlderThanAnApply(t *testing.T) {
	m, svcs := unsettled(t)
	s := m.StartSettle()
	if err := s.Read(context.Background()); err != nil {
		t.Fatal(err)
	}
	// A shape the chain never had (back to the old one would need no reading: see
	// TestRewriteToAKnownShapeIsSettled).
	svcs[0].Backends[1].State = StateUp
	svcs[0].Backends = append(svcs[0].Backends, Backend{Address: "192.0.2.199", Port: 8080})
	if _, err := m.Apply(context.Background(), Render(Resolve(svcs, nil, testEnv))); err != nil {
		t.Fatal(err)
	}
	m.FinishSettle(s)
	if !m.Unsettled() {
		t.Fatal("a reading older than the last apply was remembered")
	}
	s = m.StartSettle()
	if err := s.Read(context.Background()); err != nil {
		t.Fatal(err)
	}
	m.FinishSettle(s)
	if m.Unsettled() {
		t.Fatal("a reading after the last apply was not remembered")
	}
	// With nothing changed since, a full read finds no drift (the remembered rules are the
	// kernel's).
	m.FullEvery = 0
	res, _ := apply(t, m, svcs, nil)
	if len(res.Drift) > 0 || len(res.ChainsRewritten) > 0 {
		t.Fatalf("full read after settling: %+v", res)
	}
}

// A reading taken before the chain was deleted (its service removed) and created anew with
// other rules is dropped too: neither apply rewrote the chain, both replaced it. Settle then
// reads the new rules, and an edit of them is drift.
func TestSettleDropsAReadingOfAChainCreatedAnew(t *testing.T) {
	ctx := context.Background()
	m, svcs := unsettled(t)
	s := m.StartSettle()
	if err := s.Read(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Apply(ctx, Render(Resolve(svcs[1:], nil, testEnv))); err != nil {
		t.Fatal(err)
	}
	svcs[0].Backends[1].State = StateUp
	svcs[0].Backends = append(svcs[0].Backends, Backend{Address: "192.0.2.199", Port: 8080})
	if _, err := m.Apply(ctx, Render(Resolve(svcs, nil, testEnv))); err != nil {
		t.Fatal(err)
	}
	m.FinishSettle(s)
	if !m.Unsettled() {
		t.Fatal("a reading of the chain before it was deleted and created anew was remembered")
	}
	if err := m.Settle(ctx); err != nil || m.Unsettled() {
		t.Fatalf("settle: %v, unsettled %v", err, m.Unsettled())
	}
	m.FullEvery = 0
	if res, _ := apply(t, m, svcs, nil); len(res.Drift) > 0 || res.Changed() {
		t.Fatalf("full read after settling: %+v", res)
	}
	editSchedule(t, m.NFT.(*knftables.Fake), "svc-web-v4")
	if res, _ := apply(t, m, svcs, nil); !slices.Contains(res.Drift, "inet hostaccel-lb: chain svc-web-v4: rules changed") {
		t.Errorf("an edit of the chain created anew was not seen: %+v", res)
	}
}

// TestRewriteToAKnownShapeIsSettled: a chain rewritten back to rules read before (same
// comments, so the same text) takes their expressions and needs no reading back; an edit of
// them is then drift, as it is of any rule read.
func TestRewriteToAKnownShapeIsSettled(t *testing.T) {
	m, svcs := unsettled(t) // drained: 2 slots -> 1, the chain unread
	if err := m.Settle(context.Background()); err != nil {
		t.Fatal(err)
	}
	for _, state := range []string{StateUp, StateDrain, StateUp} {
		svcs[0].Backends[1].State = state
		res, err := m.Apply(context.Background(), Render(Resolve(svcs, nil, testEnv)))
		if err != nil {
			t.Fatal(err)
		}
		if len(res.ChainsRewritten) == 0 {
			t.Fatalf("%s: no chain rewritten: %+v", state, res)
		}
		if m.Unsettled() {
			t.Fatalf("%s: a chain back to rules read before is left for Settle", state)
		}
	}
	m.FullEvery = 0
	if res, _ := apply(t, m, svcs, nil); len(res.Drift) > 0 || len(res.ChainsRewritten) > 0 {
		t.Fatalf("full read after rewrites to known shapes: %+v", res)
	}
}

// editSchedule is someone rewriting the scheduler rule of chain (to drop), keeping its comment.
func editSchedule(t *testing.T, f *knftables.Fake, chain string) {
	t.Helper()
	f.RLock()
	var rules []*knftables.Rule
	for _, r := range f.Tables[knftables.InetFamily][NATTable].Chains[chain].Rules {
		cp := *r
		rules = append(rules, &cp)
	}
	f.RUnlock()
	tx := f.NewTransaction()
	tx.Flush(&knftables.Chain{Family: knftables.InetFamily, Table: NATTable, Name: chain})
	for _, r := range rules {
		r.Handle = nil
		if strings.Contains(r.Rule, "numgen") {
			r.Rule = "drop"
		}
		tx.Add(r)
	}
	if err := f.Run(context.Background(), tx); err != nil {
		t.Fatal(err)
	}
}

// countChainLists makes m count its nft listings of single chains.
func countChainLists(m *Manager) *int { return countLists(m, "chain") }

// countLists makes m count its nft listings of a kind of object ("table", "chain").
func countLists(m *Manager, kind string) *int {
	n := new(int)
	list := m.List
	m.List = func(ctx context.Context, args ...string) ([]byte, error) {
		if slices.Contains(args, kind) {
			*n++
		}
		return list(ctx, args...)
	}
	return n
}

// With DeferFull (the agent), an Apply that finds the periodic full read due does not read
// the tables whole (an event's sync does not wait for nft to list thousands of services); a
// reading taken apart does, and the Apply after it repairs what someone changed. A reading
// older than an apply is not used.
func TestDeferredFullRead(t *testing.T) {
	m, f := NewFakeManager()
	m.DeferFull, m.FullEvery = true, time.Millisecond
	lists := countLists(m, "table")
	svcs := svcSet()
	apply(t, m, svcs, nil) // the first apply reads (nothing there yet)
	tx := f.NewTransaction()
	tx.Flush(&knftables.Map{Family: knftables.InetFamily, Table: NATTable, Name: "web-backends-v4"})
	if err := f.Run(context.Background(), tx); err != nil {
		t.Fatal(err)
	}
	time.Sleep(2 * time.Millisecond)
	if !m.FullDue() {
		t.Fatal("no full read due")
	}
	*lists = 0
	if res, _ := apply(t, m, svcs, nil); res.FullRead || *lists != 0 || res.Drift != nil {
		t.Fatalf("a due full read was done in Apply (%d table listings): %+v", *lists, res)
	}

	stale := m.StartFullRead()
	if err := stale.Read(context.Background()); err != nil {
		t.Fatal(err)
	}
	apply(t, m, svcs, nil)
	if m.FinishFullRead(stale) {
		t.Fatal("a reading older than an apply was kept")
	}

	fr := m.StartFullRead()
	if err := fr.Read(context.Background()); err != nil {
		t.Fatal(err)
	}
	if !m.FinishFullRead(fr) || m.FullDue() {
		t.Fatalf("a current reading was not kept (or another is still due: %v)", m.FullDue())
	}
	*lists = 0
	res, d := apply(t, m, svcs, nil)
	if !res.FullRead || *lists != 0 || len(res.Drift) != 1 || !strings.HasPrefix(res.Drift[0], "inet hostaccel-lb: map web-backends-v4: ") {
		t.Fatalf("the apply after the reading (%d listings of its own): %+v", *lists, res)
	}
	checkKernel(t, f, freshDump(t, d), "map emptied, repaired from the deferred reading")
}

// The agent reads Settle's chains one reading at a time: at thousands of services each
// listing takes seconds, and a reading started after every event of a steady stream piled up
// beside the others until none finished within its timeout (seen at 5,000 services).
func TestSettleReadsOneAtATime(t *testing.T) {
	defer func(d time.Duration) { settleAfter = d }(settleAfter)
	settleAfter = time.Millisecond
	m, _ := unsettled(t)
	var running, most, total atomic.Int32
	release := make(chan struct{})
	list := m.List
	m.List = func(ctx context.Context, args ...string) ([]byte, error) {
		n := running.Add(1)
		defer running.Add(-1)
		for most.Load() < n && !most.CompareAndSwap(most.Load(), n) {
		}
		total.Add(1)
		<-release
		return list(ctx, args...)
	}
	r := NewRuntime(nil, func() {})
	r.mgrMu.Lock()
	for range 5 { // five syncs in a row, each re-arming the settle
		r.settleLater(m)
		r.mgrMu.Unlock()
		time.Sleep(5 * time.Millisecond)
		r.mgrMu.Lock()
	}
	r.mgrMu.Unlock()
	close(release)
	deadline := time.Now().Add(5 * time.Second)
	for {
		r.mgrMu.Lock()
		done := !m.Unsettled()
		r.mgrMu.Unlock()
		if done || time.Now().After(deadline) {
			break
		}
		time.Sleep(time.Millisecond)
	}
	if most.Load() != 1 || m.Unsettled() {
		t.Fatalf("%d settle readings at once (want 1), %d in all; unsettled at the end: %v", most.Load(), total.Load(), m.Unsettled())
	}
}

// unsettled is a Manager whose last apply (a backend drained) left a chain unread.
func unsettled(t *testing.T) (*Manager, []Service) {
	t.Helper()
	m, _ := NewFakeManager()
	m.FullEvery = time.Hour
	svcs := svcSet()
	apply(t, m, svcs, nil)
	svcs[0].Backends[1].State = StateDrain
	if _, err := m.Apply(context.Background(), Render(Resolve(svcs, nil, testEnv))); err != nil {
		t.Fatal(err)
	}
	if !m.Unsettled() {
		t.Fatal("nothing left for Settle")
	}
	return m, svcs
}

// A table rebuilt because its layout changed (the first sync after an upgrade) is learnt as
// rebuilt, not from the old table's listing that the full read took before: the agent
// (DeferReadBack) leaves its chains for Settle, a one-shot apply reads them back. Either way
// an edit of the new rules is drift afterwards, and is repaired.
func TestRebuiltTableLearnsItsNewRules(t *testing.T) {
	for _, deferred := range []bool{true, false} {
		ctx := context.Background()
		old, f := NewFakeManager()
		svcs := svcSet()
		svcs[0].Backends[1].State = StateDrain // the old table's svc-web-v4 has other rules
		apply(t, old, svcs, nil)
		tx := f.NewTransaction() // ... and an older layout
		tx.Delete(&knftables.Set{Family: knftables.InetFamily, Table: NATTable, Name: layoutSet})
		tx.Add(&knftables.Set{Family: knftables.InetFamily, Table: NATTable, Name: layoutSet, Type: "mark", Comment: knftables.PtrTo("an older layout")})
		if err := f.Run(ctx, tx); err != nil {
			t.Fatal(err)
		}
		m := &Manager{NFT: f, List: FakeLister(f), Tables: FakeTables(f), FullEvery: time.Hour, DeferReadBack: deferred}
		svcs[0].Backends[1].State = StateUp
		if res, _ := apply(t, m, svcs, nil); !slices.Contains(res.Rebuilt, "inet hostaccel-lb: layout changed") {
			t.Fatalf("deferred %v: precondition: %+v", deferred, res)
		}
		if deferred && !slices.Contains(m.cache.unread[TableRef{knftables.InetFamily, NATTable}], "svc-web-v4") {
			t.Errorf("deferred: svc-web-v4 of the rebuilt table is not left for Settle")
		}
		if err := m.Settle(ctx); err != nil {
			t.Fatal(err)
		}
		editSchedule(t, f, "svc-web-v4")
		m.FullEvery = 0
		if res, _ := apply(t, m, svcs, nil); !slices.Contains(res.Drift, "inet hostaccel-lb: chain svc-web-v4: rules changed") {
			t.Errorf("deferred %v: an edit of the rebuilt table's svc-web-v4 was not seen nor repaired: %+v", deferred, res)
		}
		if res, _ := apply(t, m, svcs, nil); len(res.Drift) > 0 || res.Changed() {
			t.Errorf("deferred %v: repaired, yet: %+v", deferred, res)
		}
	}
}
