package tc

import (
	"maps"
	"math/rand/v2"
	"net/netip"
	"reflect"
	"slices"
	"testing"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/hostaccel/hostaccel/internal/model"
	"github.com/hostaccel/hostaccel/internal/testbed"
)

func TestEgress(t *testing.T) {
	routes := []route{
		{dst: netip.MustParsePrefix("0.0.0.0/0"), ifindex: 9},
		{dst: netip.MustParsePrefix("10.244.1.0/24"), ifindex: 5},
		{dst: netip.MustParsePrefix("10.244.0.0/16"), ifindex: 7},
		{dst: netip.MustParsePrefix("10.244.3.0/24"), ifindex: 0}, // blackhole
		{dst: netip.MustParsePrefix("10.244.2.128/25"), ifindex: 8},
		{dst: netip.MustParsePrefix("::/0"), ifindex: 9},
		{dst: netip.MustParsePrefix("fd00:10:244:2::/64"), ifindex: 7},
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
	links := map[string]device{"antrea-gw0": {5, 1450, true}, "eth0": {7, 1500, false}, "lo": {1, 65536, false}, "wlan0": {9, 1500, false}}
	routes := []route{
		{dst: netip.MustParsePrefix("0.0.0.0/0"), ifindex: 9}, // not one of ours: no fallback route
		{dst: netip.MustParsePrefix("10.244.1.0/24"), ifindex: 5},
		{dst: netip.MustParsePrefix("10.244.0.0/23"), ifindex: 7},
		{dst: netip.MustParsePrefix("10.244.2.0/24"), ifindex: 7},
		{dst: netip.MustParsePrefix("172.18.0.0/24"), ifindex: 7},
		{dst: netip.MustParsePrefix("fd00:10:244:1::/64"), ifindex: 5},
		{dst: netip.MustParsePrefix("fd00:10:244:2::/64"), ifindex: 7},
		{dst: netip.MustParsePrefix("fd00:172:18::/64"), ifindex: 7},
	}
	// The gateway's own addresses (inside the local Pod CIDRs) are the node's; the transport's
	// are not entered.
	addrs := map[string][]netip.Addr{"antrea-gw0": {netip.MustParseAddr("10.244.1.1"), netip.MustParseAddr("fd00:10:244:1::1")},
		"eth0": {netip.MustParseAddr("172.18.0.2")}}
	// eth0's IPv6 MTU (a router advertisement's) is below its MTU; the gateway's above it.
	ipv6MTU := func(dev string) (uint32, bool) {
		m, ok := map[string]uint32{"eth0": 1280, "antrea-gw0": 1500}[dev]
		return m, ok
	}
	c, missing := want(d, netState{links: links, routes: routes, keep: map[uint32]uint32{7: flagOwnClsact, 42: flagOwnClsact}, destOnly: true, addrs: addrs, ipv6MTU: ipv6MTU})
	if !slices.Equal(missing, []string{"eth1"}) {
		t.Errorf("missing = %v, want [eth1]", missing)
	}
	wantIfaces := map[uint32]fastpathIface{5: {Role: uint32(RoleGateway), Flags: flagPeer, Mtu: 1450, Mtu6: 1450},
		7: {Role: uint32(RoleTransport), Flags: flagOwnClsact | flagMTU6Lower, Mtu: 1500, Mtu6: 1280}}
	if !reflect.DeepEqual(c.ifaces, wantIfaces) {
		t.Errorf("ifaces = %v, want %v", c.ifaces, wantIfaces)
	}
	p := func(s string) netip.Prefix { return netip.MustParsePrefix(s) }
	wantAddrs := map[netip.Prefix]fastpathAddr{
		p("10.244.1.0/24"):      {Flags: addrLocalPod, Egress: 5},
		p("fd00:10:244:1::/64"): {Flags: addrLocalPod, Egress: 5},
		p("10.244.0.0/24"):      {Flags: addrPeerPod, Egress: 7},
		p("10.244.2.0/24"):      {Flags: addrPeerPod, Egress: 7},
		p("10.99.0.0/16"):       {Flags: addrPeerPod},
		p("fd00:10:244:2::/64"): {Flags: addrPeerPod, Egress: 7},
		p("172.18.0.3/32"):      {Flags: addrPeerNode, Egress: 7},
		p("fd00:172:18::3/128"): {Flags: addrPeerNode, Egress: 7},
		// inside a peer Pod CIDR: one lookup says both
		p("10.244.2.66/32"): {Flags: addrPeerPod | addrExclude, Egress: 7},
		// the gateway's addresses: the roles around them, and the node's
		p("10.244.1.1/32"):        {Flags: addrLocalPod | addrNode},
		p("fd00:10:244:1::1/128"): {Flags: addrLocalPod | addrNode},
	}
	if !reflect.DeepEqual(c.addrs, wantAddrs) {
		t.Errorf("addrs =\n%v\nwant\n%v", c.addrs, wantAddrs)
	}
	if c.settings.Classes != 0b11 || c.settings.NatCheck != natCheckTowardPods|natCheckFromPods || c.settings.Flags != settingsNexthopCache|settingsNATCarry {
		t.Errorf("settings = %+v", c.settings)
	}
}

// TestFlatten: every prefix carries the roles of the prefixes that contain it, however
// deeply nested, and no role leaks to a sibling.
func TestFlatten(t *testing.T) {
	p := func(s string) netip.Prefix { return netip.MustParsePrefix(s) }
	d := &Desired{
		LocalPod: []netip.Prefix{p("10.0.0.0/16")},
		PeerPod:  []netip.Prefix{p("10.1.0.0/16"), p("fd00::/64")},
		PeerNode: []netip.Prefix{p("10.0.5.5/32"), p("10.2.0.1/32")},
		Exclude:  []netip.Prefix{p("10.0.5.0/24"), p("10.1.0.0/16"), p("0.0.0.0/0"), p("fd00::1/128")},
	}
	flat := flatten(d)
	got := map[netip.Prefix]uint32{}
	for _, e := range flat {
		if _, twice := got[e.p]; twice {
			t.Errorf("%s twice", e.p)
		}
		got[e.p] = e.flags
	}
	if !slices.IsSortedFunc(flat, func(a, b flatPrefix) int { return model.ComparePrefix(a.p, b.p) }) {
		t.Errorf("not sorted: %v", flat)
	}
	want := map[netip.Prefix]uint32{
		p("0.0.0.0/0"):   addrExclude,
		p("10.0.0.0/16"): addrExclude | addrLocalPod,
		p("10.0.5.0/24"): addrExclude | addrLocalPod,
		p("10.0.5.5/32"): addrExclude | addrLocalPod | addrPeerNode,
		p("10.1.0.0/16"): addrExclude | addrPeerPod, // the same prefix in two sets
		p("10.2.0.1/32"): addrExclude | addrPeerNode,
		p("fd00::/64"):   addrPeerPod, // no IPv4 role leaks into IPv6
		p("fd00::1/128"): addrPeerPod | addrExclude,
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("flatten =\n%v\nwant\n%v", got, want)
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

// TestEgressIndexIsTheLinearScan compares the route index with a scan of every route, over
// random nested routes (with repeated destinations: the first one counts).
func TestEgressIndexIsTheLinearScan(t *testing.T) {
	scan := func(p netip.Prefix, routes []route) uint32 {
		best, bits := uint32(0), -1
		for _, r := range routes {
			if r.dst.Addr().Is4() == p.Addr().Is4() && r.dst.Bits() <= p.Bits() && r.dst.Contains(p.Addr()) && r.dst.Bits() > bits {
				best, bits = r.ifindex, r.dst.Bits()
			}
		}
		return best
	}
	r := rand.New(rand.NewPCG(3, 4))
	randPrefix := func() netip.Prefix {
		a := netip.AddrFrom4([4]byte{10, byte(r.IntN(4)), byte(r.IntN(4)), byte(r.IntN(256))})
		return netip.PrefixFrom(a, 8+r.IntN(25)).Masked()
	}
	var routes []route
	for i := range 300 {
		routes = append(routes, route{dst: randPrefix(), ifindex: uint32(i % 7)})
	}
	routes = append(routes, route{dst: netip.MustParsePrefix("0.0.0.0/0"), ifindex: 9}, route{dst: netip.MustParsePrefix("fd00::/8"), ifindex: 3})
	ix := indexRoutes(routes)
	for range 2000 {
		p := randPrefix()
		if got, want := ix.egress(p), scan(p, routes); got != want {
			t.Fatalf("egress(%s) = %d, the scan says %d", p, got, want)
		}
	}
	if got := ix.egress(netip.MustParsePrefix("fd00:1::/64")); got != 3 {
		t.Errorf("egress(fd00:1::/64) = %d, want 3", got)
	}
}

// One peer CIDR replaced among 10,000 (a route each) is two map operations: its entry out,
// the new one in; the other entries are unchanged.
func TestOneChangedCIDRIsTwoMapOperations(t *testing.T) {
	peer := func(i int) netip.Prefix {
		return netip.PrefixFrom(netip.AddrFrom4([4]byte{10, byte(i >> 8), byte(i), 0}), 24)
	}
	links := map[string]device{"gw": {5, 1500, true}, "eth0": {7, 1500, false}}
	d := &Desired{Devices: map[string]Role{"gw": RoleGateway, "eth0": RoleTransport}, LocalPod: []netip.Prefix{netip.MustParsePrefix("10.255.0.0/24")}}
	var routes []route
	for i := range 10001 {
		routes = append(routes, route{dst: peer(i), ifindex: 7})
	}
	for i := range 10000 {
		d.PeerPod = append(d.PeerPod, peer(i))
	}
	n := netState{links: links, routes: routes}
	before, _ := want(d, n)
	d.PeerPod[5000] = peer(10000)
	after, _ := want(d, n)
	put, del := diff(before.addrs, after.addrs)
	if len(put) != 1 || len(del) != 1 || put[peer(10000)] != (fastpathAddr{Flags: addrPeerPod, Egress: 7}) || del[0] != peer(5000) {
		t.Errorf("put %v, delete %v; want %s in, %s out", put, del, peer(10000), peer(5000))
	}
}

// readAll reads every entry of a trie larger than one batch, as iterating it one by one does,
// whichever way the kernel offers.
func TestReadAllTrie(t *testing.T) {
	testbed.RequireRoot(t)
	m, err := ebpf.NewMap(&ebpf.MapSpec{Type: ebpf.LPMTrie, KeySize: 8, ValueSize: 4, MaxEntries: 5000, Flags: unix.BPF_F_NO_PREALLOC})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	want := map[fastpathLpm4]uint32{}
	for i := range 2500 {
		p := netip.PrefixFrom(netip.AddrFrom4([4]byte{10, byte(i >> 8), byte(i), 0}), 16+i%9)
		k := lpmKey(p.Masked()).(fastpathLpm4)
		if err := m.Put(k, uint32(i)); err != nil {
			t.Fatal(err)
		}
		want[k] = uint32(i)
	}
	got := map[fastpathLpm4]uint32{}
	if err := readAll(m, func(k fastpathLpm4, v uint32) {
		if _, dup := got[k]; dup {
			t.Errorf("%v read twice", k)
		}
		got[k] = v
	}); err != nil {
		t.Fatal(err)
	}
	if !maps.Equal(got, want) {
		t.Fatalf("read %d entries, want %d", len(got), len(want))
	}
}

// clearPairBits zeroes the filter whether it can map it (the program's, BPF_F_MMAPABLE) or
// must write it element by element (a map without the flag).
func TestClearPairBits(t *testing.T) {
	testbed.RequireRoot(t)
	for _, flags := range []uint32{unix.BPF_F_MMAPABLE, 0} {
		m, err := ebpf.NewMap(&ebpf.MapSpec{Type: ebpf.Array, KeySize: 4, ValueSize: 8, MaxEntries: 1024, Flags: flags})
		if err != nil {
			t.Fatal(err)
		}
		defer m.Close()
		for _, k := range []uint32{0, 511, 1023} {
			if err := m.Put(k, ^uint64(0)); err != nil {
				t.Fatal(err)
			}
		}
		if err := (&progSet{maps: fastpathMaps{PairBits: m}}).clearPairBits(); err != nil {
			t.Fatalf("flags %#x: %v", flags, err)
		}
		var k uint32
		var w uint64
		for it := m.Iterate(); it.Next(&k, &w); {
			if w != 0 {
				t.Errorf("flags %#x: word %d = %#x after clearing", flags, k, w)
			}
		}
	}
}

// BenchmarkWant10k: the maps' contents for 10,000 peer Pod CIDRs with a route each, as a
// one-shot apply and every agent sync work them out (bench control-plane's tc part).
func BenchmarkWant10k(b *testing.B) {
	const n = 10000
	d := &Desired{
		Devices:  map[string]Role{"gw": RoleGateway, "eth0": RoleTransport},
		LocalPod: []netip.Prefix{netip.MustParsePrefix("10.255.255.0/24")},
	}
	ns := netState{
		links: map[string]device{"gw": {index: 2, mtu: 1500}, "eth0": {index: 3, mtu: 1500}},
		addrs: map[string][]netip.Addr{"gw": {netip.MustParseAddr("10.255.255.1")}},
	}
	for i := range n {
		p := netip.PrefixFrom(netip.AddrFrom4([4]byte{10, byte(i >> 10), byte(i >> 2), byte(i&3) << 6}), 26)
		d.PeerPod = append(d.PeerPod, p)
		ns.routes = append(ns.routes, route{dst: p, ifindex: 3})
	}
	b.ReportAllocs()
	for b.Loop() {
		if c, _ := want(d, ns); len(c.addrs) != n+2 {
			b.Fatalf("%d addrs", len(c.addrs))
		}
	}
}
