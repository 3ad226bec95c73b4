package k8s

import (
	"fmt"
	"net/netip"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"

	"github.com/hostaccel/hostaccel/internal/config"
	"github.com/hostaccel/hostaccel/internal/lb"
)

const baseYAML = `
datapath: flowtable
node:
  gateways: [antrea-gw0]
  transports: [eth0]
  serviceCIDRs: [10.96.0.0/16]
classes: {pod-to-pod: true, pod-to-service: true, external-to-loadbalancer: true}
`

func mustBase(t *testing.T, y string) *config.Config {
	t.Helper()
	c, err := ParseBase([]byte(y))
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestDerivePeersFollowNodes(t *testing.T) {
	snap := Snapshot{Nodes: []*corev1.Node{
		node("n2", []string{"10.244.2.0/24", "fd00:10:244:2::/64"}, "172.18.0.4", "fc00::4"),
		node("n0", []string{"10.244.0.0/24", "fd00:10:244::/64"}, "172.18.0.2"),
		node("n1", []string{"10.244.1.0/24"}, "172.18.0.3"),
		node("n3", nil, "172.18.0.5"), // no podCIDRs yet
	}}
	d, err := Derive(mustBase(t, baseYAML), snap, Params{NodeName: "n2"})
	if err != nil {
		t.Fatal(err)
	}
	n := d.Config.Node
	want := func(field string, got, want []string) {
		t.Helper()
		if !slices.Equal(got, want) {
			t.Errorf("%s = %v, want %v", field, got, want)
		}
	}
	want("localPodCIDRs", n.LocalPodCIDRs, []string{"10.244.2.0/24", "fd00:10:244:2::/64"})
	want("peerPodCIDRs", n.PeerPodCIDRs, []string{"10.244.0.0/24", "fd00:10:244::/64", "10.244.1.0/24"})
	want("nodeIPs", n.NodeIPs, []string{"172.18.0.4", "fc00::4"})
	want("peerNodeIPs", n.PeerNodeIPs, []string{"172.18.0.2", "172.18.0.3"})
	want("serviceCIDRs (base)", n.ServiceCIDRs, []string{"10.96.0.0/16"})
	if got := d.Summary.Peers[2]; got.Name != "n3" || got.Accelerated {
		t.Errorf("peer n3 without podCIDRs: %+v", got)
	}
	// The YAML is a valid config file that parses to the same config.
	c, err := config.Parse(d.JSON)
	if err != nil {
		t.Fatalf("derived YAML does not parse: %v\n%s", err, d.JSON)
	}
	if !reflect.DeepEqual(c, d.Config) {
		t.Errorf("YAML round trip differs:\n%s", d.JSON)
	}
}

func TestDeriveSameSubnet(t *testing.T) {
	// Antrea hybrid: n1 shares 172.18.0.0/24 with this node and is routed; n2 is elsewhere and
	// tunnelled, so its Pod CIDR is not accelerated. n3's IPv6 CIDR has no IPv6 node IP in the
	// subnet, so only its IPv4 CIDR is accelerated.
	snap := Snapshot{Nodes: []*corev1.Node{
		node("self", []string{"10.244.0.0/24"}, "172.18.0.2"),
		node("n1", []string{"10.244.1.0/24"}, "172.18.0.3"),
		node("n2", []string{"10.244.2.0/24"}, "192.168.7.9"),
		node("n3", []string{"10.244.3.0/24", "fd00:10:244:3::/64"}, "172.18.0.5", "fc00:99::5"),
	}}
	p := Params{NodeName: "self", Peers: PeersSameSubnet, PeerSubnets: []netip.Prefix{netip.MustParsePrefix("172.18.0.0/24"), netip.MustParsePrefix("fc00::/64")}}
	d, err := Derive(mustBase(t, baseYAML), snap, p)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := d.Config.Node.PeerPodCIDRs, []string{"10.244.1.0/24", "10.244.3.0/24"}; !slices.Equal(got, want) {
		t.Errorf("peerPodCIDRs = %v, want %v", got, want)
	}
	if got, want := d.Config.Node.PeerNodeIPs, []string{"172.18.0.3", "172.18.0.5", "fc00:99::5"}; !slices.Equal(got, want) {
		t.Errorf("peerNodeIPs = %v, want %v", got, want)
	}
	n2 := d.Summary.Peers[1]
	if n2.Name != "n2" || n2.Accelerated || !strings.Contains(n2.Reason, "encapsulated") {
		t.Errorf("n2 = %+v", n2)
	}
	// Without known subnets, no peer is accelerated (and the reason says so).
	p.PeerSubnets = nil
	d, err = Derive(mustBase(t, baseYAML), snap, p)
	if err != nil {
		t.Fatal(err)
	}
	if len(d.Config.Node.PeerPodCIDRs) != 0 || !strings.Contains(d.Summary.Peers[0].Reason, "unknown") {
		t.Errorf("peers without subnets: %v %+v", d.Config.Node.PeerPodCIDRs, d.Summary.Peers)
	}
}

func TestDeriveMissingNodeAndInvalid(t *testing.T) {
	snap := Snapshot{Nodes: []*corev1.Node{node("other", []string{"10.244.1.0/24"}, "172.18.0.3")}}
	if _, err := Derive(mustBase(t, baseYAML), snap, Params{NodeName: "self"}); err == nil || !strings.Contains(err.Error(), `node "self" not found`) {
		t.Errorf("missing node: err = %v", err)
	}
	// This node has no Pod CIDR: the config needs one, and the error says which field.
	snap.Nodes = append(snap.Nodes, node("self", nil, "172.18.0.2"))
	_, err := Derive(mustBase(t, baseYAML), snap, Params{NodeName: "self"})
	if err == nil || !strings.Contains(err.Error(), "node.localPodCIDRs") {
		t.Errorf("no local pod CIDR: err = %v", err)
	}
	if _, err := ParseBase([]byte("datapath: flowtable\nbogus: 1\n")); err == nil {
		t.Error("unknown key in the base config accepted")
	}
}

func TestDeriveLoadBalancerIPs(t *testing.T) {
	proxy := corev1.LoadBalancerIPModeProxy
	lbSvc := service("default", "web", corev1.ServiceTypeLoadBalancer, "10.96.0.10", port("http", 80, 8080, 30080))
	lbSvc.Labels = nil // not balanced by hostaccel; its IPs still feed the class
	lbSvc.Spec.ExternalIPs = []string{"203.0.113.7"}
	lbSvc.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: "172.18.0.151"}, {Hostname: "lb.example"}}
	proxied := service("default", "proxied", corev1.ServiceTypeLoadBalancer, "10.96.0.11", port("http", 80, 8080, 30081))
	proxied.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: "172.18.0.152", IPMode: &proxy}}
	snap := Snapshot{
		Nodes:    []*corev1.Node{node("self", []string{"10.244.0.0/24"}, "172.18.0.2")},
		Services: []*corev1.Service{lbSvc, proxied},
	}
	d, err := Derive(mustBase(t, baseYAML), snap, Params{NodeName: "self", Services: ServicesNone})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := d.Config.Node.LoadBalancerIPs, []string{"172.18.0.151/32", "203.0.113.7/32"}; !slices.Equal(got, want) {
		t.Errorf("loadBalancerIPs = %v, want %v", got, want)
	}
	if len(d.Summary.Balanced) != 0 {
		t.Errorf("services: none balanced %v", d.Summary.Balanced)
	}
}

func TestDeriveBalancedServices(t *testing.T) {
	web := service("default", "web", corev1.ServiceTypeLoadBalancer, "10.96.0.10", port("http", 80, 8080, 30080))
	web.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: "172.18.0.151"}}
	web.Annotations = map[string]string{AnnotationScheduler: lb.Hash}
	sticky := service("default", "sticky", corev1.ServiceTypeClusterIP, "10.96.0.20", port("", 443, 8443, 0))
	sticky.Spec.SessionAffinity = corev1.ServiceAffinityClientIP
	timeout := int32(600)
	sticky.Spec.SessionAffinityConfig = &corev1.SessionAffinityConfig{ClientIP: &corev1.ClientIPConfig{TimeoutSeconds: &timeout}}
	unlabeled := service("default", "kube-proxied", corev1.ServiceTypeClusterIP, "10.96.0.30", port("http", 80, 80, 0))
	unlabeled.Labels = nil
	snap := Snapshot{
		Nodes:    []*corev1.Node{node("self", []string{"10.244.0.0/24"}, "172.18.0.2"), node("n1", []string{"10.244.1.0/24"}, "172.18.0.3")},
		Services: []*corev1.Service{web, sticky, unlabeled},
		EndpointSlices: append([]*discoveryv1.EndpointSlice{},
			slice("default", "web", "web-a", "http", 8080, up("10.244.0.5", "self"), notReady("10.244.1.5", "n1")),
			slice("default", "web", "web-b", "http", 8080, up("10.244.1.6", "n1"), up("10.244.0.5", "self")), // duplicate across slices
			slice("default", "sticky", "sticky-a", "", 8443, up("10.244.1.7", "n1")),
			slice("default", "kube-proxied", "kp-a", "http", 80, up("10.244.1.8", "n1")),
		),
	}
	d, err := Derive(mustBase(t, baseYAML), snap, Params{NodeName: "self"})
	if err != nil {
		t.Fatal(err)
	}
	// What the load balancer gets: one service per front, readiness as the admin state.
	webBackends := []lb.Backend{
		{Address: "10.244.0.5", Port: 8080, State: lb.StateUp},
		{Address: "10.244.1.5", Port: 8080, State: lb.StateDown},
		{Address: "10.244.1.6", Port: 8080, State: lb.StateUp},
	}
	want := []lb.Service{
		// (cluster fronts masquerade clients other than this node's Pods: off the cluster, the node)
		{Name: lbName("default/sticky:443/cluster"), VIPs: []string{"10.96.0.20"}, Port: 443, Protocol: "tcp", Topology: lb.DNAT, Hairpin: true,
			MasqueradeExcept: []string{"10.244.0.0/24"},
			Persistence:      lb.D(600 * time.Second), Backends: []lb.Backend{{Address: "10.244.1.7", Port: 8443, State: lb.StateUp}}},
		{Name: lbName("default/web:http/cluster"), VIPs: []string{"10.96.0.10"}, Port: 80, Protocol: "tcp", Topology: lb.DNAT, Hairpin: true,
			MasqueradeExcept: []string{"10.244.0.0/24"}, Scheduler: lb.Hash, Backends: webBackends},
		{Name: lbName("default/web:http/nodeport"), VIPs: []string{"172.18.0.2"}, Port: 30080, Protocol: "tcp", Topology: lb.SNAT,
			Scheduler: lb.Hash, Backends: webBackends},
		{Name: lbName("default/web:http/external"), VIPs: []string{"172.18.0.151"}, Port: 80, Protocol: "tcp", Topology: lb.SNAT,
			Scheduler: lb.Hash, Backends: webBackends},
	}
	if got := d.Config.LoadBalancer.Services; !reflect.DeepEqual(got, want) {
		t.Errorf("loadBalancer.services:\n got %+v\nwant %+v", got, want)
	}
	for _, f := range d.Summary.Balanced {
		if len(f.LBName) > 32 || !strings.HasPrefix(f.LBName, "default-") {
			t.Errorf("lb name %q", f.LBName)
		}
	}

	// externalTrafficPolicy Local: NodePort and external fronts use this node's endpoints only,
	// without source NAT. An unknown scheduler is a warning, not a broken config.
	web.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
	web.Annotations[AnnotationScheduler] = "wrr"
	d, err = Derive(mustBase(t, baseYAML), snap, Params{NodeName: "self"})
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range d.Summary.Balanced {
		if f.Service == "web" && f.Front != FrontCluster && (len(f.Backends) != 1 || f.Backends[0].Address != "10.244.0.5" || f.Topology != lb.DNAT) {
			t.Errorf("%s with externalTrafficPolicy Local: %s %+v", f.Name, f.Topology, f.Backends)
		}
		if f.Scheduler != "" {
			t.Errorf("%s: unknown scheduler kept: %q", f.Name, f.Scheduler)
		}
	}
	if len(d.Summary.Warnings) != 1 || !strings.Contains(d.Summary.Warnings[0], `"wrr"`) {
		t.Errorf("warnings = %q", d.Summary.Warnings)
	}

	// services: all adds what kube-proxy would serve.
	d, err = Derive(mustBase(t, baseYAML), snap, Params{NodeName: "self", Services: ServicesAll})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.ContainsFunc(d.Summary.Balanced, func(f LBFront) bool { return f.Service == "kube-proxied" }) {
		t.Error("services: all left out an unlabeled Service")
	}

	// A Service without endpoints is given to the load balancer without backends: it refuses
	// its clients, as kube-proxy rejects them (before, it was left out, and a connection to its
	// ClusterIP went to the default route and hung).
	snap.EndpointSlices = snap.EndpointSlices[:2]
	d, err = Derive(mustBase(t, baseYAML), snap, Params{NodeName: "self"})
	if err != nil {
		t.Fatal(err)
	}
	if n := len(d.Config.LoadBalancer.Services); n != 4 {
		t.Errorf("%d load balancer services, want 4 (sticky's without backends)", n)
	}
	if f := d.Summary.Balanced[0]; f.Service != "sticky" || f.Skipped != "" || len(f.Backends) != 0 {
		t.Errorf("sticky: %+v", f)
	}
	if s := d.Config.LoadBalancer.Services[0]; !slices.Equal(s.VIPs, []string{"10.96.0.20"}) || len(s.Backends) != 0 {
		t.Errorf("sticky's load balancer service: %+v", s)
	}
}

func TestBackendStates(t *testing.T) {
	sp := port("http", 80, 8080, 0)
	cases := []struct {
		name string
		eps  []ep
		want map[string]string
	}{
		{"ready up, not ready down", []ep{up("10.0.0.1", ""), notReady("10.0.0.2", "")},
			map[string]string{"10.0.0.1": StateUp, "10.0.0.2": StateDown}},
		{"terminating drained while another is ready", []ep{up("10.0.0.1", ""), terminating("10.0.0.2", "")},
			map[string]string{"10.0.0.1": StateUp, "10.0.0.2": StateDrain}},
		{"only terminating: serving ones stay up (kube-proxy's fallback)", []ep{terminating("10.0.0.2", ""), notReady("10.0.0.3", "")},
			map[string]string{"10.0.0.2": StateUp, "10.0.0.3": StateDown}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got := map[string]string{}
			for _, b := range fallback(backends([]*discoveryv1.EndpointSlice{slice("ns", "s", "s-1", "http", 8080, c.eps...)}, sp)) {
				got[b.Address] = b.State
			}
			if !reflect.DeepEqual(got, c.want) {
				t.Errorf("got %v, want %v", got, c.want)
			}
		})
	}
}

// kube-proxy's fallback to serving terminating endpoints is decided per front, among the
// backends the front uses: with externalTrafficPolicy Local, a node whose only local
// endpoint terminates keeps it up for its NodePort while other nodes have ready ones (the
// cluster front, which has those, drains it); per family likewise.
func TestTerminatingFallbackPerFront(t *testing.T) {
	svc := service("default", "web", corev1.ServiceTypeNodePort, "10.96.0.10", port("http", 80, 8080, 30080))
	svc.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
	snap := Snapshot{
		Nodes:    []*corev1.Node{node("self", []string{"10.244.0.0/24"}, "172.18.0.2", ""), node("other", []string{"10.244.1.0/24"}, "172.18.0.3", "")},
		Services: []*corev1.Service{svc},
		EndpointSlices: []*discoveryv1.EndpointSlice{slice("default", "web", "web-a", "http", 8080,
			terminating("10.244.0.5", "self"), up("10.244.1.5", "other"))},
	}
	d, err := Derive(mustBase(t, baseYAML), snap, Params{NodeName: "self"})
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{FrontCluster: "10.244.0.5=drain 10.244.1.5=up", FrontNodePort: "10.244.0.5=up"}
	for _, f := range d.Summary.Balanced {
		var got []string
		for _, b := range f.Backends {
			got = append(got, b.Address+"="+b.State)
		}
		if w, ok := want[f.Front]; ok && strings.Join(got, " ") != w {
			t.Errorf("%s: backends %v, want %s", f.Name, got, w)
		}
		delete(want, f.Front)
	}
	if len(want) > 0 {
		t.Errorf("fronts missing: %v", want)
	}
}

// An IPv4-only Service's node port and external IPs are of its family: kube-proxy ignores an
// externalIP of another (its proxier of that family skips the Service); a front for it would
// have no backends and refuse every client of the address (it did, before a review), and
// node.loadBalancerIPs does not list it (it did, a session later).
func TestNodePortFollowsServiceFamilies(t *testing.T) {
	svc := service("default", "web", corev1.ServiceTypeNodePort, "10.96.0.10", port("http", 80, 8080, 30080))
	svc.Spec.ExternalIPs = []string{"192.0.2.10", "2001:db8::10"}
	snap := Snapshot{
		Nodes:          []*corev1.Node{node("self", []string{"10.244.0.0/24", "fd00:10:244::/64"}, "172.18.0.2", "fc00::2")},
		Services:       []*corev1.Service{svc},
		EndpointSlices: []*discoveryv1.EndpointSlice{slice("default", "web", "web-a", "http", 8080, up("10.244.0.5", "self"))},
	}
	d, err := Derive(mustBase(t, baseYAML), snap, Params{NodeName: "self"})
	if err != nil {
		t.Fatal(err)
	}
	var vips, external [][]string
	for _, f := range d.Summary.Balanced {
		switch f.Front {
		case FrontNodePort:
			vips = append(vips, f.VIPs)
		case FrontExternal:
			external = append(external, f.VIPs)
		}
	}
	if !reflect.DeepEqual(vips, [][]string{{"172.18.0.2"}}) {
		t.Errorf("an IPv4 Service's NodePort on %v, want the node's IPv4 address only", vips)
	}
	if !reflect.DeepEqual(external, [][]string{{"192.0.2.10"}}) {
		t.Errorf("an IPv4 Service's external fronts on %v, want its IPv4 externalIP only", external)
	}
	// nor does the node answer for the other family's address (the datapaths' external classes)
	if got := d.Config.Node.LoadBalancerIPs; !reflect.DeepEqual(got, []string{"192.0.2.10/32"}) || !reflect.DeepEqual(d.Summary.ExternalIPs, []string{"192.0.2.10"}) {
		t.Errorf("node.loadBalancerIPs %v, summary %v: want the IPv4 externalIP only", got, d.Summary.ExternalIPs)
	}
}

// An address with an IPv6 zone from the API is ignored like any other invalid address: it
// must neither lose its zone on the way into the config nor make the derived config invalid.
func TestZonedAddressesIgnored(t *testing.T) {
	var got []string
	for _, b := range backends([]*discoveryv1.EndpointSlice{slice("ns", "s", "s-1", "http", 8080, up("fe80::1%eth0", ""), up("fd00::1", ""))}, port("http", 80, 8080, 0)) {
		got = append(got, b.Address)
	}
	if !slices.Equal(got, []string{"fd00::1"}) {
		t.Errorf("backends: %v", got)
	}
	svc := service("default", "web", corev1.ServiceTypeLoadBalancer, "10.96.0.10", port("http", 80, 8080, 30080))
	svc.Spec.ExternalIPs = []string{"fe80::7%eth0", "203.0.113.7"}
	svc.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: "fe80::8%eth0"}}
	if got := externalAddresses([]*corev1.Service{svc}); !slices.Equal(got, []string{"203.0.113.7"}) {
		t.Errorf("external addresses: %v", got)
	}
	if got := addressesOf(node("self", nil, "fe80::2%eth0", "172.18.0.2"), corev1.NodeInternalIP); !slices.Equal(got, []string{"172.18.0.2"}) {
		t.Errorf("node addresses: %v", got)
	}
}

// A Service the load balancer cannot take (two Services claiming one external IP and port, as
// the API allows; an endpoint port out of range) is left out with a warning instead of making
// the whole derived config invalid, which would freeze this node's config, peers and all
// (found by FuzzDerive). Of a front with several VIPs, only the one another Service has is
// left out (before, b's other external IP went with it). API addresses that are IPv4-mapped count as IPv4, zoned ones not at all.
func TestDeriveOneServiceNeverBreaksTheConfig(t *testing.T) {
	a := service("default", "a", corev1.ServiceTypeClusterIP, "10.96.0.10", port("http", 80, 8080, 0))
	a.Spec.ExternalIPs = []string{"203.0.113.7"}
	b := service("team-b", "b", corev1.ServiceTypeClusterIP, "10.96.0.11", port("http", 80, 8080, 0))
	b.Spec.ExternalIPs = []string{"203.0.113.7", "::ffff:203.0.113.8", "fe80::1%eth0"}
	bad := service("default", "bad", corev1.ServiceTypeClusterIP, "10.96.0.12", port("http", 80, 8080, 0))
	self := node("self", []string{"10.244.0.0/24"}, "172.18.0.2", "fe80::2%eth0")
	snap := Snapshot{
		Nodes:    []*corev1.Node{self, node("n1", []string{"10.244.1.0/24", "::ffff:10.244.9.0/120"}, "::ffff:172.18.0.3")},
		Services: []*corev1.Service{a, b, bad},
		EndpointSlices: []*discoveryv1.EndpointSlice{
			slice("default", "a", "a-1", "http", 8080, up("10.244.1.5", "n1")),
			slice("team-b", "b", "b-1", "http", 8080, up("10.244.1.6", "n1"), up("::ffff:10.244.1.7", "n1")),
			slice("default", "bad", "bad-1", "http", 70000, up("10.244.1.8", "n1")),
		},
	}
	d, err := Derive(mustBase(t, baseYAML), snap, Params{NodeName: "self"})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, s := range d.Config.LoadBalancer.Services {
		got = append(got, fmt.Sprintf("%v:%d %v", s.VIPs, s.Port, s.Backends))
	}
	want := []string{
		"[10.96.0.10]:80 [{10.244.1.5 8080 <nil> 0 up }]",
		"[203.0.113.7]:80 [{10.244.1.5 8080 <nil> 0 up }]",
		"[10.96.0.11]:80 [{10.244.1.6 8080 <nil> 0 up } {10.244.1.7 8080 <nil> 0 up }]",
		"[203.0.113.8]:80 [{10.244.1.6 8080 <nil> 0 up } {10.244.1.7 8080 <nil> 0 up }]",
	}
	if !slices.Equal(got, want) {
		t.Errorf("load balancer services:\n got %q\nwant %q", got, want)
	}
	warnings := strings.Join(d.Summary.Warnings, "\n")
	for _, w := range []string{
		"team-b/b:http/external: one VIP left out, the others balanced: 203.0.113.7 tcp/80 is already served by " + lbName("default/a:http/external"),
		"default/bad:http/cluster: not balanced: the load balancer rejects it: service.backends[0].port: 70000 is not a valid port",
		`node n1: podCIDR "::ffff:10.244.9.0/120" is not a CIDR; ignored`,
	} {
		if !strings.Contains(warnings, w) {
			t.Errorf("warnings lack %q:\n%s", w, warnings)
		}
	}
	if n := d.Config.Node; !slices.Equal(n.NodeIPs, []string{"172.18.0.2"}) || !slices.Equal(n.PeerNodeIPs, []string{"172.18.0.3"}) ||
		!slices.Equal(n.PeerPodCIDRs, []string{"10.244.1.0/24"}) || !slices.Contains(n.LoadBalancerIPs, "203.0.113.8/32") {
		t.Errorf("node: %+v", n)
	}
}

// An endpoint that fails readiness takes no new connection, also not from a client that
// session affinity had pinned to it (kube-proxy leaves it out): it is down, where drain kept
// it the target of its persistent clients, renewed by each of their connections. A terminating
// endpoint that still serves is drained (its affinity clients finish with it). Rendered, the
// not-ready endpoint is no target of the affinity map.
func TestNotReadyEndpointLosesAffinityClients(t *testing.T) {
	svc := service("default", "sticky", corev1.ServiceTypeClusterIP, "10.96.0.20", port("http", 80, 8080, 0))
	svc.Spec.SessionAffinity = corev1.ServiceAffinityClientIP
	snap := Snapshot{
		Nodes:    []*corev1.Node{node("self", []string{"10.244.0.0/24"}, "172.18.0.2")},
		Services: []*corev1.Service{svc},
		EndpointSlices: []*discoveryv1.EndpointSlice{slice("default", "sticky", "s-a", "http", 8080,
			up("10.244.0.5", "self"), notReady("10.244.0.6", "self"), terminating("10.244.0.7", "self"))},
	}
	d, err := Derive(mustBase(t, baseYAML), snap, Params{NodeName: "self"})
	if err != nil {
		t.Fatal(err)
	}
	states := map[string]string{}
	for _, b := range d.Config.LoadBalancer.Services[0].Backends {
		states[b.Address] = b.State
	}
	if want := map[string]string{"10.244.0.5": StateUp, "10.244.0.6": StateDown, "10.244.0.7": StateDrain}; !reflect.DeepEqual(states, want) {
		t.Errorf("backend states %v, want %v", states, want)
	}
	dump, err := lb.Render(lb.Resolve(d.Config.LoadBalancer.Services, nil, lb.Env{})).Dump()
	if err != nil {
		t.Fatal(err)
	}
	targets := 0
	for _, l := range strings.Split(dump, "\n") {
		if strings.Contains(l, "targets") && strings.Contains(l, "element") {
			targets++
			if strings.Contains(l, "10.244.0.6") {
				t.Errorf("the not-ready endpoint is a target of persistent clients: %s", l)
			}
		}
	}
	if targets == 0 {
		t.Fatalf("no affinity targets rendered:\n%s", dump)
	}
}

// A static loadBalancerIPs entry of the base (an address, or a pool's prefix) that holds a
// Service's ingress IP covers it: before, the ingress IP was added again, overlapped, and the
// whole derivation was refused (the node's config frozen at its last good one).
func TestBaseLoadBalancerIPsCoverIngressIPs(t *testing.T) {
	for _, static := range []string{"172.18.0.151", "172.18.0.128/25"} {
		t.Run(static, func(t *testing.T) {
			web := service("default", "web", corev1.ServiceTypeLoadBalancer, "10.96.0.10", port("http", 80, 8080, 30080))
			web.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: "172.18.0.151"}, {IP: "172.18.1.7"}}
			snap := Snapshot{
				Nodes:          []*corev1.Node{node("self", []string{"10.244.0.0/24"}, "172.18.0.2")},
				Services:       []*corev1.Service{web},
				EndpointSlices: []*discoveryv1.EndpointSlice{slice("default", "web", "web-a", "http", 8080, up("10.244.0.5", "self"))},
			}
			base := mustBase(t, strings.Replace(baseYAML, "  serviceCIDRs: [10.96.0.0/16]\n", "  serviceCIDRs: [10.96.0.0/16]\n  loadBalancerIPs: ["+static+"]\n", 1))
			d, err := Derive(base, snap, Params{NodeName: "self"})
			if err != nil {
				t.Fatalf("an ingress IP within the base's loadBalancerIPs: %v", err)
			}
			if got, want := d.Config.Node.LoadBalancerIPs, []string{static, "172.18.1.7/32"}; !slices.Equal(got, want) {
				t.Errorf("loadBalancerIPs %v, want %v", got, want)
			}
		})
	}
}

// A peer Node whose Pod CIDR overlaps this node's, a Service CIDR or an earlier Node's (by
// name) is left out with a reason and a warning; the others are accelerated. Before, the whole
// derivation was refused.
func TestOverlappingPeerPodCIDRLeavesThatNodeOut(t *testing.T) {
	snap := Snapshot{Nodes: []*corev1.Node{
		node("self", []string{"10.244.0.0/24"}, "172.18.0.2"),
		node("n1", []string{"10.244.1.0/24"}, "172.18.0.3"),
		node("n2", []string{"10.244.1.128/25"}, "172.18.0.4"), // n1's
		node("odd", []string{"10.244.0.0/16"}, "172.18.0.9"),  // everyone's
		node("svc", []string{"10.96.0.0/24"}, "172.18.0.10"),  // the Service CIDR's
	}}
	d, err := Derive(mustBase(t, baseYAML), snap, Params{NodeName: "self"})
	if err != nil {
		t.Fatalf("overlapping Pod CIDRs of peer Nodes: %v", err)
	}
	if got, want := d.Config.Node.PeerPodCIDRs, []string{"10.244.1.0/24"}; !slices.Equal(got, want) {
		t.Errorf("peerPodCIDRs %v, want %v", got, want)
	}
	for _, p := range d.Summary.Peers {
		if want := p.Name == "n1"; p.Accelerated != want || (!want && !strings.Contains(p.Reason, "overlaps")) {
			t.Errorf("peer %s: accelerated %v (%s), want %v", p.Name, p.Accelerated, p.Reason, want)
		}
	}
	if n := len(d.Summary.Warnings); n != 3 {
		t.Errorf("warnings %q, want one per Node left out", d.Summary.Warnings)
	}
}

// A Service whose externalIPs name another Service's ClusterIP and port (the API lets anyone
// set them: CVE-2020-8554) does not take that Service's front away: cluster and node port
// fronts claim their VIPs before external ones. Before, namespace order decided, and here
// cluster DNS went to aaa/evil's Pods.
func TestExternalIPDoesNotTakeAClusterIP(t *testing.T) {
	dnsPort := corev1.ServicePort{Name: "dns", Protocol: corev1.ProtocolUDP, Port: 53}
	dns := service("kube-system", "kube-dns", corev1.ServiceTypeClusterIP, "10.96.0.10", dnsPort)
	evil := service("aaa", "evil", corev1.ServiceTypeClusterIP, "10.96.0.77", dnsPort)
	evil.Spec.ExternalIPs = []string{"10.96.0.10"}
	udp := corev1.ProtocolUDP
	s1 := slice("kube-system", "kube-dns", "dns-a", "dns", 53, up("10.244.1.5", "n1"))
	s1.Ports[0].Protocol = &udp
	s2 := slice("aaa", "evil", "evil-a", "dns", 53, up("10.244.1.66", "n1"))
	s2.Ports[0].Protocol = &udp
	snap := Snapshot{
		Nodes:          []*corev1.Node{node("self", []string{"10.244.0.0/24"}, "172.18.0.2"), node("n1", []string{"10.244.1.0/24"}, "172.18.0.3")},
		Services:       []*corev1.Service{dns, evil},
		EndpointSlices: []*discoveryv1.EndpointSlice{s1, s2},
	}
	d, err := Derive(mustBase(t, baseYAML), snap, Params{NodeName: "self"})
	if err != nil {
		t.Fatal(err)
	}
	served := false
	for _, s := range d.Config.LoadBalancer.Services {
		if slices.Contains(s.VIPs, "10.96.0.10") && s.Port == 53 {
			served = true
			if len(s.Backends) != 1 || s.Backends[0].Address != "10.244.1.5" {
				t.Errorf("kube-dns's ClusterIP udp/53 is served by %s with %v, want kube-dns's endpoint", s.Name, s.Backends)
			}
		}
	}
	if !served {
		t.Errorf("kube-dns's ClusterIP is not served: %v", d.Summary.Warnings)
	}
	if !slices.ContainsFunc(d.Summary.Warnings, func(w string) bool { return strings.HasPrefix(w, "aaa/evil:dns/external") }) {
		t.Errorf("warnings %q, want aaa/evil's external front not balanced", d.Summary.Warnings)
	}
}

// loadBalancerSourceRanges restrict the external front of a LoadBalancer Service (as kube-
// proxy's firewall does the load balancer IPs), per family: a family without a range is not
// restricted, as kube-proxy installs a family's firewall only where it has ranges (it got a
// range no client is in: every client of the family dropped). Cluster and node port fronts
// are not restricted. Before, the field was ignored: every source reached the load balancer IP.
func TestLoadBalancerSourceRanges(t *testing.T) {
	web := service("default", "web", corev1.ServiceTypeLoadBalancer, "10.96.0.10", port("http", 80, 8080, 30080))
	web.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: "172.18.0.151"}, {IP: "2001:db8::151"}}
	web.Spec.LoadBalancerSourceRanges = []string{" 192.0.2.0/24", "198.51.100.7/32", "bad"}
	// (externalIPs are not restricted, as with kube-proxy: before, they shared the ranges)
	web.Spec.ExternalIPs = []string{"203.0.113.9", "172.18.0.151"}
	web.Spec.ClusterIPs = []string{"10.96.0.10", "fd00:96::10"} // dual-stack: an IPv6 ingress IP is the Service's
	snap := Snapshot{
		Nodes:          []*corev1.Node{node("self", []string{"10.244.0.0/24"}, "172.18.0.2")},
		Services:       []*corev1.Service{web},
		EndpointSlices: []*discoveryv1.EndpointSlice{slice("default", "web", "web-a", "http", 8080, up("10.244.0.5", "self"), up("fd00::5", "self"))},
	}
	d, err := Derive(mustBase(t, baseYAML), snap, Params{NodeName: "self"})
	if err != nil {
		t.Fatal(err)
	}
	got := map[string][]string{}
	for _, f := range d.Summary.Balanced {
		got[f.Name] = append([]string{strings.Join(f.VIPs, ",")}, f.SourceRanges...)
	}
	want := map[string][]string{
		"default/web:http/cluster":       {"10.96.0.10"},
		"default/web:http/cluster/ipv6":  {"fd00:96::10"},
		"default/web:http/nodeport":      {"172.18.0.2"},
		"default/web:http/external":      {"172.18.0.151", "192.0.2.0/24", "198.51.100.7/32"},
		"default/web:http/external/ipv6": {"2001:db8::151"}, // no IPv6 range: open, as kube-proxy (it had ::/128, no client)
		"default/web:http/externalip":    {"203.0.113.9"},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("fronts (VIPs, then source ranges):\n got %v\nwant %v", got, want)
	}
	if !slices.ContainsFunc(d.Summary.Warnings, func(w string) bool { return strings.Contains(w, `"bad" is not a CIDR`) }) {
		t.Errorf("warnings %q, want one for the bad range", d.Summary.Warnings)
	}
	for _, s := range d.Config.LoadBalancer.Services {
		if slices.Contains(s.VIPs, "172.18.0.151") && !slices.Equal(s.SourceRanges, want["default/web:http/external"][1:]) {
			t.Errorf("the load balancer service of 172.18.0.151: source ranges %v", s.SourceRanges)
		}
		if slices.Contains(s.VIPs, "2001:db8::151") && len(s.SourceRanges) > 0 {
			t.Errorf("the load balancer service of 2001:db8::151: source ranges %v, want none (no IPv6 range)", s.SourceRanges)
		}
	}
}

// externalTrafficPolicy Local: the node port and external fronts send this node's Pods (its
// Pod CIDRs of the family) and the node itself to the cluster front, with every endpoint, as
// kube-proxy short-circuits them; outside clients get this node's endpoints. A node without
// local endpoints balances those fronts anyway (before, "no endpoints": its own Pods could
// not reach the Service's load balancer IP or node port). When the cluster front is not
// balanced (its ClusterIP and port served by the base), they lose their internal clients.
func TestExternalTrafficPolicyLocalShortCircuit(t *testing.T) {
	web := dualStackLB()
	web.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
	snap := endpointsOnN1(web)
	d, err := Derive(mustBase(t, baseYAML), snap, Params{NodeName: "self"})
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, s := range d.Config.LoadBalancer.Services {
		in := internalClients(&s)
		got[fmt.Sprint(s.VIPs, s.Port)] = fmt.Sprintf("%d backends, internal: %s", len(s.Backends), in)
	}
	c4, c6 := lbName("default/web:http/cluster"), lbName("default/web:http/cluster/ipv6")
	want := map[string]string{
		"[10.96.0.10] 80":        "1 backends, internal: -",
		"[fd00:96::10] 80":       "1 backends, internal: -",
		"[172.18.0.2] 30080":     "0 backends, internal: " + c4 + " [10.244.0.0/24] localHost=true",
		"[2001:db8:18::2] 30080": "0 backends, internal: " + c6 + " [fd00:244::/64] localHost=true",
		"[172.18.0.151] 80":      "0 backends, internal: " + c4 + " [10.244.0.0/24] localHost=true",
		"[2001:db8::151] 80":     "0 backends, internal: " + c6 + " [fd00:244::/64] localHost=true",
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("load balancer services:\n got %v\nwant %v", got, want)
	}

	// The cluster front's ClusterIP and port are the base's: no short-circuit (the fronts
	// without local endpoints refuse every client).
	base := mustBase(t, baseYAML+`loadBalancer:
  services:
  - {name: static, vips: ["10.96.0.10"], port: 80, backends: [{address: "10.244.0.9"}]}
`)
	d, err = Derive(base, snap, Params{NodeName: "self"})
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range d.Summary.Balanced {
		v4 := netip.MustParseAddr(f.VIPs[0]).Is4()
		if f.Front != FrontCluster && v4 && (f.Skipped != "" || f.Internal != "" || len(f.Backends) != 0) {
			t.Errorf("%s without its cluster front: skipped %q, internal %q", f.Name, f.Skipped, f.Internal)
		}
		if f.Front != FrontCluster && !v4 && (f.Skipped != "" || f.Internal != c6) {
			t.Errorf("%s: skipped %q, internal %q; want the IPv6 cluster front's", f.Name, f.Skipped, f.Internal)
		}
	}
}

// Both traffic policies Local: the ClusterIP has this node's endpoints only (here none: its
// Pods' packets to it are dropped), but the node port and load balancer IP send this node's
// Pods and the node itself to every endpoint, as kube-proxy short-circuits them to its cluster
// endpoints ("subject to neither form of traffic policy"). A short-circuit front per family
// holds them: internalOnly, with the ClusterIP and port, which the cluster front keeps. Before,
// the short-circuit went to the cluster front, whose endpoints are this node's: the node's Pods
// could not reach the Service's load balancer IP or node port on a node without endpoints.
func TestBothTrafficPoliciesLocalShortCircuit(t *testing.T) {
	web := dualStackLB()
	web.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
	local := corev1.ServiceInternalTrafficPolicyLocal
	web.Spec.InternalTrafficPolicy = &local
	snap := endpointsOnN1(web)
	d, err := Derive(mustBase(t, baseYAML), snap, Params{NodeName: "self"})
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, s := range d.Config.LoadBalancer.Services {
		in := internalClients(&s)
		var bes []string
		for _, b := range s.Backends {
			bes = append(bes, b.Address)
		}
		got[s.Name] = fmt.Sprintf("%v %d %v internalOnly=%v noBackend=%q hairpin=%v, internal: %s", s.VIPs, s.Port, bes, s.InternalOnly, s.NoBackend, s.Hairpin, in)
	}
	sc4, sc6 := lbName("default/web:http/short-circuit"), lbName("default/web:http/short-circuit/ipv6")
	want := map[string]string{
		lbName("default/web:http/cluster"):       `[10.96.0.10] 80 [] internalOnly=false noBackend="drop" hairpin=true, internal: -`,
		lbName("default/web:http/cluster/ipv6"):  `[fd00:96::10] 80 [] internalOnly=false noBackend="drop" hairpin=true, internal: -`,
		sc4:                                      `[10.96.0.10] 80 [10.244.1.5] internalOnly=true noBackend="" hairpin=false, internal: -`,
		sc6:                                      `[fd00:96::10] 80 [fd00:244:1::5] internalOnly=true noBackend="" hairpin=false, internal: -`,
		lbName("default/web:http/nodeport"):      `[172.18.0.2] 30080 [] internalOnly=false noBackend="drop" hairpin=true, internal: ` + sc4 + ` [10.244.0.0/24] localHost=true`,
		lbName("default/web:http/nodeport/ipv6"): `[2001:db8:18::2] 30080 [] internalOnly=false noBackend="drop" hairpin=true, internal: ` + sc6 + ` [fd00:244::/64] localHost=true`,
		lbName("default/web:http/external"):      `[172.18.0.151] 80 [] internalOnly=false noBackend="drop" hairpin=true, internal: ` + sc4 + ` [10.244.0.0/24] localHost=true`,
		lbName("default/web:http/external/ipv6"): `[2001:db8::151] 80 [] internalOnly=false noBackend="drop" hairpin=true, internal: ` + sc6 + ` [fd00:244::/64] localHost=true`,
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("load balancer services:\n got %v\nwant %v", got, want)
	}
	if errs := lb.ValidateServices(d.Config.LoadBalancer.Services, func(i int) string { return d.Config.LoadBalancer.Services[i].Name }); len(errs) > 0 {
		t.Errorf("the load balancer refuses the derived services: %v", errs)
	}

	// A ClusterIP-only Service of the same policies has no short-circuit front (no clients
	// to short-circuit), nor one with internalTrafficPolicy Cluster (the cluster front serves).
	for _, mutate := range []func(s *corev1.Service){
		func(s *corev1.Service) {
			s.Spec.Type, s.Spec.ExternalTrafficPolicy, s.Status.LoadBalancer.Ingress = corev1.ServiceTypeClusterIP, "", nil
			s.Spec.Ports[0].NodePort = 0
		},
		func(s *corev1.Service) { s.Spec.InternalTrafficPolicy = nil },
	} {
		w := web.DeepCopy()
		mutate(w)
		snap.Services = []*corev1.Service{w}
		d, err := Derive(mustBase(t, baseYAML), snap, Params{NodeName: "self"})
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range d.Summary.Balanced {
			if f.Front == FrontShortCircuit || f.InternalOnly {
				t.Errorf("%s %s: a short-circuit front (%+v)", w.Spec.Type, f.Name, w.Spec.InternalTrafficPolicy)
			}
		}
	}
}

// endpointsOnN1 is a snapshot of two nodes with web, whose endpoints (one per family) are
// on the other node, n1.
func endpointsOnN1(web *corev1.Service) Snapshot {
	snap := Snapshot{
		Nodes:    twoNodes(),
		Services: []*corev1.Service{web},
		EndpointSlices: []*discoveryv1.EndpointSlice{
			slice("default", "web", "web-a", "http", 8080, up("10.244.1.5", "n1")),
			slice("default", "web", "web-b", "http", 8080, up("fd00:244:1::5", "n1")),
		},
	}
	snap.EndpointSlices[1].AddressType = discoveryv1.AddressTypeIPv6
	return snap
}

// internalClients says who s's internal clients are and which service serves them ("-": none).
func internalClients(s *lb.Service) string {
	if s.Internal == nil {
		return "-"
	}
	return fmt.Sprintf("%s %v localHost=%v", s.Internal.Service, s.Internal.Sources, s.Internal.LocalHost)
}

// A front of traffic policy Local on a node without a usable local endpoint drops its
// clients' packets while the Service has usable endpoints of the family elsewhere (ready, or
// serving while terminating), as kube-proxy drops them ("has no local endpoints"); a Service
// without any refuses them (noBackend unset: reject). Per family, as kube-proxy's proxiers.
// Before, every such front refused with a reset.
func TestLocalPolicyWithoutLocalEndpointsDrops(t *testing.T) {
	v6 := func(es *discoveryv1.EndpointSlice) *discoveryv1.EndpointSlice {
		es.AddressType = discoveryv1.AddressTypeIPv6
		return es
	}
	for _, c := range []struct {
		name     string
		internal bool // internalTrafficPolicy Local (else externalTrafficPolicy Local)
		slices   []*discoveryv1.EndpointSlice
		want     map[string]string // front (family) -> noBackend
	}{
		{"endpoints on another node", false, []*discoveryv1.EndpointSlice{slice("default", "web", "a", "http", 8080, up("10.244.1.5", "n1"))},
			map[string]string{"cluster": "", "nodeport": "drop", "external": "drop", "cluster/ipv6": "", "nodeport/ipv6": "", "external/ipv6": ""}},
		{"none anywhere", false, nil,
			map[string]string{"cluster": "", "nodeport": "", "external": "", "cluster/ipv6": "", "nodeport/ipv6": "", "external/ipv6": ""}},
		{"an IPv6 one elsewhere", false, []*discoveryv1.EndpointSlice{v6(slice("default", "web", "a", "http", 8080, up("fd00:244:1::5", "n1")))},
			map[string]string{"cluster": "", "nodeport": "", "external": "", "cluster/ipv6": "", "nodeport/ipv6": "drop", "external/ipv6": "drop"}},
		{"a terminating one elsewhere, still serving", false, []*discoveryv1.EndpointSlice{slice("default", "web", "a", "http", 8080, terminating("10.244.1.5", "n1"))},
			map[string]string{"cluster": "", "nodeport": "drop", "external": "drop", "cluster/ipv6": "", "nodeport/ipv6": "", "external/ipv6": ""}},
		{"only a not ready one elsewhere", false, []*discoveryv1.EndpointSlice{slice("default", "web", "a", "http", 8080, notReady("10.244.1.5", "n1"))},
			map[string]string{"cluster": "", "nodeport": "", "external": "", "cluster/ipv6": "", "nodeport/ipv6": "", "external/ipv6": ""}},
		{"internal traffic policy Local", true, []*discoveryv1.EndpointSlice{slice("default", "web", "a", "http", 8080, up("10.244.1.5", "n1"))},
			map[string]string{"cluster": "drop", "nodeport": "", "external": "", "cluster/ipv6": "", "nodeport/ipv6": "", "external/ipv6": ""}},
	} {
		t.Run(c.name, func(t *testing.T) {
			web := dualStackLB()
			if c.internal {
				p := corev1.ServiceInternalTrafficPolicyLocal
				web.Spec.InternalTrafficPolicy = &p
			} else {
				web.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
			}
			snap := Snapshot{
				Nodes:          twoNodes(),
				Services:       []*corev1.Service{web},
				EndpointSlices: c.slices,
			}
			d, err := Derive(mustBase(t, baseYAML), snap, Params{NodeName: "self"})
			if err != nil {
				t.Fatal(err)
			}
			got := map[string]string{}
			for _, f := range d.Summary.Balanced {
				got[strings.TrimPrefix(f.Name, "default/web:http/")] = f.NoBackend
			}
			byName := map[string]string{}
			for _, s := range d.Config.LoadBalancer.Services {
				byName[s.Name] = s.NoBackend
			}
			for _, f := range d.Summary.Balanced {
				if byName[f.LBName] != f.NoBackend {
					t.Errorf("%s: the load balancer's service has noBackend %q, the front %q", f.Name, byName[f.LBName], f.NoBackend)
				}
			}
			if !reflect.DeepEqual(got, c.want) {
				t.Errorf("noBackend by front:\n got %v\nwant %v", got, c.want)
			}
		})
	}
}

// Topology-aware routing (trafficDistribution PreferClose/PreferSameZone/PreferSameNode, the
// topology-mode annotation): as kube-proxy, the fronts that use every endpoint (Cluster
// traffic policy) take only the ready endpoints hinted for this node, else for its zone, when
// every ready endpoint has such hints and one matches; endpoints that are not ready stay (no
// new connections); a front of Local traffic policy is not filtered. Before, hints were
// ignored: traffic crossed zones (and paid for it) where the cluster asked it not to.
func TestTopologyAwareRouting(t *testing.T) {
	hint := func(es *discoveryv1.EndpointSlice, i int, zones, nodes []string) {
		h := &discoveryv1.EndpointHints{}
		for _, z := range zones {
			h.ForZones = append(h.ForZones, discoveryv1.ForZone{Name: z})
		}
		for _, n := range nodes {
			h.ForNodes = append(h.ForNodes, discoveryv1.ForNode{Name: n})
		}
		es.Endpoints[i].Hints = h
	}
	web := service("default", "web", corev1.ServiceTypeNodePort, "10.96.0.10", port("http", 80, 8080, 30080))
	self := node("self", []string{"10.244.0.0/24"}, "172.18.0.2")
	self.Labels = map[string]string{corev1.LabelTopologyZone: "zone-a"}
	derive := func(es *discoveryv1.EndpointSlice, etpLocal bool) map[string][]string {
		t.Helper()
		w := web.DeepCopy()
		if etpLocal {
			w.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
		}
		d, err := Derive(mustBase(t, baseYAML), Snapshot{Nodes: []*corev1.Node{self}, Services: []*corev1.Service{w}, EndpointSlices: []*discoveryv1.EndpointSlice{es}}, Params{NodeName: "self"})
		if err != nil {
			t.Fatal(err)
		}
		out := map[string][]string{}
		for _, f := range d.Summary.Balanced {
			for _, b := range f.Backends {
				out[f.Front] = append(out[f.Front], b.Address+"="+b.State)
			}
			slices.Sort(out[f.Front])
		}
		return out
	}
	zoned := func() *discoveryv1.EndpointSlice {
		es := slice("default", "web", "web-a", "http", 8080,
			up("10.244.1.1", "n1"), up("10.244.2.1", "n2"), up("10.244.0.1", "self"), notReady("10.244.2.2", "n2"))
		hint(es, 0, []string{"zone-a"}, nil)
		hint(es, 1, []string{"zone-b"}, nil)
		hint(es, 2, []string{"zone-b"}, nil)
		return es
	}
	all := []string{"10.244.0.1=up", "10.244.1.1=up", "10.244.2.1=up", "10.244.2.2=down"}
	for _, c := range []struct {
		name  string
		es    func() *discoveryv1.EndpointSlice
		local bool
		want  map[string][]string
	}{
		{"zone hints, one for this zone", zoned, false,
			map[string][]string{FrontCluster: {"10.244.1.1=up", "10.244.2.2=down"}, FrontNodePort: {"10.244.1.1=up", "10.244.2.2=down"}}},
		{"a ready endpoint without hints: all", func() *discoveryv1.EndpointSlice {
			es := zoned()
			es.Endpoints[2].Hints = nil
			return es
		}, false, map[string][]string{FrontCluster: all, FrontNodePort: all}},
		{"no hint for this zone: all", func() *discoveryv1.EndpointSlice {
			es := zoned()
			hint(es, 0, []string{"zone-c"}, nil)
			return es
		}, false, map[string][]string{FrontCluster: all, FrontNodePort: all}},
		{"node hints, one for this node", func() *discoveryv1.EndpointSlice {
			es := zoned()
			hint(es, 0, []string{"zone-a"}, []string{"n1"})
			hint(es, 1, []string{"zone-b"}, []string{"n2"})
			hint(es, 2, []string{"zone-b"}, []string{"self"})
			return es
		}, false, map[string][]string{FrontCluster: {"10.244.0.1=up", "10.244.2.2=down"}, FrontNodePort: {"10.244.0.1=up", "10.244.2.2=down"}}},
		{"externalTrafficPolicy Local: the node port keeps its local endpoint", zoned, true,
			map[string][]string{FrontCluster: {"10.244.1.1=up", "10.244.2.2=down"}, FrontNodePort: {"10.244.0.1=up"}}},
	} {
		if got := derive(c.es(), c.local); !reflect.DeepEqual(got, c.want) {
			t.Errorf("%s:\n got %v\nwant %v", c.name, got, c.want)
		}
	}
}

// A node port front of a Local Service whose only VIP another service has, and whose cluster
// front is not balanced either: its reason should name the service that has its VIP, not
// "no endpoints" (claim overwrites leaveOut's reason when it drops the internal clients).
func TestSkippedReasonKeptBesideInternal(t *testing.T) {
	web := service("default", "web", corev1.ServiceTypeNodePort, "10.96.0.10", port("http", 80, 8080, 30080))
	web.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
	snap := Snapshot{
		Nodes:          []*corev1.Node{node("self", []string{"10.244.0.0/24"}, "172.18.0.2"), node("n1", []string{"10.244.1.0/24"}, "172.18.0.3")},
		Services:       []*corev1.Service{web},
		EndpointSlices: []*discoveryv1.EndpointSlice{slice("default", "web", "web-a", "http", 8080, up("10.244.1.5", "n1"))},
	}
	base := mustBase(t, baseYAML+`loadBalancer:
  services:
  - {name: static, vips: ["10.96.0.10"], port: 80, backends: [{address: "10.244.0.9"}]}
  - {name: static2, vips: ["172.18.0.2"], port: 30080, backends: [{address: "10.244.0.9"}]}
`)
	d, err := Derive(base, snap, Params{NodeName: "self"})
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range d.Summary.Balanced {
		t.Logf("%s: skipped %q", f.Name, f.Skipped)
		if f.Front == FrontNodePort && !strings.Contains(f.Skipped, "static2") {
			t.Errorf("%s: skipped %q; want the reason that names static2 (which has 172.18.0.2 tcp/30080)", f.Name, f.Skipped)
		}
	}
}

// dualStackLB is Service default/web of type LoadBalancer, port http 80 -> 8080 (node port
// 30080), ClusterIPs of both families and an ingress IP of each.
func dualStackLB() *corev1.Service {
	web := service("default", "web", corev1.ServiceTypeLoadBalancer, "10.96.0.10", port("http", 80, 8080, 30080))
	web.Spec.ClusterIPs = []string{"10.96.0.10", "fd00:96::10"}
	web.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: "172.18.0.151"}, {IP: "2001:db8::151"}}
	return web
}

// twoNodes are this node (self) and n1, dual-stack, with their Pod CIDRs.
func twoNodes() []*corev1.Node {
	return []*corev1.Node{node("self", []string{"10.244.0.0/24", "fd00:244::/64"}, "172.18.0.2", "2001:db8:18::2"),
		node("n1", []string{"10.244.1.0/24", "fd00:244:1::/64"}, "172.18.0.3", "2001:db8:18::3")}
}

// A ConfigMap's "0s" periods are its own, as a config file's (the derivation dropped them: the defaults).
func TestZeroPeriodsOfTheConfigMap(t *testing.T) {
	snap := Snapshot{Nodes: []*corev1.Node{node("n2", []string{"10.244.2.0/24"}, "172.18.0.4")}}
	d, err := Derive(mustBase(t, baseYAML+"agent: {minSyncInterval: 0s}\n"), snap, Params{NodeName: "n2"})
	if err != nil {
		t.Fatal(err)
	}
	if got := d.Config.Agent.MinSyncInterval.Duration; got != 0 {
		t.Errorf("minSyncInterval: 0s in the ConfigMap gave %s", got)
	}
	if _, err := Derive(mustBase(t, baseYAML+"agent: {resyncPeriod: 0s}\n"), snap, Params{NodeName: "n2"}); err == nil {
		t.Errorf("resyncPeriod: 0s in the ConfigMap was accepted (config.Parse refuses it)")
	}
}
