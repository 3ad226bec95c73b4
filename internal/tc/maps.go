package tc

import (
	"crypto/sha256"
	"encoding/binary"
	"net/netip"
	"slices"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/hostaccel/hostaccel/internal/model"
)

// The program's flag bits (enums in bpf/fastpath.c).
const (
	// ifaces flags
	flagOwnClsact = 1 << 0 // agent bookkeeping: hostaccel created the device's clsact qdisc
	flagPeer      = 1 << 1 // a veth whose peer is in another netns: bpf_redirect_peer
	flagMTU6Lower = 1 << 2 // its IPv6 MTU is below its MTU: IPv6 GSO packets take the stack

	// addrs flags: the roles of an address
	addrLocalPod = 1 << 0
	addrPeerPod  = 1 << 1
	addrPeerNode = 1 << 2
	addrExclude  = 1 << 3
	addrNode     = 1 << 4 // an address of this node on a gateway
	addrPairOnly = 1 << 5 // a route that depends on the source decides some of it: answers kept per pair
	addrNoKeep   = 1 << 6 // an ECMP route the kernel hashes by more than the addresses decides some of it: none kept

	// settings.flags
	settingsNexthopCache = 1 << 0
	settingsNATCarry     = 1 << 1

	// settings.nat_check
	natCheckTowardPods = 1 << 0
	natCheckFromPods   = 1 << 1
)

// addrRoles names the addrs flags (render output and errors).
var addrRoles = []struct {
	flag uint32
	name string
	get  func(*Desired) []netip.Prefix
}{
	{addrLocalPod, "local-pod", func(d *Desired) []netip.Prefix { return d.LocalPod }},
	{addrPeerPod, "peer-pod", func(d *Desired) []netip.Prefix { return d.PeerPod }},
	{addrPeerNode, "peer-node", func(d *Desired) []netip.Prefix { return d.PeerNode }},
	{addrExclude, "exclude", func(d *Desired) []netip.Prefix { return d.Exclude }},
}

// contents is what the program's maps hold, or should hold.
type contents struct {
	ifaces   map[uint32]fastpathIface
	addrs    map[netip.Prefix]fastpathAddr // both families: addrs4 and addrs6
	settings fastpathSettings              // what the maps hold or should hold; compared as policy()
}

// policy is settings without what the agent keeps there as bookkeeping (the build, the
// generation, the handed marks' epochs): what two applies of the same config agree on.
func policy(s fastpathSettings) fastpathSettings {
	s.Build, s.Generation, s.HandedEpoch, s.HandedSince = 0, 0, 0, 0
	return s
}

// flatPrefix is a prefix of a Desired with its roles: its own and those of every prefix
// that contains it.
type flatPrefix struct {
	p     netip.Prefix
	flags uint32
}

// flatten gives every prefix of d the roles of all the prefixes that contain it, so that the
// program's one longest-prefix lookup per address answers every role (an excluded /32 inside
// a local Pod CIDR is both); a prefix in several sets is one entry with all their roles.
// Prefixes are nested or disjoint: after sorting by address, then length, a stack of the open
// prefixes holds exactly the ones containing the next. O(n log n), without maps (at 10,000
// peer CIDRs two maps of them were a third of want's time, BenchmarkWant10k). The result is
// sorted as model.SortPrefixes sorts.
func flatten(d *Desired) []flatPrefix {
	n := 0
	for _, r := range addrRoles {
		n += len(r.get(d))
	}
	in := make([]flatPrefix, 0, n)
	for _, r := range addrRoles {
		for _, p := range r.get(d) {
			in = append(in, flatPrefix{p, r.flag})
		}
	}
	out := make([]flatPrefix, 0, n)
	var open []int // indexes in out of the prefixes that contain the next one
	for _, i := range model.SortedOrder(len(in), func(i int) netip.Prefix { return in[i].p }) {
		e := in[i]
		if k := len(out) - 1; k >= 0 && out[k].p == e.p {
			out[k].flags |= e.flags // the same prefix again: nothing nested in it came yet
			continue
		}
		for len(open) > 0 && !contains(out[open[len(open)-1]].p, e.p) {
			open = open[:len(open)-1]
		}
		if len(open) > 0 {
			e.flags |= out[open[len(open)-1]].flags
		}
		out = append(out, e)
		open = append(open, len(out)-1)
	}
	return out
}

// contains reports whether prefix a contains all of prefix b.
func contains(a, b netip.Prefix) bool {
	return a.Addr().BitLen() == b.Addr().BitLen() && a.Bits() <= b.Bits() && a.Contains(b.Addr())
}

// netState is what want needs to know of the namespace: its devices, its main table's routes, the
// flags to keep per ifindex (agent bookkeeping), and whether the FIB's answers depend on the
// destination alone (no policy routing, no route MTUs), so that the program may keep them.
type netState struct {
	links    map[string]device
	routes   []route
	keep     map[uint32]uint32
	destOnly bool
	addrs    map[string][]netip.Addr // each device's addresses (want uses the gateways')
	// ipv6MTU reads a device's IPv6 MTU (ok false: none, IPv6 is off there); nil: none read.
	ipv6MTU func(dev string) (mtu uint32, ok bool)
}

// device is a link as want needs it.
type device struct {
	index uint32
	mtu   uint32
	peer  bool // a veth with its peer in another network namespace
}

// want computes the maps' contents for d on node n. Devices of d that are not present are
// returned as missing, sorted.
func want(d *Desired, n netState) (contents, []string) {
	c := contents{
		ifaces:   map[uint32]fastpathIface{},
		settings: fastpathSettings{Classes: classBits(d.Classes), NatCheck: natCheckBits(d.NATCheck), TickNs: tickNS()},
	}
	if n.destOnly {
		c.settings.Flags |= settingsNexthopCache
	}
	if d.NATCarry && d.NATCheck != model.NATCheckOff {
		c.settings.Flags |= settingsNATCarry
	}
	var missing []string
	for name, role := range d.Devices {
		l, ok := n.links[name]
		if !ok {
			missing = append(missing, name)
			continue
		}
		f := n.keep[l.index] & flagOwnClsact
		if l.peer && usePeer {
			f |= flagPeer
		}
		// The FIB checks IPv6 packets against the device's IPv6 MTU (an admin's, a router
		// advertisement's), which may be below its MTU: kept answers check them against it.
		mtu6 := l.mtu
		if n.ipv6MTU != nil {
			if m, ok := n.ipv6MTU(name); ok && m < mtu6 {
				mtu6 = m
				f |= flagMTU6Lower
			}
		}
		c.ifaces[l.index] = fastpathIface{Role: uint32(role), Flags: f, Mtu: l.mtu, Mtu6: mtu6}
	}
	slices.Sort(missing)
	routes := indexRoutes(n.routes)
	flat := flatten(d)
	c.addrs = make(map[netip.Prefix]fastpathAddr, len(flat)) // (plus the gateways' own addresses, below)
	for _, fp := range flat {
		var e uint32
		flags := fp.flags
		if fp.flags&(addrLocalPod|addrPeerPod|addrPeerNode) != 0 {
			if e = routes.egress(fp.p); c.ifaces[e] == (fastpathIface{}) {
				e = 0 // not one of our devices
			}
			switch routes.keeping(fp.p) {
			case keepPair:
				flags |= addrPairOnly
			case keepNone:
				flags |= addrPairOnly | addrNoKeep
			}
		}
		c.addrs[fp.p] = fastpathAddr{Flags: flags, Egress: e}
	}
	// The node's own addresses on its gateways lie inside the local Pod CIDRs: they get a
	// host entry with addrNode on top of the roles of the prefixes around them, so that the
	// program takes packets to them (masqueraded replies) as the node's, not a Pod's.
	for name, role := range d.Devices {
		if role != RoleGateway {
			continue
		}
		for _, a := range n.addrs[name] {
			p := netip.PrefixFrom(a, a.BitLen())
			if _, ok := c.addrs[p]; ok {
				c.addrs[p] = fastpathAddr{Flags: c.addrs[p].Flags | addrNode, Egress: c.addrs[p].Egress}
				continue
			}
			var around netip.Prefix
			for q := range c.addrs {
				if q.Contains(a) && q.Bits() > around.Bits() {
					around = q
				}
			}
			c.addrs[p] = fastpathAddr{Flags: c.addrs[around].Flags | addrNode}
		}
	}
	return c, missing
}

// diff returns the entries of want that cur lacks or holds with another value, and the keys
// of cur that want lacks.
func diff[K comparable, V comparable](cur, want map[K]V) (put map[K]V, del []K) {
	put = map[K]V{}
	for k, v := range want {
		if cv, ok := cur[k]; !ok || cv != v {
			put[k] = v
		}
	}
	for k := range cur {
		if _, ok := want[k]; !ok {
			del = append(del, k)
		}
	}
	return put, del
}

// lpmKey is the trie key of p.
func lpmKey(p netip.Prefix) any {
	if p.Addr().Is4() {
		return fastpathLpm4{Prefixlen: uint32(p.Bits()), Addr: p.Addr().As4()}
	}
	return fastpathLpm6{Prefixlen: uint32(p.Bits()), Addr: p.Addr().As16()}
}

// objectHash identifies the embedded object: a program set loaded from another build (an
// older hostaccel) is replaced rather than reused, since its maps may differ.
var objectHash = func() uint64 {
	h := sha256.Sum256(_FastpathBytes)
	return binary.LittleEndian.Uint64(h[:8])
}()

// buildID is what a program set's settings record: the object, and whether the kernel had
// the conntrack kfuncs when it was loaded (they are linked at load time, so a set loaded
// before nf_conntrack is replaced once it is there).
func buildID(withConntrack bool) uint64 {
	if withConntrack {
		return objectHash | 1
	}
	return objectHash &^ 1
}

// tickNS is a jiffy in nanoseconds, the resolution of the coarse clocks (1e9 / CONFIG_HZ):
// the express lane's slots expire in jiffies, the cheapest clock a program reads. 0 where the
// kernel does not say: the program then keeps no slot.
var tickNS = sync.OnceValue(func() uint32 {
	var ts unix.Timespec
	if unix.ClockGetres(unix.CLOCK_MONOTONIC_COARSE, &ts) != nil || ts.Sec != 0 || ts.Nsec <= 0 {
		return 0
	}
	return uint32(ts.Nsec)
})
