package lb

import (
	"context"
	"sync"

	"sigs.k8s.io/knftables"
)

// mapNegation is whether the kernel takes a negated lookup in a map (`key != @map`), which
// dsr, stateless-dnat and persistence render (their flow and client tables): Linux 6.1 refuses
// it ("Could not process rule: Invalid argument", and the whole transaction with it: its
// nft_lookup takes a map only to read its data), 6.18 takes it. Asked once per process, and
// only where a service needs it, with two dry runs (nft --check, nothing committed): the
// negated lookup in a map and, where that fails, the same in a set, so that a dry run that
// fails for another reason (no nft, no privilege) counts as a yes and the apply says what is
// wrong.
var mapNegation struct {
	once sync.Once
	ok   bool
}

// MapNegation reports whether nft (the Manager's) can install a negated map lookup.
func (m *Manager) MapNegation(ctx context.Context) bool {
	mapNegation.once.Do(func() {
		mapNegation.ok = true
		nft, err := m.nft()
		if err != nil {
			return
		}
		check := func(set bool) error {
			t := &knftables.Table{Family: knftables.InetFamily, Name: "hostaccel-lb-probe"}
			tx := nft.NewTransaction()
			tx.Add(t)
			if set {
				tx.Add(&knftables.Set{Family: t.Family, Table: t.Name, Name: "m", Type: "ipv4_addr"})
			} else {
				tx.Add(&knftables.Map{Family: t.Family, Table: t.Name, Name: "m", Type: "ipv4_addr : ipv4_addr"})
			}
			tx.Add(&knftables.Chain{Family: t.Family, Table: t.Name, Name: "c"})
			tx.Add(&knftables.Rule{Family: t.Family, Table: t.Name, Chain: "c", Rule: "ip saddr != @m accept"})
			return nft.Check(ctx, tx)
		}
		if check(false) != nil && check(true) == nil {
			mapNegation.ok = false
		}
	})
	return mapNegation.ok
}

// needsMapNegation reports whether a service of svcs renders a negated map lookup.
func needsMapNegation(svcs []Service) bool {
	for i := range svcs {
		if t := svcs[i].topology(); t == DSR || t == StatelessDNAT || svcs[i].Persistence != nil {
			return true
		}
	}
	return false
}
