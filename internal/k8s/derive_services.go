package k8s

import (
	"cmp"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"

	"github.com/hostaccel/hostaccel/internal/lb"
	"github.com/hostaccel/hostaccel/internal/model"
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

// DefaultProxyName is the service-proxy-name hostaccel answers to under ServicesLabeled.
const DefaultProxyName = "hostaccel"

// externalAddresses lists the addresses that Services make this node answer for from outside:
// LoadBalancer ingress IPs (unless ipMode Proxy: then the load balancer sends traffic to node
// or Pod addresses, never to the VIP) and spec.externalIPs, each of its Service's families.
func externalAddresses(svcs []*corev1.Service) []string {
	var out []string
	for _, s := range svcs {
		out = append(out, serviceExternalAddresses(s)...)
	}
	slices.SortFunc(out, func(a, b string) int { return netip.MustParseAddr(a).Compare(netip.MustParseAddr(b)) })
	return slices.Compact(out)
}

// serviceExternalAddresses are s's external and load balancer ingress IPs of s's families (a
// front of the other family would refuse every client of that address, with no backend:
// kube-proxy's proxier of a family skips a Service without a ClusterIP of it). A Service
// without a ClusterIP (headless, ExternalName) has none: kube-proxy skips it, and the API
// warns that spec.externalIPs is ignored for headless Services.
func serviceExternalAddresses(s *corev1.Service) []string {
	if len(clusterIPsOf(s)) == 0 {
		return nil
	}
	var out []string
	for _, ip := range s.Spec.ExternalIPs {
		if a, ok := apiIP(ip); ok {
			out = append(out, a.String())
		}
	}
	return sameFamilies(append(out, ingressAddresses(s)...), clusterIPsOf(s))
}

// ingressAddresses are s's load balancer ingress IPs (of every family; none unless s is of
// type LoadBalancer).
func ingressAddresses(s *corev1.Service) []string {
	if s.Spec.Type != corev1.ServiceTypeLoadBalancer {
		return nil
	}
	var out []string
	for _, ing := range s.Status.LoadBalancer.Ingress {
		if ing.IPMode != nil && *ing.IPMode == corev1.LoadBalancerIPModeProxy {
			continue
		}
		if a, ok := apiIP(ing.IP); ok {
			out = append(out, a.String())
		}
	}
	return out
}

// clusterIPsOf are s's ClusterIPs (none for a headless Service).
func clusterIPsOf(s *corev1.Service) []string {
	var out []string
	for _, ip := range s.Spec.ClusterIPs {
		if ip != corev1.ClusterIPNone && ip != "" {
			out = append(out, ip)
		}
	}
	if len(out) == 0 && s.Spec.ClusterIP != "" && s.Spec.ClusterIP != corev1.ClusterIPNone {
		out = []string{s.Spec.ClusterIP}
	}
	return out
}

// sourceRanges is s's loadBalancerSourceRanges of vip's family, as kube-proxy reads them
// (spaces trimmed; one that is not a CIDR is left out with a warning). A family without a
// range is not restricted: kube-proxy keeps a Service's ranges per family and installs a
// firewall for a family only where it has ranges.
func sourceRanges(s *corev1.Service, vip string, warn func(string, ...any)) []string {
	var out []string
	is4 := netip.MustParseAddr(vip).Is4()
	for _, r := range s.Spec.LoadBalancerSourceRanges {
		p, err := netip.ParsePrefix(strings.TrimSpace(r))
		if err != nil {
			warn("service %s/%s: loadBalancerSourceRanges: %q is not a CIDR; ignored", s.Namespace, s.Name, r)
			continue
		}
		if p.Addr().Unmap().Is4() == is4 {
			out = append(out, p.Masked().String())
		}
	}
	return out
}

// nsName is a Service's namespace and name.
type nsName struct{ namespace, name string }

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
	// SourceRanges: the Service's loadBalancerSourceRanges (external fronts of type
	// LoadBalancer): only those clients reach it.
	SourceRanges []string    `json:"sourceRanges,omitempty"`
	Backends     []LBBackend `json:"backends"`
	// Skipped says why the front is not given to the load balancer (another service has its
	// VIPs, the load balancer rejects it). A front without endpoints is given: it refuses its
	// clients, as kube-proxy rejects them.
	Skipped string `json:"skipped,omitempty"`
	// LeftOut says, per VIP the front does not serve (another Service has it), why; VIPs
	// lists those it serves.
	LeftOut []string `json:"leftOut,omitempty"`
	// Internal (node and external fronts of externalTrafficPolicy Local): the load balancer
	// service (LBName of the cluster front, or of the short-circuit front where
	// internalTrafficPolicy is Local too) that serves this node's Pods (InternalSources: its
	// Pod CIDRs of the family) and the node itself, with every endpoint, as kube-proxy
	// short-circuits them; other clients get this node's endpoints only.
	Internal        string   `json:"internal,omitempty"`
	InternalSources []string `json:"internalSources,omitempty"`
	// InternalOnly (the short-circuit front): the front serves only the internal clients of
	// the Service's other fronts; its VIPs and port (the ClusterIP's) stay the cluster front's.
	InternalOnly bool `json:"internalOnly,omitempty"`
	// MasqueradeExcept (cluster fronts): this node's Pod CIDRs of the family; other clients
	// (off the cluster, the node itself) are masqueraded, as kube-proxy does.
	MasqueradeExcept []string `json:"masqueradeExcept,omitempty"`
	// NoBackend is "drop" for a front of traffic policy Local while the Service has endpoints
	// of the family elsewhere (ready, or serving while terminating): without a local one its
	// clients' packets are dropped, as kube-proxy drops them ("has no local endpoints"); a
	// Service without any refuses them (reset).
	NoBackend string `json:"noBackend,omitempty"`
}

// LBBackend is one endpoint of a front.
type LBBackend struct {
	Address string `json:"address"`
	Port    int32  `json:"port"`
	// State is up (ready), drain (terminating but serving: established connections and
	// session-affinity clients keep it, no new ones) or down (not serving: established
	// connections finish, new ones and affinity clients go elsewhere, UDP flows are flushed).
	State    string `json:"state"`
	NodeName string `json:"nodeName,omitempty"`
	// serving: not ready, but serving (terminating); up where no backend of the front is
	// ready (fallback).
	serving bool
	// zones, nodes: its EndpointSlice hints (topology-aware routing)
	zones, nodes []string
}

// Backend states, as the load balancer names them.
const (
	StateUp    = lb.StateUp
	StateDrain = lb.StateDrain
	StateDown  = lb.StateDown
)

// schedulers the lb.hostaccel.io/scheduler annotation may name.
var schedulers = []string{lb.RoundRobin, lb.Weighted, lb.Hash, lb.SymHash}

// Front kinds.
const (
	FrontCluster  = "cluster"
	FrontNodePort = "nodeport"
	FrontExternal = "external"
	// FrontExternalIP: the externalIPs of a LoadBalancer Service with loadBalancerSourceRanges,
	// which restrict its ingress IPs only (as kube-proxy's firewall); without ranges they are
	// part of the external front.
	FrontExternalIP = "externalip"
	// FrontShortCircuit: every endpoint of a Service whose traffic policies are both Local,
	// for its node port and external fronts' internal clients (this node's Pods and the node
	// itself), as kube-proxy short-circuits them to its cluster endpoints; its cluster front
	// has this node's endpoints only. No client reaches it directly (internalOnly).
	FrontShortCircuit = "short-circuit"
)

// DefaultAffinityTimeout is Kubernetes' default sessionAffinityConfig.clientIP.timeoutSeconds.
const DefaultAffinityTimeout = 10800 * time.Second

// thisNode is what balance needs of this node: its name, addresses and Pod CIDRs.
type thisNode struct {
	name          string
	ips, podCIDRs []string
	zone          string // its topology.kubernetes.io/zone label
}

func (n thisNode) same(o thisNode) bool {
	return n.name == o.name && n.zone == o.zone && slices.Equal(n.ips, o.ips) && slices.Equal(n.podCIDRs, o.podCIDRs)
}

func (n thisNode) clone() thisNode {
	return thisNode{n.name, slices.Clone(n.ips), slices.Clone(n.podCIDRs), n.zone}
}

// balance turns the selected Services and their EndpointSlices into load balancer fronts.
// dr, when not nil, keeps each Service's fronts for the next derivation (deriver.frontsOf).
func balance(snap Snapshot, p Params, self thisNode, warn func(string, ...any), dr *deriver) []LBFront {
	if p.Services == ServicesNone {
		return nil
	}
	name := lbName
	svcs := snap.Services
	if dr != nil {
		name = dr.lbName
		defer dr.rotateFronts()
		dr.refs = dr.refs[:0]
		svcs = dr.sortedServices(svcs)
	} else {
		svcs = sortServices(svcs)
	}
	var slicesOf map[nsName][]*discoveryv1.EndpointSlice
	if dr != nil && dr.slicesOf != nil {
		slicesOf = dr.slicesOf // emptied: made anew it was ~0.5 MB per change at 5,000 Services
		clear(slicesOf)
	} else {
		slicesOf = make(map[nsName][]*discoveryv1.EndpointSlice, len(snap.EndpointSlices))
		if dr != nil {
			dr.slicesOf = slicesOf
		}
	}
	for _, es := range snap.EndpointSlices {
		if name := es.Labels[discoveryv1.LabelServiceName]; name != "" {
			k := nsName{es.Namespace, name}
			slicesOf[k] = append(slicesOf[k], es)
		}
	}
	var podCIDRs4, podCIDRs6 []string // this node's, by family
	for _, c := range self.podCIDRs {
		if pc, err := model.ParsePrefix(c); err == nil && pc.Addr().Is4() {
			podCIDRs4 = append(podCIDRs4, pc.String())
		} else if err == nil {
			podCIDRs6 = append(podCIDRs6, pc.String())
		}
	}
	out := make([]LBFront, 0, len(svcs))
	for _, s := range svcs {
		eps := slicesOf[nsName{s.Namespace, s.Name}]
		if len(eps) > 1 {
			// in name order: the lister's order changes from call to call (a map), and the
			// memo (frontsOf) compares the slices in order
			slices.SortFunc(eps, func(a, b *discoveryv1.EndpointSlice) int { return cmp.Compare(a.Name, b.Name) })
		}
		if dr != nil {
			if fs, ok := dr.frontsOf(s, eps, self, p, warn); ok {
				out = append(out, fs...)
				continue
			}
		}
		// A Service without a ClusterIP (headless) is not balanced: kube-proxy skips it, and
		// the API warns that its spec.externalIPs are ignored.
		if !selected(s, p) || s.Spec.Type == corev1.ServiceTypeExternalName || len(clusterIPsOf(s)) == 0 {
			continue
		}
		first, warn := len(out), warn
		var warned []string
		if dr != nil {
			parent := warn
			warn = func(format string, a ...any) {
				warned = append(warned, fmt.Sprintf(format, a...))
				parent("%s", warned[len(warned)-1])
			}
		}
		var persistence time.Duration
		if s.Spec.SessionAffinity == corev1.ServiceAffinityClientIP {
			persistence = DefaultAffinityTimeout
			if c := s.Spec.SessionAffinityConfig; c != nil && c.ClientIP != nil && c.ClientIP.TimeoutSeconds != nil {
				persistence = time.Duration(*c.ClientIP.TimeoutSeconds) * time.Second
			}
		}
		internalLocal := s.Spec.InternalTrafficPolicy != nil && *s.Spec.InternalTrafficPolicy == corev1.ServiceInternalTrafficPolicyLocal
		externalLocal := s.Spec.ExternalTrafficPolicy == corev1.ServiceExternalTrafficPolicyLocal
		clusterIPs := clusterIPsOf(s)
		// of the Service's families only, as its node ports
		external := serviceExternalAddresses(s)
		var externalIPs []string // apart: sourceRanges restrict the ingress IPs only
		if s.Spec.Type == corev1.ServiceTypeLoadBalancer && len(s.Spec.LoadBalancerSourceRanges) > 0 {
			ingress := sameFamilies(ingressAddresses(s), clusterIPs)
			for _, ip := range external {
				if !slices.Contains(ingress, ip) {
					externalIPs = append(externalIPs, ip)
				}
			}
			external = ingress
		}
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
			local := filterLocal(all, self.name)
			// whether the Service has a usable endpoint (ready, or serving while terminating)
			// of each family (by is4), looked at once per port: a front of traffic policy
			// Local without a local one then drops its clients' packets (NoBackend)
			usable := map[bool]bool{}
			for _, b := range all {
				if b.State == StateUp || b.serving {
					usable[netip.MustParseAddr(b.Address).Is4()] = true
				}
			}
			// bes: all endpoints (topology applies) or this node's (localOnly)
			mk := func(front string, vips []string, port int32, bes []LBBackend, localOnly bool) {
				if len(vips) == 0 || port == 0 {
					return
				}
				// externalTrafficPolicy Local: this node's Pods and the node itself reach
				// every endpoint, through the cluster front of the family (kube-proxy's
				// short-circuit)
				shortCircuit := front != FrontCluster && front != FrontShortCircuit && externalLocal
				internalFront := FrontCluster
				if internalLocal {
					internalFront = FrontShortCircuit
				}
				topology := lb.DNAT
				if front != FrontCluster && front != FrontShortCircuit && !externalLocal {
					topology = lb.SNAT
				}
				// frontName is a front's name: namespace/service:port/front[/ipv6]
				frontName := func(front string, is4 bool) string {
					n := s.Namespace + "/" + s.Name + ":" + portName(sp) + "/" + front
					if !is4 {
						n += "/ipv6"
					}
					return n
				}
				for _, fam := range splitFamilies(vips) {
					is4 := netip.MustParseAddr(fam[0]).Is4()
					f := LBFront{
						Name:      frontName(front, is4),
						Namespace: s.Namespace, Service: s.Name, Port: portName(sp), Front: front,
						VIPs: fam, VIPPort: port, Protocol: proto, Topology: topology,
						Scheduler: scheduler, Persistence: persistence, InternalOnly: front == FrontShortCircuit,
					}
					if fb := sameFamily(bes, is4); localOnly {
						f.Backends = fallback(fb)
						if usable[is4] {
							f.NoBackend = lb.NoBackendDrop
						}
					} else {
						f.Backends = fallback(byTopology(fb, self))
					}
					if front == FrontExternal && s.Spec.Type == corev1.ServiceTypeLoadBalancer {
						f.SourceRanges = sourceRanges(s, fam[0], warn)
					}
					f.LBName = name(f.Name)
					podCIDRs := podCIDRs4
					if !is4 {
						podCIDRs = podCIDRs6
					}
					if front == FrontCluster {
						// clients from off the cluster (a route to the Service CIDR that
						// leads here) and the node: masqueraded, as kube-proxy does with its
						// node-CIDR local detector (none without a Pod CIDR of the family)
						f.MasqueradeExcept = podCIDRs
					}
					if shortCircuit && slices.ContainsFunc(clusterIPs, func(ip string) bool { a, ok := apiIP(ip); return ok && a.Is4() == is4 }) {
						f.Internal, f.InternalSources = name(frontName(internalFront, is4)), podCIDRs
					}
					out = append(out, f)
				}
			}
			pick := func(localOnly bool) ([]LBBackend, bool) {
				if localOnly {
					return local, true
				}
				return all, false
			}
			bes, lo := pick(internalLocal)
			mk(FrontCluster, clusterIPs, sp.Port, bes, lo)
			nodePort := s.Spec.Type == corev1.ServiceTypeNodePort || s.Spec.Type == corev1.ServiceTypeLoadBalancer
			if internalLocal && externalLocal && (nodePort && sp.NodePort != 0 || len(externalIPs) > 0 || len(external) > 0) {
				// (before the node port: it is claimed first, as the cluster front is)
				mk(FrontShortCircuit, clusterIPs, sp.Port, all, false)
			}
			bes, lo = pick(externalLocal)
			if nodePort {
				mk(FrontNodePort, sameFamilies(self.ips, clusterIPs), sp.NodePort, bes, lo)
			}
			if len(externalIPs) > 0 {
				mk(FrontExternalIP, externalIPs, sp.Port, bes, lo)
			}
			mk(FrontExternal, external, sp.Port, bes, lo)
		}
		if dr != nil {
			dr.keepFronts(s, eps, self, p, out[first:], warned)
		}
	}
	if len(out) == 0 {
		return nil // (as before the capacity)
	}
	return out
}

// sortServices is svcs sorted by namespace and name (a copy).
func sortServices(svcs []*corev1.Service) []*corev1.Service {
	out := slices.Clone(svcs)
	slices.SortFunc(out, func(a, b *corev1.Service) int {
		return cmp.Or(cmp.Compare(a.Namespace, b.Namespace), cmp.Compare(a.Name, b.Name))
	})
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
//   - not ready, serving (terminating) -> drain: established connections finish (kube-proxy
//     does not cut them either), and so do session-affinity clients, for the termination's
//     grace period at most;
//   - not serving (failing readiness) -> down: as kube-proxy, which leaves such an endpoint
//     out, established TCP connections keep it (conntrack), while session-affinity clients go
//     elsewhere at once (a drained backend would keep them, renewed by every connection) and
//     UDP flows are flushed (kube-proxy clears the conntrack entries of endpoints that stop
//     serving; the load balancer flushes a UDP service's backends that go down);
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
			// the API's defaults: nil ready and serving are true, nil terminating false; a
			// not-ready endpoint counts as serving only while it terminates (kube-proxy's
			// fallback: serving and terminating), not a Pod still starting
			ready := e.Conditions.Ready == nil || *e.Conditions.Ready
			serving := (e.Conditions.Serving == nil || *e.Conditions.Serving) &&
				e.Conditions.Terminating != nil && *e.Conditions.Terminating
			node := ""
			if e.NodeName != nil {
				node = *e.NodeName
			}
			for _, a := range e.Addresses {
				ip, ok := apiIP(a)
				if !ok {
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
				if h := e.Hints; h != nil {
					for _, z := range h.ForZones {
						if !slices.Contains(c.zones, z.Name) {
							c.zones = append(c.zones, z.Name)
						}
					}
					for _, n := range h.ForNodes {
						if !slices.Contains(c.nodes, n.Name) {
							c.nodes = append(c.nodes, n.Name)
						}
					}
				}
			}
		}
	}
	out := make([]LBBackend, 0, len(byAddr))
	for _, c := range byAddr {
		b := c.LBBackend
		b.serving = c.serving && !c.ready
		switch {
		case c.ready:
			b.State = StateUp
		case c.serving:
			b.State = StateDrain
		default:
			b.State = StateDown
		}
		out = append(out, b)
	}
	slices.SortFunc(out, func(a, b LBBackend) int {
		return cmp.Or(netip.MustParseAddr(a.Address).Compare(netip.MustParseAddr(b.Address)), cmp.Compare(a.Port, b.Port))
	})
	return out
}

// byTopology is kube-proxy's topology-aware routing of a front's endpoints (bes: of one
// family, those a Cluster traffic policy uses), from the hints the EndpointSlice controller
// gives for trafficDistribution (PreferSameNode, PreferSameZone / PreferClose) and the
// topology-mode annotation. When every ready endpoint has node hints and one is for this
// node, the ready ones for this node; else when every ready endpoint has zone hints and one
// is for this node's zone, the ready ones for that zone; else all. Endpoints that are not
// ready stay (down or draining: no new connection, unless none is ready at all, where the
// fallback takes the serving ones, as kube-proxy's does, whatever their hints). bes is a
// copy (sameFamily's).
func byTopology(bes []LBBackend, self thisNode) []LBBackend {
	allNodes, allZones, forNode, forZone, ready := true, true, false, false, false
	for _, b := range bes {
		if b.State != StateUp {
			continue
		}
		ready = true
		allNodes = allNodes && len(b.nodes) > 0
		allZones = allZones && len(b.zones) > 0
		forNode = forNode || slices.Contains(b.nodes, self.name)
		forZone = forZone || self.zone != "" && slices.Contains(b.zones, self.zone)
	}
	var keep func(b LBBackend) bool
	switch {
	case !ready:
		return bes
	case allNodes && forNode:
		keep = func(b LBBackend) bool { return slices.Contains(b.nodes, self.name) }
	case allZones && forZone:
		keep = func(b LBBackend) bool { return slices.Contains(b.zones, self.zone) }
	default:
		return bes
	}
	return slices.DeleteFunc(bes, func(b LBBackend) bool { return b.State == StateUp && !keep(b) })
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

// fallback is kube-proxy's for a front's backends (bes, a copy: those of one family, and of
// this node where the traffic policy is Local): where none is ready, the serving ones
// (terminating) take new connections, so that a rolling update refuses none. It is decided
// per front, not per Service: a node whose only local endpoint terminates serves its local
// traffic with it while other nodes have ready ones.
func fallback(bes []LBBackend) []LBBackend {
	if slices.ContainsFunc(bes, func(b LBBackend) bool { return b.State == StateUp }) {
		return bes
	}
	for i := range bes {
		if bes[i].serving {
			bes[i].State = StateUp
		}
	}
	return bes
}

// sameFamilies keeps the addresses of the families that ref has (a NodePort serves the
// Service's IP families only); all of them when ref is empty.
func sameFamilies(addrs, ref []string) []string {
	if len(ref) == 0 {
		return addrs
	}
	var v4, v6 bool
	for _, r := range ref {
		if ip, ok := apiIP(r); ok {
			v4, v6 = v4 || ip.Is4(), v6 || ip.Is6()
		}
	}
	var out []string
	for _, a := range addrs {
		if ip, ok := apiIP(a); ok && (ip.Is4() && v4 || ip.Is6() && v6) {
			out = append(out, a)
		}
	}
	return out
}

// splitFamilies groups addresses by IP family, IPv4 first; each group is sorted.
func splitFamilies(ips []string) [][]string {
	var v4, v6 []string
	for _, s := range ips {
		ip, ok := apiIP(s)
		if !ok {
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
