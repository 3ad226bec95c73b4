package k8s

import (
	"encoding/json"
	"fmt"
	"maps"
	"net/netip"
	"reflect"
	"slices"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"sigs.k8s.io/yaml"

	"github.com/hostaccel/hostaccel/internal/config"
	"github.com/hostaccel/hostaccel/internal/model"
)

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
	// JSON is Config in the file format, as JSON (a YAML document too: `hostaccel render -f`
	// and `apply -f` accept it). Not YAML: writing and parsing 5,000 services as YAML cost
	// each derivation ~1 s of CPU (YAML gives the text for people).
	JSON []byte
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

// ParseBase reads the agent config that the API's facts are added to (the ConfigMap). It is
// decoded strictly but not validated: node-specific fields that a valid file needs (local Pod
// CIDRs) come from the API, and the merged result is validated as a whole.
func ParseBase(b []byte) (*config.Config, error) {
	c := config.Defaults() // a period the ConfigMap writes as "0s" is its own
	if err := model.UnmarshalStrict(b, &c); err != nil {
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
	return new(deriver).derive(base, snap, p)
}

// derive is Derive; dr keeps what its last derivations found (see deriver).
func (dr *deriver) derive(base *config.Config, snap Snapshot, p Params) (*Derived, error) {
	if p.Peers == "" {
		p.Peers = PeersAll
	}
	if p.Services == "" {
		p.Services = ServicesLabeled
	}
	if p.ProxyName == "" {
		p.ProxyName = DefaultProxyName
	}
	dr.gen++
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

	var bn config.Node // the base's static entries
	if base != nil {
		bn = base.Node
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
			// A Pod CIDR that overlaps this node's, the Service CIDRs or an earlier Node's (a
			// stale Node, a hand-set podCIDR) leaves this Node out, with a warning: the config
			// would be invalid, and one Node must not freeze the node's config. One within the
			// base's peer CIDRs is there already.
			var add []string
			for _, c := range accelerable(peer.PodCIDRs, peer.NodeIPs, p) {
				pc := netip.MustParsePrefix(c)
				if within(pc, bn.PeerPodCIDRs) {
					continue
				}
				if o, ok := overlapping(pc, bn.LocalPodCIDRs, sum.LocalPodCIDRs, bn.ServiceCIDRs, bn.PeerPodCIDRs, peerCIDRs); ok {
					peer.Accelerated, peer.Reason = false, fmt.Sprintf("pod CIDR %s overlaps %s (this node's, a Service CIDR, or another Node's)", c, o)
					warn("node %s left out: %s", n.Name, peer.Reason)
					break
				}
				add = append(add, c)
			}
			if peer.Accelerated {
				peerCIDRs = append(peerCIDRs, add...)
				peerIPs = append(peerIPs, peer.NodeIPs...)
			}
		}
		sum.Peers = append(sum.Peers, peer)
	}

	sum.Services = len(snap.Services)
	lbIPs := externalAddresses(snap.Services)
	sum.ExternalIPs = lbIPs
	fronts := balance(snap, p, thisNode{self.Name, sum.NodeIPs, sum.LocalPodCIDRs, self.Labels[corev1.LabelTopologyZone]}, warn, dr)

	c, err := clone(base)
	if err != nil {
		return nil, err
	}
	svcs, memos := dr.lbServices(c.LoadBalancer.Services, fronts, warn)
	sum.Balanced = fronts
	c.Node.LocalPodCIDRs = union(c.Node.LocalPodCIDRs, sum.LocalPodCIDRs)
	c.Node.PeerPodCIDRs = union(c.Node.PeerPodCIDRs, peerCIDRs)
	c.Node.NodeIPs = union(c.Node.NodeIPs, sum.NodeIPs)
	c.Node.PeerNodeIPs = union(c.Node.PeerNodeIPs, peerIPs)
	c.Node.LoadBalancerIPs = union(c.Node.LoadBalancerIPs, notWithin(hostPrefixes(lbIPs), c.Node.LoadBalancerIPs))
	if len(c.LoadBalancer.Services) == 0 {
		c.LoadBalancer.Services = svcs // (lbServices' own slice: no copy of 5,000 services per change)
	} else {
		c.LoadBalancer.Services = append(c.LoadBalancer.Services, svcs...)
	}

	defer dr.endDerivation(len(c.LoadBalancer.Services))
	if !dr.slow {
		if parsed, j, ok := dr.finish(c, memos); ok {
			return &Derived{Config: parsed, JSON: j, Summary: sum}, nil
		}
	}
	// Not valid (or not written and read back the cheap way): what it always was, for its
	// errors.
	j, err := marshalConfig(c)
	if err != nil {
		return nil, err
	}
	parsed, err := config.ParseJSON(j)
	if err != nil {
		return nil, fmt.Errorf("the derived config is invalid: %w", err)
	}
	return &Derived{Config: parsed, JSON: j, Summary: sum}, nil
}

func hostPrefixes(ips []string) []string {
	out := make([]string, 0, len(ips))
	for _, s := range ips {
		ip := netip.MustParseAddr(s)
		out = append(out, netip.PrefixFrom(ip, ip.BitLen()).String())
	}
	return out
}

// within reports whether p lies inside one of list's prefixes (or addresses).
func within(p netip.Prefix, list []string) bool {
	return slices.ContainsFunc(list, func(s string) bool {
		q, err := model.ParsePrefix(s)
		return err == nil && q.Bits() <= p.Bits() && q.Contains(p.Addr())
	})
}

// overlapping returns the first entry of lists that overlaps p.
func overlapping(p netip.Prefix, lists ...[]string) (string, bool) {
	for _, l := range lists {
		for _, s := range l {
			if q, err := model.ParsePrefix(s); err == nil && q.Overlaps(p) {
				return s, true
			}
		}
	}
	return "", false
}

// notWithin is the entries of add (prefixes) that no entry of base holds: an address of the
// base's static loadBalancerIPs (or in one of its prefixes, such as a MetalLB pool) is there
// already, and listed again it would overlap.
func notWithin(add, base []string) []string {
	out := add[:0:0]
	for _, s := range add {
		if p, err := model.ParsePrefix(s); err != nil || !within(p, base) {
			out = append(out, s)
		}
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
		d := config.Defaults()
		return &d, nil
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
	return dropNulls(b), nil
}

// YAML is the derived config as a YAML file.
func (d *Derived) YAML() ([]byte, error) { return yaml.JSONToYAML(d.JSON) }

// pruneConfig is prune of a whole config, but for the agent's periods: "0s" there is what the
// ConfigMap says (no minimum sync interval; a resync period config.Parse refuses), not an
// empty value (the base starts from config.Defaults). Pruned, it was the default again.
func pruneConfig(v any) any {
	var agent map[string]any
	if top, ok := v.(map[string]any); ok {
		if a, ok := top["agent"].(map[string]any); ok {
			agent = maps.Clone(a)
		}
	}
	v, _ = prune(v)
	if top, ok := v.(map[string]any); ok && len(agent) > 0 {
		top["agent"] = agent
	}
	return v
}

// dropNulls removes null and empty values from a JSON object, recursively.
func dropNulls(b []byte) []byte {
	var v any
	if json.Unmarshal(b, &v) != nil {
		return b
	}
	v = pruneConfig(v)
	out, err := json.Marshal(v)
	if err != nil {
		return b
	}
	return out
}

// setFields are the JSON names of the config's pointer fields (loadBalancer.api; a service's
// persistence, flowTimeout, healthCheck, internal): encoding/json leaves out a nil one, so one
// that is there was set (by the ConfigMap: the derivation sets none empty), and its empty value
// is what the config says, not an empty value to drop: `api: {}` turns the local API on;
// `persistence: 0s` and `healthCheck: {}` are refused, as in a config file. (Dropped, the API
// was off and the others were accepted as unset.) No other field of the config has one of
// these names (TestSetFieldNamesAreOnlyPointers).
var setFields = pointerFields(reflect.TypeFor[config.Config]())

// pointerFields are the JSON names of the pointer fields of t and of the structs within it.
func pointerFields(t reflect.Type) map[string]bool {
	out := map[string]bool{}
	walkFields(t, map[reflect.Type]bool{}, func(name string, ptr bool) {
		if ptr {
			out[name] = true
		}
	})
	return out
}

// walkFields calls f with the JSON name of every field of the structs in t (through pointers,
// slices and maps), and whether it is a pointer.
func walkFields(t reflect.Type, seen map[reflect.Type]bool, f func(name string, ptr bool)) {
	for t.Kind() == reflect.Pointer || t.Kind() == reflect.Slice || t.Kind() == reflect.Array || t.Kind() == reflect.Map {
		t = t.Elem()
	}
	if t.Kind() != reflect.Struct || seen[t] {
		return
	}
	seen[t] = true
	for i := range t.NumField() {
		sf := t.Field(i)
		name, ok := model.JSONName(sf)
		if !ok {
			continue
		}
		f(name, sf.Type.Kind() == reflect.Pointer)
		walkFields(sf.Type, seen, f)
	}
}

// prune drops null and empty values ("", "0s", {}, []) from v, recursively, but for the keys
// of setFields that are not null.
func prune(v any) (any, bool) {
	switch t := v.(type) {
	case nil:
		return nil, false
	case map[string]any:
		for k, e := range t {
			if pe, ok := prune(e); ok || e != nil && setFields[k] {
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
