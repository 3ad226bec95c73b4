package k8s

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/hostaccel/hostaccel/internal/config"
)

// freePort is a TCP port no one listens on at the moment.
func freePort(t *testing.T) int32 {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return int32(ln.Addr().(*net.TCPAddr).Port)
}

// healthAnswer asks a health check port as a cloud load balancer does: its status code and
// the local endpoints it reports (-1: no answer).
func healthAnswer(port int32) (int, int) {
	resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/healthz", port))
	if err != nil {
		return 0, -1
	}
	defer resp.Body.Close()
	var body struct {
		Service        struct{ Namespace, Name string }
		LocalEndpoints int `json:"localEndpoints"`
	}
	if json.NewDecoder(resp.Body).Decode(&body) != nil || body.Service.Name != "web" {
		return resp.StatusCode, -1
	}
	return resp.StatusCode, body.LocalEndpoints
}

// The agent answers the healthCheckNodePort of a balanced LoadBalancer Service with
// externalTrafficPolicy Local as kube-proxy does: 200 while this node has ready endpoints of
// it, 503 when it has none; the port closes when the Service goes.
func TestSourceAnswersHealthCheckNodePorts(t *testing.T) {
	ctx := context.Background()
	hcPort := freePort(t)
	svc := service("default", "web", corev1.ServiceTypeLoadBalancer, "10.96.0.10", port("http", 80, 8080, 30080))
	svc.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
	svc.Spec.HealthCheckNodePort = hcPort
	es := slice("default", "web", "web-a", "http", 8080, up("10.244.0.5", "self"), up("10.244.1.5", "n1"))
	c := fake.NewClientset(node("self", []string{"10.244.0.0/24"}, "172.18.0.2"), node("n1", []string{"10.244.1.0/24"}, "172.18.0.3"), svc, es)
	s := startSource(t, c, Options{HealthChecks: true, HealthCheckAddress: "127.0.0.1"})
	agentSyncs(t, s)
	eventually(t, "200 with one local endpoint", func() bool {
		code, n := healthAnswer(hcPort)
		return code == http.StatusOK && n == 1
	})
	if st := s.Status(); len(st.HealthChecks) != 1 || st.HealthChecks[0].Port != hcPort {
		t.Errorf("status: %+v", st.HealthChecks)
	}

	// This node's endpoint leaves (the Pod moved): 503, so that the cloud sends elsewhere.
	es.Endpoints = es.Endpoints[1:]
	if _, err := c.DiscoveryV1().EndpointSlices("default").Update(ctx, es, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "503 with no local endpoint", func() bool {
		code, n := healthAnswer(hcPort)
		return code == http.StatusServiceUnavailable && n == 0
	})

	// Back, then the Service goes: the port closes.
	es.Endpoints = append(es.Endpoints, discoveryv1.Endpoint{Addresses: []string{"10.244.0.6"}, NodeName: ptr("self")})
	if _, err := c.DiscoveryV1().EndpointSlices("default").Update(ctx, es, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "200 again", func() bool { code, _ := healthAnswer(hcPort); return code == http.StatusOK })
	if err := c.CoreV1().Services("default").Delete(ctx, "web", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the port to close", func() bool { code, _ := healthAnswer(hcPort); return code == 0 })
}

// agentSyncs plays the agent: it puts the Source's config in the kernel every 20 ms, and
// succeeds, until the test ends.
func agentSyncs(t *testing.T, s *Source) {
	stop, done := make(chan struct{}), make(chan struct{})
	t.Cleanup(func() { close(stop); <-done })
	go func() {
		defer close(done)
		for {
			if cfg, err := s.Config(); err == nil {
				s.Synced(cfg, nil)
			}
			select {
			case <-stop:
				return
			case <-time.After(20 * time.Millisecond):
			}
		}
	}()
}

// A health check port answers for the rules in the kernel, as kube-proxy's (which syncs its
// ports after its rules): a new local endpoint counts once a sync has put the config that
// has it in the kernel, not when it is derived. Before, the port answered 200 for it up to a
// sync (~1 s) before this node's rules sent it traffic.
func TestHealthCheckFollowsTheKernel(t *testing.T) {
	ctx := context.Background()
	hcPort := freePort(t)
	es := slice("default", "web", "web-a", "http", 8080, up("10.244.0.5", "self"), up("10.244.1.5", "n1"))
	c := fake.NewClientset(node("self", []string{"10.244.0.0/24"}, "172.18.0.2"), node("n1", []string{"10.244.1.0/24"}, "172.18.0.3"), lbLocal(hcPort), es)
	s := startSource(t, c, Options{HealthChecks: true, HealthCheckAddress: "127.0.0.1"})
	first, err := s.Config()
	if err != nil {
		t.Fatal(err)
	}
	if code, _ := healthAnswer(hcPort); code != 0 {
		t.Errorf("before the agent's first sync the port answers %d, want none (its rules are not in the kernel)", code)
	}
	s.Synced(first, errors.New("a failed sync"))
	if code, _ := healthAnswer(hcPort); code != 0 {
		t.Errorf("after a failed sync the port answers %d, want none", code)
	}
	s.Synced(first, nil)
	if code, n := healthAnswer(hcPort); code != http.StatusOK || n != 1 {
		t.Fatalf("after the sync: %d with %d local endpoints, want 200 with 1", code, n)
	}

	// a second local endpoint: derived, not yet in the kernel
	es.Endpoints = append(es.Endpoints, discoveryv1.Endpoint{Addresses: []string{"10.244.0.6"}, NodeName: ptr("self")})
	if _, err := c.DiscoveryV1().EndpointSlices("default").Update(ctx, es, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	var second *config.Config
	eventually(t, "the new endpoint derived", func() bool { second, _ = s.Config(); return second != first })
	time.Sleep(100 * time.Millisecond)
	if code, n := healthAnswer(hcPort); n != 1 {
		t.Errorf("derived, not synced: %d with %d local endpoints, want 1 (the kernel's)", code, n)
	}
	s.Synced(first, nil) // a sync of the older config (it started before the derivation)
	if code, n := healthAnswer(hcPort); n != 1 {
		t.Errorf("after a sync of the older config: %d with %d local endpoints, want 1", code, n)
	}
	s.Synced(second, nil)
	if code, n := healthAnswer(hcPort); code != http.StatusOK || n != 2 {
		t.Errorf("after the sync of the new config: %d with %d local endpoints, want 200 with 2", code, n)
	}
}

// Only balanced LoadBalancer Services with externalTrafficPolicy Local and a port have one,
// which counts the endpoints of the fronts of external clients (not the cluster or
// short-circuit fronts, which have other nodes' too).
func TestHealthChecksOfServices(t *testing.T) {
	lb := func(name string, local bool, hc int32) *corev1.Service {
		s := service("default", name, corev1.ServiceTypeLoadBalancer, "10.96.0.10", port("http", 80, 8080, 30080))
		if local {
			s.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
		}
		s.Spec.HealthCheckNodePort = hc
		return s
	}
	svcs := []*corev1.Service{lb("web", true, 32000), lb("cluster-policy", false, 0), lb("unbalanced", true, 32001), lb("none-here", true, 32002)}
	balanced := []LBFront{
		{Namespace: "default", Service: "web", Front: FrontCluster, Backends: []LBBackend{{Address: "10.244.1.5", State: StateUp}}},
		// (internalTrafficPolicy Local too: every node's endpoints, for this node's own clients)
		{Namespace: "default", Service: "web", Front: FrontShortCircuit, InternalOnly: true, Backends: []LBBackend{{Address: "10.244.1.5", State: StateUp}, {Address: "10.244.0.5", State: StateUp}}},
		{Namespace: "default", Service: "web", Front: FrontNodePort, Backends: []LBBackend{{Address: "10.244.0.5", State: StateUp}, {Address: "10.244.0.6", State: StateDrain}}},
		{Namespace: "default", Service: "web", Front: FrontExternal, Backends: []LBBackend{{Address: "10.244.0.5", State: StateUp}}},
		{Namespace: "default", Service: "cluster-policy", Front: FrontNodePort, Backends: []LBBackend{{Address: "10.244.0.7", State: StateUp}}},
		{Namespace: "default", Service: "none-here", Front: FrontNodePort, Skipped: "no endpoints"},
	}
	got := healthChecks(svcs, balanced)
	want := []HealthCheckPort{{"default", "web", 32000, 1}, {"default", "none-here", 32002, 0}}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("health checks %v, want %v", got, want)
	}
}

func lbLocal(hc int32) *corev1.Service {
	svc := service("default", "web", corev1.ServiceTypeLoadBalancer, "10.96.0.10", port("http", 80, 8080, 30080))
	svc.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
	svc.Spec.HealthCheckNodePort = hc
	return svc
}

// KEP-1669 / kube-proxy (getLocalReadyEndpointIPs): the health check counts only READY local
// endpoints; a node whose only local endpoints terminate must answer 503 so that the cloud LB
// drains it, even though traffic that still arrives is sent to the terminating Pod.
func TestHealthCheckTerminatingOnlyIs503(t *testing.T) {
	hcPort := freePort(t)
	es := slice("default", "web", "web-a", "http", 8080, terminating("10.244.0.5", "self"), up("10.244.1.5", "n1"))
	c := fake.NewClientset(node("self", []string{"10.244.0.0/24"}, "172.18.0.2"), node("n1", []string{"10.244.1.0/24"}, "172.18.0.3"), lbLocal(hcPort), es)
	agentSyncs(t, startSource(t, c, Options{HealthChecks: true, HealthCheckAddress: "127.0.0.1"}))
	var code, n int
	eventually(t, "an answer", func() bool { code, n = healthAnswer(hcPort); return code != 0 })
	time.Sleep(200 * time.Millisecond)
	code, n = healthAnswer(hcPort)
	if code != http.StatusServiceUnavailable || n != 0 {
		t.Errorf("only a terminating local endpoint: got %d localEndpoints=%d, want 503 localEndpoints=0 (kube-proxy)", code, n)
	}
}

// A health check port that was taken when the Service appeared is listened on once it is free,
// although the cluster is quiet (no derivation follows): before, only the next API event did.
func TestHealthCheckBusyPortRetried(t *testing.T) {
	hcPort := freePort(t)
	holder, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", hcPort))
	if err != nil {
		t.Fatal(err)
	}
	es := slice("default", "web", "web-a", "http", 8080, up("10.244.0.5", "self"))
	c := fake.NewClientset(node("self", []string{"10.244.0.0/24"}, "172.18.0.2"), lbLocal(hcPort), es)
	agentSyncs(t, startSource(t, c, Options{HealthChecks: true, HealthCheckAddress: "127.0.0.1"}))
	holder.Close() // the other owner goes away
	eventually(t, "the freed port to be served", func() bool {
		code, _ := healthAnswer(hcPort)
		return code == http.StatusOK
	})
}

// kube-proxy sets X-Load-Balancing-Endpoint-Weight to the count.
func TestHealthCheckWeightHeader(t *testing.T) {
	hcPort := freePort(t)
	h := &healthServer{addr: "127.0.0.1", log: quietLog()}
	defer h.Close()
	h.Sync([]HealthCheckPort{{"default", "web", hcPort, 3}})
	resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/", hcPort))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if w := resp.Header.Get("X-Load-Balancing-Endpoint-Weight"); w != "3" {
		t.Errorf("X-Load-Balancing-Endpoint-Weight %q, want 3", w)
	}
}

// kube-proxy answers 503 also with local endpoints while it is unhealthy: a change has waited
// longer than its health timeout for a sync that succeeds (its rules are stale), so that the
// cloud's load balancer leaves the node. The agent tells the Source each sync's outcome.
func TestHealthCheckProxyUnhealthyIs503(t *testing.T) {
	now := time.Unix(1000, 0)
	p := newProxyHealth(time.Minute, func() time.Time { return now })
	hcPort := freePort(t)
	h := &healthServer{addr: "127.0.0.1", log: quietLog(), proxy: p}
	defer h.Close()
	h.Sync([]HealthCheckPort{{"default", "web", hcPort, 3}})
	ask := func(what string, wantCode int, wantHealthy bool) {
		t.Helper()
		resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/healthz", hcPort))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var body struct {
			LocalEndpoints      int  `json:"localEndpoints"`
			ServiceProxyHealthy bool `json:"serviceProxyHealthy"`
		}
		if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
			t.Fatal(err)
		}
		if resp.StatusCode != wantCode || body.ServiceProxyHealthy != wantHealthy || body.LocalEndpoints != 3 ||
			resp.Header.Get("X-Load-Balancing-Endpoint-Weight") != "3" {
			t.Errorf("%s: %d %+v weight %q, want %d serviceProxyHealthy %v with 3 local endpoints",
				what, resp.StatusCode, body, resp.Header.Get("X-Load-Balancing-Endpoint-Weight"), wantCode, wantHealthy)
		}
	}
	ask("started, no sync yet", http.StatusOK, true)
	now = now.Add(61 * time.Second)
	ask("no sync a minute after the start", http.StatusServiceUnavailable, false)
	p.synced(nil)
	ask("synced", http.StatusOK, true)
	now = now.Add(time.Hour)
	ask("an hour of nothing to do", http.StatusOK, true)
	p.synced(errors.New("nft: no such file"))
	now = now.Add(59 * time.Second)
	p.synced(errors.New("nft: no such file")) // the wait runs from the first failure
	ask("failing for 59 s", http.StatusOK, true)
	now = now.Add(2 * time.Second)
	ask("failing for 61 s", http.StatusServiceUnavailable, false)
	p.synced(nil)
	ask("synced again", http.StatusOK, true)
	p.changed() // derived, and the agent never syncs it (stuck)
	now = now.Add(61 * time.Second)
	ask("a change waiting 61 s", http.StatusServiceUnavailable, false)
}
