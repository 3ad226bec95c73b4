package flowtable

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strings"
	"time"

	"github.com/vishvananda/netlink"
	"sigs.k8s.io/knftables"

	"github.com/hostaccel/hostaccel/internal/nftjson"
	"github.com/hostaccel/hostaccel/internal/nftlist"
)

// Manager owns table inet hostaccel in one network namespace. It is the only code of this
// datapath that touches the kernel.
type Manager struct {
	NFT  knftables.Interface // bound to Family/TableName
	List nftjson.Lister
	// Exists reports whether the table is in the kernel without nft, which fetches the whole
	// ruleset first (45 ms at 2,000 load-balanced services): an agent without the flowtable
	// datapath removes the table at every sync. nil: Remove always runs its transaction.
	Exists func(context.Context) (bool, error)

	// KnownDir: Apply keeps what it knows (last, lastDevices) in a file there for the next
	// process (known.go); "": no file (tests, benches: their namespaces are thrown away).
	KnownDir string

	last        string         // fingerprint of the table right after our last successful apply
	lastDevices []string       // its flowtable's devices
	lastIndex   map[string]int // the devices' indexes as the last apply knew them (Ruleset.DeviceIndex)
	written     string         // the fingerprint last written to the file (or tried)
	touched     time.Time      // when the file was last written or touched (touch)
	cleared     bool           // the file was removed, and nothing known since
}

// NewManager returns a Manager on the real nft binary, which it runs first when it has a
// transaction to run: knftables.New runs nft twice (~20 ms), and an apply without a flowtable
// (datapath tc or none, nothing to remove) need not pay it.
func NewManager() *Manager {
	exists := func(ctx context.Context) (bool, error) { return nftlist.Has(ctx, Family, TableName) }
	return &Manager{List: nftjson.NFT, Exists: exists}
}

// nft returns m.NFT, made on first use.
func (m *Manager) nft() (knftables.Interface, error) {
	if m.NFT == nil {
		nft, err := knftables.New(Family, TableName)
		if err != nil {
			return nil, err
		}
		m.NFT = nft
	}
	return m.NFT, nil
}

// Result says what one Apply changed.
type Result struct {
	Rebuilt            bool   `json:"rebuilt"`          // whole table (re)created
	Reason             string `json:"reason"`           // why it was rebuilt or changed
	FlowtableRecreated bool   `json:"flowtableFlushed"` // offloaded flows flushed (policy narrowed or devices changed)
	ElementsAdded      int    `json:"elementsAdded"`
	ElementsRemoved    int    `json:"elementsRemoved"`
	Operations         int    `json:"operations"`
	// Drift says what someone else changed in the table since this Manager's last apply,
	// which this one repaired ("" when nothing).
	Drift string `json:"drift,omitempty"`
}

// Observe reads the table as the kernel has it; nil, nil if it does not exist.
func (m *Manager) Observe(ctx context.Context) (*nftjson.Table, error) {
	t, err := nftjson.List(ctx, m.List, string(Family), TableName)
	if errors.Is(err, nftjson.ErrNoTable) {
		return nil, nil
	}
	return t, err
}

// Apply makes the kernel match r in one atomic transaction, changing as little as it can:
// set elements are added and removed one by one; the flowtable is recreated (which flushes
// offloaded flows, so that they are re-evaluated) only when devices change or the policy
// narrows; the whole table is rebuilt when it is missing, has another spec, or was changed
// by someone else since our last apply (drift).
func (m *Manager) Apply(ctx context.Context, r *Ruleset) (Result, error) {
	m.recall()
	cur, err := m.Observe(ctx)
	if err != nil {
		return Result{}, err
	}
	nft, err := m.nft()
	if err != nil {
		return Result{}, err
	}
	tx := nft.NewTransaction()
	res := Result{}
	switch reason := m.rebuildReason(cur, r); reason {
	case "":
		m.update(tx, cur, r, &res)
	default:
		res.Rebuilt, res.Reason = true, reason
		tx.Add(r.table())
		tx.Delete(r.table())
		r.AddAll(tx)
	}
	res.Operations = tx.NumOperations()
	if res.Operations > 0 {
		m.forget()
		if err := nft.Run(ctx, tx); err != nil {
			return res, fmt.Errorf("nft transaction (nothing was changed): %w", err)
		}
	}
	after, err := m.Observe(ctx)
	if err != nil {
		if res.Operations > 0 {
			// The transaction went in, unread: the next apply must not take it for someone
			// else's change (a rebuild that flushes every offloaded flow).
			m.last, m.lastDevices = "", nil
			m.remember()
		}
		return res, err
	}
	if after == nil {
		return res, fmt.Errorf("table inet %s missing right after apply", TableName)
	}
	// Drift is what this Manager had installed and someone changed: a table it never
	// installed (first apply, after Remove) is no drift.
	if m.last != "" && (res.Reason == "table missing" || strings.HasPrefix(res.Reason, "drift")) {
		res.Drift = res.Reason
	}
	m.last = after.Fingerprint()
	m.lastIndex = r.DeviceIndex
	m.lastDevices = nil
	if ft := after.Flowtables[FlowtableName]; ft != nil {
		m.lastDevices = slices.Clone(ft.Devices)
	}
	if m.last != m.written {
		m.remember()
	} else {
		m.touch()
	}
	return res, nil
}

func (m *Manager) rebuildReason(cur *nftjson.Table, r *Ruleset) string {
	switch {
	case cur == nil:
		return "table missing"
	case cur.Comment != r.Comment:
		return "spec changed"
	case m.last != "" && cur.Fingerprint() != m.last && m.vanished(cur) != m.last:
		return "drift: table changed outside hostaccel"
	}
	ch, off := cur.Chains[ChainName], cur.Chains[OffloadChain]
	if ch == nil || len(ch.Rules) != len(r.Rules) || cur.Flowtables[FlowtableName] == nil ||
		off == nil || len(off.Rules) != 1 || off.Rules[0].Comment != *r.OffloadRule.Comment {
		return "drift: chain or flowtable differs"
	}
	for i, rl := range r.Rules {
		if ch.Rules[i].Comment != *rl.Comment {
			return "drift: rule " + fmt.Sprint(i) + " differs"
		}
	}
	for _, s := range r.Sets {
		if cur.Sets[s.Name] == nil {
			return "drift: set " + s.Name + " missing"
		}
	}
	return ""
}

// vanished is cur's fingerprint with the flowtable's devices as this Manager's last apply
// left them, when the kernel has dropped some of them since (a device deleted takes itself
// out of the flowtable): that is the link's change, not someone's edit. A device missing
// there that still exists with the index it had (someone took it out of the flowtable) is an
// edit: "" (it was repaired, but not reported as drift).
func (m *Manager) vanished(cur *nftjson.Table) string {
	ft := cur.Flowtables[FlowtableName]
	if ft == nil || len(ft.Devices) >= len(m.lastDevices) || slices.ContainsFunc(ft.Devices, func(d string) bool { return !slices.Contains(m.lastDevices, d) }) {
		return ""
	}
	for _, d := range m.lastDevices {
		if idx, ok := m.lastIndex[d]; ok && !slices.Contains(ft.Devices, d) && linkIndex(d) == idx {
			return ""
		}
	}
	c := *cur
	c.Flowtables = maps.Clone(cur.Flowtables)
	f := *ft
	f.Devices = m.lastDevices
	c.Flowtables[FlowtableName] = &f
	return c.Fingerprint()
}

// linkIndex is the index of link name in this network namespace, 0 where there is none (a
// variable: tests answer for links they do not create).
var linkIndex = func(name string) int {
	l, err := netlink.LinkByName(name)
	if err != nil {
		return 0
	}
	return l.Attrs().Index
}

// update adds the element diffs to tx, and recreates the flowtable when devices changed or
// the policy narrowed (an element left an allow set, or joined the exclude set).
func (m *Manager) update(tx *knftables.Transaction, cur *nftjson.Table, r *Ruleset, res *Result) {
	flush := !slices.Equal(cur.Flowtables[FlowtableName].Devices, r.Flowtable.Devices)
	if flush {
		res.Reason = "devices changed"
	}
	// Every set's stale elements go before any new one comes: the interval sets refuse an
	// element that overlaps one still there (10.244.2.0/24 replaced by 10.244.0.0/16, in one
	// transaction, failed every sync).
	var adds []*knftables.Element
	for _, s := range r.Sets {
		have := map[string]bool{}
		for _, e := range cur.Sets[s.Name].Elements {
			have[canonical(e)] = true
		}
		want := map[string]bool{}
		for _, e := range r.Elements[s.Name] {
			c := canonical(e)
			want[c] = true
			if !have[c] {
				adds = append(adds, elem(s.Name, e))
				res.ElementsAdded++
				switch {
				case strings.HasPrefix(s.Name, "exclude-"):
					flush, res.Reason = true, "exclude list grew"
				case strings.HasPrefix(s.Name, "local-pod-"):
					// the external classes match sources outside it (saddr != @local-pod):
					// their offloaded flows from the new range must go back through the rules
					flush, res.Reason = true, "local Pod CIDRs grew"
				}
			}
		}
		for _, e := range cur.Sets[s.Name].Elements {
			if !want[canonical(e)] {
				tx.Delete(elem(s.Name, quoteIf(s.Type, e)))
				res.ElementsRemoved++
				if !strings.HasPrefix(s.Name, "exclude-") && s.Name != DevicesSet {
					flush, res.Reason = true, "set "+s.Name+" shrank"
				}
			}
		}
	}
	for _, e := range adds {
		tx.Add(e)
	}
	if !flush {
		if res.ElementsAdded+res.ElementsRemoved > 0 {
			res.Reason = "set elements changed"
		}
		return
	}
	// Flushing the chains drops the rules' references to the flowtable, so it can be
	// deleted and re-added in the same transaction; the rules come back right after.
	res.FlowtableRecreated = true
	tx.Flush(r.Chain)
	tx.Flush(r.Offload)
	tx.Delete(&knftables.Flowtable{Name: FlowtableName})
	tx.Add(r.txFlowtable())
	tx.Add(r.OffloadRule)
	for _, rl := range r.Rules {
		tx.Add(rl)
	}
}

// canonical makes nft's listing and our rendering comparable: quotes off, host prefixes bare,
// addresses as Go writes them (nft lists an IPv4-compatible IPv6 address, ::a00:1, as
// ::10.0.0.1: compared as strings, it was deleted and added again at every sync, and as a set
// that shrank, it recreated the flowtable each time).
func canonical(e string) string {
	e = strings.Trim(e, `"`)
	if p, err := netip.ParsePrefix(e); err == nil {
		if p.IsSingleIP() {
			return p.Addr().String()
		}
		return p.String()
	}
	if a, err := netip.ParseAddr(e); err == nil {
		return a.String()
	}
	return e
}

func quoteIf(setType, e string) string {
	if setType == "ifname" {
		return `"` + e + `"`
	}
	return e
}

// Remove deletes table inet hostaccel and nothing else; a table that is not there costs no
// nft run.
func (m *Manager) Remove(ctx context.Context) error {
	if m.Exists != nil {
		if ok, err := m.Exists(ctx); err == nil && !ok {
			m.last = ""
			m.remember()
			return nil
		}
	}
	nft, err := m.nft()
	if err != nil {
		return err
	}
	tx := nft.NewTransaction()
	tx.Add(&knftables.Table{})
	tx.Delete(&knftables.Table{})
	m.last = ""
	m.remember()
	return nft.Run(ctx, tx)
}
