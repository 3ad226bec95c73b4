package bench

import (
	"fmt"
	"net/netip"
)

// Plan is a topology as data: namespaces, links, addresses, routes and the reachability
// that proves it works. Build turns it into namespaces; tests check it without root.
type Plan struct {
	Namespaces []NSSpec
	Bridges    []BridgeSpec
	Links      []LinkSpec
	Addrs      []AddrSpec
	Routes     []RouteSpec
	Checks     []CheckSpec
	// Nodes are the forwarding namespaces a Variant is applied to.
	Nodes []NodeSpec
}

// NSSpec is one namespace, named by role ("node1", "pod1", ...).
type NSSpec struct {
	Role    string
	Forward bool // ip_forward=1 (a node or the fabric)
}

// BridgeSpec is a Linux bridge inside a namespace.
type BridgeSpec struct{ Role, Name string }

// LinkSpec is a veth pair: AName in A, BName in B; Master enslaves the B end to that bridge.
type LinkSpec struct {
	A, AName, B, BName string
	Master             string
}

// AddrSpec is an address with its prefix length on a device.
type AddrSpec struct {
	Role, Dev string
	Prefix    netip.Prefix
}

// RouteSpec is a route; an invalid Via with Dev set is an on-link route.
type RouteSpec struct {
	Role string
	Dst  netip.Prefix
	Via  netip.Addr
}

// CheckSpec is a TCP connect from From to a listener on Addr inside To that must succeed
// before the plan counts as built.
type CheckSpec struct {
	From, To string
	Addr     netip.Addr
}

// NodeSpec is what a Variant needs to know about a node.
type NodeSpec struct {
	Role         string
	Gateway      string // link to the local Pods
	Transport    string // link to the other nodes
	IP           netip.Addr
	PodCIDR      netip.Prefix
	PeerPodCIDRs []netip.Prefix
	PeerIPs      []netip.Addr
	// Services this node's kube-proxy-like ruleset balances.
	Services []Service
}

// Service is a Kubernetes Service port with one endpoint.
type Service struct {
	Namespace, Name, Port string
	ClusterIP             netip.Addr
	ServicePort           uint16
	NodePort              uint16 // 0: none
	Endpoint              netip.AddrPort
}

// Cluster-wide addressing (kind-like: transport 172.18.0.0/24, Pods 10.244.N.0/24,
// Services 10.96.0.0/16).
var (
	ClusterCIDR   = netip.MustParsePrefix("10.244.0.0/16")
	ServiceCIDR   = netip.MustParsePrefix("10.96.0.0/16")
	TransportCIDR = netip.MustParsePrefix("172.18.0.0/24")
	ExternalIP    = netip.MustParseAddr("172.18.0.100")
	NetperfVIP    = netip.MustParseAddr("10.96.0.10")
	// LoadBalancerVIP is the VIP of the load balancer's dnat service on the server node;
	// the external client routes it via that node.
	LoadBalancerVIP = netip.MustParseAddr("198.51.100.10")
	directCIDR      = netip.MustParsePrefix("10.250.0.0/24")
	DirectClient    = netip.MustParseAddr("10.250.0.1")
	DirectServer    = netip.MustParseAddr("10.250.0.2")
)

// netperf ports. The data port is fixed (netperf -- -P ,PORT) so that a Service can carry it.
const (
	CtrlPort         = 12865
	DataPort         = 12866
	NodePortCtrl     = 30865
	NodePortData     = 30866
	GatewayName      = "gw"
	TransportName    = "eth0"
	netperfNamespace = "bench"
)

func podCIDR(i int) netip.Prefix {
	return netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 244, byte(i), 0}), 24)
}
func gatewayIP(i int) netip.Addr { return netip.AddrFrom4([4]byte{10, 244, byte(i), 1}) }
func podIP(i int) netip.Addr     { return netip.AddrFrom4([4]byte{10, 244, byte(i), 2}) }
func nodeIP(i int) netip.Addr    { return netip.AddrFrom4([4]byte{172, 18, 0, byte(i + 1)}) }
func in(a netip.Addr, p netip.Prefix) netip.Prefix {
	return netip.PrefixFrom(a, p.Bits())
}
func host(a netip.Addr) netip.Prefix { return netip.PrefixFrom(a, a.BitLen()) }

// Roles of the cluster: the client Pod is pod1 on node1, the server Pod pod2 on node2.
const (
	RoleFabric       = "fabric"
	RoleExternal     = "ext"
	RoleClientPod    = "pod1"
	RoleServerPod    = "pod2"
	RoleClientNode   = "node1"
	RoleServerNode   = "node2"
	RoleDirectClient = "dcli"
	RoleDirectServer = "dsrv"
)

// NetperfServices are the Services that carry netperf: its control and data ports on a
// ClusterIP with NodePorts, and one more NodePort for the data port netperf uses through a
// NodePort (netserver listens on the port netperf asks for, so that Service's target port
// equals its NodePort).
func NetperfServices(endpoint netip.Addr) []Service {
	return []Service{
		{Namespace: netperfNamespace, Name: "netperf", Port: "ctrl", ClusterIP: NetperfVIP, ServicePort: CtrlPort, NodePort: NodePortCtrl, Endpoint: netip.AddrPortFrom(endpoint, CtrlPort)},
		{Namespace: netperfNamespace, Name: "netperf", Port: "data", ClusterIP: NetperfVIP, ServicePort: DataPort, Endpoint: netip.AddrPortFrom(endpoint, DataPort)},
		{Namespace: netperfNamespace, Name: "netperf-nodeport", Port: "data", ClusterIP: netip.MustParseAddr("10.96.0.11"), ServicePort: NodePortData, NodePort: NodePortData, Endpoint: netip.AddrPortFrom(endpoint, NodePortData)},
	}
}

// idleServices are Services nobody uses, so that the kube-proxy-like maps are not trivially
// small; their endpoints are on the last node.
func idleServices(n, lastNode int) []Service {
	var out []Service
	for i := range n {
		out = append(out, Service{
			Namespace: "default", Name: fmt.Sprintf("idle-%d", i), Port: "http",
			ClusterIP:   netip.AddrFrom4([4]byte{10, 96, 1, byte(i + 1)}),
			ServicePort: 80,
			NodePort:    uint16(31000 + i),
			Endpoint:    netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 244, byte(lastNode), byte(10 + i)}), 8080),
		})
	}
	return out
}

// ClusterPlan is the netperf cluster: nodes node1..nodeN, each with a gateway "gw" to its
// Pod podN and a transport "eth0" on the fabric's bridge, an external client on the same
// bridge, and a direct client/server pair on one veth (the limit, no hop). Routing is
// noEncap: each node routes the peers' Pod CIDRs via their transport IPs.
//
//	pod1 ── gw node1 eth0 ──┐
//	pod2 ── gw node2 eth0 ──┼── br0 (fabric)      dcli eth0 ── eth0 dsrv
//	pod3 ── gw node3 eth0 ──┤
//	           ext  eth0 ───┘
func ClusterPlan(nodes, services int) Plan {
	p := Plan{}
	p.Namespaces = append(p.Namespaces, NSSpec{Role: RoleFabric})
	p.Bridges = append(p.Bridges, BridgeSpec{Role: RoleFabric, Name: "br0"})
	svcs := append(NetperfServices(podIP(2)), idleServices(services, nodes)...)
	for i := 1; i <= nodes; i++ {
		node, pod := fmt.Sprintf("node%d", i), fmt.Sprintf("pod%d", i)
		p.Namespaces = append(p.Namespaces, NSSpec{Role: node, Forward: true}, NSSpec{Role: pod})
		p.Links = append(p.Links,
			LinkSpec{A: node, AName: GatewayName, B: pod, BName: "eth0"},
			LinkSpec{A: node, AName: TransportName, B: RoleFabric, BName: node, Master: "br0"})
		p.Addrs = append(p.Addrs,
			AddrSpec{node, GatewayName, in(gatewayIP(i), podCIDR(i))},
			AddrSpec{node, TransportName, in(nodeIP(i), TransportCIDR)},
			AddrSpec{pod, "eth0", in(podIP(i), podCIDR(i))})
		p.Routes = append(p.Routes, RouteSpec{Role: pod, Dst: netip.MustParsePrefix("0.0.0.0/0"), Via: gatewayIP(i)})
		ns := NodeSpec{Role: node, Gateway: GatewayName, Transport: TransportName, IP: nodeIP(i), PodCIDR: podCIDR(i), Services: svcs}
		for j := 1; j <= nodes; j++ {
			if j != i {
				p.Routes = append(p.Routes, RouteSpec{Role: node, Dst: podCIDR(j), Via: nodeIP(j)})
				ns.PeerPodCIDRs = append(ns.PeerPodCIDRs, podCIDR(j))
				ns.PeerIPs = append(ns.PeerIPs, nodeIP(j))
			}
		}
		p.Nodes = append(p.Nodes, ns)
	}
	p.Namespaces = append(p.Namespaces, NSSpec{Role: RoleExternal}, NSSpec{Role: RoleDirectClient}, NSSpec{Role: RoleDirectServer})
	p.Links = append(p.Links,
		LinkSpec{A: RoleExternal, AName: "eth0", B: RoleFabric, BName: RoleExternal, Master: "br0"},
		LinkSpec{A: RoleDirectClient, AName: "eth0", B: RoleDirectServer, BName: "eth0"})
	p.Addrs = append(p.Addrs,
		AddrSpec{RoleExternal, "eth0", in(ExternalIP, TransportCIDR)},
		AddrSpec{RoleDirectClient, "eth0", in(DirectClient, directCIDR)},
		AddrSpec{RoleDirectServer, "eth0", in(DirectServer, directCIDR)})
	p.Routes = append(p.Routes, RouteSpec{Role: RoleExternal, Dst: host(LoadBalancerVIP), Via: nodeIP(2)})
	p.Checks = []CheckSpec{
		{From: RoleClientPod, To: RoleServerPod, Addr: podIP(2)},
		{From: RoleExternal, To: RoleServerNode, Addr: nodeIP(2)},
		{From: RoleDirectClient, To: RoleDirectServer, Addr: DirectServer},
	}
	return p
}

// Roles and addresses of the pktgen bed.
const (
	RoleGen        = "gen"
	RolePktNode    = "pnode"
	RoleSink       = "sink"
	RoleDirectGen  = "dgen"
	RoleDirectSink = "dsink"
)

var (
	GenIP  = podIP(1)
	SinkIP = podIP(2) // a remote Pod behind the sink (on its lo)
)

// PktgenPlan is the per-packet bed: a generator Pod behind one node, whose transport leads
// to a sink standing for the peer node and its Pod; and the limit, a generator and a sink on
// one veth.
//
//	gen eth0 ── gw pnode eth0 ── eth0 sink (lo: 10.244.2.2)      dgen eth0 ── eth0 dsink
func PktgenPlan(services int) Plan {
	p := Plan{
		Namespaces: []NSSpec{{Role: RoleGen}, {Role: RolePktNode, Forward: true}, {Role: RoleSink}, {Role: RoleDirectGen}, {Role: RoleDirectSink}},
		Links: []LinkSpec{
			{A: RolePktNode, AName: GatewayName, B: RoleGen, BName: "eth0"},
			{A: RolePktNode, AName: TransportName, B: RoleSink, BName: "eth0"},
			{A: RoleDirectGen, AName: "eth0", B: RoleDirectSink, BName: "eth0"},
		},
		Addrs: []AddrSpec{
			{RoleGen, "eth0", in(GenIP, podCIDR(1))},
			{RolePktNode, GatewayName, in(gatewayIP(1), podCIDR(1))},
			{RolePktNode, TransportName, in(nodeIP(1), TransportCIDR)},
			{RoleSink, "eth0", in(nodeIP(2), TransportCIDR)},
			{RoleSink, "lo", host(SinkIP)},
			{RoleDirectGen, "eth0", in(DirectClient, directCIDR)},
			{RoleDirectSink, "eth0", in(DirectServer, directCIDR)},
		},
		Routes: []RouteSpec{
			{Role: RoleGen, Dst: netip.MustParsePrefix("0.0.0.0/0"), Via: gatewayIP(1)},
			{Role: RolePktNode, Dst: podCIDR(2), Via: nodeIP(2)},
			{Role: RoleSink, Dst: podCIDR(1), Via: nodeIP(1)},
		},
		Checks: []CheckSpec{
			{From: RoleGen, To: RoleSink, Addr: SinkIP},
			{From: RoleDirectGen, To: RoleDirectSink, Addr: DirectServer},
		},
		Nodes: []NodeSpec{{
			Role: RolePktNode, Gateway: GatewayName, Transport: TransportName, IP: nodeIP(1), PodCIDR: podCIDR(1),
			PeerPodCIDRs: []netip.Prefix{podCIDR(2)}, PeerIPs: []netip.Addr{nodeIP(2)},
			Services: append(NetperfServices(SinkIP), idleServices(services, 2)...),
		}},
	}
	return p
}

// Validate checks that every reference in the plan names something the plan creates.
func (p Plan) Validate() error {
	roles := map[string]bool{}
	for _, n := range p.Namespaces {
		if roles[n.Role] {
			return fmt.Errorf("plan: namespace %q twice", n.Role)
		}
		roles[n.Role] = true
	}
	devs := map[string]bool{}
	for _, n := range p.Namespaces {
		devs[n.Role+"/lo"] = true
	}
	for _, b := range p.Bridges {
		if !roles[b.Role] {
			return fmt.Errorf("plan: bridge %s in unknown namespace %q", b.Name, b.Role)
		}
		devs[b.Role+"/"+b.Name] = true
	}
	for _, l := range p.Links {
		for _, end := range [][2]string{{l.A, l.AName}, {l.B, l.BName}} {
			if !roles[end[0]] {
				return fmt.Errorf("plan: link %s/%s: unknown namespace %q", l.A, l.AName, end[0])
			}
			if devs[end[0]+"/"+end[1]] {
				return fmt.Errorf("plan: device %s/%s twice", end[0], end[1])
			}
			devs[end[0]+"/"+end[1]] = true
		}
		if l.Master != "" && !devs[l.B+"/"+l.Master] {
			return fmt.Errorf("plan: link %s/%s: no bridge %q in %s", l.B, l.BName, l.Master, l.B)
		}
	}
	for _, a := range p.Addrs {
		if !devs[a.Role+"/"+a.Dev] {
			return fmt.Errorf("plan: address %s on unknown device %s/%s", a.Prefix, a.Role, a.Dev)
		}
	}
	for _, r := range p.Routes {
		if !roles[r.Role] {
			return fmt.Errorf("plan: route %s in unknown namespace %q", r.Dst, r.Role)
		}
	}
	for _, c := range p.Checks {
		if !roles[c.From] || !roles[c.To] {
			return fmt.Errorf("plan: check %s -> %s: unknown namespace", c.From, c.To)
		}
	}
	for _, n := range p.Nodes {
		if !roles[n.Role] || !devs[n.Role+"/"+n.Gateway] || !devs[n.Role+"/"+n.Transport] {
			return fmt.Errorf("plan: node %s: namespace or devices missing", n.Role)
		}
	}
	return nil
}
