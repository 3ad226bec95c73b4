package tc

import (
	"cmp"
	"errors"
	"fmt"
	"io/fs"
	"net/netip"
	"os"
	"slices"
	"strings"
	"unsafe"

	mnl "github.com/mdlayher/netlink"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"

	"github.com/hostaccel/hostaccel/internal/nldump"
)

// route is a route of the main table, reduced to what the program's fallback needs.
type route struct {
	dst     netip.Prefix
	ifindex uint32 // 0: not a unicast route through a single device
	// keep: what the FIB's answer for the addresses it decides depends on, and so how the
	// program may keep it.
	keep keeping
}

// keeping says how the program may keep the FIB's answers for what a route decides.
type keeping uint8

const (
	keepDest keeping = iota // per destination: the answer depends on it alone
	// per pair of addresses only (addrPairOnly): the answer depends on the source too (a
	// source prefix, IPv6 `from`; several next hops the kernel picks by a hash of the
	// addresses)
	keepPair
	// none (addrNoKeep): several next hops the kernel picks per flow (a hash of the ports,
	// fib_multipath_hash_policy 1; IPv6's hash takes the flow label): every packet asks the
	// FIB with its ports. Kept per pair, every flow of a pair went the first one's way.
	keepNone
)

// egress returns the device of the most specific route that covers all of p (0: none).
// The program uses it only where the kernel's FIB helper refuses to route because
// forwarding is disabled; bpf_redirect_neigh then finds the next hop on that device.
func egress(p netip.Prefix, routes []route) uint32 { return indexRoutes(routes).egress(p) }

// routeIndex finds the most specific route of a prefix in as many lookups as there are
// distinct route lengths, not routes: a node has a route per peer (thousands).
type routeIndex struct {
	byDst map[netip.Prefix]route // the first route of each destination
	bits  [2][]int               // per family (0: IPv4), the route lengths, longest first
	// narrow are the destinations of the routes that keep less than per destination, by
	// address (few, as a rule)
	narrow []netip.Prefix
}

func indexRoutes(routes []route) routeIndex {
	ix := routeIndex{byDst: make(map[netip.Prefix]route, len(routes))}
	for _, r := range routes {
		if _, ok := ix.byDst[r.dst]; ok {
			continue
		}
		ix.byDst[r.dst] = r
		if r.keep != keepDest {
			ix.narrow = append(ix.narrow, r.dst)
		}
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
	slices.SortFunc(ix.narrow, func(a, b netip.Prefix) int { return a.Addr().Compare(b.Addr()) })
	return ix
}

// covering returns the most specific route that covers all of p (ok false: none).
func (ix routeIndex) covering(p netip.Prefix) (route, bool) {
	f := 0
	if !p.Addr().Is4() {
		f = 1
	}
	for _, b := range ix.bits[f] {
		if b > p.Bits() {
			continue
		}
		if r, ok := ix.byDst[netip.PrefixFrom(p.Addr(), b).Masked()]; ok {
			return r, true
		}
	}
	return route{}, false
}

func (ix routeIndex) egress(p netip.Prefix) uint32 {
	r, _ := ix.covering(p)
	return r.ifindex
}

// keeping returns how the program may keep answers for p: the narrowest keeping of the
// routes that decide some address of it (the route that covers all of p, and those inside it).
func (ix routeIndex) keeping(p netip.Prefix) keeping {
	k := keepDest
	if r, ok := ix.covering(p); ok {
		k = r.keep
	}
	p = p.Masked()
	i, _ := slices.BinarySearchFunc(ix.narrow, p.Addr(), func(q netip.Prefix, a netip.Addr) int { return q.Addr().Compare(a) })
	for ; i < len(ix.narrow) && p.Contains(ix.narrow[i].Addr()); i++ {
		if ix.narrow[i].Bits() > p.Bits() {
			k = max(k, ix.byDst[ix.narrow[i]].keep)
		}
	}
	return k
}

// mainRoutes lists the main table's routes of both families, and whether one of them makes
// the FIB's answers depend on more than the destination (specific, parseRoute). It reads the netlink dump for the destination, the device and the MTU
// alone: the netlink library's decoding of every route took ~30 ms of an apply at 10,000
// routes (TestMainRoutesAsTheLibrary compares the two).
// A dump the kernel marks interrupted (the table changed under it) is read again
// (nldump.Retry).
func mainRoutes() ([]route, bool, error) {
	var out []route
	specific := false
	for _, fam := range []uint8{unix.AF_INET, unix.AF_INET6} {
		byAddrs := fam == unix.AF_INET && ipv4HashByAddrs()
		type dumped struct {
			routes   []route
			specific bool
		}
		d, err := nldump.Retry(func() (dumped, error) {
			var d dumped
			req := nl.NewNetlinkRequest(unix.RTM_GETROUTE, unix.NLM_F_DUMP)
			req.AddData(&nl.RtMsg{RtMsg: unix.RtMsg{Family: fam}})
			var perr error
			err := req.ExecuteIter(unix.NETLINK_ROUTE, unix.RTM_NEWROUTE, func(m []byte) bool {
				r, sp, ok, e := parseRoute(m, fam, byAddrs)
				if ok {
					d.routes = append(d.routes, r)
					d.specific = d.specific || sp
				}
				perr = e
				return e == nil
			})
			return d, cmp.Or(perr, err)
		})
		if err != nil {
			return nil, false, fmt.Errorf("listing routes: %w", err)
		}
		out, specific = append(out, d.routes...), specific || d.specific
	}
	return out, specific, nil
}

// ipv4HashByAddrs reports whether this network namespace's kernel picks among an IPv4
// route's next hops by the packet's addresses alone: fib_multipath_hash_policy 0 (L3) or 2
// (L3, the inner header's for tunnelled packets, which the program does not forward). 1 (L4)
// and 3 (chosen fields) take more; so does IPv6's every policy (the flow label). A kernel
// without the file has no multipath routes. (A variable: tests answer for other policies.)
var ipv4HashByAddrs = func() bool {
	b, err := os.ReadFile("/proc/sys/net/ipv4/fib_multipath_hash_policy")
	if err != nil {
		return errors.Is(err, fs.ErrNotExist)
	}
	p := strings.TrimSpace(string(b))
	return p == "0" || p == "2"
}

// parseRoute reads an RTM_NEWROUTE message of family fam: ok is false for a route of another
// table or family, a cloned one, or a message too short. specific: the route makes the FIB's
// answer depend on more than a packet's addresses, so that no answer may be kept: an MTU of
// its own (the FIB checks packets against it) or a TOS selector. A route whose answer
// depends on the source as well (a source prefix, IPv6 `from`; more than one next hop, which
// the kernel picks by a hash of the addresses where byAddrs) keeps answers per pair of
// addresses for what it decides (keepPair: an answer kept per destination sent every source
// the way the last answer went: another node's, for a `from` route); one with several next
// hops the kernel picks by more (!byAddrs: the ports, the flow label) keeps none (keepNone).
func parseRoute(m []byte, fam uint8, byAddrs bool) (r route, specific, ok bool, err error) {
	if len(m) < unix.SizeofRtMsg {
		return r, false, false, nil
	}
	msg := nl.DeserializeRtMsg(m)
	if msg.Family != fam || msg.Flags&unix.RTM_F_CLONED != 0 {
		return r, false, false, nil
	}
	ad, err := mnl.NewAttributeDecoder(m[unix.SizeofRtMsg:])
	if err != nil {
		return r, false, false, err
	}
	table := uint32(msg.Table)
	var dst []byte
	var oif uint32
	single, nexthops := true, 0
	for ad.Next() {
		switch ad.Type() {
		case unix.RTA_TABLE:
			table = ad.Uint32()
		case unix.RTA_DST:
			dst = ad.Bytes()
		case unix.RTA_OIF:
			oif = ad.Uint32()
		case unix.RTA_METRICS:
			ad.Nested(func(nad *mnl.AttributeDecoder) error {
				for nad.Next() {
					specific = specific || nad.Type() == unix.RTAX_MTU && nad.Uint32() != 0
				}
				return nil
			})
		case unix.RTA_MULTIPATH:
			ad.Do(func(b []byte) error {
				for len(b) >= unix.SizeofRtNexthop {
					nh := (*unix.RtNexthop)(unsafe.Pointer(&b[0]))
					if nexthops == 0 {
						oif = uint32(nh.Ifindex)
					} else if uint32(nh.Ifindex) != oif {
						single = false
					}
					nexthops++
					n := (int(nh.Len) + unix.RTA_ALIGNTO - 1) &^ (unix.RTA_ALIGNTO - 1)
					if nh.Len < unix.SizeofRtNexthop || n > len(b) {
						break
					}
					b = b[n:]
				}
				return nil
			})
		}
	}
	if err := ad.Err(); err != nil {
		return r, false, false, err
	}
	if table != unix.RT_TABLE_MAIN {
		return r, false, false, nil
	}
	a, okAddr := netip.AddrFromSlice(dst)
	switch {
	case !okAddr && fam == unix.AF_INET:
		a = netip.IPv4Unspecified()
	case !okAddr:
		a = netip.IPv6Unspecified()
	}
	r.dst = netip.PrefixFrom(a, int(msg.Dst_len))
	if msg.Type == unix.RTN_UNICAST && single {
		r.ifindex = oif
	}
	specific = specific || msg.Tos != 0
	switch {
	case nexthops > 1 && !byAddrs:
		r.keep = keepNone
	case nexthops > 1 || msg.Src_len != 0:
		r.keep = keepPair
	}
	return r, specific, true, nil
}

// ruleList lists the routing rules of a family (a variable: tests answer for kernels they
// are not run on).
var ruleList = netlink.RuleList

// destinationRouting reports whether the FIB's answers here depend on the destination alone:
// no routing rules but the kernel's own (local, main, default) and no route in the main table
// that depends on more than the addresses (specificRoute, from mainRoutes: an MTU of its own,
// a TOS selector). Only then may the program keep answers (routes whose answer depends on the
// source too make it keep them per pair of addresses for what they decide: keepPair).
func destinationRouting(specificRoute bool) (bool, error) {
	if specificRoute {
		return false, nil
	}
	for _, fam := range []int{netlink.FAMILY_V4, netlink.FAMILY_V6} {
		rules, err := ruleList(fam)
		if fam == netlink.FAMILY_V6 && errors.Is(err, unix.EAFNOSUPPORT) {
			continue // no IPv6 policy routing here (ipv6.disable=1, or no multiple tables)
		}
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
