package lb

import (
	"context"
	"fmt"

	"github.com/google/nftables"

	"github.com/hostaccel/hostaccel/internal/nftlist"
)

// CounterReader reads the named counters of one table: name -> packets and bytes (the
// comment is left empty: the Manager knows it from its last apply).
type CounterReader func(ctx context.Context, ref TableRef) (map[string]Counter, error)

// NetlinkCounters reads them over netlink in the calling thread's network namespace
// (google/nftables): nft 1.0.6 fetches the whole ruleset for any listing (~2 s at 5,000
// services), a dump of a table's objects costs milliseconds.
func NetlinkCounters(_ context.Context, ref TableRef) (map[string]Counter, error) {
	fam, ok := nftlist.NetlinkFamily(ref.Family)
	if !ok {
		return nil, fmt.Errorf("counters of %s: unknown family", ref)
	}
	c, err := nftables.New()
	if err != nil {
		return nil, fmt.Errorf("counters of %s: %w", ref, err)
	}
	defer c.CloseLasting()
	objs, err := c.GetObjects(&nftables.Table{Name: ref.Name, Family: fam}) // counters as CounterObj
	if err != nil {
		return nil, fmt.Errorf("counters of %s: %w", ref, err)
	}
	out := map[string]Counter{}
	for _, o := range objs {
		if co, ok := o.(*nftables.CounterObj); ok {
			out[co.Name] = Counter{Packets: co.Packets, Bytes: co.Bytes}
		}
	}
	return out, nil
}

// FakeCounters reads the named counters of a Fake's table through lister (as the Fake's
// listing shows them).
func FakeCounters(lister Lister) CounterReader {
	return func(ctx context.Context, ref TableRef) (map[string]Counter, error) {
		out, err := lister(ctx, "--terse", "list", "table", string(ref.Family), ref.Name)
		if err != nil {
			return nil, err
		}
		kt, err := parseTable(ref, out)
		if err != nil {
			return nil, err
		}
		for name, c := range kt.Counters {
			c.Comment = ""
			kt.Counters[name] = c
		}
		return kt.Counters, nil
	}
}

// CounterTables is, per table the last apply left, its named counters with their comments
// (nil when the Manager knows no apply: ReadCounters then lists the tables with nft). The
// maps are the Manager's and never written after: read them anywhere.
func (m *Manager) CounterTables() map[TableRef]map[string]Counter {
	if !m.cache.known() {
		return nil
	}
	out := map[TableRef]map[string]Counter{}
	for ref, kt := range m.cache.tables {
		out[ref] = kt.Counters
	}
	return out
}

// ReadCounters reads the kernel's counters of tables (from CounterTables) over the
// Manager's CounterReader, with the comments tables hold; the kernel's counters that tables
// do not name are left out. With tables nil it lists our tables whole instead (nft).
func (m *Manager) ReadCounters(ctx context.Context, tables map[TableRef]map[string]Counter) (map[TableRef]map[string]Counter, error) {
	if tables == nil || m.ReadCounter == nil {
		st, err := m.Observe(ctx)
		out := map[TableRef]map[string]Counter{}
		for ref, t := range st {
			out[ref] = t.Counters
		}
		return out, err
	}
	out := map[TableRef]map[string]Counter{}
	for ref, names := range tables {
		got, err := m.ReadCounter(ctx, ref)
		if err != nil {
			return out, err
		}
		cs := make(map[string]Counter, len(names))
		for name, want := range names {
			if c, ok := got[name]; ok {
				c.Comment = want.Comment
				cs[name] = c
			}
		}
		out[ref] = cs
	}
	return out, nil
}
