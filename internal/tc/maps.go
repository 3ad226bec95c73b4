package tc

import (
	"crypto/sha256"
	"encoding/binary"
	"net/netip"
	"slices"
)

// flagOwnClsact in an ifaces value: hostaccel created the device's clsact qdisc, so Remove
// deletes it once nothing else is on it.
const flagOwnClsact = 1

// prefixSets are the program's address sets; each is one LPM trie per family, named
// set+"4" / set+"6". The class sets carry the agent's route as value.
var prefixSets = []struct {
	name   string
	get    func(*Desired) []netip.Prefix
	routed bool
}{
	{"local_pod", func(d *Desired) []netip.Prefix { return d.LocalPod }, true},
	{"peer_pod", func(d *Desired) []netip.Prefix { return d.PeerPod }, true},
	{"peer_node", func(d *Desired) []netip.Prefix { return d.PeerNode }, true},
	{"exclude", func(d *Desired) []netip.Prefix { return d.Exclude }, false},
}

// mapName is the trie of set for p's family.
func mapName(set string, p netip.Prefix) string {
	if p.Addr().Is4() {
		return set + "4"
	}
	return set + "6"
}

// contents is what the program's maps hold, or should hold.
type contents struct {
	ifaces   map[uint32]fastpathIface
	prefixes map[string]map[netip.Prefix]uint32 // trie name -> prefix -> egress ifindex (0: none)
	classes  uint32
}

// route is a route of the main table, reduced to what the program's fallback needs.
type route struct {
	dst     netip.Prefix
	ifindex uint32 // 0: not a unicast route through a single device
}

// egress returns the device of the most specific route that covers all of p (0: none).
// The program uses it only where the kernel's FIB helper refuses to route because
// forwarding is disabled; bpf_redirect_neigh then finds the next hop on that device.
func egress(p netip.Prefix, routes []route) uint32 {
	best, bits := uint32(0), -1
	for _, r := range routes {
		if r.dst.Addr().Is4() == p.Addr().Is4() && r.dst.Bits() <= p.Bits() && r.dst.Contains(p.Addr()) && r.dst.Bits() > bits {
			best, bits = r.ifindex, r.dst.Bits()
		}
	}
	return best
}

// want computes the maps' contents for d, given the devices present (name -> ifindex), the
// main table's routes and the flags to keep per ifindex. Devices of d that are not present
// are returned as missing, sorted.
func want(d *Desired, links map[string]uint32, routes []route, flags map[uint32]uint32) (contents, []string) {
	c := contents{ifaces: map[uint32]fastpathIface{}, prefixes: map[string]map[netip.Prefix]uint32{}, classes: classBits(d.Classes)}
	var missing []string
	for name, role := range d.Devices {
		idx, ok := links[name]
		if !ok {
			missing = append(missing, name)
			continue
		}
		c.ifaces[idx] = fastpathIface{Role: uint32(role), Flags: flags[idx]}
	}
	slices.Sort(missing)
	for _, s := range prefixSets {
		for _, fam := range []string{"4", "6"} {
			c.prefixes[s.name+fam] = map[netip.Prefix]uint32{}
		}
		for _, p := range s.get(d) {
			var e uint32
			if s.routed {
				e = egress(p, routes)
				if _, ours := c.ifaces[e]; !ours {
					e = 0
				}
			}
			c.prefixes[mapName(s.name, p)][p] = e
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

// build identifies the embedded object: a program set loaded from another build (an older
// hostaccel) is replaced rather than reused, since its maps may differ.
var build = func() uint64 {
	h := sha256.Sum256(_FastpathBytes)
	return binary.LittleEndian.Uint64(h[:8])
}()
