package lb

import (
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

// flushConntrack deletes the conntrack entries of connections to vips (proto, on ports; every
// port when none) that backend answers on its port (0: the port the client asked for).
func flushConntrack(vips []netip.Addr, ports []int, proto string, backend netip.Addr, backendPort int) error {
	fam := netlink.InetFamily(unix.AF_INET)
	if backend.Is6() {
		fam = unix.AF_INET6
	}
	_, err := netlink.ConntrackDeleteFilters(netlink.ConntrackTable, fam, conntrackFilters(vips, ports, proto, backend, backendPort)...)
	return err
}

// conntrackFilters match flushConntrack's entries: one per VIP of backend's family and port.
func conntrackFilters(vips []netip.Addr, ports []int, proto string, backend netip.Addr, backendPort int) []netlink.CustomConntrackFilter {
	p := map[string]uint8{"tcp": unix.IPPROTO_TCP, "udp": unix.IPPROTO_UDP, "sctp": unix.IPPROTO_SCTP}[proto]
	if len(ports) == 0 {
		ports = []int{0}
	}
	var filters []netlink.CustomConntrackFilter
	for _, v := range vips {
		if v.Is6() != backend.Is6() {
			continue
		}
		for _, port := range ports {
			bp := backendPort
			if bp == 0 {
				bp = port
			}
			filters = append(filters, flowFilter{proto: p, vip: v, port: uint16(port), backend: backend, backendPort: uint16(bp)})
		}
	}
	return filters
}

// flowFilter matches a connection to vip:port (0: any port) that backend:backendPort
// answers (the reply's source). netlink's own filter has no reply port: a backend's entries
// on its other ports (another service's, or this one's other backend on the same host) would
// go too.
type flowFilter struct {
	proto             uint8
	vip, backend      netip.Addr
	port, backendPort uint16
}

func (f flowFilter) MatchConntrackFlow(fl *netlink.ConntrackFlow) bool {
	vip, _ := netip.AddrFromSlice(fl.Forward.DstIP)
	backend, _ := netip.AddrFromSlice(fl.Reverse.SrcIP)
	return fl.Forward.Protocol == f.proto && vip.Unmap() == f.vip && backend.Unmap() == f.backend &&
		(f.port == 0 || fl.Forward.DstPort == f.port && fl.Reverse.SrcPort == f.backendPort)
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
