// Package nftdump writes a table as the nft script a fresh apply installs: exactly what a
// knftables.Fake's Dump prints, in time linear in the number of set and map elements (the
// Fake looks up every element it is given among those before it, which makes a table of
// 10,000 elements take seconds).
package nftdump

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"sigs.k8s.io/knftables"
)

// Table dumps one table: add puts every object but the elements into a transaction (the
// table first), which a Fake runs and dumps; elems are then written after it the way the
// Fake would: sets before maps, each by name, elements in the order given, a key given again
// replacing the earlier element in its place. fake must be empty; it holds the table without
// its elements afterwards. Elements are checked as the Fake checks them: valid, of a set or
// map of the table, a verdict naming one of its chains.
func Table(fake *knftables.Fake, add func(*knftables.Transaction), elems []*knftables.Element) (string, error) {
	tx := fake.NewTransaction()
	add(tx)
	if err := fake.Run(context.Background(), tx); err != nil {
		return "", err
	}
	t := fake.Table
	if t == nil {
		for _, tables := range fake.Tables {
			for _, tt := range tables {
				if t != nil {
					return "", errors.New("nftdump: more than one table")
				}
				t = tt
			}
		}
	}
	if t == nil {
		return "", errors.New("nftdump: no table")
	}
	type owner struct {
		isMap bool
		name  string
	}
	lists := map[owner][]*knftables.Element{}
	at := map[owner]map[string]int{}
	for _, e := range elems {
		o := owner{e.Set == "", e.Set + e.Map}
		switch {
		case !o.isMap && t.Sets[o.name] == nil:
			return "", fmt.Errorf("no such set %q", o.name)
		case o.isMap && t.Maps[o.name] == nil:
			return "", fmt.Errorf("no such map %q", o.name)
		// checked here too: a later element of the same key replaces this one before the
		// Fake sees it (which refuses both)
		case o.isMap && len(e.Value) == 0:
			return "", fmt.Errorf("map %q: no map value specified for map element %v", o.name, e.Key)
		case !o.isMap && len(e.Value) > 0:
			return "", fmt.Errorf("set %q: map value specified for set element %v", o.name, e.Key)
		}
		if len(e.Value) == 1 {
			if w := strings.Split(e.Value[0], " "); len(w) == 2 && (w[0] == "goto" || w[0] == "jump") && t.Chains[w[1]] == nil {
				return "", fmt.Errorf("no such chain %q", w[1])
			}
		}
		if at[o] == nil {
			at[o] = map[string]int{}
		}
		k := strings.Join(e.Key, "\x00")
		if i, ok := at[o][k]; ok {
			lists[o][i] = e
			continue
		}
		at[o][k] = len(lists[o])
		lists[o] = append(lists[o], e)
	}
	owners := make([]owner, 0, len(lists))
	for o := range lists {
		owners = append(owners, o)
	}
	slices.SortFunc(owners, func(a, b owner) int {
		if a.isMap != b.isMap {
			if a.isMap {
				return 1
			}
			return -1
		}
		return strings.Compare(a.name, b.name)
	})
	etx := fake.NewTransaction()
	for _, o := range owners {
		for _, e := range lists[o] {
			etx.Add(e)
		}
	}
	out := etx.String()
	if i := strings.LastIndexByte(out, '\n'); i < len(out)-1 {
		// knftables writes a pending error as a last line without a newline.
		return "", errors.New(strings.TrimPrefix(out[i+1:], "# ERROR: "))
	}
	return fake.Dump() + out, nil
}
