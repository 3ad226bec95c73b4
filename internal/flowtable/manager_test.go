package flowtable

import (
	"context"
	"encoding/json"
	"net/netip"
	"strings"
	"testing"

	"sigs.k8s.io/knftables"

	"github.com/hostaccel/hostaccel/internal/model"
	"github.com/hostaccel/hostaccel/internal/nftjson"
)

// fakeLister serves the Fake's table as `nft --json list table` would.
func fakeLister(f *knftables.Fake) nftjson.Lister {
	return func(context.Context, string, string) ([]byte, error) {
		f.RLock()
		defer f.RUnlock()
		t := f.Table
		if t == nil {
			return nil, nftjson.ErrNoTable
		}
		var objs []map[string]any
		comment := ""
		if t.Comment != nil {
			comment = *t.Comment
		}
		objs = append(objs, map[string]any{"table": map[string]any{"family": "inet", "name": TableName, "comment": comment}})
		for name, ft := range t.Flowtables {
			objs = append(objs, map[string]any{"flowtable": map[string]any{"name": name, "dev": ft.Devices}})
		}
		for name, s := range t.Sets {
			var elems []string
			for _, e := range s.Elements {
				elems = append(elems, strings.Trim(e.Key[0], `"`))
			}
			objs = append(objs, map[string]any{"set": map[string]any{"name": name, "type": s.Type, "elem": elems}})
		}
		for name, c := range t.Chains {
			objs = append(objs, map[string]any{"chain": map[string]any{"name": name}})
			for _, r := range c.Rules {
				rc := ""
				if r.Comment != nil {
					rc = *r.Comment
				}
				objs = append(objs, map[string]any{"rule": map[string]any{"chain": name, "handle": *r.Handle, "comment": rc,
					"expr": []any{map[string]any{"text": r.Rule}, map[string]any{"counter": map[string]any{"packets": 7, "bytes": 700}}}}})
			}
		}
		return json.Marshal(map[string]any{"nftables": objs})
	}
}

func newFakeManager() (*Manager, *knftables.Fake) {
	f := knftables.NewFake(Family, TableName)
	return &Manager{NFT: f, List: fakeLister(f)}, f
}

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
	m, f := newFakeManager()
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

	// An exclusion narrows the policy too.
	s.Exclude = []netip.Prefix{netip.MustParsePrefix("10.244.2.9/32")}
	if res := apply(t, m, s); !res.FlowtableRecreated || res.ElementsAdded != 1 {
		t.Fatalf("exclude added: %+v", res)
	}

	// A device appears: flowtable recreated with it, device set updated.
	s.Transports = append(s.Transports, "eth1")
	if res := apply(t, m, s); !res.FlowtableRecreated || res.Reason != "devices changed" {
		t.Fatalf("device added: %+v", res)
	}
	if got := strings.Join(f.Table.Flowtables[FlowtableName].Devices, ","); got != "eth0,eth1,gw" {
		t.Errorf("flowtable devices: %s", got)
	}
	if got := elements(f, DevicesSet); got != `"eth0","gw","eth1"` {
		t.Errorf("device set: %s", got)
	}

	// A class enabled: new spec, whole table rebuilt.
	s.Classes = append(s.Classes, model.PodToService)
	if res := apply(t, m, s); !res.Rebuilt || res.Reason != "spec changed" {
		t.Fatalf("class added: %+v", res)
	}
}

func TestManagerRepairsDrift(t *testing.T) {
	m, f := newFakeManager()
	s := state()
	apply(t, m, s)

	// Someone deletes one of our rules.
	f.Lock()
	ch := f.Table.Chains[ChainName]
	ch.Rules = ch.Rules[1:]
	f.Unlock()
	if res := apply(t, m, s); !res.Rebuilt || !strings.HasPrefix(res.Reason, "drift") {
		t.Fatalf("deleted rule not repaired: %+v", res)
	}

	// Someone deletes the table.
	tx := f.NewTransaction()
	tx.Delete(&knftables.Table{})
	if err := f.Run(context.Background(), tx); err != nil {
		t.Fatal(err)
	}
	if res := apply(t, m, s); !res.Rebuilt || res.Reason != "table missing" {
		t.Fatalf("deleted table not repaired: %+v", res)
	}

	// A fresh manager (a new `hostaccel apply`) has no memory of the last apply, but still
	// notices a rule set that is not ours.
	m2 := &Manager{NFT: f, List: fakeLister(f)}
	f.Lock()
	f.Table.Chains[ChainName].Rules[3].Comment = knftables.PtrTo("edited")
	f.Unlock()
	if res := apply(t, m2, s); !res.Rebuilt {
		t.Fatalf("edited rule not repaired by a fresh manager: %+v", res)
	}
}

func TestManagerRemove(t *testing.T) {
	m, f := newFakeManager()
	apply(t, m, state())
	if err := m.Remove(context.Background()); err != nil {
		t.Fatal(err)
	}
	if f.Table != nil {
		t.Error("table left behind")
	}
	if err := m.Remove(context.Background()); err != nil {
		t.Errorf("second remove: %v", err)
	}
}
