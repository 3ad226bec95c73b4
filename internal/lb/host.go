package lb

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/hostaccel/hostaccel/internal/conntrack"
	"github.com/hostaccel/hostaccel/internal/nldump"
)

// The load balancer's access to the host beyond nftables: the interfaces and neighbour
// tables it renders with, conntrack entries it flushes, neighbours it makes the kernel resolve.

// HostEnv reads this network namespace's interfaces and, on devs, the neighbour tables.
func HostEnv(devs []string) (Env, error) {
	env := Env{Links: map[string]net.HardwareAddr{}, Neighbors: map[string]map[netip.Addr]net.HardwareAddr{},
		Failed: map[string]map[netip.Addr]bool{}}
	if len(devs) == 0 {
		return env, nil
	}
	links, err := nldump.Links() // (read again where interrupted)
	if err != nil {
		return env, fmt.Errorf("list links: %w", err)
	}
	for _, l := range links {
		a := l.Attrs()
		env.Links[a.Name] = a.HardwareAddr
		if !slices.Contains(devs, a.Name) {
			continue
		}
		neigh, err := nldump.Neighs(a.Index) // (read again where interrupted)
		if err != nil {
			return env, fmt.Errorf("list neighbours on %s: %w", a.Name, err)
		}
		m, failed := map[netip.Addr]net.HardwareAddr{}, map[netip.Addr]bool{}
		for _, n := range neigh {
			ip, ok := netip.AddrFromSlice(n.IP)
			switch {
			case !ok:
			case n.State&netlink.NUD_FAILED != 0: // the kernel asked; no answer
				failed[ip.Unmap()] = true
			case len(n.HardwareAddr) != 6 || n.State&netlink.NUD_INCOMPLETE != 0 || n.State == netlink.NUD_NONE:
				// still being resolved (INCOMPLETE: the kernel's probes end in FAILED)
			default:
				m[ip.Unmap()] = n.HardwareAddr
			}
		}
		env.Neighbors[a.Name], env.Failed[a.Name] = m, failed
	}
	addrs, err := nldump.Addrs() // (read again where interrupted)
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

// flushConntrack deletes the entries of every flush: one dump of the conntrack table,
// whatever their number, of only its destination-NAT-ed entries (the kernel picks them: a
// leaving backend's connections were all DNAT-ed to it), then a delete per entry picked. One
// call per backend, each reading the whole table, stalled a sync for minutes when a host with
// the backends of hundreds of services went down (BenchmarkFlushConntrack).
func flushConntrack(flushes []ConntrackFlush) error {
	set := conntrackFilter(flushes)
	if len(set) == 0 {
		return nil
	}
	_, err := conntrack.DeleteDstNATed(context.Background(), set.match)
	return err
}

// conntrackFilter is the filter of flushes' entries: every VIP of the backend's family, with
// each port, and its backend.
func conntrackFilter(flushes []ConntrackFlush) flowSet {
	set := flowSet{}
	for _, f := range flushes {
		p := laneProtos[f.Proto]
		ports := f.Ports
		if len(ports) == 0 {
			ports = []int{0}
		}
		for _, v := range f.VIPs {
			if v.Is6() != f.Backend.Is6() {
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
// source), or to vip on any port (a key of port 0) that backend answers: not the backend's
// entries on its other ports (another service's, or this one's other backend on the same
// host). One map lookup or two per entry.
type flowSet map[flowKey]bool

type flowKey struct {
	proto             uint8
	vip, backend      netip.Addr
	port, backendPort uint16
}

func (s flowSet) match(f *conntrack.Flow) bool {
	k := flowKey{proto: f.Orig.Proto, vip: f.Orig.Dst.Unmap(), backend: f.Reply.Src.Unmap()}
	if s[k] { // any port
		return true
	}
	k.port, k.backendPort = f.Orig.DstPort, f.Reply.SrcPort
	return s[k]
}

// neighbourWait bounds a one-shot apply's wait for the kernel to resolve dsr backends that
// have no neighbour entry: a host that answers does so in milliseconds, one that does not is
// FAILED after mcast_solicit probes retrans_time apart (3 x 1 s by default).
const neighbourWait = 3500 * time.Millisecond

// awaitNeighbours makes the kernel resolve d's dsr backends that env has no answer for (an
// entry, or FAILED), one datagram each, and reads the neighbour tables of devs again until
// each has one or wait passed. It returns the last reading.
func awaitNeighbours(ctx context.Context, d *Desired, env Env, devs []string, wait time.Duration) (Env, error) {
	pending := unanswered(d, env, true)
	addrs := make([]netip.Addr, len(pending))
	for i, n := range pending {
		addrs[i] = n.addr
	}
	solicitNeighbours(addrs)
	for deadline := time.Now().Add(wait); len(pending) > 0 && time.Now().Before(deadline); {
		select {
		case <-ctx.Done():
			return env, ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
		var err error
		if env, err = HostEnv(devs); err != nil {
			return env, err
		}
		pending = slices.DeleteFunc(pending, func(n devAddr) bool { return env.Neighbors[n.dev][n.addr] != nil || env.Failed[n.dev][n.addr] })
	}
	return env, nil
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
