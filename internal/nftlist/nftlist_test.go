package nftlist

import (
	"context"
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
