package sockmap

import (
	"net/netip"
	"slices"

	"github.com/hostaccel/hostaccel/internal/model"
)

// Supported lists the classes the sockmap datapath serves.
var Supported = []model.Class{model.LocalPodToPod}

// Desired is what the program's maps should hold.
type Desired struct {
	LocalPod []netip.Prefix // this node's Pod CIDRs: sockets with both ends in them are entered
	Exclude  []netip.Prefix // never entered, as either end
}

// Render computes the Desired state for s (pure). Without the local-pod-to-pod class enabled
// there is nothing to do: nil.
func Render(s model.State) *Desired {
	if !s.Enabled(model.LocalPodToPod) {
		return nil
	}
	return &Desired{LocalPod: canonical(s.LocalPodCIDRs), Exclude: canonical(s.Exclude)}
}

// Addr flags (enum addr_flag in bpf/sockmap.c).
const (
	addrLocalPod uint32 = 1 << 0
	addrExclude  uint32 = 1 << 1
)

// entries turns d into trie entries: each prefix carries the flags of every prefix that
// contains it, so the longest match answers all of them (an exclusion inside a Pod CIDR, and a
// Pod CIDR inside an exclusion, both exclude).
func (d *Desired) entries() map[netip.Prefix]uint32 {
	out := map[netip.Prefix]uint32{}
	all := map[netip.Prefix]uint32{}
	for _, p := range d.LocalPod {
		all[p] |= addrLocalPod
	}
	for _, p := range d.Exclude {
		all[p] |= addrExclude
	}
	// A prefix's flags are its own and those of every prefix that holds it: looked up per
	// distinct prefix length (few), not compared with every prefix (quadratic: 262,144
	// exclusions took minutes).
	var lens [2][]int // IPv4, IPv6
	for p := range all {
		f := famOf(p)
		if !slices.Contains(lens[f], p.Bits()) {
			lens[f] = append(lens[f], p.Bits())
		}
	}
	for p := range all {
		var f uint32
		for _, b := range lens[famOf(p)] {
			if b <= p.Bits() {
				f |= all[netip.PrefixFrom(p.Addr(), b).Masked()]
			}
		}
		out[p] = f
	}
	return out
}

// famOf is 0 for an IPv4 prefix, 1 for IPv6.
func famOf(p netip.Prefix) int {
	if p.Addr().Is4() {
		return 0
	}
	return 1
}

// canonical masks, unmaps, sorts and de-duplicates prefixes (LPM trie keys must be masked).
func canonical(ps []netip.Prefix) []netip.Prefix {
	var out []netip.Prefix
	for _, p := range ps {
		out = append(out, model.Unmap4in6(p))
	}
	model.SortPrefixes(out)
	return slices.Compact(out)
}
