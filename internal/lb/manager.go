package lb

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strings"
	"time"

	"sigs.k8s.io/knftables"

	"github.com/hostaccel/hostaccel/internal/nftjson"
	"github.com/hostaccel/hostaccel/internal/nftlist"
)

// Manager owns the load balancer's tables in one network namespace; it is the only code of
// the load balancer that changes the kernel. Every Apply is one nft transaction.
//
// Reading a table back costs time in proportion to its dynamic maps (flows, persistent
// clients: up to 65536 entries each), so Apply reads the kernel whole only every FullEvery
// (drift repair), after a failed transaction, and on its first run; in between it diffs
// against what its last apply left (its cache), and reads single dynamic maps only when a
// backend their entries may point at is gone.
type Manager struct {
	NFT    knftables.Interface // not bound to a table: objects name theirs
	List   Lister
	Tables func(context.Context) ([]TableRef, error)
	// ReadCounter reads a table's named counters (status); nil: from nft's listing.
	ReadCounter CounterReader
	FullEvery   time.Duration

	// DeferFull: Apply does not read the tables whole itself when FullEvery is due; the
	// caller reads them apart, without holding up changes (StartFullRead, Read,
	// FinishFullRead), and the next Apply diffs against that reading (FullDue says when).
	// A first apply, and one after a failure, still read at once.
	DeferFull bool

	// DeferReadBack: Apply does not read back a table it rebuilt (created whole); the rules
	// of its chains are left unread, as those of rewritten chains are, for the caller's
	// Settle (Unsettled says when one is due). For a caller that settles (the agent): a
	// rebuild of 2,000 services waited ~0.35 s for that listing, and so did the first change
	// after the agent started. A one-shot apply reads back, for its known-state file.
	DeferReadBack bool

	// Generation reads the ruleset's generation (NewManager: the kernel's; nil: none), which
	// tells whether anyone changed the ruleset since our last apply (known.go): if not, a
	// due full read is skipped.
	Generation func(context.Context) (nftlist.Generation, error)
	// KnownDir: Apply keeps its cache in a file there (one per network namespace) for the
	// next process, which diffs against it while the ruleset's generation is the one the
	// file has (known.go). For the one-shot `hostaccel apply`.
	KnownDir string

	// Netlink, when set, sends the transactions it carries without nft (netlink.go).
	Netlink Netlink
	// Rehearse, when set, lets Settle have nft render a rewritten service chain in a
	// namespace of its own instead of listing the ruleset (rehearse.go).
	Rehearse Rehearser
	// Log, when set, says why a transaction went to nft after the netlink lane failed.
	Log *slog.Logger

	cache kernelCache
	// lastTx is the transaction the last apply ran (nil: none).
	lastTx *knftables.Transaction
	fresh  *FullRead // a full reading for the next Apply (DeferFull)
	// applies counts the applies and removals; rewritten is when (applies) each chain
	// ("table chain") was last rewritten, reshaped the last apply that rebuilt or removed a
	// table, read the tables whole or failed: a Settle's reading is dropped for the chains
	// rewritten while nft listed, or whole after such an apply (FinishSettle).
	applies   uint64
	rewritten map[string]uint64
	reshaped  uint64
	// quiet is the ruleset's generation after the last apply when it proves that no one
	// else's transaction came between (known.go): while the ruleset is still at it, no one
	// changed our tables, and a due full read is skipped (Reads counts them).
	quiet *nftlist.Generation
	// Reads counts the Manager's readings of the kernel (status, metrics).
	Reads ReadCounts
	// prefetched is what Prefetch reads for the next Apply (nil: nothing).
	prefetched *prefetch
	// closers close what NewManager opened (Close).
	closers []func()
	// expect is every table as the last successful apply left it (nil: none since
	// NewManager or Remove); unlike cache it survives a failed apply, so that a repair
	// after one still sees what someone else changed (Result.Drift).
	expect map[TableRef]*kernelTable
}

// DefaultFullEvery is how often Apply reads the tables back whole (drift repair).
const DefaultFullEvery = 25 * time.Second

// NewManager returns a Manager on the real nft binary. It makes its knftables interface
// (knftables.New runs nft --version and nft --check, ~15-20 ms) when a transaction first goes
// to nft, not for the changes the netlink lane carries (a one-shot apply of a backend change
// runs no nft at all).
func NewManager() (*Manager, error) {
	if _, err := exec.LookPath("nft"); err != nil {
		return nil, fmt.Errorf("could not find nftables binary: %w", err)
	}
	gen := &nftlist.GenReader{}
	m := &Manager{List: NFTList, Tables: ListTables, ReadCounter: NetlinkCounters, FullEvery: DefaultFullEvery,
		Generation: gen.Read, Rehearse: NFTRehearse, closers: []func(){func() { _ = gen.Close() }}}
	if os.Getenv(EnvNFTOnly) == "" {
		l := &lane{}
		m.Netlink, m.closers = l.run, append(m.closers, l.Close)
	}
	return m, nil
}

// Close closes the netlink sockets the Manager keeps open between applies (NewManager's lane
// and generation reads). A socket holds its network namespace: one left open keeps a deleted
// namespace, and its devices, alive until the process exits. A later apply opens them again.
func (m *Manager) Close() {
	for _, c := range m.closers {
		c()
	}
}

// nft returns m.NFT, made on first use.
func (m *Manager) nft() (knftables.Interface, error) {
	if m.NFT == nil {
		nft, err := knftables.New("", "")
		if err != nil {
			return nil, err
		}
		m.NFT = nft
	}
	return m.NFT, nil
}

// EnvNFTOnly, set to anything, makes every transaction nft's (no netlink lane).
const EnvNFTOnly = "HOSTACCEL_LB_NFT_ONLY"

// run runs tx: on the netlink lane when it carries it, else (or when the kernel refused the
// lane's batch, which then changed nothing) with nft.
func (m *Manager) run(ctx context.Context, tx *txn, tables []*Table, res *Result) error {
	if m.Netlink != nil {
		err := m.Netlink(ctx, tx, typeOfIn(tables))
		if err == nil {
			res.Netlink = true
			m.lastTx = tx.Transaction
			return nil
		}
		if !errors.Is(err, errLane) && m.Log != nil {
			m.Log.Warn("netlink batch refused; running the transaction with nft", "err", err)
		}
	}
	nft, err := m.nft()
	if err != nil {
		return err
	}
	if err := nft.Run(ctx, tx.Transaction); err != nil {
		return fmt.Errorf("nft transaction (nothing was changed): %w", err)
	}
	m.lastTx = tx.Transaction
	return nil
}

// typeOfIn finds a map's or set's typeof among tables ("" for a dynamic one: nft's). The
// index is built on the first call.
func typeOfIn(tables []*Table) func(TableRef, string) string {
	var index map[mapKey]string
	return func(ref TableRef, name string) string {
		if index == nil {
			index = map[mapKey]string{}
			for _, t := range tables {
				for _, mp := range t.Maps {
					if len(mp.Flags) == 0 && mp.Timeout == nil && mp.Type == "" {
						index[mapKey{t.ref(), mp.Name}] = mp.TypeOf
					}
				}
				for _, st := range t.Sets {
					if len(st.Flags) == 0 && st.Timeout == nil && st.Type == "" {
						index[mapKey{t.ref(), st.Name}] = st.TypeOf
					}
				}
			}
		}
		return index[mapKey{ref, name}]
	}
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
	// Drift says what someone else changed in the tables since the last apply, and this one
	// repaired: a table, map or chain missing, elements or rules changed. It is seen where
	// the apply reads the kernel: every table's presence, and whole tables on a full read.
	Drift []string `json:"drift,omitempty"`
	// Netlink: the transaction went to the kernel as a netlink batch, without nft.
	Netlink bool `json:"netlink,omitempty"`
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
	pre := m.takePrefetch()
	was, ok := pre.gen, pre.ok
	if pre.done == nil {
		was, ok = m.generation(ctx)
	}
	persist := ok && m.KnownDir != ""
	if persist {
		m.recall(was, pre)
	}
	full := m.cache.fullDue(m.FullEvery) && !m.unchangedSince(was, ok)
	if m.DeferFull && m.FullEvery > 0 && m.cache.known() {
		full = m.fresh != nil && m.fresh.applies == m.applies
	}
	res, err := m.applyAs(ctx, r, full, false, was, ok)
	if persist {
		m.keep(was)
	}
	return res, err
}

// ApplyChanges is Apply without the periodic full read: for changes that must reach the
// kernel fast (health transitions, API calls); the tables are still read whole on a first
// apply and after a failed transaction. It does not list the tables either (that alone
// takes nft a second with thousands of services): it trusts its cache, and a table someone
// deleted fails the transaction, after which the tables are read whole and it is retried.
func (m *Manager) ApplyChanges(ctx context.Context, r *Ruleset) (Result, error) {
	was, ok := m.generation(ctx)
	return m.applyAs(ctx, r, m.FullEvery <= 0, true, was, ok)
}

// applyAs applies r; was is the ruleset's generation before (ok: known), which the one after
// may prove the only change (quiet).
//
// The generation after it proves the cache exact (quiet) only if the cache the apply diffed
// against was exact at was: the last proof still held then, or the tables were read whole
// after was (here, or by a deferred reading at that very generation).
func (m *Manager) applyAs(ctx context.Context, r *Ruleset, full, trust bool, was nftlist.Generation, ok bool) (res Result, err error) {
	exact := m.quiet != nil && sameRuleset(was, *m.quiet)
	m.quiet = nil
	fresh := m.fresh
	if fresh != nil && fresh.applies != m.applies {
		fresh = nil // read before another apply: it may hold what that apply replaced
	}
	m.fresh = nil
	m.applies++
	m.lastTx = nil
	full = full || !m.cache.known()
	if full {
		exact = fresh == nil || fresh.genOK && sameRuleset(fresh.gen, was)
	}
	res, err = m.apply(ctx, r, full, trust && !full, fresh)
	if err != nil && (!full || fresh != nil) {
		// What we remembered, or a deferred reading, may be stale (someone changed the tables
		// since: a cleanup, nft flush ruleset): read them and retry. (One diffed against a
		// deferred reading was not retried, and its change was lost: an API drain rolled
		// back with a 500.)
		m.cache.distrust()
		res, err = m.apply(ctx, r, true, false, nil)
		exact = true
	}
	if err == nil && ok && exact {
		m.prove(ctx, was)
	}
	if err != nil || res.FullRead || len(res.Rebuilt) > 0 || len(res.Removed) > 0 {
		m.reshaped = m.applies
	}
	if res.FullRead {
		m.Reads.Full++
	}
	for _, c := range res.ChainsRewritten {
		if m.rewritten == nil {
			m.rewritten = map[string]uint64{}
		}
		m.rewritten[c] = m.applies
	}
	return res, err
}

// ReadCounts counts readings of the kernel: each lists our tables (nft loads the whole
// ruleset for any of them), seconds of CPU at thousands of services.
type ReadCounts struct {
	Full            uint64 `json:"full"`            // applies that diffed against our tables read whole
	FullSkipped     uint64 `json:"fullSkipped"`     // full reads due but skipped: no one committed since our last apply
	ChainsListed    uint64 `json:"chainsListed"`    // rewritten chains Settle read from the kernel
	ChainsRehearsed uint64 `json:"chainsRehearsed"` // rewritten chains Settle rehearsed instead (rehearse.go)
}

// tablePlan is what one apply does to one table.
type tablePlan struct {
	t         *Table
	read      *kernelTable // the table as read whole from the kernel before the apply, if it was
	rebuilt   bool         // created whole
	rewritten []string     // chains whose rules were added anew
}

// apply diffs every table of r against the kernel (read whole when full, else the cache),
// runs the changes as one transaction and remembers the result. With trust, the tables the
// cache knows are taken as the ones there are.
func (m *Manager) apply(ctx context.Context, r *Ruleset, full, trust bool, fresh *FullRead) (Result, error) {
	res := Result{FullRead: full}
	var existing []TableRef
	var err error
	if !full {
		fresh = nil
	}
	if fresh != nil {
		existing = fresh.refs
	} else if trust {
		existing = slices.SortedFunc(maps.Keys(m.cache.tables), func(a, b TableRef) int { return strings.Compare(a.String(), b.String()) })
	} else if existing, err = m.ours(ctx); err != nil {
		return res, err
	}
	if !full {
		if scopes, ok := m.scopes(r.Tables, existing); ok {
			return m.applyScopes(ctx, scopes, r.Tables, res)
		}
	}
	tx := newTxn()
	removeUnwanted(tx, existing, r.Tables, &res)
	plans := make([]tablePlan, len(r.Tables))
	for i, t := range r.Tables {
		if plans[i], err = m.plan(ctx, tx, t, slices.Contains(existing, t.ref()), full, fresh, &res); err != nil {
			return res, err
		}
	}
	res.Operations = tx.NumOperations()
	if res.Operations > 0 {
		if err := m.run(ctx, tx, r.Tables, &res); err != nil {
			return res, err
		}
	}
	next, err := m.remember(ctx, r.Tables, plans)
	if err != nil {
		m.cache.distrust()
		return res, err
	}
	if full {
		next.lastFull = time.Now()
	}
	m.cache = *next
	m.expect = next.tables
	return res, nil
}

// removeUnwanted deletes our tables that are not among tables.
func removeUnwanted(tx *txn, existing []TableRef, tables []*Table, res *Result) {
	for _, ref := range existing {
		if !slices.ContainsFunc(tables, func(t *Table) bool { return t.ref() == ref }) {
			tx.Delete(&knftables.Table{Family: ref.Family, Name: ref.Name})
			res.Removed = append(res.Removed, ref.String())
		}
	}
}

// plan adds to tx what brings the kernel's table to t: the whole table when it is missing
// or its layout changed, else the difference.
func (m *Manager) plan(ctx context.Context, tx *txn, t *Table, exists, full bool, fresh *FullRead, res *Result) (tablePlan, error) {
	p := tablePlan{t: t}
	var kt *kernelTable
	var read bool
	var err error
	if fresh != nil {
		kt, read = fresh.read[t.ref()], exists
	} else if kt, read, err = m.current(ctx, t, exists, full); err != nil {
		return p, err
	}
	if read {
		p.read = kt
	}
	if was := m.expect[t.ref()]; was != nil && (read || kt == nil) {
		res.Drift = append(res.Drift, m.driftOf(t.ref(), was, kt)...)
	}
	ref := t.ref().String()
	switch {
	case kt == nil:
		res.Rebuilt = append(res.Rebuilt, ref+": missing")
		p.rebuilt = true
		t.addAll(tx.Transaction)
		tx.whole = true
	case kt.Comment != t.Comment:
		res.Rebuilt = append(res.Rebuilt, ref+": layout changed")
		p.rebuilt = true
		tx.Delete(t.table())
		t.addAll(tx.Transaction)
		tx.whole = true
	default:
		p.rewritten = m.update(tx, kt, t, res)
	}
	return p, nil
}

// current is the kernel's table for t (nil: missing): read whole when full or not cached,
// else as the last apply left it, with the entries of the dynamic maps that may point at a
// backend that is gone since (read from the kernel, map by map).
func (m *Manager) current(ctx context.Context, t *Table, exists, full bool) (kt *kernelTable, read bool, err error) {
	if !exists {
		return nil, false, nil
	}
	if kt := m.cache.table(t.ref()); kt != nil && !full {
		return kt, false, m.readLost(ctx, t, kt)
	}
	kt, err = m.observe(ctx, t.ref(), false)
	return kt, true, err
}

// readLost reads into kt the entries of t's dynamic maps that may point at a lost backend.
func (m *Manager) readLost(ctx context.Context, t *Table, kt *kernelTable) error {
	for name := range t.Dynamic {
		if !m.cache.lost(t, name) || kt.Maps[name] == nil {
			continue
		}
		got, err := m.list(ctx, t.ref(), "map", name)
		if err != nil {
			return err
		}
		if got.Maps[name] != nil {
			kt.Maps[name].Elems = got.Maps[name].Elems
		}
	}
	return nil
}

// remember is the cache after an apply of tables (done as plans say): each table as the
// apply left it, with the expressions of the rules it read and of the tables it rebuilt (read
// back, unless DeferReadBack: then left unread, as rewritten chains are). Chains it rewrote
// in a table it kept are not read back here: listing one chain costs nft a listing of the
// whole ruleset (0.2-0.9 s at 2,000 services, ~2 s at 5,000), which no change should wait for
// (an API call, a health transition, an EndpointSlice event); they are left for Settle, which
// the agent runs a moment later. A one-shot `apply` exits without: its next run reads the
// tables whole anyway.
func (m *Manager) remember(ctx context.Context, tables []*Table, plans []tablePlan) (*kernelCache, error) {
	next := m.cache.next(tables)
	for _, p := range plans {
		ref := p.t.ref()
		switch {
		case p.rebuilt && m.DeferReadBack:
			next.leaveUnread(p.t, chainNames(p.t))
		case p.rebuilt:
			kt, err := m.observe(ctx, ref, true)
			if err != nil {
				return nil, err
			}
			next.readRules(ref, kt)
		case len(p.rewritten) > 0:
			next.leaveUnread(p.t, p.rewritten)
		}
		if p.read != nil && !p.rebuilt { // a rebuilt table's old rules are gone
			var kept []string
			for name := range p.read.Chains {
				if !slices.Contains(p.rewritten, name) {
					kept = append(kept, name)
				}
			}
			if len(kept) > 0 {
				next.readRules(ref, p.read, kept...)
			}
		}
	}
	return next, nil
}

// chainNames are the names of t's chains.
func chainNames(t *Table) []string {
	names := make([]string, len(t.Chains))
	for i, c := range t.Chains {
		names[i] = c.Name
	}
	return names
}

// Settle learns nft's rendering of the chains an apply rewrote without reading them, so
// that an edit of their rules by someone else is seen as drift from now on: a service chain
// from its rehearsal (rehearse.go), any other from the kernel's listing. Until then such an
// edit goes unnoticed (and one made before a listing is taken as ours). Cheap when nothing is
// unread.
func (m *Manager) Settle(ctx context.Context) error {
	s := m.StartSettle()
	if err := s.Read(ctx); err != nil {
		return err
	}
	m.FinishSettle(s)
	return nil
}

// Settling is one Settle split in three, so that its reading (nft lists the whole ruleset,
// ~2 s at 5,000 services) need not hold the manager: StartSettle and FinishSettle must be
// called where Apply may be, Read anywhere.
type Settling struct {
	list    func(ctx context.Context, ref TableRef, kind, name string) (*kernelTable, error)
	observe func(ctx context.Context, ref TableRef) (*kernelTable, error)
	applies uint64
	want    map[TableRef][]string
	got     map[TableRef]map[string]*kernelTable // per table, per chain (or "" for the table)
	texts   map[TableRef]map[ruleKey]string      // the wanted chains' rules' texts (shapes.go)
	// rehearse and the wanted chains' rehearsals (rehearse.go), made at StartSettle
	rehearse Rehearser
	scripts  map[TableRef]rehearsalScript
	noNS     error // the Rehearser could not make a namespace: none is tried again
	// nRehearsed and nListed count the chains read each way (ReadCounts)
	nRehearsed, nListed int
}

// StartSettle notes which chains are unread.
func (m *Manager) StartSettle() *Settling {
	s := &Settling{list: m.list, observe: func(ctx context.Context, ref TableRef) (*kernelTable, error) { return m.observe(ctx, ref, true) },
		applies: m.applies, want: map[TableRef][]string{}, got: map[TableRef]map[string]*kernelTable{}, texts: map[TableRef]map[ruleKey]string{}}
	for ref, chains := range m.cache.unread {
		if m.cache.tables[ref] == nil {
			delete(m.cache.unread, ref)
			continue
		}
		s.want[ref] = slices.Clone(chains)
		s.texts[ref] = m.cache.texts(ref, chains)
		if t := m.cache.rendered[ref]; m.Rehearse != nil && t != nil {
			if script, ok := rehearsal(t, chains); ok {
				if s.scripts == nil {
					s.scripts = map[TableRef]rehearsalScript{}
				}
				s.scripts[ref] = script
			}
		}
	}
	s.rehearse = m.Rehearse
	return s
}

// Read rehearses the chains it can (rehearse.go) and lists the others from the kernel (a
// table with more than two of them whole).
func (s *Settling) Read(ctx context.Context) error {
	ctx = background(ctx)
	for ref, chains := range s.want {
		s.got[ref] = s.rehearsed(ctx, ref)
		chains = slices.DeleteFunc(slices.Clone(chains), func(c string) bool { return s.got[ref][c] != nil })
		s.nRehearsed += len(s.got[ref])
		s.nListed += len(chains)
		if len(chains) > 2 {
			kt, err := s.observe(ctx, ref)
			if err != nil {
				return err
			}
			s.got[ref][""] = kt
			continue
		}
		for _, c := range chains {
			kt, err := s.list(ctx, ref, "chain", c)
			if err != nil {
				return err
			}
			s.got[ref][c] = kt
		}
	}
	return nil
}

// rehearsed is each chain of table ref its rehearsal made, as the rehearsal lists it, by
// name (none: no rehearsal, or it failed; a chain the listing has other rules of than those
// rendered is left out). The chains left out are read from the kernel.
func (s *Settling) rehearsed(ctx context.Context, ref TableRef) map[string]*kernelTable {
	got := map[string]*kernelTable{}
	script, ok := s.scripts[ref]
	if !ok || s.noNS != nil {
		return got
	}
	out, err := s.rehearse(ctx, script.text, "table", string(ref.Family), ref.Name)
	if errors.Is(err, ErrNoScratchNS) {
		s.noNS = err
	}
	var kt *kernelTable
	if err == nil {
		kt, err = parseTable(ref, out)
	}
	if err != nil {
		slog.Debug("load balancer: a rehearsal failed: its chains are read from the kernel", "table", ref.Name, "err", err)
		return got
	}
	for c, n := range script.rules {
		ch := kt.Chains[c]
		if ch == nil || len(ch.Rules) != n || slices.ContainsFunc(ch.Rules, func(rl *nftjson.Rule) bool {
			_, ok := s.texts[ref][ruleKey{ref, c, rl.Comment}]
			return !ok
		}) {
			slog.Debug("load balancer: a rehearsal listed other rules than those rendered: the chain is read from the kernel", "table", ref.Name, "chain", c)
			continue
		}
		got[c] = &kernelTable{Table: &nftjson.Table{Family: kt.Family, Name: kt.Name, Chains: map[string]*nftjson.Chain{c: ch}}}
	}
	return got
}

// FinishSettle remembers what s read of the chains no apply rewrote since StartSettle: the
// reading may hold the rules such an apply replaced, which would be taken for someone's edit
// (the apply left its chains unread, for the next Settle). An apply since that rebuilt or
// removed a table, or read the tables whole, drops the whole reading. (It dropped the whole
// reading after any apply: at 5,000 services nft lists for seconds, and under a change every
// 1.5 s no reading was ever kept, while nft kept listing.) Every rule read teaches its shape
// (shapes.go), whatever its chain became since.
func (m *Manager) FinishSettle(s *Settling) {
	m.Reads.ChainsRehearsed += uint64(s.nRehearsed)
	m.Reads.ChainsListed += uint64(s.nListed)
	if s.noNS != nil && m.Rehearse != nil {
		m.Rehearse = nil
		if m.Log != nil {
			m.Log.Warn("rewritten chains are read back from the kernel's ruleset (seconds of nft at thousands of services), not rehearsed in a network namespace of their own", "err", s.noNS)
		}
	}
	for ref, got := range s.got {
		texts := m.cache.texts(ref, s.want[ref]) // the rules' texts now, and when the reading began
		if texts == nil {
			texts = map[ruleKey]string{}
		}
		maps.Copy(texts, s.texts[ref])
		for _, kt := range got {
			m.cache.learnRules(ref, kt, texts)
		}
	}
	if s.applies != m.applies {
		if m.reshaped > s.applies {
			return
		}
		for ref, chains := range s.want {
			s.want[ref] = slices.DeleteFunc(chains, func(c string) bool { return m.rewritten[chainName(ref.Name, c)] > s.applies })
		}
	}
	for k, at := range m.rewritten {
		if at <= s.applies { // no later Settle began before it
			delete(m.rewritten, k)
		}
	}
	for ref, got := range s.got {
		want := s.want[ref]
		if len(want) == 0 {
			continue
		}
		if kt := got[""]; kt != nil {
			m.cache.readRules(ref, kt, want...)
			continue
		}
		for c, kt := range got {
			if slices.Contains(want, c) {
				m.cache.readRules(ref, kt, c)
			}
		}
	}
}

// chainName names a chain of a table as Result.ChainsRewritten does: "table chain".
func chainName(table, chain string) string { return table + " " + chain }

// Unsettled reports whether Settle has chains to read.
func (m *Manager) Unsettled() bool { return len(m.cache.unread) > 0 }

// list reads one chain or map ("chain", "map") of a table from the kernel.
func (m *Manager) list(ctx context.Context, ref TableRef, kind, name string) (*kernelTable, error) {
	out, err := m.List(ctx, "list", kind, string(ref.Family), ref.Name, name)
	if err != nil {
		return nil, err
	}
	return parseTable(ref, out)
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

// tableDiff is what turns the kernel's table kt into t.
type tableDiff struct {
	kt *kernelTable
	t  *Table
	// Sets and maps: wanted, new, or replaced (their definition changed).
	objs                      []object
	wanted, added, replaced   map[string]bool
	wantChain, newChain, redo map[string]bool // chains: wanted, new, to rewrite
	// ek, ev: the key and value of each of t.Elements as canonical text (after keepSlots).
	ek, ev []string
	// in: whether each of t.Elements is in the kernel's map with its value; held counts
	// those per map (a map holding all its wanted elements and no other has none to remove).
	in   []bool
	held map[string]int
}

// compare fills d.in and d.held.
func (d *tableDiff) compare() {
	d.in, d.held = make([]bool, len(d.t.Elements)), map[string]int{}
	for i, e := range d.t.Elements {
		n := e.Set + e.Map
		if km := d.kt.Maps[n]; km != nil {
			if v, ok := km.Elems[d.ek[i]]; ok && v == d.ev[i] {
				d.in[i] = true
				d.held[n]++
			}
		}
	}
}

type object struct {
	name, comment string
	add           func(*txn)
}

// update adds to tx what turns kt into t, in an order nft accepts within one transaction:
// stale elements out, chains to rewrite flushed (dropping their references), chains and maps
// to go deleted, new maps and chains added, rules added, new elements added. It returns the
// chains whose rules it adds.
func (m *Manager) update(tx *txn, kt *kernelTable, t *Table, res *Result) (rewritten []string) {
	d := &tableDiff{kt: kt, t: t, ek: make([]string, len(t.Elements)), ev: make([]string, len(t.Elements))}
	for i, e := range t.Elements {
		d.ek[i], d.ev[i] = elemKey(e), elemValue(e)
	}
	d.keepSlots()
	d.compare()
	d.diffMaps(res)
	rewritten = m.diffChains(d, res)
	m.removeElements(tx, d, res)
	d.removeObjects(tx)
	d.addObjects(tx)
	d.addElements(tx, res)
	for name := range d.newChain {
		rewritten = append(rewritten, name)
		m.touch(t.Name, name)
	}
	for name := range kt.Chains {
		if !d.wantChain[name] {
			m.touch(t.Name, name)
		}
	}
	return rewritten
}

// touch notes that this apply creates or deletes a chain of table: a Settle's reading of it
// taken before is dropped (FinishSettle), as that of a chain it rewrites.
func (m *Manager) touch(table, chain string) {
	if m.rewritten == nil {
		m.rewritten = map[string]uint64{}
	}
	m.rewritten[chainName(table, chain)] = m.applies
}

// keepSlots reorders the values of t's free slot maps (Table.Slots) so that every slot the
// kernel has keeps its value while that value is still wanted there; the values left over
// fill the other slots, in rendered order. One backend leaving a service of n then changes
// its own slot and removes the last one instead of moving every slot after it. A map the
// kernel holds as rendered is left as it is (most of them, in a change to one service).
func (d *tableDiff) keepSlots() {
	t, kt := d.t, d.kt
	slots := map[string][]int{} // slot map -> indices of its elements in t.Elements
	for i, e := range t.Elements {
		if e.Map != "" && t.Slots[e.Map] {
			slots[e.Map] = append(slots[e.Map], i)
		}
	}
	cloned := false
	for name, idx := range slots {
		km := kt.Maps[name]
		if km == nil || km.IsSet {
			continue
		}
		if len(km.Elems) == len(idx) && !slices.ContainsFunc(idx, func(i int) bool {
			v, ok := km.Elems[d.ek[i]]
			return !ok || v != d.ev[i]
		}) {
			continue
		}
		left := make(map[string]int, len(idx)) // wanted values not placed yet
		for _, i := range idx {
			left[d.ev[i]]++
		}
		vals := make([]string, len(idx))
		for j, i := range idx {
			if v, ok := km.Elems[d.ek[i]]; ok && left[v] > 0 {
				vals[j] = v
				left[v]--
			}
		}
		var rest []string
		for _, i := range idx {
			if v := d.ev[i]; left[v] > 0 {
				rest = append(rest, v)
				left[v]--
			}
		}
		for j, i := range idx {
			if vals[j] == "" {
				vals[j], rest = rest[0], rest[1:]
			}
			if vals[j] == d.ev[i] {
				continue
			}
			if !cloned { // the caller's slice stays as rendered
				t.Elements, cloned = slices.Clone(t.Elements), true
			}
			e := *t.Elements[i]
			e.Value = split(vals[j])
			t.Elements[i] = &e
			d.ev[i] = vals[j]
		}
	}
}

// diffMaps sorts t's maps and sets into new, replaced and kept.
func (d *tableDiff) diffMaps(res *Result) {
	for _, s := range d.t.Sets {
		d.objs = append(d.objs, object{s.Name, *s.Comment, func(tx *txn) { tx.Add(s) }})
	}
	for _, mp := range d.t.Maps {
		d.objs = append(d.objs, object{mp.Name, *mp.Comment, func(tx *txn) { tx.Add(mp) }})
	}
	d.wanted, d.added, d.replaced = map[string]bool{}, map[string]bool{}, map[string]bool{}
	for _, o := range d.objs {
		d.wanted[o.name] = true
		switch km := d.kt.Maps[o.name]; {
		case km == nil:
			d.added[o.name] = true
		case km.Comment != o.comment:
			d.replaced[o.name] = true
			res.MapsReplaced = append(res.MapsReplaced, d.t.Name+" "+o.name)
		}
	}
}

// diffChains sorts t's chains into new, rewritten (their rules differ, someone edited them,
// or they use a replaced map) and kept; it returns the rewritten ones.
func (m *Manager) diffChains(d *tableDiff, res *Result) (rewritten []string) {
	rules := map[string][]*knftables.Rule{}
	for _, rl := range d.t.Rules {
		rules[rl.Chain] = append(rules[rl.Chain], rl)
	}
	d.wantChain, d.newChain, d.redo = map[string]bool{}, map[string]bool{}, map[string]bool{}
	for _, c := range d.t.Chains {
		d.wantChain[c.Name] = true
		kc := d.kt.Chains[c.Name]
		if kc == nil {
			d.newChain[c.Name] = true
			continue
		}
		want := rules[c.Name]
		same := len(kc.Rules) == len(want)
		for i := 0; same && i < len(want); i++ {
			got := kc.Rules[i]
			same = got.Comment == *want[i].Comment && !m.cache.edited(d.t.ref(), c.Name, got)
			if len(d.replaced) == 0 { // most changes replace no map: no rule to scan
				continue
			}
			for _, ref := range mapRef.FindAllStringSubmatch(want[i].Rule, -1) {
				same = same && !d.replaced[ref[1]]
			}
		}
		if !same {
			d.redo[c.Name] = true
			rewritten = append(rewritten, c.Name)
			res.ChainsRewritten = append(res.ChainsRewritten, chainName(d.t.Name, c.Name))
		}
	}
	return rewritten
}

// removeElements deletes the elements that must go from maps that stay, and the entries of
// dynamic maps that point at a backend that is gone.
func (m *Manager) removeElements(tx *txn, d *tableDiff, res *Result) {
	t, kt := d.t, d.kt
	var desired map[string]map[string]string // of the maps that hold others than ours
	dirty := func(name string) bool {
		km := kt.Maps[name]
		return !km.Dynamic && len(km.Elems) != d.held[name] && d.wanted[name] && !d.replaced[name]
	}
	for i, e := range t.Elements {
		if n := e.Set + e.Map; kt.Maps[n] != nil && dirty(n) {
			if desired == nil {
				desired = map[string]map[string]string{}
			}
			if desired[n] == nil {
				desired[n] = make(map[string]string, len(kt.Maps[n].Elems)) // no growing: ~1 ms at 10,000
			}
			desired[n][d.ek[i]] = d.ev[i]
		}
	}
	for _, name := range slices.Sorted(maps.Keys(kt.Maps)) {
		km := kt.Maps[name]
		if !d.wanted[name] || d.replaced[name] {
			continue
		}
		if allowed, tracked := t.Dynamic[name]; tracked {
			forget(tx, t, name, km, allowed, res)
			continue
		}
		if km.Dynamic || !dirty(name) { // flow tables: the datapath's
			continue
		}
		var gone []string // sorted below: the same transaction for the same change
		for k, v := range km.Elems {
			if want, ok := desired[name][k]; !ok || want != v {
				gone = append(gone, k)
			}
		}
		slices.Sort(gone)
		for _, k := range gone {
			e := &knftables.Element{Family: t.Family, Table: t.Name, Map: name, Key: split(k)}
			if km.IsSet {
				e.Set, e.Map = name, ""
			}
			tx.Delete(e)
			res.ElementsRemoved++
		}
	}
}

// removeObjects flushes the chains to rewrite or delete, then deletes the chains, maps, sets
// and counters that go.
func (d *tableDiff) removeObjects(tx *txn) {
	fam, tab, kt := d.t.Family, d.t.Name, d.kt
	chains := slices.Sorted(maps.Keys(kt.Chains))
	for _, name := range chains {
		if d.redo[name] || !d.wantChain[name] {
			tx.Flush(&knftables.Chain{Family: fam, Table: tab, Name: name})
		}
	}
	for _, name := range chains {
		if !d.wantChain[name] {
			tx.Delete(&knftables.Chain{Family: fam, Table: tab, Name: name})
		}
	}
	for _, name := range slices.Sorted(maps.Keys(kt.Maps)) {
		if !d.wanted[name] || d.replaced[name] {
			if kt.Maps[name].IsSet {
				tx.Delete(&knftables.Set{Family: fam, Table: tab, Name: name})
			} else {
				tx.Delete(&knftables.Map{Family: fam, Table: tab, Name: name})
			}
		}
	}
	wantCounter := make(map[string]bool, len(d.t.Counters))
	for _, c := range d.t.Counters {
		wantCounter[c.Name] = true
	}
	for _, name := range slices.Sorted(maps.Keys(kt.Counters)) {
		if !wantCounter[name] {
			tx.Delete(&knftables.Counter{Family: fam, Table: tab, Name: name})
		}
	}
}

// addObjects adds the new and replaced maps and sets, the new counters and chains, and the
// rules of new and rewritten chains.
func (d *tableDiff) addObjects(tx *txn) {
	for _, o := range d.objs {
		if d.added[o.name] || d.replaced[o.name] {
			o.add(tx)
		}
	}
	for _, c := range d.t.Counters {
		if _, ok := d.kt.Counters[c.Name]; !ok {
			tx.Add(c)
		}
	}
	for _, c := range d.t.Chains {
		if d.newChain[c.Name] {
			tx.Add(c)
		}
	}
	for _, rl := range d.t.Rules {
		if d.newChain[rl.Chain] || d.redo[rl.Chain] {
			tx.Add(rl)
		}
	}
}

// addElements adds the elements that are missing (all of new and replaced maps).
func (d *tableDiff) addElements(tx *txn, res *Result) {
	for i, e := range d.t.Elements {
		n := e.Set + e.Map
		km := d.kt.Maps[n]
		if d.added[n] || d.replaced[n] || km == nil {
			tx.Add(e)
			continue
		}
		if !d.in[i] {
			tx.Add(e)
			res.ElementsAdded++
		}
	}
}

// forget deletes a dynamic map's entries that point at a backend no longer known. Each is
// added and deleted: an entry may time out between our listing and the transaction, and
// deleting it must not fail the transaction.
func forget(tx *txn, t *Table, name string, km *kernelMap, allowed map[string]bool, res *Result) {
	for _, k := range slices.Sorted(maps.Keys(km.Elems)) {
		v := km.Elems[k]
		if allowed[v] {
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

// Remove deletes every table of the load balancer, and nothing else.
func (m *Manager) Remove(ctx context.Context) ([]TableRef, error) {
	m.expect, m.quiet = nil, nil
	m.forgetKnown(ctx)
	refs, err := m.ours(ctx)
	if err != nil || len(refs) == 0 {
		return nil, err
	}
	nft, err := m.nft()
	if err != nil {
		return nil, err
	}
	tx := nft.NewTransaction()
	for _, ref := range refs {
		tx.Delete(&knftables.Table{Family: ref.Family, Name: ref.Name})
	}
	m.applies++
	m.reshaped = m.applies
	m.cache.forget()
	return refs, nft.Run(ctx, tx)
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

// FullRead is a reading of our tables whole, taken apart from Apply (DeferFull).
type FullRead struct {
	ours    func(context.Context) ([]TableRef, error)
	observe func(ctx context.Context, ref TableRef) (*kernelTable, error)
	// generation reads the ruleset's generation; gen is the one before the reading (genOK).
	generation func(context.Context) (nftlist.Generation, error)
	gen        nftlist.Generation
	genOK      bool
	applies    uint64
	refs       []TableRef
	read       map[TableRef]*kernelTable
}

// FullDue reports whether a full reading is due and none is waiting (DeferFull).
// A due reading is skipped when the ruleset is still at the generation the last apply proved
// (a netlink request, where the reading lists the whole ruleset).
func (m *Manager) FullDue() bool {
	if !m.DeferFull || m.FullEvery <= 0 || !m.cache.known() || !m.cache.fullDue(m.FullEvery) {
		return false
	}
	if m.quiet != nil && m.unchangedSince(m.generation(context.Background())) {
		return false
	}
	return m.fresh == nil || m.fresh.applies != m.applies
}

// StartFullRead notes the apply a full reading follows. Call it where Apply may be called.
func (m *Manager) StartFullRead() *FullRead {
	return &FullRead{ours: m.ours, applies: m.applies, generation: m.Generation,
		observe: func(ctx context.Context, ref TableRef) (*kernelTable, error) { return m.observe(ctx, ref, false) }}
}

// Read lists our tables whole (nft); anywhere.
func (f *FullRead) Read(ctx context.Context) error {
	ctx = background(ctx)
	f.gen, f.genOK = generation(ctx, f.generation)
	refs, err := f.ours(ctx)
	if err != nil {
		return err
	}
	read := make(map[TableRef]*kernelTable, len(refs))
	for _, ref := range refs {
		if read[ref], err = f.observe(ctx, ref); err != nil {
			return err
		}
	}
	f.refs, f.read = refs, read
	return nil
}

// FinishFullRead keeps f for the next Apply unless an apply ran since StartFullRead; it
// reports whether it did. Call it where Apply may be called.
func (m *Manager) FinishFullRead(f *FullRead) bool {
	if f.applies != m.applies || f.read == nil {
		return false
	}
	m.fresh = f
	return true
}
