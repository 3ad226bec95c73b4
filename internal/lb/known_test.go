package lb

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"sigs.k8s.io/knftables"

	"github.com/hostaccel/hostaccel/internal/nftlist"
	"github.com/hostaccel/hostaccel/internal/runfile"
)

// genFake is a Fake with the kernel's ruleset generation: a transaction that changes
// something counts one. foreign commits of someone else's are counted during the next Run
// (a commit racing ours); fail fails the transactions.
type genFake struct {
	*knftables.Fake
	gen     uint32
	netns   uint64
	inode   uint64 // the namespace's inode, which names the file
	foreign int
	fail    bool
}

func (g *genFake) Run(ctx context.Context, tx *knftables.Transaction) error {
	if g.fail {
		return errors.New("nft: transaction refused")
	}
	before := g.Dump()
	if err := g.Fake.Run(ctx, tx); err != nil {
		return err
	}
	if g.Dump() != before {
		g.gen++
	}
	g.gen += uint32(g.foreign)
	g.foreign = 0
	return nil
}

func (g *genFake) generation(context.Context) (nftlist.Generation, error) {
	return nftlist.Generation{ID: g.gen, NetNS: g.netns, NetNSInode: g.inode, Boot: "6f1b2c3d-boot"}, nil
}

// edit runs a transaction of someone else's.
func (g *genFake) edit(t *testing.T, change func(tx *knftables.Transaction)) {
	t.Helper()
	tx := g.NewTransaction()
	change(tx)
	if err := g.Run(context.Background(), tx); err != nil {
		t.Fatal(err)
	}
}

func newGenFake() *genFake {
	return &genFake{Fake: knftables.NewFake("", ""), gen: 1, netns: 4097, inode: 4026531840}
}

// process is a Manager as a one-shot `hostaccel apply` makes it: new, its cache in dir.
func (g *genFake) process(dir string) *Manager {
	return &Manager{NFT: g, List: FakeLister(g.Fake), Tables: FakeTables(g.Fake), FullEvery: DefaultFullEvery,
		KnownDir: dir, Generation: g.generation}
}

func knownServices() []Service {
	big := Service{Name: "big", VIPs: []string{"192.0.2.20"}, Port: 80, Topology: DNAT, Scheduler: RoundRobin}
	for i := range 1000 {
		big.Backends = append(big.Backends, Backend{Address: fmt.Sprintf("10.1.%d.%d", i/250, 1+i%250), Port: 8080})
	}
	return append(svcSet(), big)
}

// Each run is a new process: the first reads the kernel whole; the next ones, the ruleset
// unchanged since, diff against the file the last one left, with the operations of a diff
// against a full reading.
func TestKnownNextProcessDiffsAgainstTheFile(t *testing.T) {
	g, dir := newGenFake(), t.TempDir()
	ref := newGenFake() // the same changes, each read whole
	svcs := knownServices()
	apply(t, ref.process(""), svcs, nil)
	res, _ := apply(t, g.process(dir), svcs, nil)
	if !res.FullRead || !res.Changed() {
		t.Fatalf("first apply: %+v", res)
	}
	for _, step := range []struct {
		what   string
		change func()
		ops    int
	}{
		{"drain one", func() { svcs[3].Backends[10].State = StateDrain }, 8},
		{"no change", func() {}, 0},
		{"one down", func() { svcs[3].Backends[500].State = StateDown }, 8},
		{"one back", func() { svcs[3].Backends[10].State = "" }, 8},
		{"persistent clients' backend gone", func() { svcs[0].Backends = svcs[0].Backends[1:] }, 40},
	} {
		step.change()
		want, _ := apply(t, ref.process(""), svcs, nil)
		res, d := apply(t, g.process(dir), svcs, nil)
		if res.FullRead || !want.FullRead || res.Operations != want.Operations || res.Operations > step.ops {
			t.Errorf("%s: %d operations (full read %v), want %d as a full read's: %+v", step.what, res.Operations, res.FullRead, want.Operations, res)
		}
		checkKernel(t, g.Fake, freshDump(t, d), step.what)
	}
}

// A change by anyone else moves the generation: the next apply reads the tables whole,
// repairs them and says what changed (the file still tells what the last apply left).
func TestKnownDriftIsReadWhole(t *testing.T) {
	g, dir := newGenFake(), t.TempDir()
	svcs := knownServices()
	apply(t, g.process(dir), svcs, nil)
	g.edit(t, func(tx *knftables.Transaction) {
		tx.Delete(&knftables.Element{Family: knftables.InetFamily, Table: NATTable, Map: "big-backends-v4", Key: []string{"5"}})
	})
	res, d := apply(t, g.process(dir), svcs, nil)
	if !res.FullRead || res.Operations != 1 || len(res.Drift) == 0 {
		t.Errorf("after someone deleted an element: %+v", res)
	}
	checkKernel(t, g.Fake, freshDump(t, d), "repaired")
	// That repair only added: it cannot prove that no one else's transaction came between.
	res, _ = apply(t, g.process(dir), svcs, nil)
	if !res.FullRead || res.Changed() {
		t.Errorf("after a repair that only added: %+v", res)
	}
	if res, _ = apply(t, g.process(dir), svcs, nil); res.FullRead || res.Changed() {
		t.Errorf("then: %+v", res)
	}
	// A table deleted and made anew by someone else, the same: read whole.
	g.edit(t, func(tx *knftables.Transaction) {
		tx.Delete(&knftables.Table{Family: knftables.InetFamily, Name: NATTable})
		tx.Add(&knftables.Table{Family: knftables.InetFamily, Name: NATTable})
	})
	if res, d = apply(t, g.process(dir), svcs, nil); !res.FullRead || len(res.Rebuilt) != 1 {
		t.Errorf("after someone emptied the table: %+v", res)
	}
	checkKernel(t, g.Fake, freshDump(t, d), "rebuilt")
}

// The generation after the apply must be the next one for the file to be kept: a commit of
// someone else's beside ours removes it.
func TestKnownCommitBesideOursDropsTheFile(t *testing.T) {
	g, dir := newGenFake(), t.TempDir()
	svcs := knownServices()
	apply(t, g.process(dir), svcs, nil)
	svcs[3].Backends[10].State = StateDrain
	g.foreign = 1
	if res, _ := apply(t, g.process(dir), svcs, nil); res.FullRead {
		t.Errorf("drain: %+v", res)
	}
	if files, _ := filepath.Glob(filepath.Join(dir, "*")); len(files) != 0 {
		t.Errorf("files left: %v", files)
	}
	if res, _ := apply(t, g.process(dir), svcs, nil); !res.FullRead || res.Changed() {
		t.Errorf("next: %+v", res)
	}
}

// A failed transaction changes nothing and leaves no file: the next apply reads whole.
func TestKnownFailedApplyDropsTheFile(t *testing.T) {
	g, dir := newGenFake(), t.TempDir()
	svcs := knownServices()
	apply(t, g.process(dir), svcs, nil)
	before := g.Dump()
	svcs[3].Backends[10].State = StateDrain
	g.fail = true
	if _, err := g.process(dir).Apply(context.Background(), Render(Resolve(svcs, nil, testEnv))); err == nil {
		t.Fatal("the transaction failed, Apply did not")
	}
	if g.Dump() != before {
		t.Error("a failed apply changed the kernel")
	}
	g.fail = false
	res, d := apply(t, g.process(dir), svcs, nil)
	if !res.FullRead || res.Operations == 0 {
		t.Errorf("after a failed apply: %+v", res)
	}
	checkKernel(t, g.Fake, freshDump(t, d), "after a failed apply")
}

// A file that is not a cache of this namespace's is ignored: the tables are read whole.
func TestKnownForeignOrCorruptFileIsIgnored(t *testing.T) {
	for name, edit := range map[string]func(k *knownFile) []byte{
		"garbage":       func(*knownFile) []byte { return []byte("\x1f\xff\x81\x03\x01\x01\x09knownFile") },
		"format":        func(k *knownFile) []byte { k.Format = "hostaccel-lb-known/0"; return nil },
		"netns":         func(k *knownFile) []byte { k.NetNS++; return nil },
		"boot":          func(k *knownFile) []byte { k.Boot = "another"; return nil },
		"not our table": func(k *knownFile) []byte { k.Tables[0].Name = "filter"; return nil },
		"table twice":   func(k *knownFile) []byte { k.Tables = append(k.Tables, k.Tables[0]); return nil },
		"empty tables":  func(k *knownFile) []byte { k.Tables = []knownTable{{}, {}}; return nil },
		"truncated":     func(k *knownFile) []byte { b, _ := encodeKnown(k); return b[:len(b)/2] },
	} {
		t.Run(name, func(t *testing.T) {
			g, dir := newGenFake(), t.TempDir()
			svcs := knownServices()
			m := g.process(dir)
			apply(t, m, svcs, nil)
			path := m.knownPath(nftlist.Generation{NetNSInode: 4026531840})
			b, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			k, err := decodeKnown(b)
			if err != nil {
				t.Fatal(err)
			}
			if out := edit(k); out != nil {
				b = out
			} else if b, err = encodeKnown(k); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(path, b, 0o600); err != nil {
				t.Fatal(err)
			}
			svcs[3].Backends[10].State = StateDrain
			res, d := apply(t, g.process(dir), svcs, nil)
			if !res.FullRead {
				t.Errorf("ignored file: %+v", res)
			}
			checkKernel(t, g.Fake, freshDump(t, d), name)
			if res, _ := apply(t, g.process(dir), svcs, nil); res.FullRead || res.Changed() {
				t.Errorf("the file written anew: %+v", res)
			}
		})
	}
}

// Remove deletes the file with the tables.
func TestKnownRemoveDropsTheFile(t *testing.T) {
	g, dir := newGenFake(), t.TempDir()
	apply(t, g.process(dir), knownServices(), nil)
	if _, err := g.process(dir).Remove(context.Background()); err != nil {
		t.Fatal(err)
	}
	if files, _ := filepath.Glob(filepath.Join(dir, "*")); len(files) != 0 {
		t.Errorf("files left: %v", files)
	}
}

// Applies in more namespaces than runfile.Keep leave runfile.Keep files: the one just written and
// the most recently modified of the others; files that are not caches stay.
func TestKnownFilesAreBounded(t *testing.T) {
	dir := t.TempDir()
	old := time.Now().Add(-24 * time.Hour)
	others := []string{"hostaccel.lock", "flowtable-known-4026531840.json", "lb-known-4026531840.json",
		"lb-known-4026531840.gob.123.tmp", "lb-known-4026531840.gob.bak"}
	for _, name := range others {
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, []byte("x"), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Chtimes(path, old, old); err != nil {
			t.Fatal(err)
		}
	}
	// Each file written is then dated in the future, later than the one before: the next
	// apply's file is the oldest of all, and still kept.
	future := time.Now().Add(time.Hour)
	n := runfile.Keep + 5
	svcs := svcSet()
	for i := range n {
		g := newGenFake()
		g.netns, g.inode = 5000+uint64(i), 4026532000+uint64(i)
		m := g.process(dir)
		apply(t, m, svcs, nil)
		path := m.knownPath(nftlist.Generation{NetNSInode: g.inode})
		if _, err := os.Stat(path); err != nil {
			t.Fatalf("apply %d: its file: %v", i, err)
		}
		at := future.Add(time.Duration(i) * time.Second)
		if err := os.Chtimes(path, at, at); err != nil {
			t.Fatal(err)
		}
	}
	files, _ := filepath.Glob(filepath.Join(dir, "lb-known-*.gob"))
	var want []string
	for i := n - runfile.Keep; i < n; i++ {
		want = append(want, filepath.Join(dir, fmt.Sprintf("lb-known-%d.gob", 4026532000+i)))
	}
	if !slices.Equal(files, want) {
		t.Errorf("after applies in %d namespaces, %d files:\n%v\nwant the last %d:\n%v", n, len(files), files, runfile.Keep, want)
	}
	for _, name := range others {
		if _, err := os.Stat(filepath.Join(dir, name)); err != nil {
			t.Errorf("not a cache file, removed: %v", err)
		}
	}
}

func TestSurelyChanges(t *testing.T) {
	tx := knftables.NewFake("", "").NewTransaction()
	if surelyChanges(nil) || surelyChanges(tx) {
		t.Error("no transaction changes something")
	}
	tx.Add(&knftables.Table{Family: knftables.InetFamily, Name: NATTable})
	tx.Add(&knftables.Element{Family: knftables.InetFamily, Table: NATTable, Map: "m", Key: []string{"1"}, Value: []string{"2"}})
	if surelyChanges(tx) {
		t.Error("adds of what may be there already")
	}
	tx.Delete(&knftables.Element{Family: knftables.InetFamily, Table: NATTable, Map: "m", Key: []string{"1"}})
	if !surelyChanges(tx) {
		t.Error("a delete")
	}
	tx = knftables.NewFake("", "").NewTransaction()
	tx.Add(&knftables.Rule{Family: knftables.InetFamily, Table: NATTable, Chain: "c", Rule: "accept"})
	if !surelyChanges(tx) {
		t.Error("a rule added")
	}
}

// The agent's Manager (DeferFull) skips a due full read while the ruleset is still at the
// generation its last apply proved: no one can have changed our tables. Someone's edit, or a
// commit beside ours, makes the reading due again, and the apply after it repairs the drift.
func TestFullReadSkippedWhileTheRulesetIsOurs(t *testing.T) {
	g := newGenFake()
	m := g.process("")
	m.DeferFull, m.FullEvery = true, time.Millisecond
	svcs := knownServices()
	due := func(what string, want bool) {
		t.Helper()
		time.Sleep(2 * time.Millisecond)
		skipped := m.Reads.FullSkipped
		if got := m.FullDue(); got != want {
			t.Fatalf("%s: full read due %v, want %v", what, got, want)
		}
		if n := m.Reads.FullSkipped - skipped; n != map[bool]uint64{true: 0, false: 1}[want] {
			t.Fatalf("%s: %d full reads counted as skipped", what, n)
		}
	}
	apply(t, m, svcs, nil)
	due("after the first apply", false)
	svcs[3].Backends[10].State = StateDrain
	apply(t, m, svcs, nil)
	due("after a drain", false)
	apply(t, m, svcs, nil)
	due("after an apply that changed nothing", false)

	g.edit(t, func(tx *knftables.Transaction) {
		tx.Delete(&knftables.Element{Family: knftables.InetFamily, Table: NATTable, Map: "big-backends-v4", Key: []string{"5"}})
	})
	due("after someone deleted an element", true)
	// Applies from the cache after it (one that changes nothing, one that changes
	// something) do not make it ours again: the cache did not see that change.
	apply(t, m, svcs, nil)
	due("after someone's change and an apply of nothing", true)
	svcs[3].Backends[12].State = StateDrain
	apply(t, m, svcs, nil)
	due("after someone's change and a drain", true)
	// A reading taken before someone else's next commit cannot prove the apply after it.
	stale := m.StartFullRead()
	if err := stale.Read(context.Background()); err != nil || !m.FinishFullRead(stale) {
		t.Fatalf("reading: %v", err)
	}
	theirs := &knftables.Table{Family: knftables.IPv4Family, Name: "theirs"}
	g.edit(t, func(tx *knftables.Transaction) { tx.Add(theirs) })
	g.edit(t, func(tx *knftables.Transaction) { tx.Delete(theirs) })
	svcs[3].Backends[13].State = StateDrain // a chain rewritten: a transaction that surely changes
	res, d := apply(t, m, svcs, nil)
	if !res.FullRead || len(res.Drift) == 0 {
		t.Fatalf("the apply after the reading: %+v", res)
	}
	checkKernel(t, g.Fake, freshDump(t, d), "repaired")
	due("after an apply from a reading older than someone's commit", true)
	// A reading at the generation the apply starts from proves it.
	fr := m.StartFullRead()
	if err := fr.Read(context.Background()); err != nil || !m.FinishFullRead(fr) {
		t.Fatalf("reading: %v", err)
	}
	if res, _ := apply(t, m, svcs, nil); !res.FullRead || res.Changed() {
		t.Fatalf("the apply after a current reading: %+v", res)
	}
	due("after an apply from a current reading", false)

	svcs[3].Backends[10].State = ""
	apply(t, m, svcs, nil)
	due("after an apply proved again", false)
	svcs[3].Backends[11].State = StateDrain
	g.foreign = 1
	if res, _ := apply(t, m, svcs, nil); res.FullRead {
		t.Fatalf("drain: %+v", res)
	}
	due("after a commit beside ours", true)

	m.Generation = nil
	apply(t, m, svcs, nil)
	due("without generations", true)
}

// Prefetch reads the generation and the file before Apply: the apply diffs against the file
// as without it. A change by someone else after the prefetch (the generation read) and
// before the transaction is not proven ours: the file goes, and the next apply reads the
// tables whole and repairs them.
func TestKnownPrefetch(t *testing.T) {
	g, dir := newGenFake(), t.TempDir()
	svcs := knownServices()
	apply(t, g.process(dir), svcs, nil)

	m := g.process(dir)
	m.Prefetch(context.Background())
	svcs[3].Backends[10].State = StateDrain
	res, d := apply(t, m, svcs, nil)
	if res.FullRead || res.Operations == 0 || res.Operations > 8 {
		t.Errorf("prefetched: %+v", res)
	}
	checkKernel(t, g.Fake, freshDump(t, d), "prefetched")

	m = g.process(dir)
	m.Prefetch(context.Background())
	<-m.prefetched.done
	g.edit(t, func(tx *knftables.Transaction) {
		tx.Delete(&knftables.Element{Family: knftables.InetFamily, Table: NATTable, Map: "big-backends-v4", Key: []string{"5"}})
	})
	svcs[3].Backends[10].State = ""
	apply(t, m, svcs, nil)
	if files, _ := filepath.Glob(filepath.Join(dir, "*")); len(files) != 0 {
		t.Errorf("a change beside the apply, the file kept: %v", files)
	}
	res, d = apply(t, g.process(dir), svcs, nil)
	if !res.FullRead || res.Operations != 1 {
		t.Errorf("after someone deleted an element beside the apply: %+v", res)
	}
	checkKernel(t, g.Fake, freshDump(t, d), "repaired")
}
