package tc

import (
	"net/netip"
	"reflect"
	"slices"
	"testing"
)

func TestEgress(t *testing.T) {
	routes := []route{
		{netip.MustParsePrefix("0.0.0.0/0"), 9},
		{netip.MustParsePrefix("10.244.1.0/24"), 5},
		{netip.MustParsePrefix("10.244.0.0/16"), 7},
		{netip.MustParsePrefix("10.244.3.0/24"), 0}, // blackhole
		{netip.MustParsePrefix("10.244.2.128/25"), 8},
		{netip.MustParsePrefix("::/0"), 9},
		{netip.MustParsePrefix("fd00:10:244:2::/64"), 7},
	}
	for p, want := range map[string]uint32{
		"10.244.1.0/24":      5,
		"10.244.2.0/24":      7, // a route for half of it does not count
		"10.244.2.200/32":    8,
		"10.244.3.0/24":      0,
		"192.0.2.0/24":       9,
		"fd00:10:244:2::/64": 7,
		"fd00:10:244:9::/64": 9,
	} {
		if got := egress(netip.MustParsePrefix(p), routes); got != want {
			t.Errorf("egress(%s) = %d, want %d", p, got, want)
		}
	}
	if got := egress(netip.MustParsePrefix("10.0.0.0/8"), nil); got != 0 {
		t.Errorf("egress without routes = %d", got)
	}
}

// TestWant checks the map contents the agent computes for a node like the testbed's.
func TestWant(t *testing.T) {
	d, err := Render(node())
	if err != nil {
		t.Fatal(err)
	}
	d.PeerPod = append(d.PeerPod, netip.MustParsePrefix("10.99.0.0/16"))
	links := map[string]uint32{"antrea-gw0": 5, "eth0": 7, "lo": 1, "wlan0": 9}
	routes := []route{
		{netip.MustParsePrefix("0.0.0.0/0"), 9}, // not one of ours: no fallback route
		{netip.MustParsePrefix("10.244.1.0/24"), 5},
		{netip.MustParsePrefix("10.244.0.0/23"), 7},
		{netip.MustParsePrefix("10.244.2.0/24"), 7},
		{netip.MustParsePrefix("172.18.0.0/24"), 7},
		{netip.MustParsePrefix("fd00:10:244:1::/64"), 5},
		{netip.MustParsePrefix("fd00:10:244:2::/64"), 7},
		{netip.MustParsePrefix("fd00:172:18::/64"), 7},
	}
	c, missing := want(d, links, routes, map[uint32]uint32{7: flagOwnClsact, 42: flagOwnClsact})
	if !slices.Equal(missing, []string{"eth1"}) {
		t.Errorf("missing = %v, want [eth1]", missing)
	}
	wantIfaces := map[uint32]fastpathIface{5: {Role: uint32(RoleGateway)}, 7: {Role: uint32(RoleTransport), Flags: flagOwnClsact}}
	if !reflect.DeepEqual(c.ifaces, wantIfaces) {
		t.Errorf("ifaces = %v, want %v", c.ifaces, wantIfaces)
	}
	p := func(s string) netip.Prefix { return netip.MustParsePrefix(s) }
	wantPrefixes := map[string]map[netip.Prefix]uint32{
		"local_pod4": {p("10.244.1.0/24"): 5},
		"local_pod6": {p("fd00:10:244:1::/64"): 5},
		"peer_pod4":  {p("10.244.0.0/24"): 7, p("10.244.2.0/24"): 7, p("10.99.0.0/16"): 0},
		"peer_pod6":  {p("fd00:10:244:2::/64"): 7},
		"peer_node4": {p("172.18.0.3/32"): 7},
		"peer_node6": {p("fd00:172:18::3/128"): 7},
		"exclude4":   {p("10.244.2.66/32"): 0},
		"exclude6":   {},
	}
	if !reflect.DeepEqual(c.prefixes, wantPrefixes) {
		t.Errorf("prefixes =\n%v\nwant\n%v", c.prefixes, wantPrefixes)
	}
	if c.classes != 0b11 {
		t.Errorf("classes = %b", c.classes)
	}
}

func TestLPMKey(t *testing.T) {
	if got, want := lpmKey(netip.MustParsePrefix("10.244.1.0/24")), (fastpathLpm4{Prefixlen: 24, Addr: [4]byte{10, 244, 1, 0}}); got != want {
		t.Errorf("v4 key = %+v, want %+v", got, want)
	}
	k := lpmKey(netip.MustParsePrefix("fd00:10:244:1::/64")).(fastpathLpm6)
	if k.Prefixlen != 64 || k.Addr[0] != 0xfd || k.Addr[3] != 0x10 || k.Addr[15] != 0 {
		t.Errorf("v6 key = %+v", k)
	}
}

func TestDiff(t *testing.T) {
	cur := map[string]uint32{"keep": 1, "change": 2, "stale": 3}
	wnt := map[string]uint32{"keep": 1, "change": 4, "new": 5}
	put, del := diff(cur, wnt)
	if !reflect.DeepEqual(put, map[string]uint32{"change": 4, "new": 5}) || !slices.Equal(del, []string{"stale"}) {
		t.Errorf("diff = %v, %v", put, del)
	}
	if put, del := diff(wnt, wnt); len(put)+len(del) != 0 {
		t.Errorf("diff of equal maps = %v, %v", put, del)
	}
}
