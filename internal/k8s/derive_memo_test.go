package k8s

import (
	"fmt"
	"reflect"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"

	"github.com/hostaccel/hostaccel/internal/config"
	"github.com/hostaccel/hostaccel/internal/lb"
)

// TestSameServiceFields: sameService compares every field of lb.Service, lb.Backend and
// lb.HealthCheck; a field added there must be added to it (and to lb.Service.Clone).
func TestSameServiceFields(t *testing.T) {
	for _, c := range []struct {
		typ    reflect.Type
		fields []string
	}{
		{reflect.TypeFor[lb.Service](), []string{"Name", "VIPs", "Port", "Ports", "Protocol", "Topology", "SNATAddresses", "Interface",
			"BackendInterface", "Scheduler", "HashFields", "Persistence", "FlowTimeout", "FlowTableSize", "SourceRanges", "Hairpin", "FlushConntrack", "HealthCheck", "MasqueradeExcept", "Internal", "InternalOnly", "NoBackend", "Backends"}},
		{reflect.TypeFor[lb.Internal](), []string{"Service", "Sources", "LocalHost"}},
		{reflect.TypeFor[lb.Backend](), []string{"Address", "Port", "Weight", "Priority", "State", "MAC"}},
		{reflect.TypeFor[lb.HealthCheck](), []string{"Type", "Port", "Path", "Host", "ExpectStatus", "Send", "Expect", "Query",
			"Command", "Interval", "Timeout", "Rise", "Fall"}},
	} {
		var got []string
		for f := range c.typ.Fields() {
			got = append(got, f.Name)
		}
		if !slices.Equal(got, c.fields) {
			t.Errorf("%s has fields %v; sameService and lb.Service.Clone know %v", c.typ, got, c.fields)
		}
	}
	a := lb.Service{Name: "a", VIPs: []string{"10.0.0.1"}, Port: 80, Persistence: lb.D(5), Backends: []lb.Backend{{Address: "10.0.1.1"}},
		HealthCheck: &lb.HealthCheck{Type: "tcp", Command: []string{"x"}}, Internal: &lb.Internal{Service: "c", Sources: []string{"10.244.0.0/24"}}}
	b := a.Clone()
	if !sameService(&a, &b) {
		t.Fatal("a clone differs")
	}
	if c := a.Clone(); func() bool { c.NoBackend = lb.NoBackendDrop; return sameService(&a, &c) }() {
		t.Fatal("services of another noBackend are the same")
	}
	b.Backends[0].State = lb.StateDrain
	b.HealthCheck.Command[0] = "y"
	b.Internal.Sources[0] = "10.244.1.0/24"
	if sameService(&a, &b) || a.Backends[0].State != "" || a.HealthCheck.Command[0] != "x" || a.Internal.Sources[0] != "10.244.0.0/24" {
		t.Fatal("a changed clone is the same, or changed its original")
	}
}

// checkSame derives snap with dr and the way Derive always did, and fails unless both give
// the same (config, JSON, summary, error).
func checkSame(t *testing.T, dr *deriver, base *config.Config, snap Snapshot, p Params, what string) {
	t.Helper()
	got, gotErr := dr.derive(base, snap, p)
	want, wantErr := (&deriver{slow: true}).derive(base, snap, p)
	if fmt.Sprint(gotErr) != fmt.Sprint(wantErr) {
		t.Fatalf("%s: error %v, want %v", what, gotErr, wantErr)
	}
	if wantErr != nil {
		return
	}
	if string(got.JSON) != string(want.JSON) {
		t.Fatalf("%s: JSON\n%s\nwant\n%s", what, got.JSON, want.JSON)
	}
	if !reflect.DeepEqual(got.Config, want.Config) || !reflect.DeepEqual(got.Summary, want.Summary) {
		t.Fatalf("%s: config or summary differ\n%+v\nwant\n%+v", what, got.Config, want.Config)
	}
}

// TestDeriverMatchesDerive: derivations that keep what the last found give what Derive always
// gave, error messages included: over the fuzz seeds (one deriver for all of them, one after
// the other), and over changes to a cluster that make its config invalid and valid again.
func TestDeriverMatchesDerive(t *testing.T) {
	var dr deriver
	for i := range 40 {
		snap, p, baseYAML := (&fuzzObjects{seedBytes(i)}).snapshot()
		base, err := ParseBase([]byte(baseYAML))
		if err != nil {
			t.Fatal(err)
		}
		checkSame(t, &dr, base, snap, p, fmt.Sprint("seed ", i))
		checkSame(t, &dr, base, snap, p, fmt.Sprint("seed ", i, " again"))
		checkSame(t, new(deriver), base, snap, p, fmt.Sprint("seed ", i, " fresh"))
	}

	dr = deriver{}
	base, err := ParseBase([]byte(baseYAML))
	if err != nil {
		t.Fatal(err)
	}
	p := Params{NodeName: "self"}
	snap := scaleSnapshot(60)
	checkSame(t, &dr, base, snap, p, "first")
	edit := func(what string, f func(s *Snapshot)) {
		t.Helper()
		snap.Services = slices.Clone(snap.Services)
		snap.EndpointSlices = slices.Clone(snap.EndpointSlices)
		f(&snap)
		checkSame(t, &dr, base, snap, p, what)
	}
	edit("an endpoint not ready", func(s *Snapshot) {
		es := s.EndpointSlices[3].DeepCopy()
		no := false
		es.Endpoints[0].Conditions.Ready = &no
		s.EndpointSlices[3] = es
	})
	edit("an endpoint added", func(s *Snapshot) {
		es := s.EndpointSlices[4].DeepCopy()
		es.Endpoints = append(es.Endpoints, es.Endpoints[0])
		es.Endpoints[len(es.Endpoints)-1].Addresses = []string{"10.128.4.99"}
		s.EndpointSlices[4] = es
	})
	edit("a Service removed", func(s *Snapshot) { s.Services = slices.Delete(s.Services, 5, 6) })
	edit("a Service's endpoints removed", func(s *Snapshot) { s.EndpointSlices = slices.Delete(s.EndpointSlices, 7, 8) })
	edit("a second port", func(s *Snapshot) {
		svc := s.Services[8].DeepCopy()
		svc.Spec.Ports = append(svc.Spec.Ports, port("https", 443, 8443, 0))
		s.Services[8] = svc
		es := s.EndpointSlices[8].DeepCopy()
		name, pt, proto := "https", int32(8443), corev1.ProtocolTCP
		es.Ports = append(es.Ports, discoveryv1.EndpointPort{Name: &name, Port: &pt, Protocol: &proto})
		s.EndpointSlices[8] = es
	})
	edit("a NodePort Service", func(s *Snapshot) {
		svc := s.Services[9].DeepCopy()
		svc.Spec.Type = corev1.ServiceTypeNodePort
		svc.Spec.Ports[0].NodePort = 30080
		s.Services[9] = svc
	})
	edit("an unknown scheduler (a warning)", func(s *Snapshot) {
		svc := s.Services[10].DeepCopy()
		svc.Annotations = map[string]string{AnnotationScheduler: "fastest"}
		s.Services[10] = svc
	})
	edit("another endpoint change (the warning again)", func(s *Snapshot) {
		es := s.EndpointSlices[11].DeepCopy()
		es.Endpoints = es.Endpoints[:1]
		s.EndpointSlices[11] = es
	})
	edit("this node's IPs changed (the NodePort's VIPs)", func(s *Snapshot) {
		s.Nodes = slices.Clone(s.Nodes)
		s.Nodes[0] = node("self", []string{"10.128.0.0/24"}, "172.18.0.2", "172.18.9.9")
	})
	// A backend that is also a stateless-dnat backend of the base's service: the derived
	// config is invalid, and then valid again.
	bad, err := ParseBase([]byte(baseYAML + `
loadBalancer:
  services:
  - {name: static, vips: [192.0.2.1], port: 80, topology: stateless-dnat, interface: eth0, backends: [{address: 10.128.10.10, port: 8080}]}
`))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Derive(bad, snap, p); err == nil {
		t.Fatal("the config with a stateless-dnat backend of a Service's derived")
	}
	checkSame(t, &dr, bad, snap, p, "an invalid derived config")
	checkSame(t, &dr, base, snap, p, "valid again")
	edit("an endpoint back", func(s *Snapshot) {
		es := s.EndpointSlices[3].DeepCopy()
		yes := true
		es.Endpoints[0].Conditions.Ready = &yes
		s.EndpointSlices[3] = es
	})
	checkSame(t, &dr, bad, snap, p, "invalid again")
	checkSame(t, &dr, bad, snap, p, "invalid, the same")
	checkSame(t, &dr, base, snap, p, "valid, the same")
	checkSame(t, &dr, base, snap, p, "valid, the same again")

	// What Derive hands out is the caller's: changing it changes nothing of the next.
	d, err := dr.derive(base, snap, p)
	if err != nil {
		t.Fatal(err)
	}
	for i := range d.Config.LoadBalancer.Services {
		s := &d.Config.LoadBalancer.Services[i]
		if len(s.Backends) > 0 {
			s.Backends[0].State = lb.StateDown
		}
		s.VIPs[0] = "192.0.2.99"
	}
	checkSame(t, &dr, base, snap, p, "after the caller changed the last config")
}

// TestDeriverKeepsUnchangedServices: an EndpointSlice change converts and writes only its
// Service's load balancer service again; every other front keeps its memo (the same object),
// and the Services' order is not sorted again while they are the same objects.
func TestDeriverKeepsUnchangedServices(t *testing.T) {
	base, p := mustBase(t, baseYAML), Params{NodeName: "self"}
	snap := scaleSnapshot(40)
	var dr deriver
	memos := func() map[string]*svcMemo {
		out := map[string]*svcMemo{}
		for _, r := range dr.refs {
			if m := r.m.svcs[r.i]; m != nil {
				out[m.src.Name] = m
			}
		}
		return out
	}
	checkSame(t, &dr, base, snap, p, "first")
	before, sorted := memos(), dr.sorted
	if len(before) != 40 {
		t.Fatalf("%d services kept with their fronts, want 40", len(before))
	}

	snap.EndpointSlices = slices.Clone(snap.EndpointSlices)
	es := snap.EndpointSlices[5].DeepCopy()
	no := false
	es.Endpoints[0].Conditions.Ready = &no
	snap.EndpointSlices[5] = es
	slices.Reverse(snap.Services) // (the informer's list has no order)
	checkSame(t, &dr, base, snap, p, "an endpoint not ready")
	after := memos()
	var changed []string
	for name, m := range after {
		if before[name] != m {
			changed = append(changed, name)
		}
	}
	if want := LBName("default", "svc-5", "http", FrontCluster); !slices.Equal(changed, []string{want}) {
		t.Fatalf("services converted again: %v, want only %s", changed, want)
	}
	if &dr.sorted[0] != &sorted[0] {
		t.Fatal("the same Services were sorted again")
	}

	// A Service listed twice in place of another (not what an informer gives; the order must
	// not be taken from the last derivation).
	snap.Services = slices.Clone(snap.Services)
	snap.Services[3] = snap.Services[4]
	checkSame(t, &dr, base, snap, p, "a Service twice")
}

// TestDeriverForgetsServices: memos of services no longer derived are dropped; they do not
// pile up over changes.
func TestDeriverForgetsServices(t *testing.T) {
	base, p := mustBase(t, baseYAML), Params{NodeName: "self"}
	var dr deriver
	for round := range 30 {
		snap := scaleSnapshot(20)
		for _, s := range snap.Services {
			s.Name = fmt.Sprintf("%s-r%d", s.Name, round)
		}
		for _, es := range snap.EndpointSlices {
			es.Labels[discoveryv1.LabelServiceName] += fmt.Sprintf("-r%d", round)
		}
		if _, err := dr.derive(base, snap, p); err != nil {
			t.Fatal(err)
		}
	}
	if len(dr.memos) > 2*20+64 {
		t.Fatalf("%d service memos kept after 30 rounds of 20 new services", len(dr.memos))
	}
	if len(dr.fronts) != 20 {
		t.Fatalf("%d Services' fronts kept, want the last 20", len(dr.fronts))
	}
}

// A Service's EndpointSlices listed in another order (the lister walks a map) are the same
// input: its fronts are kept, not derived again (about half the derivations of every Service
// with two slices or more did so).
func TestMemoKeepsFrontsWhateverTheSliceOrder(t *testing.T) {
	svc := service("default", "web", corev1.ServiceTypeClusterIP, "10.96.0.10", port("http", 80, 8080, 0))
	a := slice("default", "web", "web-a", "http", 8080, up("10.244.0.5", "self"))
	b := slice("default", "web", "web-b", "http", 8080, up("10.244.0.6", "self"))
	snap := Snapshot{
		Nodes:          []*corev1.Node{node("self", []string{"10.244.0.0/24"}, "172.18.0.2")},
		Services:       []*corev1.Service{svc},
		EndpointSlices: []*discoveryv1.EndpointSlice{a, b},
	}
	var dr deriver
	if _, err := dr.derive(mustBase(t, baseYAML), snap, Params{NodeName: "self"}); err != nil {
		t.Fatal(err)
	}
	m1 := dr.fronts[svc]
	snap.EndpointSlices = []*discoveryv1.EndpointSlice{b, a}
	if _, err := dr.derive(mustBase(t, baseYAML), snap, Params{NodeName: "self"}); err != nil {
		t.Fatal(err)
	}
	if m1 == nil || dr.fronts[svc] != m1 {
		t.Errorf("the same EndpointSlices in another order: the Service's fronts were derived again")
	}
}

// A front that lost one of its external IPs to another Service gets it back when that Service
// goes, also where the deriver keeps the fronts of unchanged Services: the reduced service is
// not kept as the front's.
func TestExternalIPComesBackWhenItsClaimantGoes(t *testing.T) {
	base, p := mustBase(t, baseYAML), Params{NodeName: "self"}
	a := service("default", "a", corev1.ServiceTypeClusterIP, "10.96.0.10", port("http", 80, 8080, 0))
	a.Spec.ExternalIPs = []string{"203.0.113.7"}
	b := service("team-b", "b", corev1.ServiceTypeClusterIP, "10.96.0.11", port("http", 80, 8080, 0))
	b.Spec.ExternalIPs = []string{"203.0.113.7", "203.0.113.8"}
	snap := Snapshot{
		Nodes:    []*corev1.Node{node("self", []string{"10.244.0.0/24"}, "172.18.0.2")},
		Services: []*corev1.Service{a, b},
		EndpointSlices: []*discoveryv1.EndpointSlice{
			slice("default", "a", "a-1", "http", 8080, up("10.244.0.5", "self")),
			slice("team-b", "b", "b-1", "http", 8080, up("10.244.0.6", "self")),
		},
	}
	bExternal := func(d *Derived) (vips, leftOut []string) {
		for _, f := range d.Summary.Balanced {
			if f.Name == "team-b/b:http/external" {
				return f.VIPs, f.LeftOut
			}
		}
		t.Fatal("no external front of team-b/b")
		return nil, nil
	}
	var dr deriver
	checkSame(t, &dr, base, snap, p, "both")
	d, err := dr.derive(base, snap, p)
	if err != nil {
		t.Fatal(err)
	}
	if vips, left := bExternal(d); !slices.Equal(vips, []string{"203.0.113.8"}) || len(left) != 1 || !strings.HasPrefix(left[0], "203.0.113.7 tcp/80 is already served by") {
		t.Errorf("with a: b's external front serves %v, left out %q; want 203.0.113.8, and 203.0.113.7 left out", vips, left)
	}
	snap.Services = []*corev1.Service{b}
	snap.EndpointSlices = snap.EndpointSlices[1:]
	checkSame(t, &dr, base, snap, p, "a gone")
	d, err = dr.derive(base, snap, p)
	if err != nil {
		t.Fatal(err)
	}
	if vips, left := bExternal(d); !slices.Equal(vips, []string{"203.0.113.7", "203.0.113.8"}) || left != nil {
		t.Errorf("a gone: b's external front serves %v, left out %q; want both", vips, left)
	}
	if n := len(d.Config.LoadBalancer.Services); n != 2 || !slices.Equal(d.Config.LoadBalancer.Services[1].VIPs, []string{"203.0.113.7", "203.0.113.8"}) {
		t.Errorf("a gone: services %+v", d.Config.LoadBalancer.Services)
	}
}
