package lb

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"regexp"
	"slices"
	"sort"
	"strings"
	"time"

	"sigs.k8s.io/knftables"

	"github.com/hostaccel/hostaccel/internal/nftjson"
)

// Manager owns the load balancer's tables in one network namespace; it is the only code of
// the load balancer that changes the kernel. Every Apply is one nft transaction.
//
// Reading a table back costs time in proportion to its dynamic maps (flows, persistent
// clients: up to 65536 entries each), so Apply reads the kernel whole only every FullEvery
// (drift repair), after a failed transaction, and on its first run; in between it diffs
// against what its last apply left, and reads single dynamic maps only when a backend their
// entries may point at is gone.
type Manager struct {
	NFT       knftables.Interface // not bound to a table: objects name theirs
	List      Lister
	Tables    func(context.Context) ([]TableRef, error)
	FullEvery time.Duration

	known    map[TableRef]*kernelTable // the tables as the last apply left them
	lastFull time.Time
	exprs    map[string]string          // table/chain/comment -> rule expression as last read
	allowed  map[string]map[string]bool // table/map -> values a dynamic map's entries could point at
}

// DefaultFullEvery is how often Apply reads the tables back whole (drift repair).
const DefaultFullEvery = 25 * time.Second

// NewManager returns a Manager on the real nft binary.
func NewManager() (*Manager, error) {
	nft, err := knftables.New("", "")
	if err != nil {
		return nil, err
	}
	return &Manager{NFT: nft, List: NFTList, Tables: ListTables, FullEvery: DefaultFullEvery}, nil
}

// Result says what one Apply changed.
type Result struct {
	Operations int `json:"operations"`
	// FullRead: the tables were read back whole from the kernel (drift repair).
	FullRead bool `json:"fullRead"`
	// Tables created whole, with the reason ("inet hostaccel-lb: missing").
	Rebuilt []string `json:"rebuilt,omitempty"`
	Removed []string `json:"removed,omitempty"`
	// Chains whose rules were replaced (a service's structure changed, e.g. its number of
	// slots, or someone edited them).
	ChainsRewritten []string `json:"chainsRewritten,omitempty"`
	MapsReplaced    []string `json:"mapsReplaced,omitempty"`
	ElementsAdded   int      `json:"elementsAdded"`
	ElementsRemoved int      `json:"elementsRemoved"`
	// FlowsForgotten counts flow-table and persistence entries deleted because their backend
	// went down or away.
	FlowsForgotten int `json:"flowsForgotten"`
}

// Changed reports whether the kernel was changed.
func (r Result) Changed() bool { return r.Operations > 0 }

// Apply makes the kernel's load balancer tables match r in one atomic transaction, changing
// as little as it can: backends come and go as map elements; a chain's rules are replaced
// only when they differ (its service's structure changed, or someone edited them); a map is
// recreated only when its type changed; a table is created whole only when it is missing or
// its layout changed. Our tables that r does not have are deleted. Dynamic maps (flows,
// persistent clients) keep their entries, except those pointing at backends that are gone.
func (m *Manager) Apply(ctx context.Context, r *Ruleset) (Result, error) {
	return m.applyAs(ctx, r, m.FullEvery <= 0 || time.Since(m.lastFull) >= m.FullEvery)
}

// ApplyChanges is Apply without the periodic full read: for changes that must reach the
// kernel fast (health transitions, API calls); the tables are still read whole on a first
// apply and after a failed transaction.
func (m *Manager) ApplyChanges(ctx context.Context, r *Ruleset) (Result, error) {
	return m.applyAs(ctx, r, m.FullEvery <= 0)
}

func (m *Manager) applyAs(ctx context.Context, r *Ruleset, full bool) (Result, error) {
	full = full || m.known == nil
	res, err := m.apply(ctx, r, full)
	if err != nil && !full {
		// What we remembered may be stale (someone changed the tables): read them and retry.
		m.known = nil
		return m.apply(ctx, r, true)
	}
	return res, err
}

func (m *Manager) apply(ctx context.Context, r *Ruleset, full bool) (Result, error) {
	res := Result{FullRead: full}
	existing, err := m.ours(ctx)
	if err != nil {
		return res, err
	}
	tx := m.NFT.NewTransaction()
	want := map[TableRef]bool{}
	for _, t := range r.Tables {
		want[TableRef{t.Family, t.Name}] = true
	}
	for _, ref := range existing {
		if !want[ref] {
			tx.Delete(&knftables.Table{Family: ref.Family, Name: ref.Name})
			res.Removed = append(res.Removed, ref.String())
		}
	}
	read := map[TableRef]*kernelTable{} // tables read from the kernel
	rebuilt := map[TableRef]bool{}
	rewritten := map[TableRef][]string{}
	for _, t := range r.Tables {
		ref := TableRef{t.Family, t.Name}
		var kt *kernelTable
		switch {
		case !slices.Contains(existing, ref):
		case full || m.known[ref] == nil:
			if kt, err = m.observe(ctx, ref, false); err != nil {
				return res, err
			}
			read[ref] = kt
		default:
			if kt, err = m.remembered(ctx, ref, t); err != nil {
				return res, err
			}
		}
		switch {
		case kt == nil:
			res.Rebuilt = append(res.Rebuilt, ref.String()+": missing")
			rebuilt[ref] = true
			t.addAll(tx)
		case kt.Comment != t.Comment:
			res.Rebuilt = append(res.Rebuilt, ref.String()+": layout changed")
			rebuilt[ref] = true
			tx.Delete(t.table())
			t.addAll(tx)
		default:
			rewritten[ref] = m.update(tx, kt, t, &res)
		}
	}
	res.Operations = tx.NumOperations()
	if res.Operations > 0 {
		if err := m.NFT.Run(ctx, tx); err != nil {
			return res, fmt.Errorf("nft transaction (nothing was changed): %w", err)
		}
	}
	// Remember what the kernel has now, and the rules' expressions (drift detection).
	exprs := map[string]string{}
	record := func(t *Table, kt *kernelTable, chains ...string) {
		for name, c := range kt.Chains {
			if len(chains) > 0 && !slices.Contains(chains, name) {
				continue
			}
			for _, rl := range c.Rules {
				exprs[t.Name+"/"+name+"/"+rl.Comment] = normExpr(rl.Expr)
			}
		}
	}
	m.known, m.allowed = map[TableRef]*kernelTable{}, map[string]map[string]bool{}
	for _, t := range r.Tables {
		ref := TableRef{t.Family, t.Name}
		m.known[ref] = known(t)
		for name, a := range t.Dynamic {
			m.allowed[t.Name+"/"+name] = a
		}
		for k, v := range m.exprs {
			if strings.HasPrefix(k, t.Name+"/") {
				exprs[k] = v
			}
		}
		switch {
		case rebuilt[ref]:
			kt, err := m.observe(ctx, ref, true)
			if err != nil {
				return res, err
			}
			record(t, kt)
		case len(rewritten[ref]) > 0:
			for _, c := range rewritten[ref] {
				out, err := m.List(ctx, "list", "chain", string(ref.Family), ref.Name, c)
				if err != nil {
					return res, err
				}
				kt, err := parseTable(ref, out)
				if err != nil {
					return res, err
				}
				record(t, kt, c)
			}
		}
		if kt := read[ref]; kt != nil {
			var kept []string
			for name := range kt.Chains {
				if !slices.Contains(rewritten[ref], name) {
					kept = append(kept, name)
				}
			}
			if len(kept) > 0 {
				record(t, kt, kept...)
			}
		}
	}
	m.exprs = exprs
	if full {
		m.lastFull = time.Now()
	}
	return res, nil
}

// remembered is the table as our last apply left it, plus the entries of the dynamic maps
// that may point at a backend that is gone since (read from the kernel, map by map).
func (m *Manager) remembered(ctx context.Context, ref TableRef, t *Table) (*kernelTable, error) {
	kt := cloneKnown(m.known[ref])
	for name, now := range t.Dynamic {
		gone := false
		for v := range m.allowed[t.Name+"/"+name] {
			gone = gone || !now[v]
		}
		if !gone || kt.Maps[name] == nil {
			continue
		}
		names := []string{name}
		if p := t.Paired[name]; p != "" {
			names = append(names, p)
		}
		for other, p := range t.Paired {
			if p == name {
				names = append(names, other)
			}
		}
		for _, n := range names {
			out, err := m.List(ctx, "list", "map", string(ref.Family), ref.Name, n)
			if err != nil {
				return nil, err
			}
			got, err := parseTable(ref, out)
			if err != nil {
				return nil, err
			}
			if got.Maps[n] != nil {
				kt.Maps[n].Elems = got.Maps[n].Elems
			}
		}
	}
	return kt, nil
}

func cloneKnown(k *kernelTable) *kernelTable {
	c := &kernelTable{Table: k.Table, Maps: map[string]*kernelMap{}, Counters: k.Counters}
	for n, km := range k.Maps {
		cp := *km
		cp.Elems = maps.Clone(km.Elems)
		c.Maps[n] = &cp
	}
	return c
}

func (m *Manager) ours(ctx context.Context) ([]TableRef, error) {
	all, err := m.Tables(ctx)
	if err != nil {
		return nil, err
	}
	var out []TableRef
	for _, t := range all {
		if t.ours() {
			out = append(out, t)
		}
	}
	return out, nil
}

var mapRef = regexp.MustCompile(`@([A-Za-z0-9_.-]+)`)

// update adds to tx what turns kt into t, in an order nft accepts within one transaction:
// stale elements out, chains to rewrite flushed (dropping their references), chains and maps
// to go deleted, new maps and chains added, rules added, new elements added.
func (m *Manager) update(tx *knftables.Transaction, kt *kernelTable, t *Table, res *Result) (rewritten []string) {
	fam, tab := t.Family, t.Name
	// Maps and sets: new, replaced (their definition changed) or kept.
	type object struct {
		name, comment string
		add           func()
	}
	var objs []object
	for _, s := range t.Sets {
		objs = append(objs, object{s.Name, *s.Comment, func() { tx.Add(s) }})
	}
	for _, mp := range t.Maps {
		objs = append(objs, object{mp.Name, *mp.Comment, func() { tx.Add(mp) }})
	}
	replaced, added, wanted := map[string]bool{}, map[string]bool{}, map[string]bool{}
	for _, o := range objs {
		wanted[o.name] = true
		switch km := kt.Maps[o.name]; {
		case km == nil:
			added[o.name] = true
		case km.Comment != o.comment:
			replaced[o.name] = true
			res.MapsReplaced = append(res.MapsReplaced, tab+" "+o.name)
		}
	}
	// Chains: new, rewritten (rules differ, or they use a replaced map) or kept.
	rules := map[string][]*knftables.Rule{}
	for _, rl := range t.Rules {
		rules[rl.Chain] = append(rules[rl.Chain], rl)
	}
	rewrite, newChain, wantChain := map[string]bool{}, map[string]bool{}, map[string]bool{}
	for _, c := range t.Chains {
		wantChain[c.Name] = true
		kc := kt.Chains[c.Name]
		if kc == nil {
			newChain[c.Name] = true
			continue
		}
		want := rules[c.Name]
		same := len(kc.Rules) == len(want)
		for i := 0; same && i < len(want); i++ {
			key := tab + "/" + c.Name + "/" + *want[i].Comment
			got := kc.Rules[i]
			same = got.Comment == *want[i].Comment && (got.Expr == "" || m.exprs[key] == "" || m.exprs[key] == normExpr(got.Expr))
			for _, ref := range mapRef.FindAllStringSubmatch(want[i].Rule, -1) {
				same = same && !replaced[ref[1]]
			}
		}
		if !same {
			rewrite[c.Name] = true
			rewritten = append(rewritten, c.Name)
			res.ChainsRewritten = append(res.ChainsRewritten, tab+" "+c.Name)
		}
	}

	// 1. Elements that must go, from maps that stay.
	desired := map[string]map[string]string{}
	for _, e := range t.Elements {
		n := e.Set + e.Map
		if desired[n] == nil {
			desired[n] = map[string]string{}
		}
		desired[n][elemKey(e)] = elemValue(e)
	}
	for _, name := range sortedKeys(kt.Maps) {
		km := kt.Maps[name]
		if !wanted[name] || replaced[name] {
			continue
		}
		if allowed, tracked := t.Dynamic[name]; tracked {
			m.forget(tx, t, name, km, allowed, kt, res)
			continue
		}
		if km.Dynamic { // flow tables: the datapath's
			continue
		}
		for _, k := range sortedKeys(km.Elems) {
			if v, ok := desired[name][k]; !ok || v != km.Elems[k] {
				e := &knftables.Element{Family: fam, Table: tab, Map: name, Key: split(k)}
				if km.IsSet {
					e.Set, e.Map = name, ""
				}
				tx.Delete(e)
				res.ElementsRemoved++
			}
		}
	}
	// 2. Flush chains to rewrite or delete; 3. delete chains and maps that go.
	for _, name := range sortedKeys(kt.Chains) {
		if rewrite[name] || !wantChain[name] {
			tx.Flush(&knftables.Chain{Family: fam, Table: tab, Name: name})
		}
	}
	for _, name := range sortedKeys(kt.Chains) {
		if !wantChain[name] {
			tx.Delete(&knftables.Chain{Family: fam, Table: tab, Name: name})
		}
	}
	for _, name := range sortedKeys(kt.Maps) {
		if !wanted[name] || replaced[name] {
			if kt.Maps[name].IsSet {
				tx.Delete(&knftables.Set{Family: fam, Table: tab, Name: name})
			} else {
				tx.Delete(&knftables.Map{Family: fam, Table: tab, Name: name})
			}
		}
	}
	wantCounter := map[string]bool{}
	for _, c := range t.Counters {
		wantCounter[c.Name] = true
	}
	for _, name := range sortedKeys(kt.Counters) {
		if !wantCounter[name] {
			tx.Delete(&knftables.Counter{Family: fam, Table: tab, Name: name})
		}
	}
	// 4. Add maps, counters, chains, rules.
	for _, o := range objs {
		if added[o.name] || replaced[o.name] {
			o.add()
		}
	}
	for _, c := range t.Counters {
		if _, ok := kt.Counters[c.Name]; !ok {
			tx.Add(c)
		}
	}
	for _, c := range t.Chains {
		if newChain[c.Name] {
			tx.Add(c)
		}
	}
	for _, rl := range t.Rules {
		if newChain[rl.Chain] || rewrite[rl.Chain] {
			tx.Add(rl)
		}
	}
	// 5. Elements that are missing.
	for _, e := range t.Elements {
		n := e.Set + e.Map
		km := kt.Maps[n]
		if added[n] || replaced[n] || km == nil {
			tx.Add(e)
			continue
		}
		if v, ok := km.Elems[elemKey(e)]; !ok || v != elemValue(e) {
			tx.Add(e)
			res.ElementsAdded++
		}
	}
	for name := range newChain {
		rewritten = append(rewritten, name)
	}
	return rewritten
}

// forget deletes a dynamic map's entries that point at a backend no longer known (and, for a
// paired map, entries whose key left the map it completes). Each is added and deleted: an
// entry may time out between our listing and the transaction, and deleting it must not fail
// the transaction.
func (m *Manager) forget(tx *knftables.Transaction, t *Table, name string, km *kernelMap, allowed map[string]bool, kt *kernelTable, res *Result) {
	var partner map[string]bool
	if p, ok := t.Paired[name]; ok && kt.Maps[p] != nil {
		partner = map[string]bool{}
		for k, v := range kt.Maps[p].Elems {
			if t.Dynamic[p][v] {
				partner[k] = true
			}
		}
	}
	for _, k := range sortedKeys(km.Elems) {
		v := km.Elems[k]
		if allowed[v] && (partner == nil || partner[k]) {
			continue
		}
		e := &knftables.Element{Family: t.Family, Table: t.Name, Map: name, Key: split(k), Value: split(v)}
		tx.Add(e)
		tx.Delete(e)
		res.FlowsForgotten++
	}
}

// split turns a canonical element back into its parts.
func split(e string) []string { return strings.Split(e, " . ") }

// normExpr makes a rule's expressions comparable across listings (spacing, key order).
func normExpr(e string) string {
	var v any
	if json.Unmarshal([]byte("["+e+"]"), &v) != nil {
		return e
	}
	b, _ := json.Marshal(v)
	return string(b)
}

func sortedKeys[V any](m map[string]V) []string {
	k := make([]string, 0, len(m))
	for n := range m {
		k = append(k, n)
	}
	sort.Strings(k)
	return k
}

// Remove deletes every table of the load balancer, and nothing else.
func (m *Manager) Remove(ctx context.Context) ([]TableRef, error) {
	refs, err := m.ours(ctx)
	if err != nil || len(refs) == 0 {
		return nil, err
	}
	tx := m.NFT.NewTransaction()
	for _, ref := range refs {
		tx.Delete(&knftables.Table{Family: ref.Family, Name: ref.Name})
	}
	m.known, m.exprs, m.allowed = nil, nil, nil
	return refs, m.NFT.Run(ctx, tx)
}

// Observe lists the load balancer's tables as the kernel has them (for status: counters).
func (m *Manager) Observe(ctx context.Context) (map[TableRef]TableState, error) {
	refs, err := m.ours(ctx)
	if err != nil {
		return nil, err
	}
	out := map[TableRef]TableState{}
	for _, ref := range refs {
		kt, err := m.observe(ctx, ref, true)
		if err != nil {
			return nil, err
		}
		out[ref] = TableState{kt.Table, kt.Counters}
	}
	return out, nil
}

// TableState is one table as the kernel has it: rules with their counters, named counters.
type TableState struct {
	*nftjson.Table
	Counters map[string]Counter
}
