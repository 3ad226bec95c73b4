package flowtable

import (
	"context"
	"encoding/json"
	"strings"

	"sigs.k8s.io/knftables"

	"github.com/hostaccel/hostaccel/internal/nftjson"
)

// FakeLister serves a knftables.Fake's table as `nft --json list table` would, so that
// Manager can be unit-tested (and used by other packages' tests) without a kernel.
func FakeLister(f *knftables.Fake) nftjson.Lister {
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
			devs := make([]string, len(ft.Devices))
			for i, d := range ft.Devices {
				devs[i] = strings.Trim(d, `"`) // as nft lists them (txFlowtable quotes some)
			}
			objs = append(objs, map[string]any{"flowtable": map[string]any{"name": name, "dev": devs}})
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

// NewFakeManager is a Manager on a knftables.Fake.
func NewFakeManager() (*Manager, *knftables.Fake) {
	f := knftables.NewFake(Family, TableName)
	exists := func(context.Context) (bool, error) {
		f.RLock()
		defer f.RUnlock()
		return f.Table != nil, nil
	}
	return &Manager{NFT: f, List: FakeLister(f), Exists: exists}, f
}
