package flowtable

import (
	"context"
	"errors"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/knftables"

	"github.com/hostaccel/hostaccel/internal/model"
)

func state() model.State {
	s := base()
	s.Classes = []model.Class{model.PodToPod}
	s.Normalize()
	return s
}

func apply(t *testing.T, m *Manager, s model.State) Result {
	t.Helper()
	s.Normalize()
	res, err := m.Apply(context.Background(), Render(s, Options{FlowtableCounter: true}))
	if err != nil {
		t.Fatal(err)
	}
	return res
}

func elements(f *knftables.Fake, set string) string {
	var out []string
	for _, e := range f.Table.Sets[set].Elements {
		out = append(out, e.Key[0])
	}
	return strings.Join(out, ",")
}

func TestManagerUpdatesInPlace(t *testing.T) {
	m, f := NewFakeManager()
	s := state()
	if res := apply(t, m, s); !res.Rebuilt || res.Reason != "table missing" {
		t.Fatalf("first apply: %+v", res)
	}
	if res := apply(t, m, s); res.Operations != 0 {
		t.Fatalf("second apply not a no-op: %+v", res)
	}

	// A peer joins: one element added, nothing else touched (established offloads stay).
	s.PeerPodCIDRs = append(s.PeerPodCIDRs, netip.MustParsePrefix("10.244.3.0/24"))
	res := apply(t, m, s)
	if res.Rebuilt || res.FlowtableRecreated || res.ElementsAdded != 1 || res.ElementsRemoved != 0 || res.Operations != 1 {
		t.Fatalf("peer added: %+v", res)
	}
	if got := elements(f, "peer-pod-v4"); got != "10.244.2.0/24,10.244.3.0/24" {
		t.Errorf("peer set: %s", got)
	}

	// A peer leaves: the policy narrowed, so offloaded flows are flushed (flowtable recreated).
	s.PeerPodCIDRs = pfx("10.244.2.0/24", "fd00:10:244:2::/64")
	res = apply(t, m, s)
	if res.Rebuilt || !res.FlowtableRecreated || res.ElementsRemoved != 1 {
		t.Fatalf("peer removed: %+v", res)
	}
	if got := elements(f, "peer-pod-v4"); got != "10.244.2.0/24" {
		t.Errorf("peer set: %s", got)
	}
	if n := len(f.Table.Chains[ChainName].Rules); n != len(Render(s, Options{}).Rules) {
		t.Errorf("rules after flowtable recreation: %d", n)
	}

	// The first exclusion brings the exclude rules (a new spec: the table is rebuilt,
	// which flushes offloaded flows too); the next one narrows the policy in place.
	s.Exclude = []netip.Prefix{netip.MustParsePrefix("10.244.2.9/32")}
	if res := apply(t, m, s); !res.Rebuilt || res.Reason != "spec changed" {
		t.Fatalf("first exclude added: %+v", res)
	}
	s.Exclude = append(s.Exclude, netip.MustParsePrefix("10.244.2.10/32"))
	if res := apply(t, m, s); res.Rebuilt || !res.FlowtableRecreated || res.ElementsAdded != 1 {
		t.Fatalf("exclude added: %+v", res)
	}

	// A device appears: the guards name it, so the table is rebuilt with it (which
	// recreates the flowtable, as a device change always did).
	s.Transports = append(s.Transports, "eth1")
	if res := apply(t, m, s); !res.Rebuilt || res.Reason != "spec changed" || res.Drift != "" {
		t.Fatalf("device added: %+v", res)
	}
	// (as a transaction writes them: quoted, so that a name nft takes for a keyword parses)
	if got := strings.Join(f.Table.Flowtables[FlowtableName].Devices, ","); got != `"eth0","eth1","gw"` {
		t.Errorf("flowtable devices: %s", got)
	}
	if got := elements(f, DevicesSet); got != `"eth0","eth1","gw"` {
		t.Errorf("device set: %s", got)
	}

	// A class enabled: new spec, whole table rebuilt.
	s.Classes = append(s.Classes, model.PodToService)
	if res := apply(t, m, s); !res.Rebuilt || res.Reason != "spec changed" {
		t.Fatalf("class added: %+v", res)
	}
}

func TestManagerRepairsDrift(t *testing.T) {
	m, f := NewFakeManager()
	s := state()
	if res := apply(t, m, s); res.Drift != "" {
		t.Fatalf("first apply reports drift: %+v", res)
	}
	if res := apply(t, m, s); res.Drift != "" {
		t.Fatalf("a no-op apply reports drift: %+v", res)
	}

	// Someone deletes one of our rules: repaired, and reported as drift (the agent logs
	// and counts it).
	f.Lock()
	ch := f.Table.Chains[ChainName]
	ch.Rules = ch.Rules[1:]
	f.Unlock()
	if res := apply(t, m, s); !res.Rebuilt || !strings.HasPrefix(res.Reason, "drift") || res.Drift != res.Reason {
		t.Fatalf("deleted rule not repaired: %+v", res)
	}

	// Someone deletes an element.
	f.Lock()
	f.Table.Sets["peer-pod-v4"].Elements = nil
	f.Unlock()
	if res := apply(t, m, s); res.Drift != "drift: table changed outside hostaccel" || elements(f, "peer-pod-v4") != "10.244.2.0/24" {
		t.Fatalf("deleted element not repaired: %+v", res)
	}

	// Someone deletes the table.
	tx := f.NewTransaction()
	tx.Delete(&knftables.Table{})
	if err := f.Run(context.Background(), tx); err != nil {
		t.Fatal(err)
	}
	if res := apply(t, m, s); !res.Rebuilt || res.Reason != "table missing" || res.Drift != "table missing" {
		t.Fatalf("deleted table not repaired: %+v", res)
	}

	// A device deleted takes itself out of the flowtable: the kernel's doing, not drift;
	// the agent prunes it from the desired state.
	f.Lock()
	f.Table.Flowtables[FlowtableName].Devices = []string{"gw"}
	f.Unlock()
	gone := s
	gone.Transports = nil
	if res := apply(t, m, gone); res.Drift != "" {
		t.Fatalf("a vanished device: %+v", res)
	}
	// A device someone else added is.
	f.Lock()
	f.Table.Flowtables[FlowtableName].Devices = []string{"gw", "eth9"}
	f.Unlock()
	if res := apply(t, m, gone); res.Drift == "" {
		t.Fatalf("a device added behind our back: %+v", res)
	}

	// Removing and installing again is no drift.
	if err := m.Remove(context.Background()); err != nil {
		t.Fatal(err)
	}
	if res := apply(t, m, s); res.Reason != "table missing" || res.Drift != "" {
		t.Fatalf("apply after Remove: %+v", res)
	}

	// A fresh manager (a new `hostaccel apply`) has no memory of the last apply, but still
	// notices a rule set that is not ours.
	m2 := &Manager{NFT: f, List: FakeLister(f)}
	f.Lock()
	f.Table.Chains[ChainName].Rules[3].Comment = knftables.PtrTo("edited")
	f.Unlock()
	if res := apply(t, m2, s); !res.Rebuilt || res.Drift != "" {
		t.Fatalf("edited rule not repaired by a fresh manager: %+v", res)
	}

	// The chain the class rules go to, emptied: nothing would be offloaded any more.
	f.Lock()
	f.Table.Chains[OffloadChain].Rules = nil
	f.Unlock()
	if res := apply(t, m2, s); !res.Rebuilt {
		t.Fatalf("emptied %s chain not repaired: %+v", OffloadChain, res)
	}
	f.RLock()
	n := len(f.Table.Chains[OffloadChain].Rules)
	f.RUnlock()
	if n != 1 {
		t.Fatalf("%s chain has %d rules after the repair, want 1", OffloadChain, n)
	}
}

func TestManagerRemove(t *testing.T) {
	m, f := NewFakeManager()
	apply(t, m, state())
	if err := m.Remove(context.Background()); err != nil {
		t.Fatal(err)
	}
	if f.Table != nil {
		t.Error("table left behind")
	}
	// No table: no nft run (an agent without this datapath removes it at every sync).
	tx := f.LastTransaction
	if err := m.Remove(context.Background()); err != nil {
		t.Errorf("second remove: %v", err)
	}
	if f.LastTransaction != tx {
		t.Errorf("remove of a missing table ran %q", f.LastTransaction)
	}
	// Without Exists it runs, and a missing table is no error.
	m.Exists = nil
	if err := m.Remove(context.Background()); err != nil || f.LastTransaction == tx {
		t.Errorf("remove without Exists: %v, ran %v", err, f.LastTransaction != tx)
	}
}

// One peer joining, leaving or replaced costs the same operations with 1,000 peers as with
// 10: the elements that changed (and, when the policy narrows, the flowtable's recreation),
// never the other peers'.
func TestManagerOneChangeIsIndependentOfSize(t *testing.T) {
	peer := func(i int) netip.Prefix {
		return netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 100 + byte(i>>8), byte(i), 0}), 24)
	}
	ops := map[int][]int{}
	for _, n := range []int{10, 1000} {
		m, _ := NewFakeManager()
		s := state()
		s.PeerPodCIDRs = nil
		for i := range n {
			s.PeerPodCIDRs = append(s.PeerPodCIDRs, peer(i))
		}
		apply(t, m, s)
		for _, change := range []func(){
			func() { s.PeerPodCIDRs = append(s.PeerPodCIDRs, peer(n)) },    // joins
			func() { s.PeerPodCIDRs = s.PeerPodCIDRs[1:] },                 // leaves
			func() { s.PeerPodCIDRs[len(s.PeerPodCIDRs)/2] = peer(n + 1) }, // replaced
			func() {}, // nothing
		} {
			change()
			res := apply(t, m, s)
			if res.Rebuilt || res.ElementsAdded > 1 || res.ElementsRemoved > 1 {
				t.Errorf("%d peers: %+v", n, res)
			}
			ops[n] = append(ops[n], res.Operations)
		}
	}
	if ops[10][0] != 1 || ops[10][3] != 0 || !slices.Equal(ops[10], ops[1000]) {
		t.Errorf("operations per change (joins, leaves, replaced, nothing): 10 peers %v, 1,000 peers %v; want equal, 1 for a join", ops[10], ops[1000])
	}
}

// A reading of the table that fails right after a transaction went in leaves the Manager
// not knowing the table, rather than knowing the one before: the next apply finds its own
// change, not drift to repair by a rebuild (which would flush every offloaded flow).
func TestFailedReadAfterApplyIsNoDrift(t *testing.T) {
	m, f := NewFakeManager()
	s := state()
	apply(t, m, s)
	lister, calls := m.List, 0
	m.List = func(ctx context.Context, family, table string) ([]byte, error) {
		if calls++; calls == 2 { // the reading after the transaction
			return nil, errors.New("nft: resource temporarily unavailable")
		}
		return lister(ctx, family, table)
	}
	s.PeerPodCIDRs = append(s.PeerPodCIDRs, netip.MustParsePrefix("10.244.3.0/24"))
	s.Normalize()
	if _, err := m.Apply(context.Background(), Render(s, Options{FlowtableCounter: true})); err == nil {
		t.Fatal("the failed reading was not reported")
	}
	if got := elements(f, "peer-pod-v4"); got != "10.244.2.0/24,10.244.3.0/24" {
		t.Fatalf("precondition: the transaction went in: %s", got)
	}
	m.List = lister
	if res := apply(t, m, s); res.Rebuilt || res.Drift != "" || res.Operations != 0 {
		t.Errorf("the apply after: %+v", res)
	}
}

// A local Pod CIDR added narrows the external classes (they match sources outside it): the
// flows from the new range that were offloaded as external go back through the rules, as
// with an exclusion added. A review found them kept (only exclude-* additions flushed).
func TestLocalPodCIDRAddedFlushes(t *testing.T) {
	m, _ := NewFakeManager()
	s := base()
	s.Classes = []model.Class{model.ExternalToService}
	s.LocalPodCIDRs = pfx("10.244.1.0/24", "10.244.9.0/24") // two: a set, not inlined
	apply(t, m, s)
	s.LocalPodCIDRs = append(s.LocalPodCIDRs, netip.MustParsePrefix("10.244.10.0/24"))
	if res := apply(t, m, s); res.Rebuilt || !res.FlowtableRecreated || res.ElementsAdded != 1 {
		t.Errorf("a local Pod CIDR added under external-to-service: %+v, want the flowtable recreated (flushed)", res)
	}
}

// nft lists an IPv4-compatible IPv6 address in dotted form: compared as Go writes it, an
// unchanged config changes nothing (a review found such an element deleted and added, and
// the flowtable recreated, at every sync).
func TestCanonicalElements(t *testing.T) {
	for _, c := range [][2]string{
		{"::10.0.0.1", "::a00:1"}, {"::11.0.0.0/120", "::b00:0/120"}, {"10.0.0.1/32", "10.0.0.1"},
		{"fd00::1/128", "fd00::1"}, {`"eth0"`, "eth0"}, {"10.244.0.0/16", "10.244.0.0/16"},
	} {
		if a, b := canonical(c[0]), canonical(c[1]); a != b {
			t.Errorf("canonical(%s) = %s, canonical(%s) = %s: want equal", c[0], a, c[1], b)
		}
	}
}

// A new process's Manager starts from what the last one left (its known file): a rule edited
// in place with its comment kept is repaired, as the agent's own Manager repairs it. Before,
// a new Manager compared the comments only and kept the edited rule.
func TestFreshManagerRepairsAnEditedRule(t *testing.T) {
	dir := t.TempDir()
	m, f := NewFakeManager()
	m.KnownDir = dir
	s := state()
	apply(t, m, s)
	if res := apply(t, &Manager{NFT: f, List: FakeLister(f), KnownDir: dir}, s); res.Rebuilt || res.Drift != "" {
		t.Fatalf("a new manager, nothing changed: %+v", res)
	}
	f.Lock()
	f.Table.Chains[ChainName].Rules[3].Rule = "meta l4proto udp accept"
	f.Unlock()
	res := apply(t, &Manager{NFT: f, List: FakeLister(f), KnownDir: dir}, s)
	if !res.Rebuilt || res.Drift != "drift: table changed outside hostaccel" {
		t.Fatalf("edited rule, comment kept, not repaired by a new manager: %+v", res)
	}
	f.RLock()
	got := f.Table.Chains[ChainName].Rules[3].Rule
	f.RUnlock()
	if strings.Contains(got, "udp accept") {
		t.Fatalf("rule 3 is still %q", got)
	}
	// Removed: the next process starts from nothing (no drift to report).
	m3 := &Manager{NFT: f, List: FakeLister(f), KnownDir: dir}
	if err := m3.Remove(context.Background()); err != nil {
		t.Fatal(err)
	}
	if res := apply(t, &Manager{NFT: f, List: FakeLister(f), KnownDir: dir}, s); res.Reason != "table missing" || res.Drift != "" {
		t.Fatalf("after Remove: %+v", res)
	}
}

// A process that dies between its transaction and the known file's rewrite (here: in the
// reading after the commit, the apply's memory peak, where an OOM kill lands) leaves no file
// that says what the table was before: the next process finds its predecessor's change, not
// drift to repair by a rebuild (which flushes every offloaded flow). The file kept the old
// fingerprint.
func TestKilledAfterCommitIsNoDrift(t *testing.T) {
	dir := t.TempDir()
	m, f := NewFakeManager()
	m.KnownDir = dir
	s := state()
	apply(t, m, s)
	lister, calls := m.List, 0
	m.List = func(ctx context.Context, family, table string) ([]byte, error) {
		if calls++; calls == 2 { // the reading after the transaction
			panic("killed")
		}
		return lister(ctx, family, table)
	}
	s.PeerPodCIDRs = append(s.PeerPodCIDRs, netip.MustParsePrefix("10.244.3.0/24"))
	s.Normalize()
	func() {
		defer func() { _ = recover() }()
		m.Apply(context.Background(), Render(s, Options{FlowtableCounter: true}))
	}()
	if got := elements(f, "peer-pod-v4"); got != "10.244.2.0/24,10.244.3.0/24" {
		t.Fatalf("precondition: the transaction went in: %s", got)
	}
	if res := apply(t, &Manager{NFT: f, List: FakeLister(f), KnownDir: dir}, s); res.Rebuilt || res.Drift != "" || res.Operations != 0 {
		t.Errorf("the next process's apply of the same state: %+v", res)
	}
}

// A device that someone takes out of the flowtable while it still exists, with the index the
// last apply knew, is drift (repaired and reported); one whose link is gone, or replaced by
// another of the same name, was dropped by the kernel (no drift). Both were taken as the
// kernel's doing, and the edit was repaired silently.
func TestDeviceTakenOutIsDrift(t *testing.T) {
	defer func(f func(string) int) { linkIndex = f }(linkIndex)
	for _, c := range []struct {
		name  string
		index int // eth0's index now (0: gone)
		drift bool
	}{{"still there", 8, true}, {"gone", 0, false}, {"replaced", 9, false}} {
		m, f := NewFakeManager()
		s := state()
		s.DeviceIndex = map[string]int{"gw": 7, "eth0": 8}
		apply(t, m, s)
		f.Lock()
		f.Table.Flowtables[FlowtableName].Devices = []string{"gw"}
		f.Unlock()
		linkIndex = func(name string) int { return map[string]int{"gw": 7, "eth0": c.index}[name] }
		next := s
		if c.index == 0 {
			next.Transports = nil // the agent prunes a device gone
		}
		if res := apply(t, m, next); (res.Drift != "") != c.drift || !res.Rebuilt && !res.FlowtableRecreated && c.index != 0 {
			t.Errorf("eth0 out of the flowtable, %s: %+v, want drift %v", c.name, res, c.drift)
		}
	}
}

// An agent whose table does not change marks its known file as in use at its syncs (at most
// once a minute), so that runfile.Prune, which keeps the most recently modified files, does not
// take it first for the applies of short-lived namespaces. Before, the file kept the time of
// the agent's last change.
func TestUnchangedTableTouchesTheKnownFile(t *testing.T) {
	dir := t.TempDir()
	m, _ := NewFakeManager()
	m.KnownDir = dir
	s := state()
	apply(t, m, s)
	files, _ := filepath.Glob(filepath.Join(dir, "flowtable-known-*.json"))
	if len(files) != 1 {
		t.Fatalf("known files %v, want one", files)
	}
	old := time.Now().Add(-2 * time.Hour)
	if err := os.Chtimes(files[0], old, old); err != nil {
		t.Fatal(err)
	}
	apply(t, m, s) // (within a minute of the write: not touched)
	if fi, err := os.Stat(files[0]); err != nil || !fi.ModTime().Equal(old) {
		t.Fatalf("touched within a minute of its write: %v %v", fi.ModTime(), err)
	}
	m.touched = time.Now().Add(-2 * touchEvery)
	if res := apply(t, m, s); res.Operations != 0 {
		t.Fatalf("nothing changed, yet %d operations", res.Operations)
	}
	if fi, err := os.Stat(files[0]); err != nil || time.Since(fi.ModTime()) > time.Minute {
		t.Errorf("an unchanged table's sync did not touch the known file: %v %v", fi.ModTime(), err)
	}
}
