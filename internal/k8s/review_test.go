package k8s

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	corelisters "k8s.io/client-go/listers/core/v1"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/cache"

	"github.com/hostaccel/hostaccel/internal/config"
)

// Found by a review of the Kubernetes mode (2026-11-28); each failed before its fix.

// An endpoint that is not ready and terminating, with serving unset (nil), is serving: the
// API says "a nil value should be interpreted as true", and kube-proxy reads it so. When it
// is the only endpoint, the fallback uses it (it was down: every client refused).
func TestServingUnsetIsServing(t *testing.T) {
	f, tr := false, true
	es := slice("ns", "s", "s-1", "http", 8080)
	es.Endpoints = []discoveryv1.Endpoint{{Addresses: []string{"10.0.0.2"}, NodeName: ptr("n1"),
		Conditions: discoveryv1.EndpointConditions{Ready: &f, Terminating: &tr}}} // serving: nil
	got := fallback(backends([]*discoveryv1.EndpointSlice{es}, port("http", 80, 8080, 0)))
	if len(got) != 1 || got[0].State != StateUp {
		t.Errorf("terminating endpoint with serving unset: %+v, want up (serving, kube-proxy's fallback)", got)
	}
	// Not ready and not terminating (a Pod still starting), serving unset or true: down, and no
	// fallback takes it (kube-proxy's takes serving and terminating ones only).
	for _, serving := range []*bool{nil, &tr} {
		es.Endpoints[0].Conditions = discoveryv1.EndpointConditions{Ready: &f, Serving: serving}
		got := fallback(backends([]*discoveryv1.EndpointSlice{es}, port("http", 80, 8080, 0)))
		if len(got) != 1 || got[0].State != StateDown {
			t.Errorf("a starting endpoint (serving %v): %+v, want down", serving != nil, got)
		}
	}
}

// A derivation rejected (a bad ConfigMap edit) keeps the last good config: the API's changes
// no longer reach the kernel. The health check port does not keep answering 200 for a local
// endpoint that is gone, with serviceProxyHealthy true, past ProxyHealthTimeout, though every
// sync succeeds; once the base config is mended, it answers again as the API says.
func TestHealthCheckWhileDerivationRejected(t *testing.T) {
	ctx := context.Background()
	hcPort := freePort(t)
	svc := lbLocal(hcPort)
	es := slice("default", "web", "web-a", "http", 8080, up("10.244.0.5", "self"), up("10.244.1.5", "n1"))
	c := fake.NewClientset(node("self", []string{"10.244.0.0/24"}, "172.18.0.2"), node("n1", []string{"10.244.1.0/24"}, "172.18.0.3"), svc, es)
	base := filepath.Join(t.TempDir(), "base.yaml")
	if err := os.WriteFile(base, []byte(baseYAML), 0o644); err != nil {
		t.Fatal(err)
	}
	s := startSource(t, c, Options{BaseConfigPath: base, HealthChecks: true, HealthCheckAddress: "127.0.0.1", ProxyHealthTimeout: 300 * time.Millisecond})
	agentSyncs(t, s) // every sync succeeds (it applies the last good config)
	eventually(t, "200 with one local endpoint", func() bool { code, n := healthAnswer(hcPort); return code == http.StatusOK && n == 1 })

	if err := os.WriteFile(base, []byte(baseYAML+"bogus: true\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the bad base config to be rejected", func() bool { return len(s.Notes()) > 0 })
	es.Endpoints = es.Endpoints[1:] // this node's endpoint goes
	if _, err := c.DiscoveryV1().EndpointSlices("default").Update(ctx, es, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Second) // > ProxyHealthTimeout
	code, n := healthAnswer(hcPort)
	st := s.Status()
	cfg, _ := s.Config()
	t.Logf("kernel config still has backends: %+v", cfg.LoadBalancer.Services[1].Backends)
	if code == http.StatusOK || st.ServiceProxyHealthy || st.ChangeWaitingSince.IsZero() {
		t.Errorf("health check port: %d with %d local endpoints (serviceProxyHealthy %v, waiting since %v) a second after this node's only endpoint left, while every derivation is rejected; want 503", code, n, st.ServiceProxyHealthy, st.ChangeWaitingSince)
	}
	if err := os.WriteFile(base, []byte(baseYAML), 0o644); err != nil {
		t.Fatal(err)
	}
	eventually(t, "healthy again, 503 for no local endpoint", func() bool {
		code, n := healthAnswer(hcPort)
		return code == http.StatusServiceUnavailable && n == 0 && s.Status().ServiceProxyHealthy
	})
}

// Found by a later review of the Kubernetes mode; each failed before its fix.

// A headless Service (clusterIP None) with spec.externalIPs is not balanced and its IPs are
// not the node's: the API warns "spec.externalIPs is ignored for headless services", and
// kube-proxy skips a Service without a ClusterIP. It had an external front, and its IPs were
// in node.loadBalancerIPs.
func TestHeadlessServiceExternalIPsIgnored(t *testing.T) {
	svc := service("default", "db", corev1.ServiceTypeClusterIP, corev1.ClusterIPNone, port("pg", 5432, 5432, 0))
	svc.Spec.ExternalIPs = []string{"192.0.2.20", "2001:db8::20"}
	snap := Snapshot{
		Nodes:          []*corev1.Node{node("self", []string{"10.244.0.0/24", "fd00:10:244::/64"}, "172.18.0.2", "fc00::2")},
		Services:       []*corev1.Service{svc},
		EndpointSlices: []*discoveryv1.EndpointSlice{slice("default", "db", "db-a", "pg", 5432, up("10.244.0.5", "self"), up("fd00:10:244::5", "self"))},
	}
	for _, policy := range []ServicePolicy{ServicesLabeled, ServicesAll} {
		d, err := Derive(mustBase(t, baseYAML), snap, Params{NodeName: "self", Services: policy})
		if err != nil {
			t.Fatal(err)
		}
		if len(d.Summary.Balanced) > 0 || len(d.Config.LoadBalancer.Services) > 0 {
			t.Errorf("%s: a headless Service balanced: %+v", policy, d.Summary.Balanced)
		}
		if len(d.Config.Node.LoadBalancerIPs) > 0 || len(d.Summary.ExternalIPs) > 0 {
			t.Errorf("%s: node.loadBalancerIPs %v, summary %v: want none from a headless Service", policy, d.Config.Node.LoadBalancerIPs, d.Summary.ExternalIPs)
		}
	}
}

// A node the Node informer's cache does not hold before it has synced (the agent starting, or
// the API unreachable since the start) is eligible, as kube-proxy answers; once synced, a node
// it does not hold was deleted. A lister over an unsynced cache answers NotFound, which was
// read as deleted: /healthz answered 503 at every start.
func TestNodeHealthEligibleUntilSynced(t *testing.T) {
	indexer := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{})
	lister := corelisters.NewNodeLister(indexer)
	synced := false
	h := &nodeHealth{node: func() (*corev1.Node, error) { return lister.Get("self") }, synced: func() bool { return synced }}
	if !h.eligible() {
		t.Errorf("not synced, no node: not eligible; want eligible")
	}
	synced = true
	if h.eligible() {
		t.Errorf("synced, no node: eligible; want not (the node was deleted)")
	}
	if err := indexer.Add(node("self", nil, "172.18.0.2")); err != nil {
		t.Fatal(err)
	}
	if !h.eligible() {
		t.Errorf("synced, the node: not eligible")
	}
}

// The Source's node health check while the Nodes cannot be listed (the API unreachable at
// the start): nodeEligible true.
func TestNodeHealthWhileNodesUnlisted(t *testing.T) {
	port := freePort(t)
	c := fake.NewClientset(node("self", []string{"10.244.0.0/24"}, "172.18.0.2"))
	c.PrependReactor("list", "nodes", func(k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, fmt.Errorf("the API server is unreachable")
	})
	base := filepath.Join(t.TempDir(), "base.yaml")
	if err := os.WriteFile(base, []byte(baseYAML), 0o644); err != nil {
		t.Fatal(err)
	}
	s, err := New(c, Options{NodeName: "self", Log: quietLog(), NodeHealthAddress: fmt.Sprintf("127.0.0.1:%d", port),
		ProbeInterval: 50 * time.Millisecond, BaseConfigPath: base})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { s.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	var eligible *bool
	eventually(t, "the node health check to answer", func() bool { _, eligible = nodeHealthAnswer(port, "/healthz"); return eligible != nil })
	if !*eligible {
		t.Errorf("/healthz before the Nodes are listed: nodeEligible false; want true")
	}
}

// The ConfigMap's empty values are its own, as a config file's: `loadBalancer: {api: {}}`
// turns the local API on (docs/lb.md: a node that gets all its services through the API says
// so), and a static service's `persistence: 0s`, `flowTimeout: 0s`, `healthCheck: {}` or
// `internal: {}` is refused with the error the file gives. The derivation dropped them as
// empty values: the API was off, the others accepted as unset.
func TestEmptyValuesOfTheConfigMap(t *testing.T) {
	snap := Snapshot{Nodes: []*corev1.Node{node("self", []string{"10.244.0.0/24"}, "172.18.0.2")}}
	for _, dr := range []*deriver{nil, new(deriver)} {
		derive := func(base string) (*Derived, error) {
			if dr == nil {
				return Derive(mustBase(t, base), snap, Params{NodeName: "self"})
			}
			return dr.derive(mustBase(t, base), snap, Params{NodeName: "self"})
		}
		d, err := derive(baseYAML + "loadBalancer: {api: {}}\n")
		if err != nil {
			t.Fatal(err)
		}
		if d.Config.LoadBalancer.APIConfig() == nil {
			t.Errorf("loadBalancer: {api: {}}: the local API is off; derived %s", d.JSON)
		}
		for _, bad := range []string{"persistence: 0s", "topology: dsr, interface: eth0, flowTimeout: 0s", "healthCheck: {}", "internal: {}"} {
			lbSection := "loadBalancer: {services: [{name: static, vips: [192.0.2.50], port: 80, " + bad + ", backends: [{address: 10.244.0.9}]}]}\n"
			file := strings.Replace(baseYAML, "  serviceCIDRs:", "  localPodCIDRs: [10.244.0.0/24]\n  serviceCIDRs:", 1) + lbSection
			_, fileErr := config.Parse([]byte(file))
			if fileErr == nil {
				t.Fatalf("%s: the config file is accepted", bad)
			}
			_, err := derive(baseYAML + lbSection)
			if err == nil || !strings.Contains(err.Error(), fileErr.Error()) {
				t.Errorf("%s in the ConfigMap: %v\nwant the config file's error: %v", bad, err, fileErr)
			}
		}
	}
}

// setFields (the names of pointer fields, kept by prune when set) names no other field of the
// config: prune does not know where it is, and would keep that one's empty values.
func TestSetFieldNamesAreOnlyPointers(t *testing.T) {
	walkFields(reflect.TypeFor[config.Config](), map[reflect.Type]bool{}, func(name string, ptr bool) {
		if !ptr && setFields[name] {
			t.Errorf("%s is the name of a pointer field and of another field", name)
		}
	})
	for _, want := range []string{"api", "persistence", "flowTimeout", "healthCheck", "internal"} {
		if !setFields[want] {
			t.Errorf("setFields lacks %s: %v", want, setFields)
		}
	}
}
