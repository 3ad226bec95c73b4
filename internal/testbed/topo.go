package testbed

import (
	"cmp"
	"errors"
	"fmt"
	"net/netip"
	"testing"
	"time"
)

// TopoOptions configures NewTopo. The zero value is valid.
type TopoOptions struct {
	GatewayName    string // Node's link to Pod; default "gw"
	TransportName  string // Node's link to Remote; default "eth0"
	ExtraTransport bool   // add Node "eth1" <-> Remote2
	Transport2Name string // Node's link to Remote2; default "eth1"
}

// Addrs holds the addresses of one IP family of a Topo.
type Addrs struct {
	Pod           netip.Addr   // Pod eth0: 10.244.1.2
	Gateway       netip.Addr   // Node gateway: 10.244.1.1
	PodCIDR       netip.Prefix // local Pod CIDR: 10.244.1.0/24
	TransportCIDR netip.Prefix // 172.18.0.0/24
	Node          netip.Addr   // Node transport: 172.18.0.2
	Remote        netip.Addr   // Remote eth0: 172.18.0.3
	RemotePod     netip.Addr   // on Remote's lo: 10.244.2.2
	RemotePodCIDR netip.Prefix // peer Pod CIDR: 10.244.2.0/24
	External      netip.Addr   // external client on Remote's lo: 198.51.100.10
	ExternalCIDR  netip.Prefix // 198.51.100.0/24
	// Only with ExtraTransport:
	Transport2CIDR netip.Prefix // 172.19.0.0/24
	Node2          netip.Addr   // Node second transport: 172.19.0.2
	Remote2        netip.Addr   // Remote2 eth0: 172.19.0.3
}

// The addressing plan.
var (
	v4 = Addrs{
		Pod:            netip.MustParseAddr("10.244.1.2"),
		Gateway:        netip.MustParseAddr("10.244.1.1"),
		PodCIDR:        netip.MustParsePrefix("10.244.1.0/24"),
		TransportCIDR:  netip.MustParsePrefix("172.18.0.0/24"),
		Node:           netip.MustParseAddr("172.18.0.2"),
		Remote:         netip.MustParseAddr("172.18.0.3"),
		RemotePod:      netip.MustParseAddr("10.244.2.2"),
		RemotePodCIDR:  netip.MustParsePrefix("10.244.2.0/24"),
		External:       netip.MustParseAddr("198.51.100.10"),
		ExternalCIDR:   netip.MustParsePrefix("198.51.100.0/24"),
		Transport2CIDR: netip.MustParsePrefix("172.19.0.0/24"),
		Node2:          netip.MustParseAddr("172.19.0.2"),
		Remote2:        netip.MustParseAddr("172.19.0.3"),
	}
	v6 = Addrs{
		Pod:            netip.MustParseAddr("fd00:10:244:1::2"),
		Gateway:        netip.MustParseAddr("fd00:10:244:1::1"),
		PodCIDR:        netip.MustParsePrefix("fd00:10:244:1::/64"),
		TransportCIDR:  netip.MustParsePrefix("fd00:172:18::/64"),
		Node:           netip.MustParseAddr("fd00:172:18::2"),
		Remote:         netip.MustParseAddr("fd00:172:18::3"),
		RemotePod:      netip.MustParseAddr("fd00:10:244:2::2"),
		RemotePodCIDR:  netip.MustParsePrefix("fd00:10:244:2::/64"),
		External:       netip.MustParseAddr("2001:db8:100::10"),
		ExternalCIDR:   netip.MustParsePrefix("2001:db8:100::/64"),
		Transport2CIDR: netip.MustParsePrefix("fd00:172:19::/64"),
		Node2:          netip.MustParseAddr("fd00:172:19::2"),
		Remote2:        netip.MustParseAddr("fd00:172:19::3"),
	}
)

// Topo models a Kubernetes node (Node) with a local pod (Pod) behind its
// gateway link, and a peer node (Remote) on the transport link that hosts a
// remote pod and an external client. Routing is plain; no NAT, no firewall.
//
//	Pod eth0 ── GatewayName  Node  TransportName ── eth0 Remote (lo: RemotePod, External)
//	                               Transport2Name ── eth0 Remote2   (ExtraTransport only)
type Topo struct {
	Pod, Node, Remote *NS
	Remote2           *NS // nil unless ExtraTransport

	GatewayName, TransportName, Transport2Name string // Node link names
	V4, V6                                     Addrs
}

// Addrs returns V6 if v6, else V4.
func (t *Topo) Addrs(v6 bool) Addrs {
	if v6 {
		return t.V6
	}
	return t.V4
}

// NewTopoT is NewTopo for tests: it skips (or fails, see RequireRoot) without
// root, fails the test on error and closes the topology on cleanup.
func NewTopoT(tb testing.TB, opts TopoOptions) *Topo {
	tb.Helper()
	RequireRoot(tb)
	t, err := NewTopo(opts)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		if err := t.Close(); err != nil {
			tb.Error(err)
		}
	})
	return t
}

// NewTopo builds the topology and waits until pod -> remote pod TCP connects
// succeed over IPv4 and IPv6. On error everything created is torn down.
func NewTopo(opts TopoOptions) (*Topo, error) {
	t := &Topo{
		GatewayName:    cmp.Or(opts.GatewayName, "gw"),
		TransportName:  cmp.Or(opts.TransportName, "eth0"),
		Transport2Name: cmp.Or(opts.Transport2Name, "eth1"),
		V4:             v4,
		V6:             v6,
	}
	if err := t.build(opts.ExtraTransport); err != nil {
		return nil, errors.Join(err, t.Close())
	}
	return t, nil
}

// Close deletes all namespaces of the topology. It is safe to call more than
// once and on a partially built topology.
func (t *Topo) Close() error {
	var errs []error
	for _, n := range []*NS{t.Remote2, t.Remote, t.Node, t.Pod} {
		if n != nil {
			errs = append(errs, n.Close())
		}
	}
	return errors.Join(errs...)
}

func hostPrefix(a netip.Addr) netip.Prefix { return netip.PrefixFrom(a, a.BitLen()) }

func inPrefix(a netip.Addr, p netip.Prefix) netip.Prefix { return netip.PrefixFrom(a, p.Bits()) }

// newTopoNS creates a namespace with forwarding on or off, and without DAD
// or reverse path filtering (set as defaults before any link is created).
func newTopoNS(role string, forward bool) (*NS, error) {
	n, err := NewNS(role)
	if err != nil {
		return nil, err
	}
	fwd := "0"
	if forward {
		fwd = "1"
	}
	for _, kv := range [][2]string{
		{"net.ipv4.ip_forward", fwd},
		{"net.ipv6.conf.all.forwarding", fwd},
		{"net.ipv6.conf.all.accept_dad", "0"},
		{"net.ipv6.conf.default.accept_dad", "0"},
		{"net.ipv4.conf.all.rp_filter", "0"},
		{"net.ipv4.conf.default.rp_filter", "0"},
	} {
		if err := n.Sysctl(kv[0], kv[1]); err != nil {
			return n, err
		}
	}
	return n, nil
}

func (t *Topo) build(extra bool) error {
	var err error
	// Assign each namespace before checking err so Close sees it.
	if t.Pod, err = newTopoNS("pod", false); err != nil {
		return err
	}
	if t.Node, err = newTopoNS("node", true); err != nil {
		return err
	}
	if t.Remote, err = newTopoNS("remote", true); err != nil {
		return err
	}
	if extra {
		if t.Remote2, err = newTopoNS("remote2", true); err != nil {
			return err
		}
	}

	if err := Veth(t.Node, t.GatewayName, t.Pod, "eth0"); err != nil {
		return err
	}
	if err := Veth(t.Node, t.TransportName, t.Remote, "eth0"); err != nil {
		return err
	}
	if extra {
		if err := Veth(t.Node, t.Transport2Name, t.Remote2, "eth0"); err != nil {
			return err
		}
	}

	for _, a := range []Addrs{t.V4, t.V6} {
		steps := []func() error{
			func() error { return t.Pod.AddrAdd("eth0", inPrefix(a.Pod, a.PodCIDR)) },
			func() error { return t.Node.AddrAdd(t.GatewayName, inPrefix(a.Gateway, a.PodCIDR)) },
			func() error { return t.Node.AddrAdd(t.TransportName, inPrefix(a.Node, a.TransportCIDR)) },
			func() error { return t.Remote.AddrAdd("eth0", inPrefix(a.Remote, a.TransportCIDR)) },
			func() error { return t.Remote.AddrAdd("lo", hostPrefix(a.RemotePod), hostPrefix(a.External)) },
			func() error { return t.Pod.RouteAdd(netip.PrefixFrom(a.Gateway, 0), a.Gateway) }, // default route
			func() error { return t.Node.RouteAdd(a.RemotePodCIDR, a.Remote) },
			func() error { return t.Node.RouteAdd(a.ExternalCIDR, a.Remote) },
			func() error { return t.Remote.RouteAdd(a.PodCIDR, a.Node) },
		}
		if extra {
			steps = append(steps,
				func() error { return t.Node.AddrAdd(t.Transport2Name, inPrefix(a.Node2, a.Transport2CIDR)) },
				func() error { return t.Remote2.AddrAdd("eth0", inPrefix(a.Remote2, a.Transport2CIDR)) },
				func() error { return t.Remote2.RouteAdd(a.PodCIDR, a.Node2) },
			)
		}
		for _, step := range steps {
			if err := step(); err != nil {
				return err
			}
		}
	}

	for _, a := range []Addrs{t.V4, t.V6} {
		if err := waitTCP(t.Pod, t.Remote, a.RemotePod); err != nil {
			return err
		}
		if extra {
			if err := waitTCP(t.Remote2, t.Pod, a.Pod); err != nil {
				return err
			}
		}
	}
	return nil
}

// waitTCP retries TCP connects from client to a listener on dst in server
// until one succeeds or 10s pass.
func waitTCP(client, server *NS, dst netip.Addr) error {
	srv, err := server.ListenTCP(netip.AddrPortFrom(dst, 0).String())
	if err != nil {
		return err
	}
	defer srv.Close()
	deadline := time.Now().Add(10 * time.Second)
	for {
		c, err := client.DialTCP("", srv.Addr().String())
		if err == nil {
			return c.Close()
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("topology not ready: %w", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// RecreateTransport re-creates the Node <-> Remote link (new ifindex) with its addresses and
// routes, as after a device was deleted; the old link must be gone.
func (t *Topo) RecreateTransport() error {
	if err := Veth(t.Node, t.TransportName, t.Remote, "eth0"); err != nil {
		return err
	}
	for _, a := range []Addrs{t.V4, t.V6} {
		for _, err := range []error{
			t.Node.AddrAdd(t.TransportName, netip.PrefixFrom(a.Node, a.TransportCIDR.Bits())),
			t.Remote.AddrAdd("eth0", netip.PrefixFrom(a.Remote, a.TransportCIDR.Bits())),
			t.Node.RouteAdd(a.RemotePodCIDR, a.Remote),
			t.Node.RouteAdd(a.ExternalCIDR, a.Remote),
			t.Remote.RouteAdd(a.PodCIDR, a.Node),
		} {
			if err != nil {
				return err
			}
		}
	}
	return nil
}
