package sockmap

import (
	"context"
	"net/netip"
	"slices"
	"testing"

	"github.com/hostaccel/hostaccel/internal/model"
)

// An update that fails after it wrote an exclusion still bumps the epoch, and its retry
// reports no drift: an open connection to the newly excluded Pod takes TCP from its next
// message. Before, the failed apply skipped the bump and kept its last tries, so the retry
// found the exclusion in place, counted no change, never bumped the epoch (the connection
// kept being moved past netfilter) and reported its own write as drift.
func TestPartialUpdateReachesOpenConnections(t *testing.T) {
	b := newBed(t, true)
	c, s := b.pair(false)
	if n := b.settle(2); n < 2 {
		t.Fatalf("%d sockets, want 2", n)
	}
	moved := func(what string) uint64 { t.Helper(); return b.moved(t, what, c, s) }
	if d := moved("before"); d == 0 {
		t.Fatal("nothing moved socket to socket before the exclusion: the test shows nothing")
	}
	cfg, err := b.currentSet().settings()
	if err != nil {
		t.Fatal(err)
	}
	d := Render(model.State{LocalPodCIDRs: b.pods.CIDRs, Exclude: []netip.Prefix{netip.PrefixFrom(b.pods.B4, 32)}, Classes: []model.Class{model.LocalPodToPod}})
	// The kernel refuses the zero prefix (prefix length 2^32-1): a write that fails after the
	// exclusions (written first).
	bad := &Desired{LocalPod: append(slices.Clone(d.LocalPod), netip.Prefix{}), Exclude: d.Exclude}
	res, err := b.m.Apply(context.Background(), bad)
	if err == nil || res.ElementsAdded == 0 {
		t.Fatalf("apply with an invalid prefix: %+v, %v; want the exclusion written, then an error", res, err)
	}
	t.Logf("the failed apply: %v", err)
	res, err = b.m.Apply(context.Background(), d)
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Drift) > 0 {
		t.Errorf("the retry reports its own write as drift: %q", res.Drift)
	}
	after, err := b.currentSet().settings()
	if err != nil {
		t.Fatal(err)
	}
	if after.Epoch == cfg.Epoch {
		t.Errorf("epoch %d after the exclusion was written: not bumped", after.Epoch)
	}
	if n := moved("after"); n > 0 {
		t.Errorf("the open connection to the excluded Pod still had %d bytes moved socket to socket", n)
	}
}
