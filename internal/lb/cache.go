package lb

import (
	"slices"
	"time"

	"sigs.k8s.io/knftables"

	"github.com/hostaccel/hostaccel/internal/nftjson"
)

// kernelCache is what the Manager believes the kernel holds, as its last apply left it: the
// tables (their maps' elements, their chains' rule comments), the expressions of the rules
// as last read (to see someone's edits), and the values each dynamic map's entries may point
// at. It answers what a partial apply must read or change; when it knows nothing (first
// apply, after a failure or a Remove), the Manager reads the kernel whole.
type kernelCache struct {
	tables   map[TableRef]*kernelTable // nil: nothing known
	exprs    map[ruleKey]string        // normalised rule expressions as last read
	allowed  map[mapKey]map[string]bool
	lastFull time.Time // when the tables were last read whole
	// unread are chains an ApplyChanges rewrote without reading them back (that listing
	// costs nft the whole ruleset): their rules have no expressions yet, so they cannot be
	// seen as edited until Settle (or a full read) reads them.
	unread map[TableRef][]string
	// rendered is each table as the last apply rendered it: with what the tables hold, it
	// tells an apply which parts of a table changed (partScope).
	rendered map[TableRef]*Table
	// retired are the expressions read of rules a rewrite took out of their chain. A rule's
	// comment hashes its chain and its text, so a rule that comes back with the same
	// comment has the same expression: its chain needs no reading back (a service whose
	// slots go 2 -> 1 -> 2 is read once per shape, not after every change).
	retired map[ruleKey]string
	// shapes are the renderings of service chains' rules learnt by shape (shapes.go).
	shapes map[string]*shape
}

// maxRetired bounds kernelCache.retired (past it, it starts over).
const maxRetired = 1 << 16

type ruleKey struct {
	table          TableRef
	chain, comment string
}

type mapKey struct {
	table TableRef
	name  string
}

// known reports whether the cache holds anything a partial apply may diff against.
func (c *kernelCache) known() bool { return c.tables != nil }

// forget drops everything: the next apply reads the kernel whole.
func (c *kernelCache) forget() { *c = kernelCache{} }

// distrust drops the tables but keeps the rule expressions (someone may have changed the
// tables): the next apply reads the kernel whole and still sees edited rules.
func (c *kernelCache) distrust() { c.tables, c.rendered = nil, nil }

// fullDue reports whether the last full read is at least every ago (every <= 0: always).
func (c *kernelCache) fullDue(every time.Duration) bool {
	return every <= 0 || time.Since(c.lastFull) >= every
}

// table is a copy of ref as the last apply left it (nil: unknown), for the next to change.
func (c *kernelCache) table(ref TableRef) *kernelTable {
	k := c.tables[ref]
	if k == nil {
		return nil
	}
	// The maps are copied, their elements shared: an apply replaces a map's Elems (readLost),
	// it never writes into them.
	cp := &kernelTable{Table: k.Table, Maps: make(map[string]*kernelMap, len(k.Maps)), Counters: k.Counters}
	for n, km := range k.Maps {
		m := *km
		cp.Maps[n] = &m
	}
	return cp
}

// lost reports whether a backend that dynamic map name of t could point at is gone since
// the last apply: its entries must then be read, to forget those.
func (c *kernelCache) lost(t *Table, name string) bool {
	now := t.Dynamic[name]
	for v := range c.allowed[mapKey{t.ref(), name}] {
		if !now[v] {
			return true
		}
	}
	return false
}

// edited reports whether the kernel's rule got of chain differs from what was last read of
// it (someone edited it). A rule listed without its expression, or never read, is not.
func (c *kernelCache) edited(ref TableRef, chain string, got *nftjson.Rule) bool {
	was := c.exprs[ruleKey{ref, chain, got.Comment}]
	if got.Expr != "" && was != "" && was != normExpr(got.Expr) {
		c.distrustShape(ref, chain, got.Comment) // it may have been predicted
		return true
	}
	return false
}

// next starts the cache that follows an apply of tables: each as the apply leaves it, with
// the rule expressions this cache has of them (to be overwritten by what is read anew).
func (c *kernelCache) next(tables []*Table) *kernelCache {
	n := &kernelCache{tables: map[TableRef]*kernelTable{}, exprs: map[ruleKey]string{},
		allowed: map[mapKey]map[string]bool{}, lastFull: c.lastFull, unread: map[TableRef][]string{}, rendered: map[TableRef]*Table{}}
	for _, t := range tables {
		ref := t.ref()
		n.tables[ref] = known(t)
		n.rendered[ref] = t
		for name, a := range t.Dynamic {
			n.allowed[mapKey{ref, name}] = a
		}
	}
	// Only the rules the tables still have: a rule's comment names its content, so a
	// service changed back and forth would otherwise leave an expression per version. The
	// others are retired (bounded), for when they come back.
	for _, t := range tables {
		for _, rl := range t.Rules {
			k := ruleKey{t.ref(), rl.Chain, *rl.Comment}
			if v, ok := c.exprs[k]; ok {
				n.exprs[k] = v
			}
		}
	}
	n.retired, n.shapes = c.retired, c.shapes
	for k, v := range c.exprs {
		if _, kept := n.exprs[k]; !kept {
			n.retire(k, v)
		}
	}
	for ref, chains := range c.unread { // (markUnread keeps each list free of repeats)
		if kt := n.tables[ref]; kt != nil {
			for _, ch := range chains {
				if kt.Chains[ch] != nil {
					n.unread[ref] = append(n.unread[ref], ch)
				}
			}
		}
	}
	return n
}

// leaveUnread marks chains of t rewritten and not read back, unless the expressions of all
// their rules are known (recall): the expressions they have are dropped until Settle reads
// them.
// (Sets of names, not slices.Contains: a table the agent created whole leaves all of its
// chains here, 5,000 at 5,000 services, which a scan per rule made ~95 ms.)
func (c *kernelCache) leaveUnread(t *Table, chains []string) {
	ref := t.ref()
	rules := make(map[string][]*knftables.Rule, len(chains))
	for _, ch := range chains {
		rules[ch] = nil
	}
	for _, rl := range t.Rules {
		if r, ok := rules[rl.Chain]; ok {
			rules[rl.Chain] = append(r, rl)
		}
	}
	var unknown []string
	for _, ch := range chains {
		if !c.recall(ref, ch, rules[ch]) {
			unknown = append(unknown, ch)
		}
	}
	isUnknown := nameSet(unknown)
	for k := range c.exprs {
		if k.table == ref && isUnknown[k.chain] {
			delete(c.exprs, k)
		}
	}
	c.markUnread(ref, unknown...)
}

// nameSet is the set of names.
func nameSet(names []string) map[string]bool {
	set := make(map[string]bool, len(names))
	for _, n := range names {
		set[n] = true
	}
	return set
}

// markUnread adds chains to ref's unread ones, each once.
func (c *kernelCache) markUnread(ref TableRef, chains ...string) {
	if len(chains) == 0 {
		return
	}
	if c.unread == nil {
		c.unread = map[TableRef][]string{}
	}
	have := nameSet(c.unread[ref])
	for _, ch := range chains {
		if !have[ch] {
			have[ch] = true
			c.unread[ref] = append(c.unread[ref], ch)
		}
	}
}

// retire keeps the expression of a rule that leaves its chain, for its return.
func (c *kernelCache) retire(k ruleKey, expr string) {
	if c.retired == nil || len(c.retired) >= maxRetired {
		c.retired = map[ruleKey]string{}
	}
	c.retired[k] = expr
}

// recall gives the rules of chain the expressions known of them, kept or retired, or
// predicted from their shape (shapes.go), and reports whether every one has one: the chain
// then needs no reading back.
func (c *kernelCache) recall(ref TableRef, chain string, rules []*knftables.Rule) bool {
	found := make([]string, len(rules))
	for i, rl := range rules {
		k := ruleKey{ref, chain, *rl.Comment}
		if e, ok := c.exprs[k]; ok {
			found[i] = e
		} else if e, ok := c.retired[k]; ok {
			found[i] = e
		} else if e, ok := c.predict(ref, chain, rl.Rule); ok {
			found[i] = e
		} else {
			return false
		}
	}
	for i, rl := range rules {
		k := ruleKey{ref, chain, *rl.Comment}
		c.exprs[k] = found[i]
		delete(c.retired, k)
	}
	return true
}

// readRules remembers the expressions of the rules of kt's chains (all, or those named).
func (c *kernelCache) readRules(ref TableRef, kt *kernelTable, chains ...string) {
	only := nameSet(chains)
	if c.unread == nil {
		c.unread = map[TableRef][]string{}
	}
	c.unread[ref] = slices.DeleteFunc(c.unread[ref], func(n string) bool { return len(chains) == 0 || only[n] })
	if len(c.unread[ref]) == 0 {
		delete(c.unread, ref)
	}
	for name, ch := range kt.Chains {
		if len(chains) > 0 && !only[name] {
			continue
		}
		for _, rl := range ch.Rules {
			c.exprs[ruleKey{ref, name, rl.Comment}] = normExpr(rl.Expr)
		}
	}
}
