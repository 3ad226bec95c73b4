package k8s

import (
	"crypto/sha256"
	"fmt"
	"net/netip"
	"reflect"
	"regexp"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/hostaccel/hostaccel/internal/config"
	"github.com/hostaccel/hostaccel/internal/config/configtest"
	"github.com/hostaccel/hostaccel/internal/golden"
)

// fuzzObjects reads API objects from fuzz bytes: each choice takes a byte, most values come
// from small palettes (so that names, addresses and ports collide the way they do in a
// cluster): a byte below 160 picks a value the API server would accept, below 200 an odd one
// (invalid, or valid but unusual), and above that a raw value follows. Past the end of the
// bytes every choice is 0.
type fuzzObjects struct{ b []byte }

// palette: values the API accepts, and odd ones.
type palette[T any] struct{ ok, odd []T }

func (f *fuzzObjects) byte() byte {
	if len(f.b) == 0 {
		return 0
	}
	c := f.b[0]
	f.b = f.b[1:]
	return c
}

func (f *fuzzObjects) n(max int) int { return int(f.byte()) % (max + 1) }
func (f *fuzzObjects) bool() bool    { return f.byte()&1 == 1 }

func pick[T any](f *fuzzObjects, p palette[T], raw func() T) T {
	switch i := int(f.byte()); {
	case i < 160 || len(p.odd) == 0 && i < 200:
		return p.ok[i%len(p.ok)]
	case i < 200:
		return p.odd[i%len(p.odd)]
	}
	return raw()
}

// str picks from p, or takes a raw string of up to 31 bytes.
func (f *fuzzObjects) str(p palette[string]) string {
	return pick(f, p, func() string {
		s := make([]byte, f.n(31))
		for i := range s {
			s[i] = f.byte()
		}
		return string(s)
	})
}

func (f *fuzzObjects) strs(max int, p palette[string]) []string {
	var out []string
	for range f.n(max) {
		out = append(out, f.str(p))
	}
	return out
}

func (f *fuzzObjects) int32(p palette[int32]) int32 {
	return pick(f, p, func() int32 {
		return int32(uint32(f.byte())<<24 | uint32(f.byte())<<16 | uint32(f.byte())<<8 | uint32(f.byte()))
	})
}

var (
	fuzzNodeNames = palette[string]{ok: []string{"self", "n1", "n2", "n3"}}
	fuzzNames     = palette[string]{[]string{"web", "db", "dns"}, []string{"a-very-long-service-name-that-goes-on-and-on-past-sixty-three", "UPPER.case", ""}}
	fuzzNamespace = palette[string]{[]string{"default", "kube-system"}, []string{""}}
	fuzzIPs       = palette[string]{[]string{"10.244.0.5", "10.244.1.5", "10.244.2.6", "10.96.0.10", "10.96.0.11", "172.18.0.2", "172.18.0.3",
		"192.0.2.10", "203.0.113.7", "fd00:10:244::5", "fd00:10:244:1::5", "fd00:10:96::a", "fc00::2", "2001:db8::7"},
		[]string{"::ffff:10.244.0.7", "fe80::1%eth0", "0.0.0.0", "127.0.0.1", "224.0.0.1", "::", "not-an-ip", "", "10.244.0.5 "}}
	fuzzCIDRs = palette[string]{[]string{"10.244.0.0/24", "10.244.1.0/24", "10.244.2.0/24", "fd00:10:244::/64", "fd00:10:244:1::/64"},
		[]string{"10.244.0.0/16", "10.244.1.7/24", "::ffff:10.244.3.0/120", "0.0.0.0/0", "fe80::/10", "bad", ""}}
	fuzzPorts     = palette[int32]{[]int32{80, 443, 53, 8080, 30080, 30053, 1, 65535}, []int32{0, 65536, -1}}
	fuzzProtocols = palette[string]{[]string{"TCP", "UDP", "SCTP", "TCP"}, []string{"", "ICMP", "tcp"}}
	fuzzPortNames = palette[string]{ok: []string{"http", "", "dns", "https"}}
	fuzzTypes     = palette[string]{[]string{"ClusterIP", "NodePort", "LoadBalancer"}, []string{"ExternalName", ""}}
	fuzzAddrTypes = []corev1.NodeAddressType{corev1.NodeInternalIP, corev1.NodeExternalIP, corev1.NodeHostName, corev1.NodeInternalDNS}
	fuzzTimeouts  = palette[int32]{[]int32{10800, 600, 1, 86400}, []int32{0, 86401, -5}}
	fuzzScheds    = palette[string]{[]string{"", "hash", "symhash", "weight", "rr"}, []string{"wrr"}}
	fuzzBases     = []string{baseYAML, "datapath: none\n", "datapath: auto\nnode: {gateways: [gw], transports: auto}\nclasses: {pod-to-pod: true, external-to-loadbalancer: true}\n"}
)

func ptr[T any](v T) *T { return &v }

// snapshot builds the objects one derivation reads, and its parameters.
func (f *fuzzObjects) snapshot() (Snapshot, Params, string) {
	var snap Snapshot
	for i := range f.n(4) + 1 {
		n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: f.str(fuzzNodeNames)}}
		if i == 0 && f.byte() < 240 {
			n.Name = "self" // mostly, this node is there
		}
		// Mostly, each node its own Pod CIDRs; odd: any (overlaps, invalid ones).
		cidrs := palette[string]{[]string{fmt.Sprintf("10.244.%d.0/24", i), fmt.Sprintf("fd00:10:244:%d::/64", i)}, append(fuzzCIDRs.ok, fuzzCIDRs.odd...)}
		n.Spec.PodCIDRs = f.strs(2, cidrs)
		if f.bool() {
			n.Spec.PodCIDR = f.str(cidrs)
		}
		for range f.n(3) {
			n.Status.Addresses = append(n.Status.Addresses, corev1.NodeAddress{Type: fuzzAddrTypes[f.n(3)], Address: f.str(fuzzIPs)})
		}
		snap.Nodes = append(snap.Nodes, n)
	}
	var svcNames []string
	for range f.n(4) {
		s := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: f.str(fuzzNamespace), Name: f.str(fuzzNames)}}
		svcNames = append(svcNames, s.Name)
		switch f.n(5) {
		case 0:
		case 1:
			s.Labels = map[string]string{LabelServiceProxyName: "other"}
		default:
			s.Labels = map[string]string{LabelServiceProxyName: DefaultProxyName}
		}
		if sched := f.str(fuzzScheds); sched != "" {
			s.Annotations = map[string]string{AnnotationScheduler: sched}
		}
		s.Spec.Type = corev1.ServiceType(f.str(fuzzTypes))
		s.Spec.ClusterIPs = f.strs(2, fuzzIPs)
		if len(s.Spec.ClusterIPs) > 0 && f.bool() {
			s.Spec.ClusterIP = s.Spec.ClusterIPs[0]
		} else if f.bool() {
			s.Spec.ClusterIP = f.str(palette[string]{fuzzIPs.ok, append([]string{corev1.ClusterIPNone}, fuzzIPs.odd...)})
		}
		s.Spec.ExternalIPs = f.strs(2, fuzzIPs)
		for range f.n(2) {
			ing := corev1.LoadBalancerIngress{IP: f.str(fuzzIPs)}
			switch f.n(2) {
			case 1:
				ing.IPMode = ptr(corev1.LoadBalancerIPModeProxy)
			case 2:
				ing.IPMode = ptr(corev1.LoadBalancerIPModeVIP)
			}
			s.Status.LoadBalancer.Ingress = append(s.Status.LoadBalancer.Ingress, ing)
		}
		for range f.n(3) {
			s.Spec.Ports = append(s.Spec.Ports, corev1.ServicePort{Name: f.str(fuzzPortNames), Protocol: corev1.Protocol(f.str(fuzzProtocols)),
				Port: f.int32(fuzzPorts), NodePort: f.int32(fuzzPorts)})
		}
		if f.bool() {
			s.Spec.SessionAffinity = corev1.ServiceAffinityClientIP
			if f.bool() {
				s.Spec.SessionAffinityConfig = &corev1.SessionAffinityConfig{ClientIP: &corev1.ClientIPConfig{TimeoutSeconds: ptr(f.int32(fuzzTimeouts))}}
			}
		}
		if f.bool() {
			s.Spec.InternalTrafficPolicy = ptr(corev1.ServiceInternalTrafficPolicyLocal)
		}
		if f.bool() {
			s.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
		}
		snap.Services = append(snap.Services, s)
		if f.n(3) > 0 {
			snap.EndpointSlices = append(snap.EndpointSlices, f.slice(len(snap.EndpointSlices), s, svcNames))
		}
	}
	for range f.n(2) { // slices of no Service, or of one with odd ports
		var of *corev1.Service
		if len(snap.Services) > 0 && f.bool() {
			of = snap.Services[f.n(len(snap.Services)-1)]
		}
		snap.EndpointSlices = append(snap.EndpointSlices, f.slice(len(snap.EndpointSlices), of, svcNames))
	}
	p := Params{NodeName: "self"}
	p.Peers = []PeerPolicy{"", PeersAll, PeersSameSubnet}[f.n(2)]
	for _, s := range f.strs(2, fuzzCIDRs) {
		if pfx, err := netip.ParsePrefix(s); err == nil {
			p.PeerSubnets = append(p.PeerSubnets, pfx.Masked())
		}
	}
	p.Services = []ServicePolicy{"", ServicesLabeled, ServicesAll, "", ServicesAll, ServicesNone}[f.n(5)]
	base := fuzzBases[f.n(len(fuzzBases)-1)]
	// Topology: zones of nodes and hints of endpoints, from the bytes left (none in the
	// seeds of before: they read as they did).
	zones := palette[string]{ok: []string{"zone-a", "zone-b"}, odd: []string{""}}
	for _, n := range snap.Nodes {
		if f.bool() {
			n.Labels = map[string]string{corev1.LabelTopologyZone: f.str(zones)}
		}
	}
	for _, es := range snap.EndpointSlices {
		for i := range es.Endpoints {
			if f.bool() {
				h := &discoveryv1.EndpointHints{}
				for range f.n(2) {
					h.ForZones = append(h.ForZones, discoveryv1.ForZone{Name: f.str(zones)})
				}
				for range f.n(2) {
					h.ForNodes = append(h.ForNodes, discoveryv1.ForNode{Name: f.str(fuzzNodeNames)})
				}
				es.Endpoints[i].Hints = h
			}
		}
	}
	return snap, p, base
}

// slice builds an EndpointSlice: mostly one of Service of (same namespace, its ports), else
// of a Service by name.
func (f *fuzzObjects) slice(i int, of *corev1.Service, svcNames []string) *discoveryv1.EndpointSlice {
	es := &discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Namespace: f.str(fuzzNamespace), Name: fmt.Sprint("es", i)}}
	if of != nil {
		es.Namespace = of.Namespace
		es.Labels = map[string]string{discoveryv1.LabelServiceName: of.Name}
	} else if name := f.str(palette[string]{append(svcNames, fuzzNames.ok...), fuzzNames.odd}); name != "" {
		es.Labels = map[string]string{discoveryv1.LabelServiceName: name}
	}
	es.AddressType = []discoveryv1.AddressType{discoveryv1.AddressTypeIPv4, discoveryv1.AddressTypeIPv6, discoveryv1.AddressTypeIPv4, discoveryv1.AddressTypeFQDN}[f.n(3)]
	if of != nil && f.n(7) > 0 {
		for _, sp := range of.Spec.Ports {
			es.Ports = append(es.Ports, discoveryv1.EndpointPort{Name: ptr(sp.Name), Protocol: ptr(sp.Protocol), Port: ptr(f.int32(fuzzPorts))})
		}
	}
	for range f.n(2) {
		p := discoveryv1.EndpointPort{Port: ptr(f.int32(fuzzPorts))}
		if f.bool() {
			p.Name = ptr(f.str(fuzzPortNames))
		}
		if f.bool() {
			p.Protocol = ptr(corev1.Protocol(f.str(fuzzProtocols)))
		}
		es.Ports = append(es.Ports, p)
	}
	for range f.n(3) + 1 {
		e := discoveryv1.Endpoint{Addresses: []string{f.str(fuzzIPs)}}
		if f.n(3) == 0 {
			e.Addresses = append(e.Addresses, f.str(fuzzIPs))
		}
		for _, c := range []**bool{&e.Conditions.Ready, &e.Conditions.Serving, &e.Conditions.Terminating} {
			switch f.n(2) {
			case 1:
				*c = ptr(true)
			case 2:
				*c = ptr(false)
			}
		}
		if f.bool() {
			e.NodeName = ptr(f.str(fuzzNodeNames))
		}
		es.Endpoints = append(es.Endpoints, e)
	}
	return es
}

// configField: a config validation error that names its field (as config's FuzzParse checks).
var configField = regexp.MustCompile(`^(datapath|node|classes|packetThreshold|exclude|tc|agent|loadBalancer)[.:\[ ]`)

// FuzzDerive builds Nodes, Services and EndpointSlices from the fuzz bytes and derives this
// node's config from them. Derive never panics; it fails only for this node (missing) or
// with config errors that name their field; what it derives is a valid config that renders
// (flowtable, tc, lb with the knftables Fake) and whose YAML parses back to it.
func FuzzDerive(f *testing.F) {
	f.Fuzz(func(t *testing.T, b []byte) {
		snap, p, baseYAML := (&fuzzObjects{b}).snapshot()
		base, err := ParseBase([]byte(baseYAML))
		if err != nil {
			t.Fatal(err)
		}
		d, err := Derive(base, snap, p)
		// The way it always was (Derive keeps nothing from one derivation to the next, but
		// writes and reads its services one by one) gives the same.
		if want, wantErr := (&deriver{slow: true}).derive(base, snap, p); fmt.Sprint(err) != fmt.Sprint(wantErr) ||
			err == nil && (string(d.JSON) != string(want.JSON) || !reflect.DeepEqual(d.Config, want.Config)) {
			t.Fatalf("derive: %v, the old way %v\n%s", err, wantErr, describe(snap, p))
		}
		if err != nil {
			msg := err.Error()
			if msg == `node "self" not found in the API (is --node-name right?)` {
				return
			}
			rest, ok := strings.CutPrefix(msg, "the derived config is invalid: ")
			for _, line := range strings.Split(rest, "\n") {
				if !ok || !configField.MatchString(line) {
					t.Fatalf("derive: %q names no field\n%s", line, describe(snap, p))
				}
			}
			// Services and EndpointSlices (anyone with a namespace can create them) never
			// break the derivation, which would freeze this node's config: without them it
			// fails too.
			if _, err := Derive(base, Snapshot{Nodes: snap.Nodes}, p); err == nil {
				t.Fatalf("Services or EndpointSlices break the derivation: %v\n%s", msg, describe(snap, p))
			}
			return
		}
		c, err := config.Parse(d.JSON)
		if err != nil || !reflect.DeepEqual(c, d.Config) {
			t.Fatalf("derived YAML does not parse back: %v\n%s\n%s", err, d.JSON, describe(snap, p))
		}
		if _, err := configtest.Render(d.Config); err != nil {
			t.Fatalf("derived config does not render: %v\n%s\n%s", err, d.JSON, describe(snap, p))
		}
	})
}

func describe(snap Snapshot, p Params) string {
	var b strings.Builder
	fmt.Fprintf(&b, "params: %+v\n", p)
	for _, n := range snap.Nodes {
		fmt.Fprintf(&b, "node %q: podCIDRs %q podCIDR %q addresses %+v\n", n.Name, n.Spec.PodCIDRs, n.Spec.PodCIDR, n.Status.Addresses)
	}
	for _, s := range snap.Services {
		fmt.Fprintf(&b, "service %s/%s labels %v annotations %v spec %+v status %+v\n", s.Namespace, s.Name, s.Labels, s.Annotations, s.Spec, s.Status)
	}
	for _, es := range snap.EndpointSlices {
		fmt.Fprintf(&b, "slice %s/%s labels %v %s ports %d endpoints %d\n", es.Namespace, es.Name, es.Labels, es.AddressType, len(es.Ports), len(es.Endpoints))
	}
	return b.String()
}

// seedBytes is FuzzDerive's seed i: bytes from a hash, mostly choices of values the API
// accepts (bytes < 160).
func seedBytes(i int) []byte {
	var b []byte
	for j := 0; len(b) < 40+i%5*40; j++ {
		sum := sha256.Sum256(fmt.Appendf(nil, "seed %d %d", i, j))
		b = append(b, sum[:]...)
	}
	for k := range b {
		if k%7 != 0 {
			b[k] %= 160
		}
	}
	return b
}

// TestFuzzSeeds keeps FuzzDerive's seed corpus current (go test -update rewrites it): byte
// strings from a hash, mostly choices of values the API accepts (bytes < 160).
func TestFuzzSeeds(t *testing.T) {
	seeds := map[string][]any{}
	derived, balanced := 0, 0
	for i := range 40 {
		b := seedBytes(i)
		seeds[fmt.Sprint("snapshot-", i)] = []any{b}
		snap, p, base := (&fuzzObjects{b}).snapshot()
		bc, _ := ParseBase([]byte(base))
		if d, err := Derive(bc, snap, p); err == nil {
			derived++
			if len(d.Config.LoadBalancer.Services) > 0 {
				balanced++
			}
		}
	}
	t.Logf("%d of %d seeds derive a config, %d with load balancer services", derived, len(seeds), balanced)
	if derived < 10 || balanced < 2 {
		t.Errorf("the seeds derive too few configs (%d) or load balancer services (%d)", derived, balanced)
	}
	golden.FuzzSeeds(t, "testdata/fuzz/FuzzDerive", seeds)
}
