package tc

import (
	"fmt"
	"net"
	"net/netip"
	"slices"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// route is a route of the main table, reduced to what the program's fallback needs.
type route struct {
	dst     netip.Prefix
	ifindex uint32 // 0: not a unicast route through a single device
}

// egress returns the device of the most specific route that covers all of p (0: none).
// The program uses it only where the kernel's FIB helper refuses to route because
// forwarding is disabled; bpf_redirect_neigh then finds the next hop on that device.
func egress(p netip.Prefix, routes []route) uint32 { return indexRoutes(routes).egress(p) }

// routeIndex finds the most specific route of a prefix in as many lookups as there are
// distinct route lengths, not routes: a node has a route per peer (thousands).
type routeIndex struct {
	byDst map[netip.Prefix]uint32 // the first route of each destination
	bits  [2][]int                // per family (0: IPv4), the route lengths, longest first
}

func indexRoutes(routes []route) routeIndex {
	ix := routeIndex{byDst: make(map[netip.Prefix]uint32, len(routes))}
	for _, r := range routes {
		if _, ok := ix.byDst[r.dst]; ok {
			continue
		}
		ix.byDst[r.dst] = r.ifindex
		f := 0
		if !r.dst.Addr().Is4() {
			f = 1
		}
		if !slices.Contains(ix.bits[f], r.dst.Bits()) {
			ix.bits[f] = append(ix.bits[f], r.dst.Bits())
		}
	}
	for f := range ix.bits {
		slices.SortFunc(ix.bits[f], func(a, b int) int { return b - a })
	}
	return ix
}

func (ix routeIndex) egress(p netip.Prefix) uint32 {
	f := 0
	if !p.Addr().Is4() {
		f = 1
	}
	for _, b := range ix.bits[f] {
		if b > p.Bits() {
			continue
		}
		if idx, ok := ix.byDst[netip.PrefixFrom(p.Addr(), b).Masked()]; ok {
			return idx
		}
	}
	return 0
}

// mainRoutes lists the main table's routes of both families, and whether one of them has
// an MTU of its own.
func mainRoutes() ([]route, bool, error) {
	var out []route
	mtu := false
	for _, fam := range []int{netlink.FAMILY_V4, netlink.FAMILY_V6} {
		rs, err := netlink.RouteListFiltered(fam, &netlink.Route{Table: unix.RT_TABLE_MAIN}, netlink.RT_FILTER_TABLE)
		if err != nil {
			return nil, false, fmt.Errorf("listing routes: %w", err)
		}
		for _, r := range rs {
			out = append(out, route{dst: prefixOf(r.Dst, fam), ifindex: routeDevice(r)})
			mtu = mtu || r.MTU != 0
		}
	}
	return out, mtu, nil
}

// destinationRouting reports whether the FIB's answers here depend on the destination alone:
// no routing rules but the kernel's own (local, main, default) and no route with an MTU of its
// own in the main table (routeMTU, from mainRoutes). Only then may the program keep an answer
// for a destination.
func destinationRouting(routeMTU bool) (bool, error) {
	if routeMTU {
		return false, nil
	}
	for _, fam := range []int{netlink.FAMILY_V4, netlink.FAMILY_V6} {
		rules, err := netlink.RuleList(fam)
		if err != nil {
			return false, fmt.Errorf("listing routing rules: %w", err)
		}
		for _, r := range rules {
			if r.Table != unix.RT_TABLE_LOCAL && r.Table != unix.RT_TABLE_MAIN && r.Table != unix.RT_TABLE_DEFAULT {
				return false, nil
			}
			if r.Src != nil || r.Dst != nil || r.IifName != "" || r.OifName != "" || r.Mark != 0 {
				return false, nil
			}
		}
	}
	return true, nil
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
