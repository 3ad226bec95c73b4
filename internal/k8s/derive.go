package k8s

import (
	"cmp"
	"encoding/json"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"sigs.k8s.io/yaml"

	"github.com/hostaccel/hostaccel/internal/config"
	"github.com/hostaccel/hostaccel/internal/lb"
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

// ServicePolicy says which Services the load balancer serves. Services always feed the
// traffic classes (LoadBalancer ingress and external IPs); this is only about balancing.
type ServicePolicy string

const (
	// ServicesNone: no Service is balanced by hostaccel (kube-proxy or the CNI does it).
	ServicesNone ServicePolicy = "none"
	// ServicesLabeled: only Services labeled service.kubernetes.io/service-proxy-name=<ProxyName>,
	// the label that tells kube-proxy to leave a Service to another proxy.
	ServicesLabeled ServicePolicy = "labeled"
	// ServicesAll: what kube-proxy would serve (Services without a service-proxy-name label)
	// plus the labeled ones: hostaccel in place of kube-proxy.
	ServicesAll ServicePolicy = "all"
)

// LabelServiceProxyName is the well-known label that hands a Service to a named proxy.
const LabelServiceProxyName = "service.kubernetes.io/service-proxy-name"

// AnnotationScheduler on a Service picks the load balancer's scheduler for it.
const AnnotationScheduler = "lb.hostaccel.io/scheduler"

// Params are what a derivation needs besides the objects.
type Params struct {
	NodeName string
	Peers    PeerPolicy
	// PeerSubnets are this node's transport subnets for PeersSameSubnet (normally the
	// prefixes of the local addresses that carry the node's IPs).
	PeerSubnets []netip.Prefix
	Services    ServicePolicy
	ProxyName   string
}

// Snapshot is the set of API objects one derivation reads.
type Snapshot struct {
	Nodes          []*corev1.Node
	Services       []*corev1.Service
	EndpointSlices []*discoveryv1.EndpointSlice
}

// Derived is one derivation's result.
type Derived struct {
	// Config is the base config plus what the API says, validated by config.Parse.
	Config *config.Config
	// YAML is Config in the file format (`hostaccel render -f` and `apply -f` accept it).
	YAML []byte
	// Summary is the derivation explained, for status.
	Summary Summary
}

// Summary explains a derivation.
type Summary struct {
	NodeName      string     `json:"nodeName"`
	NodeFound     bool       `json:"nodeFound"`
	LocalPodCIDRs []string   `json:"localPodCIDRs"`
	NodeIPs       []string   `json:"nodeIPs"`
	Peers         []Peer     `json:"peers"`
	Services      int        `json:"services"` // Services seen
	Balanced      []LBFront  `json:"balanced,omitempty"`
	ExternalIPs   []string   `json:"loadBalancerIPs,omitempty"`
	Warnings      []string   `json:"warnings,omitempty"`
	PeerPolicy    PeerPolicy `json:"peerPolicy"`
}

// Peer is another Node as the derivation saw it.
type Peer struct {
	Name     string   `json:"name"`
	PodCIDRs []string `json:"podCIDRs"`
	NodeIPs  []string `json:"nodeIPs"`
	// Accelerated is false when the peer policy left the Node out; Reason says why.
	Accelerated bool   `json:"accelerated"`
	Reason      string `json:"reason,omitempty"`
}

// ParseBase reads the agent config that the API's facts are added to (the ConfigMap). It is
// decoded strictly but not validated: node-specific fields that a valid file needs (local Pod
// CIDRs) come from the API, and the merged result is validated as a whole.
func ParseBase(b []byte) (*config.Config, error) {
	var c config.Config
	if err := yaml.UnmarshalStrict(b, &c); err != nil {
		return nil, err
	}
	return &c, nil
}

// Derive adds what the API says about this node to base and validates the result with the same
// parser as a config file. base is not modified.
//
//   - this Node's spec.podCIDRs -> node.localPodCIDRs; its InternalIP and ExternalIP addresses
//     -> node.nodeIPs
//   - every other Node's spec.podCIDRs -> node.peerPodCIDRs and its InternalIPs ->
//     node.peerNodeIPs, subject to the peer policy
//   - Services' LoadBalancer ingress IPs (ipMode VIP) and spec.externalIPs -> node.loadBalancerIPs
//   - the Services the service policy selects, with their EndpointSlices -> loadBalancer.services
//
// Lists in base are kept and the API's entries added, so the ConfigMap can name static extras.
func Derive(base *config.Config, snap Snapshot, p Params) (*Derived, error) {
	if p.Peers == "" {
		p.Peers = PeersAll
	}
	if p.Services == "" {
		p.Services = ServicesLabeled
	}
	if p.ProxyName == "" {
		p.ProxyName = DefaultProxyName
	}
	sum := Summary{NodeName: p.NodeName, PeerPolicy: p.Peers}
	warn := func(format string, a ...any) { sum.Warnings = append(sum.Warnings, fmt.Sprintf(format, a...)) }

	var self *corev1.Node
	for _, n := range snap.Nodes {
		if n.Name == p.NodeName {
			self = n
		}
	}
	if self == nil {
		return nil, fmt.Errorf("node %q not found in the API (is --node-name right?)", p.NodeName)
	}
	sum.NodeFound = true
	sum.LocalPodCIDRs = podCIDRs(self, warn)
	sum.NodeIPs = addressesOf(self, corev1.NodeInternalIP, corev1.NodeExternalIP)
	if len(sum.LocalPodCIDRs) == 0 {
		warn("node %s has no spec.podCIDRs yet", self.Name)
	}

	var peerCIDRs, peerIPs []string
	for _, n := range sortedNodes(snap.Nodes) {
		if n.Name == p.NodeName {
			continue
		}
		peer := Peer{Name: n.Name, PodCIDRs: podCIDRs(n, warn), NodeIPs: addressesOf(n, corev1.NodeInternalIP)}
		peer.Accelerated, peer.Reason = peerAccelerated(peer, p)
		switch {
		case len(peer.PodCIDRs) == 0:
			peer.Accelerated, peer.Reason = false, "no spec.podCIDRs"
		case peer.Accelerated:
			peerCIDRs = append(peerCIDRs, accelerable(peer.PodCIDRs, peer.NodeIPs, p)...)
			peerIPs = append(peerIPs, peer.NodeIPs...)
		}
		sum.Peers = append(sum.Peers, peer)
	}

	sum.Services = len(snap.Services)
	lbIPs := externalAddresses(snap.Services)
	sum.ExternalIPs = lbIPs
	fronts := balance(snap, p, self, sum.NodeIPs, warn)
	sum.Balanced = fronts

	c, err := clone(base)
	if err != nil {
		return nil, err
	}
	c.Node.LocalPodCIDRs = union(c.Node.LocalPodCIDRs, sum.LocalPodCIDRs)
	c.Node.PeerPodCIDRs = union(c.Node.PeerPodCIDRs, peerCIDRs)
	c.Node.NodeIPs = union(c.Node.NodeIPs, sum.NodeIPs)
	c.Node.PeerNodeIPs = union(c.Node.PeerNodeIPs, peerIPs)
	c.Node.LoadBalancerIPs = union(c.Node.LoadBalancerIPs, hostPrefixes(lbIPs))
	c.LoadBalancer.Services = append(c.LoadBalancer.Services, lbServices(fronts)...)

	y, err := marshalConfig(c)
	if err != nil {
		return nil, err
	}
	parsed, err := config.Parse(y)
	if err != nil {
		return nil, fmt.Errorf("the derived config is invalid: %w", err)
	}
	return &Derived{Config: parsed, YAML: y, Summary: sum}, nil
}

// DefaultProxyName is the service-proxy-name hostaccel answers to under ServicesLabeled.
const DefaultProxyName = "hostaccel"

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
		if err != nil {
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
		if ip, err := netip.ParseAddr(a.Address); err == nil && !slices.Contains(out, ip.String()) {
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

// externalAddresses lists the addresses that Services make this node answer for from outside:
// LoadBalancer ingress IPs (unless ipMode Proxy: then the load balancer sends traffic to node
// or Pod addresses, never to the VIP) and spec.externalIPs.
func externalAddresses(svcs []*corev1.Service) []string {
	var out []string
	add := func(s string) {
		if ip, err := netip.ParseAddr(s); err == nil {
			out = append(out, ip.String())
		}
	}
	for _, s := range svcs {
		for _, ip := range s.Spec.ExternalIPs {
			add(ip)
		}
		if s.Spec.Type != corev1.ServiceTypeLoadBalancer {
			continue
		}
		for _, ing := range s.Status.LoadBalancer.Ingress {
			if ing.IPMode != nil && *ing.IPMode == corev1.LoadBalancerIPModeProxy {
				continue
			}
			add(ing.IP)
		}
	}
	slices.SortFunc(out, func(a, b string) int { return netip.MustParseAddr(a).Compare(netip.MustParseAddr(b)) })
	return slices.Compact(out)
}

func hostPrefixes(ips []string) []string {
	out := make([]string, 0, len(ips))
	for _, s := range ips {
		ip := netip.MustParseAddr(s)
		out = append(out, netip.PrefixFrom(ip, ip.BitLen()).String())
	}
	return out
}

// union appends the entries of add that base lacks, comparing canonical forms.
func union(base, add []string) []string {
	seen := map[string]bool{}
	var out []string
	for _, s := range append(slices.Clone(base), add...) {
		k := canonical(s)
		if !seen[k] {
			seen[k] = true
			out = append(out, s)
		}
	}
	return out
}

func canonical(s string) string {
	if p, err := netip.ParsePrefix(s); err == nil {
		return p.String()
	}
	if a, err := netip.ParseAddr(s); err == nil {
		return a.String()
	}
	return s
}

func clone(c *config.Config) (*config.Config, error) {
	if c == nil {
		return &config.Config{}, nil
	}
	b, err := json.Marshal(c)
	if err != nil {
		return nil, err
	}
	var out config.Config
	if err := json.Unmarshal(dropNulls(b), &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// marshalConfig writes c in the file format. Empty values are left out, so that the file reads
// as a person would write it and parses back to the same Config.
func marshalConfig(c *config.Config) ([]byte, error) {
	b, err := json.Marshal(c)
	if err != nil {
		return nil, err
	}
	return yaml.JSONToYAML(dropNulls(b))
}

// dropNulls removes null and empty values from a JSON object, recursively.
func dropNulls(b []byte) []byte {
	var v any
	if json.Unmarshal(b, &v) != nil {
		return b
	}
	v, _ = prune(v)
	out, err := json.Marshal(v)
	if err != nil {
		return b
	}
	return out
}

func prune(v any) (any, bool) {
	switch t := v.(type) {
	case nil:
		return nil, false
	case map[string]any:
		for k, e := range t {
			if pe, ok := prune(e); ok {
				t[k] = pe
			} else {
				delete(t, k)
			}
		}
		return t, len(t) > 0
	case []any:
		for i, e := range t {
			if pe, ok := prune(e); ok {
				t[i] = pe
			}
		}
		return t, len(t) > 0
	case string:
		return t, t != "" && t != "0s"
	default:
		return t, true
	}
}

// LBFront is one (Service port, front, IP family) the load balancer serves, with its backends.
type LBFront struct {
	// Name is namespace/service:port/front[/ipv6], unique within a derivation.
	Name string `json:"name"`
	// LBName is the load balancer service's name (loadBalancer.services[].name): a readable
	// prefix of Name and a hash of it, within the load balancer's 32 characters.
	LBName    string `json:"lbName"`
	Namespace string `json:"namespace"`
	Service   string `json:"service"`
	Port      string `json:"port"` // the Service port's name, or its number when unnamed
	// Front: cluster (ClusterIPs), nodeport (this node's IPs at the NodePort) or external
	// (LoadBalancer ingress IPs and externalIPs).
	Front    string   `json:"front"`
	VIPs     []string `json:"vips"`
	VIPPort  int32    `json:"vipPort"`
	Protocol string   `json:"protocol"` // tcp, udp or sctp
	// Topology: dnat, or snat for the node and external fronts of externalTrafficPolicy
	// Cluster (kube-proxy masquerades those, so that replies from other nodes come back).
	Topology string `json:"topology"`
	// Scheduler is the Service's lb.hostaccel.io/scheduler annotation ("" for the default).
	Scheduler string `json:"scheduler,omitempty"`
	// Persistence is sessionAffinity: ClientIP's timeout (0: no persistence).
	Persistence time.Duration `json:"persistence,omitempty"`
	Backends    []LBBackend   `json:"backends"`
	// Skipped says why the front is not given to the load balancer (no endpoints).
	Skipped string `json:"skipped,omitempty"`
}

// LBBackend is one endpoint of a front.
type LBBackend struct {
	Address string `json:"address"`
	Port    int32  `json:"port"`
	// State is up (ready) or drain (not ready: established connections finish, no new ones).
	State    string `json:"state"`
	NodeName string `json:"nodeName,omitempty"`
}

// Backend states, as the load balancer names them.
const (
	StateUp    = lb.StateUp
	StateDrain = lb.StateDrain
)

// schedulers the lb.hostaccel.io/scheduler annotation may name.
var schedulers = []string{lb.RoundRobin, lb.Weighted, lb.Hash, lb.SymHash}

// Front kinds.
const (
	FrontCluster  = "cluster"
	FrontNodePort = "nodeport"
	FrontExternal = "external"
)

// DefaultAffinityTimeout is Kubernetes' default sessionAffinityConfig.clientIP.timeoutSeconds.
const DefaultAffinityTimeout = 10800 * time.Second

// balance turns the selected Services and their EndpointSlices into load balancer fronts.
func balance(snap Snapshot, p Params, self *corev1.Node, nodeIPs []string, warn func(string, ...any)) []LBFront {
	if p.Services == ServicesNone {
		return nil
	}
	slicesOf := map[string][]*discoveryv1.EndpointSlice{} // namespace/service
	for _, es := range snap.EndpointSlices {
		if name := es.Labels[discoveryv1.LabelServiceName]; name != "" {
			k := es.Namespace + "/" + name
			slicesOf[k] = append(slicesOf[k], es)
		}
	}
	svcs := slices.Clone(snap.Services)
	slices.SortFunc(svcs, func(a, b *corev1.Service) int {
		return cmp.Or(cmp.Compare(a.Namespace, b.Namespace), cmp.Compare(a.Name, b.Name))
	})
	var out []LBFront
	for _, s := range svcs {
		if !selected(s, p) || s.Spec.Type == corev1.ServiceTypeExternalName {
			continue
		}
		eps := slicesOf[s.Namespace+"/"+s.Name]
		var persistence time.Duration
		if s.Spec.SessionAffinity == corev1.ServiceAffinityClientIP {
			persistence = DefaultAffinityTimeout
			if c := s.Spec.SessionAffinityConfig; c != nil && c.ClientIP != nil && c.ClientIP.TimeoutSeconds != nil {
				persistence = time.Duration(*c.ClientIP.TimeoutSeconds) * time.Second
			}
		}
		internalLocal := s.Spec.InternalTrafficPolicy != nil && *s.Spec.InternalTrafficPolicy == corev1.ServiceInternalTrafficPolicyLocal
		externalLocal := s.Spec.ExternalTrafficPolicy == corev1.ServiceExternalTrafficPolicyLocal
		var clusterIPs []string
		for _, ip := range s.Spec.ClusterIPs {
			if ip != corev1.ClusterIPNone && ip != "" {
				clusterIPs = append(clusterIPs, ip)
			}
		}
		if len(clusterIPs) == 0 && s.Spec.ClusterIP != "" && s.Spec.ClusterIP != corev1.ClusterIPNone {
			clusterIPs = []string{s.Spec.ClusterIP}
		}
		external := externalAddresses([]*corev1.Service{s})
		scheduler := s.Annotations[AnnotationScheduler]
		if scheduler != "" && !slices.Contains(schedulers, scheduler) {
			warn("service %s/%s: %s %q is not one of %v; using the default", s.Namespace, s.Name, AnnotationScheduler, scheduler, schedulers)
			scheduler = ""
		}

		for _, sp := range s.Spec.Ports {
			proto := strings.ToLower(string(sp.Protocol))
			if proto == "" {
				proto = "tcp"
			}
			if proto != "tcp" && proto != "udp" && proto != "sctp" {
				warn("service %s/%s port %s: protocol %s is not balanced", s.Namespace, s.Name, portName(sp), sp.Protocol)
				continue
			}
			all := backends(eps, sp)
			local := filterLocal(all, self.Name)
			mk := func(front string, vips []string, port int32, bes []LBBackend) {
				if len(vips) == 0 || port == 0 {
					return
				}
				topology := lb.DNAT
				if front != FrontCluster && !externalLocal {
					topology = lb.SNAT
				}
				for _, fam := range splitFamilies(vips) {
					f := LBFront{
						Name:      s.Namespace + "/" + s.Name + ":" + portName(sp) + "/" + front,
						Namespace: s.Namespace, Service: s.Name, Port: portName(sp), Front: front,
						VIPs: fam, VIPPort: port, Protocol: proto, Topology: topology,
						Scheduler: scheduler, Persistence: persistence,
						Backends: sameFamily(bes, netip.MustParseAddr(fam[0]).Is4()),
					}
					if !netip.MustParseAddr(fam[0]).Is4() {
						f.Name += "/ipv6"
					}
					f.LBName = lbName(f.Name)
					if len(f.Backends) == 0 {
						f.Skipped = "no endpoints"
					}
					out = append(out, f)
				}
			}
			pick := func(localOnly bool) []LBBackend {
				if localOnly {
					return local
				}
				return all
			}
			mk(FrontCluster, clusterIPs, sp.Port, pick(internalLocal))
			if s.Spec.Type == corev1.ServiceTypeNodePort || s.Spec.Type == corev1.ServiceTypeLoadBalancer {
				mk(FrontNodePort, sameFamilies(nodeIPs, clusterIPs), sp.NodePort, pick(externalLocal))
			}
			mk(FrontExternal, external, sp.Port, pick(externalLocal))
		}
	}
	return out
}

func selected(s *corev1.Service, p Params) bool {
	name, labeled := s.Labels[LabelServiceProxyName]
	switch p.Services {
	case ServicesLabeled:
		return labeled && name == p.ProxyName
	case ServicesAll:
		return !labeled || name == p.ProxyName
	}
	return false
}

func portName(sp corev1.ServicePort) string {
	if sp.Name != "" {
		return sp.Name
	}
	return strconv.Itoa(int(sp.Port))
}

// backends collects a Service port's endpoints from its EndpointSlices:
//
//   - ready -> up
//   - not ready -> drain (established connections finish; kube-proxy does not cut them either)
//   - but when no endpoint is ready, serving terminating ones are up: kube-proxy's fallback
//     that lets a rolling update finish without refusing new connections.
//
// An address listed by several slices (while the controller moves it) counts once, at its best
// state.
func backends(eps []*discoveryv1.EndpointSlice, sp corev1.ServicePort) []LBBackend {
	type cand struct {
		LBBackend
		ready, serving bool
	}
	byAddr := map[string]*cand{}
	for _, es := range eps {
		if es.AddressType != discoveryv1.AddressTypeIPv4 && es.AddressType != discoveryv1.AddressTypeIPv6 {
			continue
		}
		var port int32
		found := false
		for _, ep := range es.Ports {
			name := ""
			if ep.Name != nil {
				name = *ep.Name
			}
			proto := corev1.ProtocolTCP
			if ep.Protocol != nil {
				proto = *ep.Protocol
			}
			if name == sp.Name && proto == cmp.Or(sp.Protocol, corev1.ProtocolTCP) && ep.Port != nil {
				port, found = *ep.Port, true
				break
			}
		}
		if !found {
			continue
		}
		for _, e := range es.Endpoints {
			ready := e.Conditions.Ready == nil || *e.Conditions.Ready
			serving := ready
			if e.Conditions.Serving != nil {
				serving = *e.Conditions.Serving
			}
			node := ""
			if e.NodeName != nil {
				node = *e.NodeName
			}
			for _, a := range e.Addresses {
				ip, err := netip.ParseAddr(a)
				if err != nil {
					continue
				}
				k := netip.AddrPortFrom(ip, uint16(port)).String()
				c := byAddr[k]
				if c == nil {
					c = &cand{LBBackend: LBBackend{Address: ip.String(), Port: port, NodeName: node}}
					byAddr[k] = c
				}
				c.ready = c.ready || ready
				c.serving = c.serving || serving
			}
		}
	}
	anyReady := false
	for _, c := range byAddr {
		anyReady = anyReady || c.ready
	}
	out := make([]LBBackend, 0, len(byAddr))
	for _, c := range byAddr {
		b := c.LBBackend
		b.State = StateDrain
		if c.ready || (!anyReady && c.serving) {
			b.State = StateUp
		}
		out = append(out, b)
	}
	slices.SortFunc(out, func(a, b LBBackend) int {
		return cmp.Or(netip.MustParseAddr(a.Address).Compare(netip.MustParseAddr(b.Address)), cmp.Compare(a.Port, b.Port))
	})
	return out
}

func filterLocal(bes []LBBackend, node string) []LBBackend {
	var out []LBBackend
	for _, b := range bes {
		if b.NodeName == node {
			out = append(out, b)
		}
	}
	return out
}

func sameFamily(bes []LBBackend, is4 bool) []LBBackend {
	out := []LBBackend{}
	for _, b := range bes {
		if netip.MustParseAddr(b.Address).Is4() == is4 {
			out = append(out, b)
		}
	}
	return out
}

// sameFamilies keeps the addresses of the families that ref has (a NodePort serves the
// Service's IP families only); all of them when ref is empty.
func sameFamilies(addrs, ref []string) []string {
	if len(ref) == 0 {
		return addrs
	}
	var v4, v6 bool
	for _, r := range ref {
		if ip, err := netip.ParseAddr(r); err == nil {
			v4, v6 = v4 || ip.Is4(), v6 || ip.Is6()
		}
	}
	var out []string
	for _, a := range addrs {
		if ip, err := netip.ParseAddr(a); err == nil && (ip.Is4() && v4 || ip.Is6() && v6) {
			out = append(out, a)
		}
	}
	return out
}

// splitFamilies groups addresses by IP family, IPv4 first; each group is sorted.
func splitFamilies(ips []string) [][]string {
	var v4, v6 []string
	for _, s := range ips {
		ip, err := netip.ParseAddr(s)
		if err != nil {
			continue
		}
		if ip.Is4() {
			v4 = append(v4, ip.String())
		} else {
			v6 = append(v6, ip.String())
		}
	}
	var out [][]string
	for _, g := range [][]string{v4, v6} {
		if len(g) > 0 {
			slices.SortFunc(g, func(a, b string) int { return netip.MustParseAddr(a).Compare(netip.MustParseAddr(b)) })
			out = append(out, slices.Compact(g))
		}
	}
	return out
}
