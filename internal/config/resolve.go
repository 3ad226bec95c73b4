package config

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"github.com/hostaccel/hostaccel/internal/lb"
	"github.com/hostaccel/hostaccel/internal/model"
)

// Link is what resolution needs to know about a network interface.
type Link struct {
	Name     string
	Up       bool
	Loopback bool
	Index    int // the kernel's interface index; 0: unknown (an offline render)
}

// State resolves the config against the interfaces that exist now. Interfaces named
// explicitly but absent are an error when strict (apply: bad input), and are pruned with a
// warning otherwise (agent: a device may vanish and come back; one missing device would fail
// the whole nft transaction). The load balancer's NAT VIPs are those of the config's services
// (StateWith takes the services in effect, the API's merged in).
func (c *Config) State(links []Link, strict bool) (model.State, []string, error) {
	return c.StateWith(links, strict, lb.NATVIPs(c.LoadBalancer.Services))
}

// StateWith is State with natVIPs, the snat and dnat VIPs of the services in effect, joining
// the external-to-loadbalancer class's addresses (node.loadBalancerIPs).
func (c *Config) StateWith(links []Link, strict bool, natVIPs []netip.Addr) (model.State, []string, error) {
	present := map[string]Link{}
	for _, l := range links {
		present[l.Name] = l
	}
	var warnings []string
	var errs Errors
	// keep returns the present interfaces of names; with patterns, an entry ending in "*"
	// names every present interface that starts with the rest (none is no error).
	keep := func(field string, names []string, patterns bool) []string {
		var out []string
		for i, n := range names {
			if patterns && strings.HasSuffix(n, "*") {
				for _, l := range links {
					if gatewayNames(n, l.Name) {
						out = append(out, l.Name)
					}
				}
				continue
			}
			if _, ok := present[n]; ok {
				out = append(out, n)
				continue
			}
			msg := fmt.Sprintf("%s[%d]: interface %s does not exist", field, i, model.Quote(n))
			if strict {
				errs = append(errs, fmt.Errorf("%s", msg))
			} else {
				warnings = append(warnings, msg+" (left out until it appears)")
			}
		}
		return out
	}
	s := model.State{
		Datapath:        c.Datapath,
		Gateways:        keep("node.gateways", c.Node.Gateways, true),
		LocalPodCIDRs:   prefixes(c.Node.LocalPodCIDRs),
		PeerPodCIDRs:    prefixes(c.Node.PeerPodCIDRs),
		ServiceCIDRs:    prefixes(c.Node.ServiceCIDRs),
		LoadBalancerIPs: prefixes(c.Node.LoadBalancerIPs),
		Exclude:         prefixes(c.Exclude),
		NodeIPs:         addrs(c.Node.NodeIPs),
		PeerNodeIPs:     addrs(c.Node.PeerNodeIPs),
		PacketThreshold: c.PacketThreshold,
		CountOffloaded:  c.Flowtable.CountOffloaded,
		TCNATCheck:      c.TC.NATCheck,
		TCNoNATCarry:    c.TC.NATCarry != nil && !*c.TC.NATCarry,
		SockmapInAuto:   c.Sockmap.Auto,
	}
	if c.Node.Transports.Auto {
		for _, l := range links {
			if l.Up && !l.Loopback && c.Node.gateway(l.Name) == "" {
				s.Transports = append(s.Transports, l.Name)
			}
		}
	} else {
		s.Transports = keep("node.transports", c.Node.Transports.Names, false)
	}
	// Connections to the load balancer's NAT VIPs are conntrack'd and DNAT-ed: the
	// external-to-loadbalancer class offloads them after the balancing decision.
	// (Thousands of VIPs: those added are looked up in a map, only the configured prefixes
	// one by one.)
	configured, added := len(s.LoadBalancerIPs), map[netip.Addr]bool{}
	for _, v := range natVIPs {
		if !added[v] && !slices.ContainsFunc(s.LoadBalancerIPs[:configured], func(p netip.Prefix) bool { return p.Contains(v) }) {
			added[v] = true
			s.LoadBalancerIPs = append(s.LoadBalancerIPs, netip.PrefixFrom(v, v.BitLen()))
		}
	}
	s.SetDeviceIndexes(func(d string) int { return present[d].Index })
	for name, on := range c.Classes {
		if on {
			s.Classes = append(s.Classes, model.Class(name))
		}
	}
	s.Normalize()
	if len(errs) > 0 {
		return s, warnings, errs
	}
	return s, warnings, nil
}

// prefixes and addrs parse values that validate already accepted.
func prefixes(in []string) []netip.Prefix {
	var out []netip.Prefix
	for _, s := range in {
		p, err := netip.ParsePrefix(s)
		if err != nil {
			a := netip.MustParseAddr(s)
			p = netip.PrefixFrom(a, a.BitLen())
		}
		out = append(out, p)
	}
	return out
}

func addrs(in []string) []netip.Addr {
	var out []netip.Addr
	for _, s := range in {
		out = append(out, netip.MustParseAddr(s))
	}
	return out
}
