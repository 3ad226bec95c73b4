package bench

import (
	"net/netip"
	"strings"
	"testing"
)

func TestPlansValid(t *testing.T) {
	for name, p := range map[string]Plan{"cluster2": ClusterPlan(2, 0), "cluster3": ClusterPlan(3, 50), "pktgen": PktgenPlan(10)} {
		if err := p.Validate(); err != nil {
			t.Errorf("%s: %v", name, err)
		}
		// Addresses are unique within a namespace's reach: no two links share one.
		seen := map[netip.Addr]string{}
		for _, a := range p.Addrs {
			if prev, ok := seen[a.Prefix.Addr()]; ok {
				t.Errorf("%s: %s on %s/%s and %s", name, a.Prefix.Addr(), a.Role, a.Dev, prev)
			}
			seen[a.Prefix.Addr()] = a.Role + "/" + a.Dev
		}
	}
}

func TestClusterPlan(t *testing.T) {
	p := ClusterPlan(3, 5)
	if len(p.Nodes) != 3 {
		t.Fatalf("nodes: %d", len(p.Nodes))
	}
	n2 := p.Nodes[1]
	if n2.Role != RoleServerNode || n2.IP != netip.MustParseAddr("172.18.0.3") || n2.PodCIDR != netip.MustParsePrefix("10.244.2.0/24") {
		t.Errorf("node2: %+v", n2)
	}
	if len(n2.PeerPodCIDRs) != 2 || len(n2.PeerIPs) != 2 {
		t.Errorf("node2 peers: %v %v", n2.PeerPodCIDRs, n2.PeerIPs)
	}
	// The netperf Services point at the server Pod; NodePort data target = NodePort.
	var np, vip int
	for _, s := range n2.Services {
		if s.Namespace != netperfNamespace {
			continue
		}
		if s.Endpoint.Addr() != podIP(2) {
			t.Errorf("service %s/%s endpoint %s, want the server Pod", s.Name, s.Port, s.Endpoint)
		}
		if s.NodePort != 0 {
			np++
		}
		if s.ClusterIP == NetperfVIP {
			vip++
		}
		if s.NodePort == NodePortData && s.Endpoint.Port() != NodePortData {
			t.Errorf("nodeport data service targets %d, want %d (netserver listens on the port netperf asks for)", s.Endpoint.Port(), NodePortData)
		}
	}
	if np != 2 || vip != 2 {
		t.Errorf("netperf services: %d nodeports, %d on the VIP", np, vip)
	}
	// Every node routes every peer's Pod CIDR via that peer.
	routes := map[string]int{}
	for _, r := range p.Routes {
		routes[r.Role]++
	}
	for i := 1; i <= 3; i++ {
		if routes["node"+string(rune('0'+i))] != 2 {
			t.Errorf("node%d has %d routes, want 2", i, routes["node"+string(rune('0'+i))])
		}
	}
	// Transports hang on the bridge.
	var onBridge int
	for _, l := range p.Links {
		if l.Master == "br0" {
			onBridge++
		}
	}
	if onBridge != 4 {
		t.Errorf("%d ports on the bridge, want 3 nodes + external", onBridge)
	}
}

func TestPlanValidateRejects(t *testing.T) {
	base := func() Plan { return PktgenPlan(0) }
	cases := map[string]func(p *Plan){
		"duplicate namespace": func(p *Plan) { p.Namespaces = append(p.Namespaces, NSSpec{Role: RoleGen}) },
		"unknown link end":    func(p *Plan) { p.Links = append(p.Links, LinkSpec{A: "nope", AName: "x", B: RoleGen, BName: "y"}) },
		"duplicate device": func(p *Plan) {
			p.Links = append(p.Links, LinkSpec{A: RoleGen, AName: "eth0", B: RoleSink, BName: "eth9"})
		},
		"unknown bridge": func(p *Plan) { p.Links[0].Master = "br9" },
		"address on nothing": func(p *Plan) {
			p.Addrs = append(p.Addrs, AddrSpec{RoleGen, "eth7", netip.MustParsePrefix("1.2.3.4/24")})
		},
		"node without device": func(p *Plan) { p.Nodes[0].Gateway = "nope" },
	}
	for name, mutate := range cases {
		p := base()
		mutate(&p)
		if err := p.Validate(); err == nil {
			t.Errorf("%s: accepted", name)
		} else if !strings.HasPrefix(err.Error(), "plan: ") {
			t.Errorf("%s: %v", name, err)
		}
	}
}
