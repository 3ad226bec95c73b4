package agent

import (
	"context"
	"testing"
	"time"

	"github.com/vishvananda/netlink/nl"

	"github.com/hostaccel/hostaccel/internal/testbed"
)

// The routing watch triggers a sync for a rule added or deleted and for a route with an MTU
// of its own, not for other routes (the tc datapath's FIB answers follow those within their
// one-second TTL).
func TestRoutingWatch(t *testing.T) {
	testbed.RequireRoot(t)
	ns, err := testbed.NewNS("routing")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ns.Close() })
	var s *nl.NetlinkSocket
	if err := ns.Do(func() (err error) { s, err = subscribeRouting(); return err }); err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx, cancel := context.WithCancel(context.Background())
	changed := make(chan struct{}, 16)
	done := make(chan error, 1)
	go func() { done <- readRouting(ctx, s, func() { changed <- struct{}{} }) }()
	for _, c := range []struct {
		cmd  []string
		want bool
	}{
		{[]string{"ip", "route", "add", "10.9.0.0/24", "dev", "lo"}, false},
		{[]string{"ip", "rule", "add", "from", "10.244.1.2", "lookup", "100"}, true},
		{[]string{"ip", "route", "add", "10.9.1.0/24", "dev", "lo", "mtu", "1400"}, true},
		{[]string{"ip", "-6", "rule", "add", "from", "fd00::2", "lookup", "100"}, true},
		{[]string{"ip", "route", "del", "10.9.0.0/24", "dev", "lo"}, false},
		{[]string{"ip", "rule", "del", "from", "10.244.1.2", "lookup", "100"}, true},
		{[]string{"ip", "route", "del", "10.9.1.0/24"}, true},
	} {
		if out, err := ns.Exec(c.cmd...); err != nil {
			t.Fatalf("%v: %v %s", c.cmd, err, out)
		}
		got := false
		select {
		case <-changed:
			got = true
		case <-time.After(300 * time.Millisecond):
		}
		if got != c.want {
			t.Errorf("%v: triggered %v, want %v", c.cmd, got, c.want)
		}
		for len(changed) > 0 {
			<-changed
		}
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("readRouting: %v", err)
		}
	case <-time.After(2 * routingPoll):
		t.Error("readRouting did not return once ctx ended")
	}
}
