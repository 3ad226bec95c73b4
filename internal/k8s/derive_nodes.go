package k8s

import (
	"cmp"
	"fmt"
	"net/netip"
	"slices"

	corev1 "k8s.io/api/core/v1"
)

// PeerPolicy says which other Nodes are peers whose Pod CIDRs are accelerated.
type PeerPolicy string

const (
	// PeersAll: every other Node with a Pod CIDR (a flat, routed Pod network: Antrea noEncap,
	// Kindnet, Calico without overlay).
	PeersAll PeerPolicy = "all"
	// PeersSameSubnet: only Nodes reachable without encapsulation, Antrea's hybrid-mode rule:
	// a peer whose node IP lies in this node's transport subnet is routed directly, any other
	// is tunnelled (its traffic never crosses the forward path as Pod addresses).
	PeersSameSubnet PeerPolicy = "same-subnet"
)

// Peer is another Node as the derivation saw it.
type Peer struct {
	Name     string   `json:"name"`
	PodCIDRs []string `json:"podCIDRs"`
	NodeIPs  []string `json:"nodeIPs"`
	// Accelerated is false when the peer policy left the Node out; Reason says why.
	Accelerated bool   `json:"accelerated"`
	Reason      string `json:"reason,omitempty"`
}

func sortedNodes(ns []*corev1.Node) []*corev1.Node {
	out := slices.Clone(ns)
	slices.SortFunc(out, func(a, b *corev1.Node) int { return cmp.Compare(a.Name, b.Name) })
	return out
}

// podCIDRs returns a Node's Pod CIDRs, masked (the API accepts host bits in podCIDR).
func podCIDRs(n *corev1.Node, warn func(string, ...any)) []string {
	in := n.Spec.PodCIDRs
	if len(in) == 0 && n.Spec.PodCIDR != "" {
		in = []string{n.Spec.PodCIDR}
	}
	var out []string
	for _, s := range in {
		pfx, err := netip.ParsePrefix(s)
		if err != nil || pfx.Addr().Is4In6() {
			warn("node %s: podCIDR %q is not a CIDR; ignored", n.Name, s)
			continue
		}
		out = append(out, pfx.Masked().String())
	}
	return out
}

// addressesOf returns a Node's addresses of the given types that are IPs, in their order.
func addressesOf(n *corev1.Node, types ...corev1.NodeAddressType) []string {
	var out []string
	for _, a := range n.Status.Addresses {
		if !slices.Contains(types, a.Type) {
			continue
		}
		if ip, ok := apiIP(a.Address); ok && !slices.Contains(out, ip.String()) {
			out = append(out, ip.String())
		}
	}
	return out
}

// peerAccelerated applies the peer policy to a Node as a whole.
func peerAccelerated(peer Peer, p Params) (bool, string) {
	if p.Peers != PeersSameSubnet {
		return true, ""
	}
	if len(p.PeerSubnets) == 0 {
		return false, "same-subnet: this node's transport subnet is unknown"
	}
	for _, s := range peer.NodeIPs {
		if inAny(netip.MustParseAddr(s), p.PeerSubnets) {
			return true, ""
		}
	}
	return false, fmt.Sprintf("same-subnet: node IPs %v are outside %v (encapsulated)", peer.NodeIPs, prefixStrings(p.PeerSubnets))
}

// accelerable filters a peer's Pod CIDRs per family under PeersSameSubnet: a family's CIDR is
// routed directly only when the peer has a node IP of that family in a local subnet.
func accelerable(cidrs, nodeIPs []string, p Params) []string {
	if p.Peers != PeersSameSubnet {
		return cidrs
	}
	var out []string
	for _, c := range cidrs {
		is4 := netip.MustParsePrefix(c).Addr().Is4()
		for _, s := range nodeIPs {
			ip := netip.MustParseAddr(s)
			if ip.Is4() == is4 && inAny(ip, p.PeerSubnets) {
				out = append(out, c)
				break
			}
		}
	}
	return out
}

func inAny(ip netip.Addr, ps []netip.Prefix) bool {
	return slices.ContainsFunc(ps, func(p netip.Prefix) bool { return p.Contains(ip) })
}

func prefixStrings(ps []netip.Prefix) []string {
	out := make([]string, len(ps))
	for i, p := range ps {
		out[i] = p.String()
	}
	return out
}

// apiIP parses an address from an API object. An IPv4-mapped IPv6 address is the IPv4
// address (as the tc datapath reads it; config validation wants it written so); a zoned one
// is no address a node serves, routes or balances to.
func apiIP(s string) (netip.Addr, bool) {
	ip, err := netip.ParseAddr(s)
	if err != nil || ip.Zone() != "" {
		return netip.Addr{}, false
	}
	return ip.Unmap(), true
}
