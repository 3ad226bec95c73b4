package nftlist

import (
	"context"
	"fmt"
	"testing"

	"sigs.k8s.io/knftables"

	"github.com/hostaccel/hostaccel/internal/testbed"
)

// The listing sees the namespace's tables, of every family we use, and only its own.
func TestTablesInANamespace(t *testing.T) {
	testbed.RequireRoot(t)
	ns, err := testbed.NewNS("nftlist")
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Close()
	has := func(f knftables.Family, name string) bool {
		t.Helper()
		var ok bool
		if err := ns.Do(func() (err error) { ok, err = Has(context.Background(), f, name); return }); err != nil {
			t.Fatal(err)
		}
		return ok
	}
	if has(knftables.InetFamily, "x") {
		t.Fatal("a fresh namespace has table inet x")
	}
	if err := ns.NFT("add table inet x\nadd table netdev y\nadd table ip x\n"); err != nil {
		t.Fatal(err)
	}
	if !has(knftables.InetFamily, "x") || !has(knftables.NetDevFamily, "y") || !has(knftables.IPv4Family, "x") {
		t.Error("a table created is not listed")
	}
	if has(knftables.IPv6Family, "x") || has(knftables.InetFamily, "y") {
		t.Error("a table listed under another family")
	}
	if out, err := ns.Exec("nft", "delete", "table", "inet", "x"); err != nil {
		t.Fatal(err, out)
	}
	if has(knftables.InetFamily, "x") || !has(knftables.IPv4Family, "x") {
		t.Error("the listing did not follow a delete")
	}
	for _, f := range []knftables.Family{knftables.InetFamily, knftables.IPv4Family, knftables.IPv6Family, knftables.NetDevFamily} {
		if nl, ok := NetlinkFamily(f); !ok || families[nl] != f {
			t.Errorf("family %s: %v %v", f, nl, ok)
		}
	}
}

// The generation counts the transactions that changed something in the namespace, and
// only its own; each namespace has its cookie.
func TestGenerationInANamespace(t *testing.T) {
	testbed.RequireRoot(t)
	ns, err := testbed.NewNS("nftgen")
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Close()
	gen := func() Generation {
		t.Helper()
		var g Generation
		if err := ns.Do(func() (err error) { g, err = getGeneration(context.Background()); return }); err != nil {
			t.Fatal(err)
		}
		return g
	}
	host, err := getGeneration(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	g0 := gen()
	if g0.NetNS == 0 || g0.NetNS == host.NetNS || g0.NetNSInode == 0 || g0.NetNSInode == host.NetNSInode || g0.Boot == "" || g0.Boot != host.Boot {
		t.Fatalf("namespace %+v, host %+v", g0, host)
	}
	if err := ns.NFT("add table inet x\n"); err != nil {
		t.Fatal(err)
	}
	if g := gen(); g != g0.Next() {
		t.Errorf("after a table added: %+v, want %+v", g, g0.Next())
	}
	// Adding what is there changes nothing, and neither does a failed transaction.
	if err := ns.NFT("add table inet x\n"); err != nil {
		t.Fatal(err)
	}
	if err := ns.NFT("add table inet y\ndelete table inet nosuch\n"); err == nil {
		t.Fatal("deleting a table that is not there did not fail")
	}
	if g := gen(); g != g0.Next() {
		t.Errorf("after no change: %+v, want %+v", g, g0.Next())
	}
	if (Generation{ID: ^uint32(0)}).Next().ID != 1 {
		t.Error("the generation after the last is 1 (the kernel skips 0)")
	}
}

// A GenReader keeps its socket: it sees every commit after it opened it, and a reading from
// a thread in another namespace is that namespace's (as a fresh socket's).
func TestGenReaderFollowsCommitsAndNamespaces(t *testing.T) {
	testbed.RequireRoot(t)
	var nss [2]*testbed.NS
	for i := range nss {
		ns, err := testbed.NewNS("genreader")
		if err != nil {
			t.Fatal(err)
		}
		defer ns.Close()
		nss[i] = ns
	}
	var r GenReader
	defer r.Close()
	read := func(ns *testbed.NS) (g, fresh Generation) {
		t.Helper()
		if err := ns.Do(func() (err error) {
			if g, err = r.Read(context.Background()); err == nil {
				fresh, err = getGeneration(context.Background())
			}
			return err
		}); err != nil {
			t.Fatal(err)
		}
		return g, fresh
	}
	for round := range 3 {
		for i, ns := range nss {
			before, _ := read(ns)
			if err := ns.NFT(fmt.Sprintf("add table inet t%d\n", round)); err != nil {
				t.Fatal(err)
			}
			g, fresh := read(ns)
			if g != fresh || g != before.Next() {
				t.Errorf("round %d, namespace %d: kept socket %+v, fresh %+v, before the commit %+v", round, i, g, fresh, before)
			}
		}
	}
	a, _ := read(nss[0])
	b, _ := read(nss[1])
	if a.NetNS == b.NetNS || a.NetNSInode == b.NetNSInode {
		t.Errorf("two namespaces read as one: %+v, %+v", a, b)
	}
}

// getGeneration reads the generation over a socket of its own (opened and closed).
func getGeneration(ctx context.Context) (Generation, error) {
	var r GenReader
	defer r.Close()
	return r.Read(ctx)
}
