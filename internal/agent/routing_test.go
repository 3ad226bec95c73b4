package agent

import (
	"context"
	"testing"
	"time"

	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"

	"github.com/hostaccel/hostaccel/internal/testbed"
)

// The routing watch triggers a sync for a rule added or deleted and for a route the tc
// datapath's kept answers depend on: an MTU of its own, a TOS selector, a source prefix,
// several next hops; not for other routes while forwarding is on (the tc datapath's FIB
// answers follow those within their one-second TTL); for every route of a family whose
// forwarding is off (the program then sends by the route device of the last sync). TOS,
// source prefix, several next hops and forwarding off were followed a resync period late.
func TestRoutingWatch(t *testing.T) {
	testbed.RequireRoot(t)
	ns, err := testbed.NewNS("routing")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ns.Close() })
	for _, c := range [][]string{
		{"ip", "link", "add", "d0", "type", "veth", "peer", "name", "p0"}, {"ip", "link", "add", "d1", "type", "veth", "peer", "name", "p1"},
		{"ip", "link", "set", "p0", "up"}, {"ip", "link", "set", "p1", "up"}, {"ip", "link", "set", "d0", "up"}, {"ip", "link", "set", "d1", "up"},
		{"ip", "addr", "add", "192.0.2.1/24", "dev", "d0"}, {"ip", "addr", "add", "198.51.100.1/24", "dev", "d1"},
		{"ip", "-6", "addr", "add", "fd00:1::1/64", "dev", "d0", "nodad"},
		{"sh", "-c", "echo 1 > /proc/sys/net/ipv4/conf/all/forwarding; echo 1 > /proc/sys/net/ipv6/conf/all/forwarding"},
	} {
		if out, err := ns.Exec(c...); err != nil {
			t.Fatalf("%v: %v %s", c, err, out)
		}
	}
	var s *nl.NetlinkSocket
	if err := ns.Do(func() (err error) { s, err = subscribeRouting(); return err }); err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx, cancel := context.WithCancel(context.Background())
	changed := make(chan struct{}, 16)
	done := make(chan error, 1)
	// (in the namespace: routingChange reads its forwarding settings)
	// the tc datapath serves IPv4 only here
	serves := func(fam uint8) bool { return fam == unix.AF_INET }
	go ns.Do(func() error { done <- readRouting(ctx, s, func() { changed <- struct{}{} }, serves); return nil })
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
		{[]string{"ip", "route", "add", "10.9.2.0/24", "tos", "0x10", "dev", "d0"}, true},
		{[]string{"ip", "route", "add", "10.9.3.0/24", "nexthop", "via", "192.0.2.2", "dev", "d0", "nexthop", "via", "198.51.100.2", "dev", "d1"}, true},
		{[]string{"ip", "-6", "route", "add", "fd00:9::/64", "from", "fd00:1::/64", "dev", "d0"}, true},
		{[]string{"ip", "-6", "route", "add", "fd00:8::/64", "dev", "d0"}, false},
		{[]string{"sh", "-c", "echo 0 > /proc/sys/net/ipv4/conf/all/forwarding"}, false},
		{[]string{"ip", "route", "add", "10.9.4.0/24", "dev", "d0"}, true},
		{[]string{"ip", "route", "add", "10.9.5.0/24", "dev", "d0", "table", "100"}, false}, // not the main table
		{[]string{"ip", "route", "add", "10.9.6.0/24", "tos", "0x10", "dev", "d0", "table", "100"}, false},
		{[]string{"ip", "-6", "route", "add", "fd00:7::/64", "dev", "d0"}, false},
		{[]string{"sh", "-c", "echo 0 > /proc/sys/net/ipv6/conf/all/forwarding"}, false},
		{[]string{"ip", "-6", "route", "add", "fd00:6::/64", "dev", "d0"}, false}, // a family tc does not serve
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
