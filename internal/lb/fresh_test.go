package lb

import (
	"context"
	"testing"
	"time"

	"sigs.k8s.io/knftables"
)

// An apply that diffs against a deferred full reading (DeferFull) which someone made stale
// meanwhile (the table deleted, as `hostaccel cleanup` or `nft flush ruleset` do) is
// retried against the kernel as an apply from the cache is (it failed: an API drain answered 500).
func TestStaleDeferredReadingRetried(t *testing.T) {
	for _, deferred := range []bool{false, true} {
		m, f := NewFakeManager()
		m.FullEvery, m.DeferFull = time.Millisecond, true
		ctx := context.Background()
		svcs := []Service{fixture(DNAT, RoundRobin)}
		if _, err := m.Apply(ctx, Render(Resolve(svcs, nil, testEnv))); err != nil {
			t.Fatal(err)
		}
		time.Sleep(2 * time.Millisecond)
		if deferred {
			if !m.FullDue() {
				t.Fatal("no full read due")
			}
			fr := m.StartFullRead()
			if err := fr.Read(ctx); err != nil {
				t.Fatal(err)
			}
			if !m.FinishFullRead(fr) {
				t.Fatal("reading not kept")
			}
		}
		tx := f.NewTransaction()
		tx.Delete(&knftables.Table{Family: knftables.InetFamily, Name: NATTable})
		if err := f.Run(ctx, tx); err != nil {
			t.Fatal(err)
		}
		svcs[0].Backends[0].State = StateDrain // an API drain
		if res, err := m.Apply(ctx, Render(Resolve(svcs, nil, testEnv))); err != nil {
			t.Errorf("deferred reading %v: the apply failed: %v (%+v)", deferred, err, res)
		}
	}
}
