package bench

import (
	"crypto/sha256"
	"encoding/base32"
	"fmt"
	"net/netip"
	"strings"
)

// Tables of the default node path.
const (
	KubeProxyTable  = "kube-proxy"  // ip family, modelled on kube-proxy's nftables mode
	NodeFilterTable = "node-filter" // inet family, the node's own forward rules
	// CountersTable is the bench's own probe on every node: a forward chain right after the
	// node's forward rules and a prerouting chain right after DNAT, each with one counter.
	// (Anonymous rule counters, as the seeds' rulesets have.)
	CountersTable   = "bench-counters"
	SlowPathCounter = "slowpath"      // packets through the forward hook
	ServiceCounter  = "service-conns" // new connections destination-NATed by a Service
)

// CountersRuleset is the bench's probe table (same on every node, for every variant).
func CountersRuleset() string {
	return fmt.Sprintf(`table inet %s {
	comment "hostaccel bench: counters that show which path packets took"
	chain forward {
		type filter hook forward priority filter + 5; policy accept;
		counter comment %q
	}
	chain prerouting {
		type filter hook prerouting priority dstnat + 10; policy accept;
		ct state new ct status dnat counter comment %q
	}
}
`, CountersTable, SlowPathCounter, ServiceCounter)
}

// DefaultRuleset is the node's default path: a kube-proxy-like NAT ruleset (its nftables
// mode's shape: verdict maps keyed by ClusterIP/NodePort, one chain per service port and
// endpoint, masquerading by mark) that balances the Services, and a forward chain with
// rules policy rules that never match the benchmark's traffic, so every forwarded packet is
// checked against all of them. Conntrack is on (NAT needs it).
func DefaultRuleset(n NodeSpec, rules int) string {
	var b strings.Builder
	w := func(format string, a ...any) { fmt.Fprintf(&b, format+"\n", a...) }

	w("table ip %s {", KubeProxyTable)
	w("\tcomment \"rules for kube-proxy (modelled on its nftables mode by hostaccel bench)\"")
	var ips, svcElems, npElems []string
	seen := map[netip.Addr]bool{}
	for _, s := range n.Services {
		if !seen[s.ClusterIP] {
			seen[s.ClusterIP] = true
			ips = append(ips, s.ClusterIP.String())
		}
		svcElems = append(svcElems, fmt.Sprintf("%s . tcp . %d : goto %s", s.ClusterIP, s.ServicePort, serviceChain(s)))
		if s.NodePort != 0 {
			npElems = append(npElems, fmt.Sprintf("tcp . %d : goto %s", s.NodePort, externalChain(s)))
		}
	}
	// collection writes a set or a map with its elements, joined by sep.
	collection := func(kind, name, typ, comment, sep string, elems []string) {
		w("\t%s %s {", kind, name)
		w("\t\ttype %s", typ)
		w("\t\tcomment %q", comment)
		if len(elems) > 0 {
			w("\t\telements = { %s }", strings.Join(elems, sep))
		}
		w("\t}")
	}
	set := func(name, typ, comment string, elems []string) { collection("set", name, typ, comment, ", ", elems) }
	vmap := func(name, typ, comment string, elems []string) {
		collection("map", name, typ+" : verdict", comment, ",\n\t\t\t     ", elems)
	}
	set("cluster-ips", "ipv4_addr", "Active ClusterIPs", ips)
	set("nodeport-ips", "ipv4_addr", "IPs that accept NodePort traffic", []string{n.IP.String()})
	vmap("no-endpoint-services", "ipv4_addr . inet_proto . inet_service", "vmap to drop or reject packets to services with no endpoints", nil)
	vmap("service-ips", "ipv4_addr . inet_proto . inet_service", "ClusterIP, ExternalIP and LoadBalancer IP traffic", svcElems)
	vmap("service-nodeports", "inet_proto . inet_service", "NodePort traffic", npElems)

	chain := func(name, hook string, body ...string) {
		w("\tchain %s {", name)
		if hook != "" {
			w("\t\t%s", hook)
		}
		for _, r := range body {
			w("\t\t%s", r)
		}
		w("\t}")
	}
	chain("filter-forward", "type filter hook forward priority -110; policy accept;",
		"ct state new jump service-endpoints-check",
		"ct state new jump cluster-ips-check")
	chain("service-endpoints-check", "", "ip daddr . meta l4proto . th dport vmap @no-endpoint-services")
	chain("cluster-ips-check", "",
		`ip daddr @cluster-ips reject comment "Reject traffic to invalid ports of ClusterIPs"`,
		fmt.Sprintf(`ip daddr %s drop comment "Drop traffic to unallocated ClusterIPs"`, ServiceCIDR))
	chain("nat-prerouting", "type nat hook prerouting priority dstnat; policy accept;", "jump services")
	chain("nat-output", "type nat hook output priority -100; policy accept;", "jump services")
	chain("nat-postrouting", "type nat hook postrouting priority srcnat; policy accept;", "jump masquerading")
	chain("masquerading", "",
		"meta mark & 0x00004000 == 0x00000000 return",
		"meta mark set meta mark ^ 0x00004000",
		"masquerade fully-random")
	chain("mark-for-masquerade", "", "meta mark set meta mark | 0x00004000")
	chain("services", "",
		"ip daddr . meta l4proto . th dport vmap @service-ips",
		"ip daddr @nodeport-ips meta l4proto . th dport vmap @service-nodeports")
	for _, s := range n.Services {
		chain(serviceChain(s), "",
			fmt.Sprintf("ip daddr %s tcp dport %d ip saddr != %s jump mark-for-masquerade", s.ClusterIP, s.ServicePort, ClusterCIDR),
			fmt.Sprintf("numgen random mod 1 vmap { 0 : goto %s }", endpointChain(s)))
		chain(endpointChain(s), "",
			fmt.Sprintf("ip saddr %s jump mark-for-masquerade", s.Endpoint.Addr()),
			fmt.Sprintf("meta l4proto tcp dnat to %s", s.Endpoint))
		if s.NodePort != 0 {
			chain(externalChain(s), "", "jump mark-for-masquerade", "goto "+serviceChain(s))
		}
	}
	w("}")

	w("table inet %s {", NodeFilterTable)
	w("\tcomment \"the node's own forward rules: %d policy rules that never match the benchmark's traffic\"", rules)
	w("\tchain forward {")
	w("\t\ttype filter hook forward priority filter; policy accept;")
	w("\t\tct state invalid drop")
	for i := range rules {
		w("\t\tip saddr 10.255.%d.%d ip daddr 10.254.%d.%d tcp dport %d drop", i/250, i%250+1, i/250, i%250+1, 1000+i%60000)
	}
	w("\t}")
	w("}")
	return b.String()
}

// kube-proxy names chains after a hash of the service port plus its name.
func chainHash(s string) string {
	h := sha256.Sum256([]byte(s))
	return base32.StdEncoding.EncodeToString(h[:])[:8]
}

func servicePortName(s Service) string {
	return fmt.Sprintf("%s/%s/tcp/%s", s.Namespace, s.Name, s.Port)
}

func serviceChain(s Service) string {
	return "service-" + chainHash(servicePortName(s)) + "-" + servicePortName(s)
}

func externalChain(s Service) string {
	return "external-" + chainHash(servicePortName(s)) + "-" + servicePortName(s)
}

func endpointChain(s Service) string {
	ep := fmt.Sprintf("%s__%s/%d", servicePortName(s), s.Endpoint.Addr(), s.Endpoint.Port())
	return "endpoint-" + chainHash(ep) + "-" + ep
}

// AntreaRuleset is Antrea's hostNetworkAcceleration ruleset exactly as its documentation
// shows it (shared/seeds/001), IPv4 table only (the bench cluster is IPv4-only, so Antrea
// would create no ip6 table), with this node's devices and CIDRs.
func AntreaRuleset(n NodeSpec) string {
	var peers []string
	for _, p := range n.PeerPodCIDRs {
		peers = append(peers, p.String())
	}
	return fmt.Sprintf(`table ip antrea {
	comment "Rules for Antrea"
	set peer-pod-cidr {
		type ipv4_addr
		flags interval
		comment "Set for storing IPv4 peer Pods CIDRs"
		elements = { %[1]s }
	}
	flowtable fastpath {
		hook ingress priority filter
		devices = { %[2]s, %[3]s }
	}
	chain forward {
		comment "Forward chain for storing rules"
		type filter hook forward priority filter; policy accept;
		iif "%[2]s" ip saddr %[4]s oif "%[3]s" ip daddr @peer-pod-cidr flow add @fastpath counter comment "Accelerate IPv4 connections: local Pod CIDR to remote Pod CIDRs"
		iif "%[3]s" ip saddr @peer-pod-cidr oif "%[2]s" ip daddr %[4]s flow add @fastpath counter comment "Accelerate IPv4 connections: remote Pod CIDRs to local Pod CIDR"
	}
}
`, strings.Join(peers, ", "), n.Gateway, n.Transport, n.PodCIDR)
}

// KindnetRuleset is Kindnet's fastpath table exactly as its documentation shows it
// (shared/seeds/002): every interface of the node in the flowtable, connections offloaded
// once they carried more than threshold packets.
func KindnetRuleset(n NodeSpec, threshold int) string {
	return fmt.Sprintf(`table inet kindnet-fastpath {
	comment "rules for kindnet fastpath"
	flowtable kindnet-flowtables {
		hook ingress priority filter
		devices = { %[1]s, %[2]s }
	}
	chain kindnet-fastpath-chain {
		type filter hook forward priority -110; policy accept;
		ct packets > %[3]d flow add @kindnet-flowtables counter
	}
}
`, n.Transport, n.Gateway, threshold)
}
