package tc

import (
	"net"
	"net/netip"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/hostaccel/hostaccel/internal/testbed"
)

// mainRoutes reads from its own dump what the netlink library decodes: every route of the
// main table of both families with its single device (0 for multipath over several devices,
// a blackhole, a route in another table is left out), and whether one has an MTU.
func TestMainRoutesAsTheLibrary(t *testing.T) {
	testbed.RequireRoot(t)
	ns, err := testbed.NewNS("routes")
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Close()
	for _, cmd := range []string{
		"link add ra type veth peer name ra-peer", "link add rb type veth peer name rb-peer", "link set ra up", "link set rb up",
		"addr add 192.0.2.1/24 dev ra", "addr add 198.51.100.1/24 dev rb",
		"addr add 2001:db8::1/64 dev ra nodad", "addr add 2001:db8:1::1/64 dev rb nodad",
		"route add 10.1.0.0/16 via 192.0.2.2", "route add 10.2.0.0/26 dev rb",
		"route add 10.3.0.0/24 nexthop via 192.0.2.2 nexthop via 192.0.2.3",
		"route add 10.4.0.0/24 nexthop via 192.0.2.2 nexthop via 198.51.100.2",
		"route add blackhole 10.5.0.0/24", "route add 10.6.0.0/24 via 192.0.2.2 table 100",
		"route add default via 192.0.2.254",
		"route add fd00::/64 via 2001:db8::2", "route add fd01::/48 dev rb",
		"route add fd02::/64 nexthop via 2001:db8::2 nexthop via 2001:db8:1::2",
		"route add unreachable fd03::/64",
	} {
		if out, err := ns.Exec(append([]string{"ip"}, strings.Fields(cmd)...)...); err != nil {
			t.Fatalf("ip %s: %v %s", cmd, err, out)
		}
	}
	for _, withMTU := range []bool{false, true} {
		if withMTU {
			if out, err := ns.Exec("ip", "route", "add", "10.7.0.0/24", "via", "192.0.2.2", "mtu", "1400"); err != nil {
				t.Fatal(err, out)
			}
		}
		var got, want []route
		var gotMTU, wantMTU bool
		if err := ns.Do(func() error {
			var err error
			if got, gotMTU, err = mainRoutes(); err != nil {
				return err
			}
			want, wantMTU, err = libraryRoutes()
			return err
		}); err != nil {
			t.Fatal(err)
		}
		if len(want) < 12 {
			t.Fatalf("the library listed %d routes: %v", len(want), want)
		}
		order := func(a, b route) int { return strings.Compare(a.dst.String(), b.dst.String()) }
		slices.SortFunc(got, order)
		slices.SortFunc(want, order)
		if !slices.Equal(got, want) || gotMTU != wantMTU {
			t.Errorf("mainRoutes: %v (specific %v)\nlibrary:    %v (specific %v)", got, gotMTU, want, wantMTU)
		}
	}
}

// libraryRoutes is mainRoutes by the netlink library's decoding.
func libraryRoutes() ([]route, bool, error) {
	var out []route
	specific := false
	for _, fam := range []int{netlink.FAMILY_V4, netlink.FAMILY_V6} {
		rs, err := netlink.RouteListFiltered(fam, &netlink.Route{Table: unix.RT_TABLE_MAIN}, netlink.RT_FILTER_TABLE)
		if err != nil {
			return nil, false, err
		}
		for _, r := range rs {
			// (the library does not decode a route's source prefix: TestSpecificRoutes)
			k := keepDest
			if len(r.MultiPath) > 1 {
				k = keepPair
				if fam == netlink.FAMILY_V6 || !ipv4HashByAddrs() {
					k = keepNone
				}
			}
			out = append(out, route{dst: prefixOf(r.Dst, fam), ifindex: routeDevice(r), keep: k})
			specific = specific || r.MTU != 0 || r.Tos != 0
		}
	}
	return out, specific, nil
}

// routeDevice is the single device a unicast route leaves through, or 0.
func routeDevice(r netlink.Route) uint32 {
	if r.Type != unix.RTN_UNICAST {
		return 0
	}
	if len(r.MultiPath) == 0 {
		return uint32(r.LinkIndex)
	}
	idx := r.MultiPath[0].LinkIndex
	for _, nh := range r.MultiPath {
		if nh.LinkIndex != idx {
			return 0
		}
	}
	return uint32(idx)
}

func prefixOf(n *net.IPNet, fam int) netip.Prefix {
	if n == nil {
		if fam == netlink.FAMILY_V4 {
			return netip.PrefixFrom(netip.IPv4Unspecified(), 0)
		}
		return netip.PrefixFrom(netip.IPv6Unspecified(), 0)
	}
	a, _ := netip.AddrFromSlice(n.IP)
	if fam == netlink.FAMILY_V4 {
		a = a.Unmap()
	}
	bits, _ := n.Mask.Size()
	return netip.PrefixFrom(a, bits)
}

// A route whose FIB answer depends on more than a packet's addresses (an MTU of its own, a
// TOS selector) makes the program keep no answer; one whose answer depends on the source too
// (a source prefix, IPv6 `from`; several next hops the kernel picks by the addresses) keeps
// answers for what it decides per pair of addresses (kept per destination, a next hop kept
// for one source went to another whose route leaves elsewhere, and every flow went the way of
// the last answer); several next hops the kernel picks per flow (IPv4 with
// fib_multipath_hash_policy 1, IPv6) keep none (kept per pair, every flow of a pair went the
// first one's way).
func TestSpecificRoutes(t *testing.T) {
	testbed.RequireRoot(t)
	for _, tc := range []struct {
		route    string
		policy   string // net.ipv4.fib_multipath_hash_policy
		specific bool
		keep     keeping
	}{
		{"10.1.0.0/16 via 192.0.2.2", "0", false, keepDest},
		{"10.1.0.0/16 nexthop via 192.0.2.2", "1", false, keepDest},
		{"fd00::/64 via 2001:db8::2", "0", false, keepDest},
		{"10.1.0.0/16 via 192.0.2.2 mtu 1400", "0", true, keepDest},
		{"10.1.0.0/16 tos 0x10 via 192.0.2.2", "0", true, keepDest},
		{"fd00::/64 from 2001:db8:5::/64 via 2001:db8::2", "0", false, keepPair},
		{"10.1.0.0/16 nexthop via 192.0.2.2 nexthop via 192.0.2.3", "0", false, keepPair},
		{"10.1.0.0/16 nexthop via 192.0.2.2 nexthop via 192.0.2.3", "2", false, keepPair},
		{"10.1.0.0/16 nexthop via 192.0.2.2 nexthop via 192.0.2.3", "1", false, keepNone},
		{"fd00::/64 nexthop via 2001:db8::2 nexthop via 2001:db8::3", "0", false, keepNone},
	} {
		ns, err := testbed.NewNS("routes")
		if err != nil {
			t.Fatal(err)
		}
		for _, cmd := range []string{"link add ra type veth peer name ra-peer", "link set ra up",
			"addr add 192.0.2.1/24 dev ra", "addr add 2001:db8::1/64 dev ra nodad", "route add " + tc.route} {
			if out, err := ns.Exec(append([]string{"ip"}, strings.Fields(cmd)...)...); err != nil {
				ns.Close()
				t.Fatalf("ip %s: %v %s", cmd, err, out)
			}
		}
		var got bool
		var routes []route
		err = ns.Do(func() (err error) {
			if err := os.WriteFile("/proc/sys/net/ipv4/fib_multipath_hash_policy", []byte(tc.policy), 0); err != nil {
				return err
			}
			routes, got, err = mainRoutes()
			return err
		})
		ns.Close()
		if err != nil {
			t.Fatal(err)
		}
		dst := netip.MustParsePrefix(strings.Fields(tc.route)[0])
		i := slices.IndexFunc(routes, func(r route) bool { return r.dst == dst })
		if got != tc.specific || i < 0 || routes[i].keep != tc.keep {
			t.Errorf("route %s, policy %s: specific %v, routes %+v; want specific %v, keep %v", tc.route, tc.policy, got, routes, tc.specific, tc.keep)
		}
	}
}

// A prefix keeps answers as narrowly as the narrowest route that decides some address of it:
// the one route that covers all of it, or one inside it; not one shadowed by a more specific
// route.
func TestPrefixKeeping(t *testing.T) {
	p := netip.MustParsePrefix
	ix := indexRoutes([]route{
		{dst: p("0.0.0.0/0"), ifindex: 9, keep: keepPair}, // an ECMP default route
		{dst: p("10.244.0.0/16"), ifindex: 7},
		{dst: p("10.244.5.0/24"), ifindex: 7, keep: keepPair},
		{dst: p("10.244.6.128/25"), ifindex: 7, keep: keepPair},
		{dst: p("10.244.8.0/24"), ifindex: 7, keep: keepPair},
		{dst: p("10.244.8.64/26"), ifindex: 7, keep: keepNone},
		{dst: p("10.244.8.128/26"), ifindex: 7, keep: keepPair},
		{dst: p("fd00:10:244::/48"), ifindex: 7},
		{dst: p("fd00:10:244:2::/64"), ifindex: 7, keep: keepPair},
		{dst: p("fd00:10:244:3::/64"), ifindex: 7, keep: keepNone},
	})
	for s, want := range map[string]keeping{
		"10.244.1.0/24":      keepDest, // under 10.244.0.0/16, which shadows the default route
		"10.244.5.0/24":      keepPair,
		"10.244.5.7/32":      keepPair,
		"10.244.6.0/24":      keepPair, // a keepPair route inside it
		"10.244.7.0/24":      keepDest,
		"10.244.8.0/24":      keepNone, // a keepNone route inside it, after it and before a keepPair one
		"10.244.8.128/25":    keepPair,
		"192.0.2.0/24":       keepPair, // the default route decides it
		"fd00:10:244:1::/64": keepDest,
		"fd00:10:244:2::/64": keepPair,
		"fd00:10:244::/48":   keepNone, // both inside it
		"fd00:10:244:3::/64": keepNone,
	} {
		if got := ix.keeping(p(s)); got != want {
			t.Errorf("keeping(%s) = %v, want %v", s, got, want)
		}
	}
}

// A kernel without IPv6 policy routing (booted with ipv6.disable=1, or built without
// multiple tables) answers a dump of IPv6 rules with EAFNOSUPPORT: there are none, and the
// IPv4 rules decide. Any other error is one.
func TestDestinationRoutingWithoutIPv6Rules(t *testing.T) {
	defer func(f func(int) ([]netlink.Rule, error)) { ruleList = f }(ruleList)
	var v4 []netlink.Rule
	ruleList = func(fam int) ([]netlink.Rule, error) {
		if fam == netlink.FAMILY_V6 {
			return nil, unix.EAFNOSUPPORT
		}
		return v4, nil
	}
	if ok, err := destinationRouting(false); !ok || err != nil {
		t.Errorf("no IPv6 rules, none of IPv4: %v %v", ok, err)
	}
	v4 = []netlink.Rule{{Table: 100, Priority: 10}}
	if ok, err := destinationRouting(false); ok || err != nil {
		t.Errorf("an IPv4 rule to table 100: %v %v", ok, err)
	}
	ruleList = func(int) ([]netlink.Rule, error) { return nil, unix.EPERM }
	if _, err := destinationRouting(false); err == nil {
		t.Error("EPERM was taken for no rules")
	}
}
