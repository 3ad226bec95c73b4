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

// flushConntrack deletes the conntrack entries of connections to vips (proto) that backend
// answers.
func flushConntrack(vips []netip.Addr, proto string, backend netip.Addr) error {
	p := map[string]uint8{"tcp": unix.IPPROTO_TCP, "udp": unix.IPPROTO_UDP, "sctp": unix.IPPROTO_SCTP}[proto]
	var filters []netlink.CustomConntrackFilter
	for _, v := range vips {
		if v.Is6() != backend.Is6() {
			continue
		}
		f := &netlink.ConntrackFilter{}
		if err := errors.Join(f.AddIP(netlink.ConntrackOrigDstIP, v.AsSlice()), f.AddIP(netlink.ConntrackReplySrcIP, backend.AsSlice()), f.AddProtocol(p)); err != nil {
			return err
		}
		filters = append(filters, f)
	}
	fam := netlink.InetFamily(unix.AF_INET)
	if backend.Is6() {
		fam = unix.AF_INET6
	}
	_, err := netlink.ConntrackDeleteFilters(netlink.ConntrackTable, fam, filters...)
	return err
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
