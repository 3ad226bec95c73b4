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
// Addresses come from a block of their own, 10.N.0.0/16 and fd00:N::/32 (N: SockmapBlock or
// TCBlock), so that a sockmap program attached for one block (it sees every socket of the
// host) never takes the connections of a test using the other, even in parallel packages.
type LocalPods struct {
	A, B, Node *NS
	// More are the Pods AddPod added: Pod i (from 0) is behind gateway "gw" + 'c'+i, at
	// 10.N.(3+i).2 and fd00:N:(3+i)::2.
	More  []*NS
	block byte
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

// Address blocks of LocalPods.
const (
	SockmapBlock byte = 213 // the sockmap datapath's tests and the bench's same-node cells
	TCBlock      byte = 214 // the tc datapath's same-node tests
)

// NewLocalPodsT builds LocalPods in SockmapBlock and closes them when tb ends.
func NewLocalPodsT(tb testing.TB) *LocalPods { return NewLocalPodsInT(tb, SockmapBlock) }

// NewLocalPodsInT builds LocalPods in block and closes them when tb ends.
func NewLocalPodsInT(tb testing.TB, block byte) *LocalPods {
	tb.Helper()
	p, err := NewLocalPodsIn(block)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { p.Close() })
	return p
}

// NewLocalPods builds the topology in SockmapBlock.
func NewLocalPods() (*LocalPods, error) { return NewLocalPodsIn(SockmapBlock) }

// NewLocalPodsIn builds the topology in block.
func NewLocalPodsIn(block byte) (*LocalPods, error) {
	p := &LocalPods{block: block}
	p.A4, p.B4, p.A6, p.B6 = p.podAddr(0, false), p.podAddr(1, false), p.podAddr(0, true), p.podAddr(1, true)
	for _, a := range []netip.Addr{p.A4, p.B4, p.A6, p.B6} {
		p.CIDRs = append(p.CIDRs, netip.PrefixFrom(a, map[bool]int{false: 24, true: 64}[a.Is6()]).Masked())
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
	a4, a6 := p.podAddr(i, false), p.podAddr(i, true)
	return pod, a4, a6, waitTCP(p.A, pod, a4)
}

// podAddr is the address of Pod i (A is 0) of the family.
func (p *LocalPods) podAddr(i int, v6 bool) netip.Addr { return p.hostAddr(i, 2, v6) }

// hostAddr is host h of Pod i's subnet (1: the gateway, 2: the Pod).
func (p *LocalPods) hostAddr(i, h int, v6 bool) netip.Addr {
	if v6 {
		return netip.MustParseAddr(fmt.Sprintf("fd00:%d:%d::%d", p.block, i+1, h))
	}
	return netip.AddrFrom4([4]byte{10, p.block, byte(i + 1), byte(h)})
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
	g4, g6 := p.hostAddr(i, 1, false), p.hostAddr(i, 1, true)
	return pod, errors.Join(
		p.Node.AddrAdd(gw, netip.PrefixFrom(g4, 24), netip.PrefixFrom(g6, 64)),
		pod.AddrAdd("eth0", netip.PrefixFrom(p.podAddr(i, false), 24), netip.PrefixFrom(p.podAddr(i, true), 64)),
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
