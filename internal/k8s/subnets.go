package k8s

import (
	"fmt"
	"net"
	"net/netip"
	"slices"

	"github.com/hostaccel/hostaccel/internal/nldump"
)

// LocalSubnets returns the prefixes of this network namespace's addresses that equal one of
// nodeIPs: the node's transport subnets, which Antrea's hybrid mode uses to tell a peer reached
// directly from one reached through a tunnel.
func LocalSubnets(nodeIPs []netip.Addr) ([]netip.Prefix, error) {
	if len(nodeIPs) == 0 {
		return nil, fmt.Errorf("the node has no InternalIP address")
	}
	addrs, err := nldump.Addrs() // (read again where interrupted)
	if err != nil {
		return nil, err
	}
	var out []netip.Prefix
	for _, a := range addrs {
		p, ok := prefixOf(a.IPNet)
		if ok && slices.Contains(nodeIPs, p.Addr()) {
			out = append(out, p.Masked())
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("no local interface holds the node IPs %v", nodeIPs)
	}
	return out, nil
}

func prefixOf(n *net.IPNet) (netip.Prefix, bool) {
	if n == nil {
		return netip.Prefix{}, false
	}
	ip, ok := netip.AddrFromSlice(n.IP)
	if !ok {
		return netip.Prefix{}, false
	}
	ones, _ := n.Mask.Size()
	return netip.PrefixFrom(ip.Unmap(), ones), true
}
