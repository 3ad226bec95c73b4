package lb

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"

	"sigs.k8s.io/knftables"
)

// NewFakeManager is a Manager on a knftables.Fake (unit tests; no kernel, no root). Rules
// containing "counter" report 7 packets.
func NewFakeManager() (*Manager, *knftables.Fake) {
	f := knftables.NewFake("", "")
	return &Manager{NFT: f, List: FakeLister(f), Tables: FakeTables(f), ReadCounter: FakeCounters(FakeLister(f))}, f
}

// FakeTables lists the Fake's tables as `nft list tables` would.
func FakeTables(f *knftables.Fake) func(context.Context) ([]TableRef, error) {
	return func(context.Context) ([]TableRef, error) {
		f.RLock()
		defer f.RUnlock()
		var refs []TableRef
		for fam, tables := range f.Tables {
			for name := range tables {
				refs = append(refs, TableRef{fam, name})
			}
		}
		slices.SortFunc(refs, func(a, b TableRef) int { return strings.Compare(a.String(), b.String()) })
		return refs, nil
	}
}

// FakeLister answers the list commands the Manager sends (list table FAMILY TABLE, list
// chain|map FAMILY TABLE NAME, optionally --terse) from a Fake, in the JSON shapes the Manager
// reads: elements as their text, rules as their text plus a counter (7 packets where the rule
// counts).
func FakeLister(f *knftables.Fake) Lister {
	return func(_ context.Context, args ...string) ([]byte, error) {
		f.RLock()
		defer f.RUnlock()
		terse := len(args) > 0 && args[0] == "--terse"
		if terse {
			args = args[1:]
		}
		if len(args) < 4 || args[0] != "list" {
			return nil, fmt.Errorf("fake nft: cannot %q", args)
		}
		t := f.Tables[knftables.Family(args[2])][args[3]]
		if t == nil {
			return nil, fmt.Errorf("fake nft: %v: No such file or directory", args)
		}
		str := func(p *string) string {
			if p == nil {
				return ""
			}
			return *p
		}
		var objs []map[string]any
		add := func(kind string, v map[string]any) { objs = append(objs, map[string]any{kind: v}) }
		addMap := func(name string, m *knftables.FakeMap) {
			o := map[string]any{"name": name, "comment": str(m.Comment), "flags": m.Flags}
			if !terse {
				var elems []any
				for _, e := range m.Elements {
					elems = append(elems, []any{strings.Join(e.Key, " . "), strings.Join(e.Value, " . ")})
				}
				o["elem"] = elems
			}
			add("map", o)
		}
		addChain := func(name string, c *knftables.FakeChain) {
			add("chain", map[string]any{"name": name})
			for _, r := range c.Rules {
				expr := []any{map[string]any{"text": r.Rule}}
				if strings.Contains(r.Rule, "counter") && !strings.Contains(r.Rule, "counter name") {
					expr = append(expr, map[string]any{"counter": map[string]any{"packets": 7, "bytes": 700}})
				}
				add("rule", map[string]any{"chain": name, "handle": *r.Handle, "comment": str(r.Comment), "expr": expr})
			}
		}
		switch {
		case args[1] == "table" && len(args) == 4:
			for name, st := range t.Sets {
				o := map[string]any{"name": name, "comment": str(st.Comment), "flags": st.Flags}
				if !terse {
					var elems []any
					for _, e := range st.Elements {
						elems = append(elems, strings.Join(e.Key, " . "))
					}
					o["elem"] = elems
				}
				add("set", o)
			}
			for name, m := range t.Maps {
				addMap(name, m)
			}
			for name, c := range t.Counters {
				add("counter", map[string]any{"name": name, "comment": str(c.Comment), "packets": 7, "bytes": 700})
			}
			for name, c := range t.Chains {
				addChain(name, c)
			}
		case args[1] == "map" && len(args) == 5 && t.Maps[args[4]] != nil:
			addMap(args[4], t.Maps[args[4]])
		case args[1] == "chain" && len(args) == 5 && t.Chains[args[4]] != nil:
			addChain(args[4], t.Chains[args[4]])
		default:
			return nil, fmt.Errorf("fake nft: %v: No such file or directory", args)
		}
		return json.Marshal(map[string]any{"nftables": objs})
	}
}
