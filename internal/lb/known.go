package lb

import (
	"bytes"
	"context"
	"encoding/gob"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"sigs.k8s.io/knftables"

	"github.com/hostaccel/hostaccel/internal/nftjson"
	"github.com/hostaccel/hostaccel/internal/nftlist"
	"github.com/hostaccel/hostaccel/internal/runfile"
)

// A one-shot `hostaccel apply` starts with an empty cache, and reading the tables back whole
// costs nft a listing of the ruleset and us its parse: at 10,000 backends most of the run,
// for a change of one element (issue 13). So Apply keeps its cache in a file (KnownDir) with
// the ruleset's generation after its transaction: the kernel counts every transaction that
// changed something, by anyone, so the next process that finds the generation unchanged knows
// the tables are as the file says, and diffs against it as the agent diffs against its
// memory. Any other generation (someone changed a table: ours or not) and the tables are read
// whole, as before. The generation after our transaction is only recorded when it proves that
// no one else's came between: it is the one read before the apply (nothing changed), or the
// next one and our transaction certainly changed something (it deletes something or adds a
// rule: a transaction of adds only may change nothing, and then the next generation would be
// someone else's). Otherwise the file is removed, and the next run reads the tables whole.

// DefaultKnownDir holds the one-shot apply's cache, one file per network namespace
// (tmpfs: a reboot empties it, as it empties the ruleset).
const DefaultKnownDir = "/run/hostaccel"

// knownFormat names the file's layout; a file of another is ignored.
const knownFormat = "hostaccel-lb-known/2"

// knownGlob matches the cache files in KnownDir (not the temporary files of replaceFile).
const knownGlob = "lb-known-*.gob"

// knownFile is the cache as a file: the tables as the last apply left them, in the network
// namespace NetNS (a cookie: never reused in a boot) of boot Boot at ruleset generation Gen.
type knownFile struct {
	Format string
	Gen    uint32
	NetNS  uint64
	Boot   string
	Tables []knownTable
}

type knownTable struct {
	Family  knftables.Family
	Name    string
	Comment string
	// Chains are each chain's rule comments, in order.
	Chains   map[string][]string
	Maps     map[string]knownMap
	Counters map[string]string // name -> comment
	// Allowed are the values each dynamic map's entries may point at.
	Allowed map[string][]string
	// Exprs are rule expressions as last read: chain, rule comment, expression.
	Exprs  [][3]string
	Unread []string
}

type knownMap struct {
	Set     bool
	Dynamic bool
	Comment string
	Elems   map[string]string
}

// knownPath is the file of the network namespace of g (one of knownGlob).
func (m *Manager) knownPath(g nftlist.Generation) string {
	return filepath.Join(m.KnownDir, fmt.Sprintf("lb-known-%d.gob", g.NetNSInode))
}

// generation reads the ruleset's generation with read (ok false: read is nil, or the
// kernel does not tell the namespace or the boot, so a generation proves nothing).
func generation(ctx context.Context, read func(context.Context) (nftlist.Generation, error)) (g nftlist.Generation, ok bool) {
	if read == nil {
		return g, false
	}
	g, err := read(ctx)
	if err != nil || g.NetNS == 0 || g.Boot == "" {
		slog.Debug("load balancer: no ruleset generation: the tables are read whole when due", "err", err)
		return g, false
	}
	return g, true
}

func (m *Manager) generation(ctx context.Context) (nftlist.Generation, bool) {
	return generation(ctx, m.Generation)
}

// sameNamespace reports whether a and b are generations of one namespace's ruleset.
func sameNamespace(a, b nftlist.Generation) bool {
	return a.NetNS == b.NetNS && a.NetNSInode == b.NetNSInode && a.Boot == b.Boot
}

// sameRuleset reports whether a and b are one ruleset at one generation.
func sameRuleset(a, b nftlist.Generation) bool { return a.ID == b.ID && sameNamespace(a, b) }

// prefetch is what Prefetch read for the next Apply.
type prefetch struct {
	done chan struct{} // closed when read; nil: nothing was prefetched
	gen  nftlist.Generation
	ok   bool
	read bool // the cache file was read: file or err
	file *knownFile
	err  error
}

// Prefetch starts reading, on another goroutine, what the next Apply reads first: the
// ruleset's generation and, while the Manager knows nothing yet, the cache file. A one-shot
// apply reads them while it resolves and renders (the file alone is ~4 ms at 10,000
// backends). The Manager's fields must not change until that Apply.
func (m *Manager) Prefetch(ctx context.Context) {
	p := &prefetch{done: make(chan struct{})}
	file := m.KnownDir != "" && !m.cache.known()
	go func() {
		defer close(p.done)
		p.gen, p.ok = m.generation(ctx)
		if p.ok && file {
			p.read = true
			p.file, p.err = readKnown(m.knownPath(p.gen), p.gen)
		}
	}()
	m.prefetched = p
}

// takePrefetch waits for what Prefetch started, if anything, and hands it over.
func (m *Manager) takePrefetch() prefetch {
	p := m.prefetched
	if p == nil {
		return prefetch{}
	}
	m.prefetched = nil
	<-p.done
	return *p
}

// recall takes the cache from the file when the Manager knows nothing yet (g: the ruleset's
// generation before the apply reads anything): trusted when the generation is the file's,
// else only for the rule expressions (the tables are read whole, and what changed since is
// Result.Drift).
func (m *Manager) recall(g nftlist.Generation, pre prefetch) {
	if m.cache.known() {
		return
	}
	path := m.knownPath(g)
	k, err := pre.file, pre.err
	if !pre.read {
		k, err = readKnown(path, g)
	}
	switch {
	case err != nil:
		if !errors.Is(err, os.ErrNotExist) {
			slog.Debug("load balancer: ignoring the cache file", "path", path, "err", err)
		}
	case k.Gen != g.ID:
		slog.Debug("load balancer: the ruleset changed since the last apply: the tables are read whole",
			"generation", g.ID, "cached", k.Gen)
		m.cache = k.cache()
		m.expect = m.cache.tables
		m.cache.distrust()
	default:
		slog.Debug("load balancer: the ruleset is as the last apply left it: diffing against its cache", "generation", g.ID)
		m.cache = k.cache()
		m.expect = m.cache.tables
		m.quiet = &g
	}
}

// prove sets quiet to the ruleset's generation after a successful apply that began at was,
// when that proves no one else's transaction came between (see above).
func (m *Manager) prove(ctx context.Context, was nftlist.Generation) {
	now, ok := m.generation(ctx)
	sure := surelyChanges(m.lastTx)
	switch {
	case !ok || !sameNamespace(now, was):
	case !sure && now.ID == was.ID || sure && now.ID == was.Next().ID:
		m.quiet = &now
	default:
		slog.Debug("load balancer: the ruleset changed beside this apply: the tables are read whole when due",
			"before", was.ID, "after", now.ID)
	}
}

// unchangedSince reports whether the ruleset is still at the generation our last apply
// proved (g: the generation now): then no one changed our tables, and the cache is as good
// as a full read (it counts as one).
func (m *Manager) unchangedSince(g nftlist.Generation, ok bool) bool {
	if !ok || m.quiet == nil || !sameRuleset(g, *m.quiet) {
		return false
	}
	m.cache.lastFull = time.Now()
	m.Reads.FullSkipped++
	if m.Log != nil {
		m.Log.Debug("full read skipped: no transaction since our last apply", "generation", g.ID, "skipped", m.Reads.FullSkipped)
	}
	return true
}

// keep writes the cache to the file after an apply that began at generation was when the
// generation after it proves the cache exact (quiet), or else removes the file.
func (m *Manager) keep(was nftlist.Generation) {
	path := m.knownPath(was)
	if m.quiet != nil && m.cache.known() {
		werr := writeKnown(path, m.cache.file(*m.quiet))
		if werr == nil {
			runfile.Prune(path, knownGlob, runfile.Keep)
			return
		}
		slog.Debug("load balancer: cannot write the cache file", "err", werr)
	}
	if rerr := os.Remove(path); rerr != nil && !errors.Is(rerr, os.ErrNotExist) {
		slog.Debug("load balancer: cannot remove the cache file", "err", rerr)
	}
}

// forgetKnown removes the file of the current network namespace (Remove).
func (m *Manager) forgetKnown(ctx context.Context) {
	if m.KnownDir == "" || m.Generation == nil {
		return
	}
	if g, err := m.Generation(ctx); err == nil {
		_ = os.Remove(m.knownPath(g))
	}
}

// surelyChanges reports whether tx, when it succeeds, changes the kernel: it deletes
// something (which fails when it is not there) or adds a rule (always a new one). Adds of
// other objects and elements that are there already change nothing.
func surelyChanges(tx *knftables.Transaction) bool {
	if tx == nil {
		return false
	}
	for line := range strings.Lines(tx.String()) {
		if strings.HasPrefix(line, "delete ") || strings.HasPrefix(line, "add rule ") ||
			strings.HasPrefix(line, "insert rule ") || strings.HasPrefix(line, "replace rule ") {
			return true
		}
	}
	return false
}

// file is c as a knownFile at generation g.
func (c *kernelCache) file(g nftlist.Generation) *knownFile {
	f := &knownFile{Format: knownFormat, Gen: g.ID, NetNS: g.NetNS, Boot: g.Boot}
	for _, ref := range slices.SortedFunc(maps.Keys(c.tables), func(a, b TableRef) int { return strings.Compare(a.String(), b.String()) }) {
		kt := c.tables[ref]
		t := knownTable{Family: ref.Family, Name: ref.Name, Comment: kt.Comment, Chains: map[string][]string{},
			Maps: map[string]knownMap{}, Counters: map[string]string{}, Allowed: map[string][]string{}, Unread: c.unread[ref]}
		for name, ch := range kt.Chains {
			comments := make([]string, len(ch.Rules))
			for i, r := range ch.Rules {
				comments[i] = r.Comment
			}
			t.Chains[name] = comments
		}
		for name, km := range kt.Maps {
			t.Maps[name] = knownMap{Set: km.IsSet, Dynamic: km.Dynamic, Comment: km.Comment, Elems: km.Elems}
		}
		for name, ct := range kt.Counters {
			t.Counters[name] = ct.Comment
		}
		for k, a := range c.allowed {
			if k.table == ref {
				t.Allowed[k.name] = slices.Sorted(maps.Keys(a))
			}
		}
		for k, e := range c.exprs {
			if k.table == ref {
				t.Exprs = append(t.Exprs, [3]string{k.chain, k.comment, e})
			}
		}
		slices.SortFunc(t.Exprs, func(a, b [3]string) int { return strings.Compare(a[0]+"\x00"+a[1], b[0]+"\x00"+b[1]) })
		f.Tables = append(f.Tables, t)
	}
	return f
}

// cache is the kernelCache f holds (rendered unknown: an apply diffs whole tables).
func (f *knownFile) cache() kernelCache {
	c := kernelCache{tables: map[TableRef]*kernelTable{}, exprs: map[ruleKey]string{}, allowed: map[mapKey]map[string]bool{},
		unread: map[TableRef][]string{}}
	for _, t := range f.Tables {
		ref := TableRef{t.Family, t.Name}
		kt := &kernelTable{Table: &nftjson.Table{Family: string(t.Family), Name: t.Name, Comment: t.Comment, Chains: map[string]*nftjson.Chain{}},
			Maps: map[string]*kernelMap{}, Counters: map[string]Counter{}}
		for name, comments := range t.Chains {
			rules := make([]*nftjson.Rule, len(comments))
			for i, cm := range comments {
				rules[i] = &nftjson.Rule{Comment: cm}
			}
			kt.Chains[name] = &nftjson.Chain{Rules: rules}
		}
		for name, km := range t.Maps {
			elems := km.Elems
			if elems == nil {
				elems = map[string]string{}
			}
			kt.Maps[name] = &kernelMap{IsSet: km.Set, Dynamic: km.Dynamic, Comment: km.Comment, Elems: elems}
		}
		for name, cm := range t.Counters {
			kt.Counters[name] = Counter{Comment: cm}
		}
		for name, vals := range t.Allowed {
			c.allowed[mapKey{ref, name}] = nameSet(vals)
		}
		for _, e := range t.Exprs {
			c.exprs[ruleKey{ref, e[0], e[1]}] = e[2]
		}
		if len(t.Unread) > 0 {
			c.unread[ref] = t.Unread
		}
		c.tables[ref] = kt
	}
	return c
}

// readKnown reads the file at path, if it is a cache of the network namespace of g.
func readKnown(path string, g nftlist.Generation) (*knownFile, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	f, err := decodeKnown(b)
	if err != nil {
		return nil, err
	}
	switch {
	case f.Format != knownFormat:
		return nil, fmt.Errorf("format %q, not %q", f.Format, knownFormat)
	case f.NetNS != g.NetNS || f.Boot != g.Boot:
		return nil, errors.New("another network namespace's, or another boot's")
	}
	seen := map[TableRef]bool{}
	for _, t := range f.Tables {
		ref := TableRef{t.Family, t.Name}
		if !ref.ours() || seen[ref] {
			return nil, fmt.Errorf("table %s: not one of the load balancer's, or twice", ref)
		}
		seen[ref] = true
	}
	return f, nil
}

// encodeKnown and decodeKnown write and read the file's bytes: gob, which at 10,000 backends
// takes half the time of JSON (~7 against ~14 ms both ways).
func encodeKnown(f *knownFile) ([]byte, error) {
	var b bytes.Buffer
	err := gob.NewEncoder(&b).Encode(f)
	return b.Bytes(), err
}

func decodeKnown(b []byte) (*knownFile, error) {
	var f knownFile
	if err := gob.NewDecoder(bytes.NewReader(b)).Decode(&f); err != nil {
		return nil, err
	}
	return &f, nil
}

// writeKnown replaces the file at path with f (a reader sees the old file or the new one).
func writeKnown(path string, f *knownFile) error {
	b, err := encodeKnown(f)
	if err != nil {
		return err
	}
	return replaceFile(path, b, false) // a cache: a crash costs a full read, no fsync
}
