package tc

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"strings"
	"unsafe"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netlink"

	"github.com/hostaccel/hostaccel/internal/nldump"
)

// The kernel as it is: our attachments and the program sets they run, found again by
// asking the kernel (no bpffs pins, no state in the process).

// attachment is the program of one of our program sets attached to a device.
type attachment struct {
	mode   Mode
	link   netlink.Link
	prog   ebpf.ProgramID
	filter *netlink.BpfFilter // ModeClsBPF
}

// observed is what the kernel has: the links of the namespace, our attachments on them and
// the program sets they run.
type observed struct {
	links map[string]netlink.Link
	atts  []attachment
	sets  map[ebpf.ProgramID]*progSet // nil values: programs that are not ours
}

func observe() (*observed, error) {
	o := &observed{links: map[string]netlink.Link{}, sets: map[ebpf.ProgramID]*progSet{}}
	links, err := nldump.Links() // (read again where interrupted)
	if err != nil {
		return o, fmt.Errorf("listing links: %w", err)
	}
	tcx := haveTCX()
	for _, l := range links {
		o.links[l.Attrs().Name] = l
		if tcx {
			q, err := link.QueryPrograms(link.QueryOptions{Target: l.Attrs().Index, Attach: ebpf.AttachTCXIngress})
			if err != nil && !gone(err) {
				return o, fmt.Errorf("%s: tcx programs: %w", l.Attrs().Name, err)
			}
			for _, p := range programs(q) {
				if _, isLink := p.LinkID(); isLink {
					continue // we never attach with links
				}
				if ours, err := o.open(p.ID); err != nil {
					return o, err
				} else if ours {
					o.atts = append(o.atts, attachment{mode: ModeTCX, link: l, prog: p.ID})
				}
			}
		}
		fs, err := ourFilters(l)
		if err != nil {
			return o, err
		}
		for _, f := range fs {
			if ours, err := o.open(ebpf.ProgramID(f.Id)); err != nil {
				return o, err
			} else if ours {
				o.atts = append(o.atts, attachment{mode: ModeClsBPF, link: l, prog: ebpf.ProgramID(f.Id), filter: f})
			}
		}
	}
	return o, nil
}

func programs(q *link.QueryResult) []link.AttachedProgram {
	if q == nil {
		return nil
	}
	return q.Programs
}

func (o *observed) open(id ebpf.ProgramID) (bool, error) {
	s, ok := o.sets[id]
	if !ok {
		var err error
		if s, err = openSet(id); err != nil {
			return false, err
		}
		o.sets[id] = s
	}
	return s != nil, nil
}

func (o *observed) Close() {
	for _, s := range o.sets {
		s.Close()
	}
}

// current returns an attached program set of build, or nil.
func (o *observed) current(build uint64) *progSet {
	for _, a := range o.atts {
		if s := o.sets[a.prog]; s != nil && s.build == build {
			return s
		}
	}
	return nil
}

// on returns our attachments on device ifindex.
func (o *observed) on(ifindex int) []attachment {
	var out []attachment
	for _, a := range o.atts {
		if a.link.Attrs().Index == ifindex {
			out = append(out, a)
		}
	}
	return out
}

// flags returns the ifaces flags every attached set holds, by ifindex: of every build, also
// one that lacks maps of this one or has a shorter iface (fields are only appended, so the
// flags keep their offset). Only usable sets were read: after an upgrade, the ownership of the
// clsact qdiscs the older build had created was lost, and they stayed after cleanup.
func (o *observed) flags() map[uint32]uint32 {
	f := map[uint32]uint32{}
	for _, s := range o.sets {
		if s == nil || s.maps.Ifaces == nil || int(s.maps.Ifaces.ValueSize()) < ifaceFlagsEnd {
			continue
		}
		var idx uint32
		var v []byte
		for it := s.maps.Ifaces.Iterate(); it.Next(&idx, &v); {
			f[idx] |= binary.LittleEndian.Uint32(v[ifaceFlagsAt:])
		}
	}
	return f
}

// ifaceFlagsAt is the offset of iface.flags in every build; ifaceFlagsEnd where it ends.
const (
	ifaceFlagsAt  = int(unsafe.Offsetof(fastpathIface{}.Flags))
	ifaceFlagsEnd = ifaceFlagsAt + 4
)

// usePeer is off only in tests of the bpf_redirect path.
var usePeer = true

// PeerElsewhere reports whether l is a veth whose peer lives in another network namespace (a
// Pod's): packets for it go there with bpf_redirect_peer.
func PeerElsewhere(l netlink.Link) bool {
	_, veth := l.(*netlink.Veth)
	return veth && l.Attrs().NetNsID >= 0
}

// readIPv6MTU reads net.ipv6.conf.DEV.mtu of the calling thread's network namespace (a
// router advertisement's MTU lands there too). The kernel announces no change of it: the
// agent's periodic resync finds one.
func readIPv6MTU(dev string) (uint32, bool) {
	b, err := os.ReadFile("/proc/sys/net/ipv6/conf/" + dev + "/mtu")
	if err != nil {
		return 0, false
	}
	v, err := strconv.ParseUint(strings.TrimSpace(string(b)), 10, 32)
	return uint32(v), err == nil
}

// netState reads what want needs from the namespace.
func (o *observed) netState(listRoutes func() ([]route, bool, error)) (netState, error) {
	n := netState{links: map[string]device{}, keep: o.flags(), addrs: map[string][]netip.Addr{}}
	for name, l := range o.links {
		n.links[name] = device{index: uint32(l.Attrs().Index), mtu: uint32(l.Attrs().MTU), peer: PeerElsewhere(l)}
	}
	addrs, err := nldump.Addrs() // (read again where interrupted)
	if err != nil {
		return n, fmt.Errorf("listing addresses: %w", err)
	}
	names := map[int]string{}
	for name, l := range o.links {
		names[l.Attrs().Index] = name
	}
	for _, a := range addrs {
		if ip, ok := netip.AddrFromSlice(a.IP); ok && !ip.IsLinkLocalUnicast() {
			name := names[a.LinkIndex]
			n.addrs[name] = append(n.addrs[name], ip.Unmap())
		}
	}
	routes, specificRoute, err := listRoutes()
	if err != nil {
		return n, err
	}
	n.routes = routes
	n.destOnly, err = destinationRouting(specificRoute)
	return n, err
}

func sortedNames(links map[string]netlink.Link) []string {
	names := make([]string, 0, len(links))
	for n := range links {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}
