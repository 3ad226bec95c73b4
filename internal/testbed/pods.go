package testbed

import (
	"errors"
	"fmt"
	"net/netip"
	"testing"
)

// LocalPods models two Pods of one node, each behind its own gateway veth of the node
// (routed, as most CNIs do):
//
//	PodA eth0 ── gwa  Node  gwb ── eth0 PodB
//
// Addresses come from 10.213.0.0/16 and fd00:213::/32, so that a sockmap program attached
// for them (it sees every socket of the host) never takes another test's connections.
type LocalPods struct {
	A, B, Node *NS
	// More are the Pods AddPod added: Pod i (from 0) is behind gateway "gw" + 'c'+i, at
	// 10.213.(3+i).2 and fd00:213:(3+i)::2.
	More []*NS
	// A4, B4, A6, B6 are the Pods' addresses; CIDRs their Pod CIDRs (both families).
	A4, B4, A6, B6 netip.Addr
	CIDRs          []netip.Prefix
}

// Addr returns Pod a's (or b's) address of the family.
func (p *LocalPods) Addr(b, v6 bool) netip.Addr {
	switch {
	case !b && !v6:
		return p.A4
	case b && !v6:
		return p.B4
	case !b:
		return p.A6
	}
	return p.B6
}

// NewLocalPodsT builds LocalPods and closes them when tb ends.
func NewLocalPodsT(tb testing.TB) *LocalPods {
	tb.Helper()
	p, err := NewLocalPods()
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { p.Close() })
	return p
}

// NewLocalPods builds the topology.
func NewLocalPods() (*LocalPods, error) {
	p := &LocalPods{
		A4: netip.MustParseAddr("10.213.1.2"), B4: netip.MustParseAddr("10.213.2.2"),
		A6: netip.MustParseAddr("fd00:213:1::2"), B6: netip.MustParseAddr("fd00:213:2::2"),
		CIDRs: []netip.Prefix{netip.MustParsePrefix("10.213.1.0/24"), netip.MustParsePrefix("10.213.2.0/24"),
			netip.MustParsePrefix("fd00:213:1::/64"), netip.MustParsePrefix("fd00:213:2::/64")},
	}
	var err error
	if p.Node, err = newTopoNS("node", true); err != nil {
		return p, errors.Join(err, p.Close())
	}
	for i, pod := range []**NS{&p.A, &p.B} {
		if *pod, err = p.addPod(i); err != nil {
			return p, errors.Join(err, p.Close())
		}
	}
	for _, v6 := range []bool{false, true} {
		if err := waitTCP(p.A, p.B, p.Addr(true, v6)); err != nil {
			return p, errors.Join(err, p.Close())
		}
	}
	return p, nil
}

// AddPod adds a Pod behind a new gateway veth of the node (see More) and returns it with its
// addresses (IPv4, IPv6).
func (p *LocalPods) AddPod() (*NS, netip.Addr, netip.Addr, error) {
	i := 2 + len(p.More)
	pod, err := p.addPod(i)
	if pod != nil {
		p.More = append(p.More, pod)
	}
	if err != nil {
		return nil, netip.Addr{}, netip.Addr{}, err
	}
	a4, a6 := podAddr(i, false), podAddr(i, true)
	return pod, a4, a6, waitTCP(p.A, pod, a4)
}

// podAddr is the address of Pod i (A is 0) of the family.
func podAddr(i int, v6 bool) netip.Addr {
	if v6 {
		return netip.MustParseAddr(fmt.Sprintf("fd00:213:%d::2", i+1))
	}
	return netip.AddrFrom4([4]byte{10, 213, byte(i + 1), 2})
}

// addPod creates Pod i (A is 0): its namespace, the veth "gw"+letter <-> its eth0, the
// addresses and its default routes.
func (p *LocalPods) addPod(i int) (*NS, error) {
	name := string(rune('a' + i))
	pod, err := newTopoNS("pod"+name, false)
	if err != nil {
		return nil, err
	}
	gw := "gw" + name
	if err := Veth(p.Node, gw, pod, "eth0"); err != nil {
		return pod, err
	}
	g4 := netip.AddrFrom4([4]byte{10, 213, byte(i + 1), 1})
	g6 := netip.MustParseAddr(fmt.Sprintf("fd00:213:%d::1", i+1))
	return pod, errors.Join(
		p.Node.AddrAdd(gw, netip.PrefixFrom(g4, 24), netip.PrefixFrom(g6, 64)),
		pod.AddrAdd("eth0", netip.PrefixFrom(podAddr(i, false), 24), netip.PrefixFrom(podAddr(i, true), 64)),
		pod.RouteAdd(netip.MustParsePrefix("0.0.0.0/0"), g4),
		pod.RouteAdd(netip.MustParsePrefix("::/0"), g6),
	)
}

// Close deletes the namespaces.
func (p *LocalPods) Close() error {
	var errs []error
	for _, n := range append([]*NS{p.A, p.B, p.Node}, p.More...) {
		if n != nil {
			errs = append(errs, n.Close())
		}
	}
	return errors.Join(errs...)
}
