// Package model holds the desired state of one node: a plain value that every source (YAML
// file, local API, Kubernetes) produces and every datapath consumes. No datapath reads YAML or
// talks to Kubernetes; they only see a State.
package model

import (
	"encoding/json"
	"net/netip"
	"slices"
	"strings"
	"time"
)

// Class is a traffic class that hostaccel can accelerate (seed 000's table, plus
// node-to-remote-pod).
type Class string

const (
	PodToPod               Class = "pod-to-pod"
	PodToService           Class = "pod-to-service"
	ExternalToNodePort     Class = "external-to-nodeport"
	ExternalToLoadBalancer Class = "external-to-loadbalancer"
	ExternalToService      Class = "external-to-service"
	NodeToRemotePod        Class = "node-to-remote-pod"
	// LocalPodToPod is traffic between two Pods of this node (both ends in the local Pod
	// CIDRs): the sockmap datapath carries its TCP socket to socket, the tc datapath moves
	// its packets from one Pod's gateway veth into the other Pod (bpf_redirect_peer).
	LocalPodToPod Class = "local-pod-to-pod"
)

// Classes lists every class in rule order: the most specific first, so that a connection is
// counted under the class that describes it best.
var Classes = []Class{PodToService, ExternalToNodePort, ExternalToLoadBalancer, LocalPodToPod, PodToPod, NodeToRemotePod, ExternalToService}

// TCClasses are the classes the stateless tc datapath can serve: no NAT involved. Their
// order is the program's class numbering (enum class in internal/tc/bpf/fastpath.c).
var TCClasses = []Class{PodToPod, NodeToRemotePod, LocalPodToPod}

// NATCheck says where the tc datapath asks conntrack whether this node's stack NATs a flow
// (such flows stay on the stack, which un-NATs them).
type NATCheck string

const (
	// NATCheckBoth looks up packets in both directions: replies toward local Pods of their
	// DNAT-ed connections (a ClusterIP in the host stack), and replies from local Pods to
	// peers whose connections this node DNAT-ed (NodePort without SNAT, hostPort). Default.
	NATCheckBoth NATCheck = "both"
	// NATCheckTowardPods looks up only packets for local Pods (the ClusterIP case).
	NATCheckTowardPods NATCheck = "toward-pods"
	// NATCheckOff never looks up: for nodes whose host stack NATs no Pod traffic (Services
	// translated before it, as in Antrea's OVS pipeline).
	NATCheckOff NATCheck = "off"
)

// NATChecks lists the NATCheck values.
var NATChecks = []NATCheck{NATCheckBoth, NATCheckTowardPods, NATCheckOff}

// Datapath names.
const (
	DatapathFlowtable = "flowtable"
	DatapathTC        = "tc"
	DatapathSockmap   = "sockmap"
	DatapathAuto      = "auto"
	DatapathNone      = "none" // no fastpath (e.g. a load balancer only)
)

// State is everything one node should do. Slices are sorted and free of duplicates
// (see Normalize), so two States that mean the same thing are equal.
type State struct {
	Datapath string
	// Gateways and Transports are the interfaces that exist now (vanished ones are pruned
	// before a State is built, since one missing device fails a whole nft transaction).
	Gateways   []string
	Transports []string
	// DeviceIndex holds the interface index of each device when known (the agent reads them
	// from the kernel; an offline render has none): the flowtable's device guards compare
	// indexes then, which costs a packet less than comparing names.
	DeviceIndex map[string]int

	LocalPodCIDRs   []netip.Prefix
	PeerPodCIDRs    []netip.Prefix
	ServiceCIDRs    []netip.Prefix
	NodeIPs         []netip.Addr
	PeerNodeIPs     []netip.Addr
	LoadBalancerIPs []netip.Prefix
	Exclude         []netip.Prefix

	Classes         []Class  // enabled classes, in the order of Classes
	PacketThreshold int      // offload only once a connection has carried more packets than this (0: at once)
	CountOffloaded  bool     // conntrack's counters keep running for offloaded flows (the flowtable's counter flag)
	TCNATCheck      NATCheck // where the tc datapath checks conntrack for NAT ("": NATCheckBoth)
	TCNoNATCarry    bool     // the tc datapath leaves NAT-ed flows to the flowtable (tc.natCarry: false)
	SockmapInAuto   bool     // auto may put local-pod-to-pod on the sockmap datapath (sockmap.auto)
}

// Devices returns the gateways and transports, sorted and without duplicates.
func (s State) Devices() []string {
	d := append(append([]string{}, s.Gateways...), s.Transports...)
	slices.Sort(d)
	return slices.Compact(d)
}

// SetDeviceIndexes records in DeviceIndex the interface index of each device that index
// knows (> 0); devices it does not know keep none.
func (s *State) SetDeviceIndexes(index func(name string) int) {
	for _, d := range s.Devices() {
		if i := index(d); i > 0 {
			if s.DeviceIndex == nil {
				s.DeviceIndex = map[string]int{}
			}
			s.DeviceIndex[d] = i
		}
	}
}

// Enabled reports whether class c is on.
func (s State) Enabled(c Class) bool { return slices.Contains(s.Classes, c) }

// Normalize sorts and de-duplicates every list so that equal states compare equal.
func (s *State) Normalize() {
	for _, l := range []*[]string{&s.Gateways, &s.Transports} {
		slices.Sort(*l)
		*l = slices.Compact(*l)
	}
	for _, l := range []*[]netip.Prefix{&s.LocalPodCIDRs, &s.PeerPodCIDRs, &s.ServiceCIDRs, &s.LoadBalancerIPs, &s.Exclude} {
		SortPrefixes(*l)
		*l = slices.Compact(*l)
	}
	for _, l := range []*[]netip.Addr{&s.NodeIPs, &s.PeerNodeIPs} {
		slices.SortFunc(*l, netip.Addr.Compare)
		*l = slices.Compact(*l)
	}
	var cs []Class
	for _, c := range Classes {
		if slices.Contains(s.Classes, c) {
			cs = append(cs, c)
		}
	}
	s.Classes = cs
}

// ComparePrefix orders prefixes by address, then by length.
func ComparePrefix(a, b netip.Prefix) int {
	if c := a.Addr().Compare(b.Addr()); c != 0 {
		return c
	}
	return a.Bits() - b.Bits()
}

// Unmap4in6 is p with an IPv4-mapped IPv6 address as IPv4 (its length less 96, at least 0),
// masked: how the BPF tries and the load balancer's rules hold an IPv4 range written as IPv6.
func Unmap4in6(p netip.Prefix) netip.Prefix {
	a, bits := p.Addr(), p.Bits()
	if a.Is4In6() {
		a, bits = a.Unmap(), max(bits-96, 0)
	}
	return netip.PrefixFrom(a, bits).Masked()
}

// Duration is a time.Duration written as "30s" in configs (one type for every section).
type Duration struct{ time.Duration }

// UnmarshalJSON reads "30s", "1m30s"; null leaves d as it is. Its errors reach
// UnmarshalStrict as type errors, so that they name the field.
func (d *Duration) UnmarshalJSON(b []byte) error {
	if string(b) == "null" {
		return nil
	}
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return durationError(`%s is not a duration; write one such as "30s" or "1m30s"`, Cut(string(b)))
	}
	v, err := time.ParseDuration(s)
	if err != nil {
		return durationError(`%s is not a duration such as "30s" or "1m30s" (at most 2562047h)`, Quote(s))
	}
	d.Duration = v
	return nil
}

func (d Duration) MarshalJSON() ([]byte, error) { return json.Marshal(d.String()) }

// ValidInterfaceName follows the kernel's dev_valid_name, and what nft carries in a quoted
// string: printable ASCII without '"' and '\' (Linux allows those in a name, but nft cannot
// name such a device: a quote ends its string, and backslashes do not come back as written).
func ValidInterfaceName(n string) bool {
	if n == "" || len(n) >= 16 || n == "." || n == ".." || strings.ContainsAny(n, "/: \"\\") {
		return false
	}
	for i := 0; i < len(n); i++ {
		if n[i] <= ' ' || n[i] >= 0x7f {
			return false
		}
	}
	return true
}
