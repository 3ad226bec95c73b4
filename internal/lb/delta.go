package lb

import (
	"context"
	"maps"
	"slices"

	"sigs.k8s.io/knftables"

	"github.com/hostaccel/hostaccel/internal/nftjson"
)

// An apply that trusts its cache diffs only the parts of a table (Table.parts: the table's
// own objects, then each service's) that are not the ones it applied last: a change to one
// service of thousands reads, diffs and remembers that service and the table's own objects,
// not every service (issue 13). The kernel holds what the cache says (the last apply wrote it
// and nothing was read since), so a part that is the same object as last time needs nothing.
// The diff itself is update's, on a table of the parts in scope against the kernel's objects
// of those parts: the chains, maps, sets and counters they name, and of the table's own maps
// (which every service adds elements to: VIP . protocol . port -> service chain) only the
// elements the parts in scope have, had, or the table itself has.

// partScope is one table's objects that an apply diffs (see above).
type partScope struct {
	t    *Table       // the table as rendered
	sub  *Table       // its parts in scope, as one table (update reorders its slot maps' elements)
	ksub *kernelTable // the kernel's objects of those parts
	// The names of the objects of the parts in scope (old and new): chains, sets and maps,
	// named counters; own: the sets and maps of the table itself; shared: of those, the
	// element keys in scope.
	chains, objs, counters, own map[string]bool
	shared                      map[string]map[string]bool
}

// index maps each part's owner to the part (built once per table).
func (t *Table) index() (map[string]*Table, bool) {
	if t.byOwner == nil {
		by := make(map[string]*Table, len(t.parts))
		for _, p := range t.parts {
			if by[p.owner] != nil {
				return nil, false // two parts of one owner: diff the whole table
			}
			by[p.owner] = p
		}
		t.byOwner = by
	}
	return t.byOwner, true
}

// scopeOf returns what turns the table was (as last applied, the kernel holding it as kt)
// into t, or false when only a whole diff can tell (no parts, the table's own maps changed).
func scopeOf(was, t *Table, kt *kernelTable) (*partScope, bool) {
	if was == nil || len(was.parts) == 0 || len(t.parts) == 0 || kt == nil || kt.Comment != t.Comment ||
		was.parts[0].owner != "" || t.parts[0].owner != "" {
		return nil, false
	}
	oldBy, ok := was.index()
	if !ok {
		return nil, false
	}
	newBy, ok := t.index()
	if !ok {
		return nil, false
	}
	s := &partScope{t: t, chains: map[string]bool{}, objs: map[string]bool{}, counters: map[string]bool{},
		own: map[string]bool{}, shared: map[string]map[string]bool{}}
	// The table's own objects are always in scope (a few); the services' when they changed.
	olds, news := []*Table{was.parts[0]}, []*Table{t.parts[0]}
	for _, p := range t.parts[1:] {
		if o := oldBy[p.owner]; o != p {
			news = append(news, p)
			if o != nil {
				olds = append(olds, o)
			}
		}
	}
	for _, o := range was.parts[1:] {
		if newBy[o.owner] == nil {
			olds = append(olds, o)
		}
	}
	// The table's own sets and maps must be there, as rendered: replacing one would drop
	// the elements of the services out of scope.
	for _, base := range []*Table{was.parts[0], t.parts[0]} {
		for _, st := range base.Sets {
			s.own[st.Name] = true
		}
		for _, mp := range base.Maps {
			s.own[mp.Name] = true
		}
	}
	for _, st := range t.parts[0].Sets {
		if km := kt.Maps[st.Name]; km == nil || km.Comment != *st.Comment {
			return nil, false
		}
	}
	for _, mp := range t.parts[0].Maps {
		if km := kt.Maps[mp.Name]; km == nil || km.Comment != *mp.Comment {
			return nil, false
		}
	}
	if len(s.own) != len(t.parts[0].Sets)+len(t.parts[0].Maps) {
		return nil, false // the table's own sets and maps differ from last time's
	}
	for _, p := range slices.Concat(olds, news) {
		for _, c := range p.Chains {
			s.chains[c.Name] = true
		}
		for _, c := range p.Counters {
			s.counters[c.Name] = true
		}
		for _, st := range p.Sets {
			s.objs[st.Name] = true
			if s.own[st.Name] && p.owner != "" {
				return nil, false // a service's set of the table's name
			}
		}
		for _, mp := range p.Maps {
			s.objs[mp.Name] = true
			if s.own[mp.Name] && p.owner != "" {
				return nil, false // a service's map of the table's name
			}
		}
	}
	for _, p := range slices.Concat(olds, news) {
		for _, e := range p.Elements {
			n := e.Set + e.Map
			switch {
			case s.own[n]:
				if s.shared[n] == nil {
					s.shared[n] = map[string]bool{}
				}
				s.shared[n][elemKey(e)] = true
			case !s.objs[n]:
				return nil, false // an element of another service's map
			}
		}
	}
	s.sub = &Table{Family: t.Family, Name: t.Name, Comment: t.Comment, Dynamic: map[string]map[string]bool{}, Slots: map[string]bool{}}
	for _, p := range news {
		s.sub.Chains = append(s.sub.Chains, p.Chains...)
		s.sub.Rules = append(s.sub.Rules, p.Rules...)
		s.sub.Sets = append(s.sub.Sets, p.Sets...)
		s.sub.Maps = append(s.sub.Maps, p.Maps...)
		s.sub.Counters = append(s.sub.Counters, p.Counters...)
		s.sub.Elements = append(s.sub.Elements, p.Elements...)
		for k, v := range p.Dynamic {
			s.sub.Dynamic[k] = v
		}
		for k, v := range p.Slots {
			s.sub.Slots[k] = v
		}
	}
	s.ksub = &kernelTable{Table: &nftjson.Table{Family: kt.Family, Name: kt.Name, Comment: kt.Comment, Chains: map[string]*nftjson.Chain{}},
		Maps: map[string]*kernelMap{}, Counters: map[string]Counter{}}
	for n := range s.chains {
		if c := kt.Chains[n]; c != nil {
			s.ksub.Chains[n] = c
		}
	}
	for n := range s.counters {
		if c, ok := kt.Counters[n]; ok {
			s.ksub.Counters[n] = c
		}
	}
	for n := range s.objs {
		km := kt.Maps[n]
		if km == nil {
			continue
		}
		cp := *km // readLost may replace its elements
		if s.own[n] {
			cp.Elems = map[string]string{}
			for k := range s.shared[n] {
				if v, ok := km.Elems[k]; ok {
					cp.Elems[k] = v
				}
			}
		}
		s.ksub.Maps[n] = &cp
	}
	return s, true
}

// scopes returns the scope of every table of tables, or false when one of them needs the
// whole diff: the cache must hold each (and no other) as last applied.
func (m *Manager) scopes(tables []*Table, existing []TableRef) ([]*partScope, bool) {
	if len(existing) != len(tables) || len(m.cache.tables) != len(tables) {
		return nil, false
	}
	out := make([]*partScope, 0, len(tables))
	for _, t := range tables {
		if !slices.Contains(existing, t.ref()) {
			return nil, false
		}
		s, ok := scopeOf(m.cache.rendered[t.ref()], t, m.cache.tables[t.ref()])
		if !ok {
			return nil, false
		}
		out = append(out, s)
	}
	return out, true
}

// applyScopes is apply for tables whose scopes are known (the cache is trusted).
func (m *Manager) applyScopes(ctx context.Context, scopes []*partScope, tables []*Table, res Result) (Result, error) {
	tx := newTxn()
	rewritten := make([][]string, len(scopes))
	for i, s := range scopes {
		if err := m.readLost(ctx, s.sub, s.ksub); err != nil {
			return res, err
		}
		rewritten[i] = m.update(tx, s.ksub, s.sub, &res)
	}
	res.Operations = tx.NumOperations()
	if res.Operations > 0 {
		if err := m.run(ctx, tx, tables, &res); err != nil {
			return res, err
		}
	}
	for i, s := range scopes {
		m.cache.patch(s, rewritten[i])
	}
	m.expect = m.cache.tables
	return res, nil
}

// patch brings the cache to what an apply of s left (it changed nothing else).
func (c *kernelCache) patch(s *partScope, rewritten []string) {
	ref := s.t.ref()
	kt, ks := c.tables[ref], known(s.sub)
	for n := range s.chains {
		old, now := kt.Chains[n], ks.Chains[n]
		redo := slices.Contains(rewritten, n)
		if old != nil && (now == nil || redo) {
			for _, rl := range old.Rules { // the old rules' expressions, retired
				k := ruleKey{ref, n, rl.Comment}
				if e, ok := c.exprs[k]; ok {
					c.retire(k, e)
					delete(c.exprs, k)
				}
			}
		}
		settled := now == nil
		if now != nil && redo {
			var rules []*knftables.Rule
			for _, rl := range s.sub.Rules {
				if rl.Chain == n {
					rules = append(rules, rl)
				}
			}
			settled = c.recall(ref, n, rules)
		}
		switch {
		case now == nil:
			delete(kt.Chains, n)
		default:
			kt.Chains[n] = now
			if redo && !settled {
				c.markUnread(ref, n)
			}
		}
		if settled && c.unread[ref] != nil {
			c.unread[ref] = slices.DeleteFunc(c.unread[ref], func(u string) bool { return u == n })
		}
	}
	if len(c.unread[ref]) == 0 {
		delete(c.unread, ref)
	}
	if len(s.counters) > 0 {
		// A new map: CounterTables handed the old one out, to be read without the
		// Manager's lock (the agent's status and metrics, while it syncs).
		kt.Counters = maps.Clone(kt.Counters)
	}
	for n := range s.counters {
		if v, ok := ks.Counters[n]; ok {
			kt.Counters[n] = v
		} else {
			delete(kt.Counters, n)
		}
	}
	for n := range s.objs {
		if s.own[n] {
			km := kt.Maps[n]
			for k := range s.shared[n] {
				delete(km.Elems, k)
			}
			for k, v := range ks.Maps[n].Elems {
				km.Elems[k] = v
			}
			continue
		}
		delete(c.allowed, mapKey{ref, n})
		if a, ok := s.sub.Dynamic[n]; ok {
			c.allowed[mapKey{ref, n}] = a
		}
		if km := ks.Maps[n]; km != nil {
			kt.Maps[n] = km
		} else {
			delete(kt.Maps, n)
		}
	}
	c.rendered[ref] = s.t
}
