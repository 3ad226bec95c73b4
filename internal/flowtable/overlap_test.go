package flowtable

import (
	"context"
	"strings"
	"testing"

	"github.com/hostaccel/hostaccel/internal/testbed"
)

// A set element replaced by one that overlaps it (peer CIDRs 10.244.2.0/24 and 10.244.3.0/24
// become 10.244.0.0/16) is updated in place, with every stale element deleted before any new
// one is added: the kernel's interval sets refuse an element that overlaps one still there,
// and the whole transaction with it (every sync failed, for good).
func TestUpdateDeletesBeforeItAdds(t *testing.T) {
	m, f := NewFakeManager()
	s := state()
	s.PeerPodCIDRs = pfx("10.244.2.0/24", "10.244.3.0/24", "fd00:10:244:2::/64")
	apply(t, m, s)
	s.PeerPodCIDRs = pfx("10.244.0.0/16", "fd00:10:244::/48")
	res := apply(t, m, s)
	if res.Rebuilt || res.ElementsAdded != 2 || res.ElementsRemoved != 3 {
		t.Fatalf("want an update of the sets: %+v", res)
	}
	tx := f.LastTransaction.String()
	if add, del := strings.Index(tx, "add element"), strings.LastIndex(tx, "delete element"); add < 0 || del < 0 || add < del {
		t.Errorf("an element added before a stale one was deleted:\n%s", tx)
	}
}

// The same on the kernel, where the flowtable is (the VM): widened, then narrowed again.
func TestUpdateOfOverlappingElementsOnTheKernel(t *testing.T) {
	testbed.RequireRoot(t)
	ns, err := testbed.NewNS("ftoverlap")
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Close()
	if _, whole := flowtableIn(t, ns); !whole {
		t.Skip("this kernel has no flowtable")
	}
	for _, dev := range []string{"eth0", "gw"} {
		if out, err := ns.Exec("ip", "link", "add", dev, "type", "dummy"); err != nil {
			t.Fatal(out, err)
		}
	}
	s := state()
	s.PeerPodCIDRs = pfx("10.244.2.0/24", "10.244.3.0/24", "fd00:10:244:2::/64")
	var results []Result
	err = ns.Do(func() error {
		m := NewManager()
		for _, peers := range [][]string{{"10.244.2.0/24", "10.244.3.0/24", "fd00:10:244:2::/64"}, {"10.244.0.0/16", "fd00:10:244::/48"}, {"10.244.2.0/25", "10.244.3.0/24", "fd00:10:244:2::/64"}} {
			s.PeerPodCIDRs = pfx(peers...)
			s.Normalize()
			res, err := m.Apply(context.Background(), Render(s, Options{FlowtableCounter: true}))
			if err != nil {
				return err
			}
			results = append(results, res)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for i, res := range results[1:] {
		if res.Rebuilt || res.ElementsAdded == 0 || res.ElementsRemoved == 0 {
			t.Errorf("change %d: want an update of the sets: %+v", i+1, res)
		}
	}
	if out, err := ns.Exec("nft", "list", "set", "inet", TableName, "peer-pod-v4"); err != nil || !strings.Contains(out, "10.244.2.0/25") || strings.Contains(out, "10.244.0.0/16") {
		t.Errorf("peer-pod-v4 after the changes: %v\n%s", err, out)
	}
}
