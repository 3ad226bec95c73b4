package lb

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// The load balancer's access to the host beyond nftables: the interfaces and neighbour
// tables it renders with, conntrack entries it flushes, neighbours it makes the kernel resolve.

// HostEnv reads this network namespace's interfaces and, on devs, the neighbour tables.
func HostEnv(devs []string) (Env, error) {
	env := Env{Links: map[string]net.HardwareAddr{}, Neighbors: map[string]map[netip.Addr]net.HardwareAddr{}}
	if len(devs) == 0 {
		return env, nil
	}
	links, err := netlink.LinkList()
	if err != nil {
		return env, fmt.Errorf("list links: %w", err)
	}
	for _, l := range links {
		a := l.Attrs()
		env.Links[a.Name] = a.HardwareAddr
		if !slices.Contains(devs, a.Name) {
			continue
		}
		neigh, err := netlink.NeighList(a.Index, netlink.FAMILY_ALL)
		if err != nil {
			return env, fmt.Errorf("list neighbours on %s: %w", a.Name, err)
		}
		m := map[netip.Addr]net.HardwareAddr{}
		for _, n := range neigh {
			ip, ok := netip.AddrFromSlice(n.IP)
			if !ok || len(n.HardwareAddr) != 6 || n.State&(netlink.NUD_FAILED|netlink.NUD_INCOMPLETE) != 0 || n.State == netlink.NUD_NONE {
				continue
			}
			m[ip.Unmap()] = n.HardwareAddr
		}
		env.Neighbors[a.Name] = m
	}
	addrs, err := netlink.AddrList(nil, netlink.FAMILY_ALL)
	if err != nil {
		return env, fmt.Errorf("list addresses: %w", err)
	}
	for _, a := range addrs {
		if ip, ok := netip.AddrFromSlice(a.IP); ok && !ip.IsLinkLocalUnicast() {
			env.Local = append(env.Local, ip.Unmap())
		}
	}
	return env, nil
}

// ConntrackFlush names the conntrack entries of one backend that leaves: the connections to
// one of VIPs (and one of Ports; none: any port) of protocol Proto that Backend answers on
// BackendPort (0: the client's port).
type ConntrackFlush struct {
	VIPs        []netip.Addr
	Ports       []int
	Proto       string
	Backend     netip.Addr
	BackendPort int
}

// flushConntrack deletes the entries of every flush: one dump of the conntrack table per
// family, whatever their number (netlink's delete reads the whole table per call, ~1 s at a
// million entries: one call per backend stalled a sync for minutes when a host with the
// backends of hundreds of services went down).
func flushConntrack(flushes []ConntrackFlush) error {
	var errs []error
	for _, fam := range []netlink.InetFamily{unix.AF_INET, unix.AF_INET6} {
		set := conntrackFilter(flushes, fam == unix.AF_INET6)
		if len(set) == 0 {
			continue
		}
		if _, err := netlink.ConntrackDeleteFilters(netlink.ConntrackTable, fam, set); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// conntrackFilter is the filter of flushes' entries of one family: every VIP of the family,
// with each port, and its backend.
func conntrackFilter(flushes []ConntrackFlush, v6 bool) flowSet {
	set := flowSet{}
	for _, f := range flushes {
		if f.Backend.Is6() != v6 {
			continue
		}
		p := laneProtos[f.Proto]
		ports := f.Ports
		if len(ports) == 0 {
			ports = []int{0}
		}
		for _, v := range f.VIPs {
			if v.Is6() != v6 {
				continue
			}
			for _, port := range ports {
				bp := f.BackendPort
				if bp == 0 || port == 0 {
					bp = port
				}
				set[flowKey{proto: p, vip: v, port: uint16(port), backend: f.Backend, backendPort: uint16(bp)}] = true
			}
		}
	}
	return set
}

// flowSet matches a connection to vip:port that backend:backendPort answers (the reply's
// source), or to vip on any port (a key of port 0) that backend answers. netlink's own filter
// has no reply port: a backend's entries on its other ports (another service's, or this one's
// other backend on the same host) would go too. One map lookup or two per entry, where a
// filter per backend and VIP cost a compare each.
type flowSet map[flowKey]bool

type flowKey struct {
	proto             uint8
	vip, backend      netip.Addr
	port, backendPort uint16
}

func (s flowSet) MatchConntrackFlow(fl *netlink.ConntrackFlow) bool {
	vip, _ := netip.AddrFromSlice(fl.Forward.DstIP)
	backend, _ := netip.AddrFromSlice(fl.Reverse.SrcIP)
	k := flowKey{proto: fl.Forward.Protocol, vip: vip.Unmap(), backend: backend.Unmap()}
	if s[k] { // any port
		return true
	}
	k.port, k.backendPort = fl.Forward.DstPort, fl.Reverse.SrcPort
	return s[k]
}

// solicitNeighbours makes the kernel resolve addrs' MAC addresses: one empty datagram each
// (to the discard port).
func solicitNeighbours(addrs []netip.Addr) {
	for _, a := range addrs {
		if c, err := net.Dial("udp", netip.AddrPortFrom(a, 9).String()); err == nil {
			c.Write(nil)
			c.Close()
		}
	}
}
