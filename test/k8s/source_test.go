package k8s_test

import (
	"context"
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"

	"github.com/hostaccel/hostaccel/internal/config"
	"github.com/hostaccel/hostaccel/internal/k8s"
	"github.com/hostaccel/hostaccel/internal/k8s/k8stest"
	"github.com/hostaccel/hostaccel/internal/lb"
)

const base = `
datapath: flowtable
node:
  gateways: [antrea-gw0]
  transports: [eth0]
classes: {pod-to-pod: true, pod-to-service: true, external-to-nodeport: true, external-to-loadbalancer: true}
`

// startSource runs a Source for node self with client c until the test ends.
func startSource(t *testing.T, c kubernetes.Interface, opts k8s.Options) *k8s.Source {
	t.Helper()
	if opts.NodeName == "" {
		opts.NodeName = "self"
	}
	if opts.BaseConfigPath == "" {
		opts.BaseConfigPath = filepath.Join(t.TempDir(), "config.yaml")
		if err := os.WriteFile(opts.BaseConfigPath, []byte(base), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	opts.Log = testLog(t)
	opts.ProbeInterval = 200 * time.Millisecond
	s, err := k8s.New(c, opts)
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Now()
	k8stest.Run(t, s, 30*time.Second)
	t.Logf("source ready (informers synced, first config derived) in %s", time.Since(t0).Round(time.Millisecond))
	return s
}

func cfg(t *testing.T, s *k8s.Source) *config.Config {
	t.Helper()
	c, err := s.Config()
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// createNode creates a Node (its status too: a Node's create keeps the status) and deletes it
// when the test ends.
func createNode(t *testing.T, n *corev1.Node) {
	t.Helper()
	if _, err := admin.CoreV1().Nodes().Create(context.Background(), n, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { deleteNode(t, n.Name) })
}

func deleteNode(t *testing.T, name string) {
	err := admin.CoreV1().Nodes().Delete(context.Background(), name, metav1.DeleteOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		t.Error(err)
	}
}

// percentile returns the p-th percentile of ds.
func percentile(ds []time.Duration, p int) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[min(len(s)-1, len(s)*p/100)]
}

// Nodes added and removed: the peer set follows within a second.
func TestPeersFollowNodes(t *testing.T) {
	requireEnv(t)
	createNode(t, k8stest.Node("self", []string{"10.244.0.0/24", "fd00:10:244::/64"}, "172.18.0.2", "fc00::2"))
	createNode(t, k8stest.Node("peer-1", []string{"10.244.1.0/24", "fd00:10:244:1::/64"}, "172.18.0.3", "fc00::3"))
	s := startSource(t, admin, k8s.Options{})
	c := cfg(t, s)
	if !slices.Equal(c.Node.LocalPodCIDRs, []string{"10.244.0.0/24", "fd00:10:244::/64"}) ||
		!slices.Equal(c.Node.PeerPodCIDRs, []string{"10.244.1.0/24", "fd00:10:244:1::/64"}) ||
		!slices.Equal(c.Node.NodeIPs, []string{"172.18.0.2", "fc00::2"}) ||
		!slices.Equal(c.Node.PeerNodeIPs, []string{"172.18.0.3", "fc00::3"}) {
		t.Fatalf("initial node section: %+v", c.Node)
	}

	var adds, removes []time.Duration
	for i := 2; i < 12; i++ {
		name := "peer-" + itoa(i)
		cidr := "10.244." + itoa(i) + ".0/24"
		t0 := time.Now()
		createNode(t, k8stest.Node(name, []string{cidr}, "172.18.0."+itoa(i+2)))
		k8stest.WaitFor(t, name+" joins the peer set", 5*time.Second, func() bool { return slices.Contains(cfg(t, s).Node.PeerPodCIDRs, cidr) })
		adds = append(adds, time.Since(t0))
	}
	for i := 2; i < 12; i++ {
		name := "peer-" + itoa(i)
		cidr := "10.244." + itoa(i) + ".0/24"
		t0 := time.Now()
		deleteNode(t, name)
		k8stest.WaitFor(t, name+" leaves the peer set", 5*time.Second, func() bool { return !slices.Contains(cfg(t, s).Node.PeerPodCIDRs, cidr) })
		removes = append(removes, time.Since(t0))
	}
	t.Logf("API write -> derived peer set: add p50 %s max %s; remove p50 %s max %s (debounce 100ms)",
		percentile(adds, 50).Round(time.Millisecond), percentile(adds, 100).Round(time.Millisecond),
		percentile(removes, 50).Round(time.Millisecond), percentile(removes, 100).Round(time.Millisecond))
	if got := cfg(t, s).Node.PeerPodCIDRs; !slices.Equal(got, []string{"10.244.1.0/24", "fd00:10:244:1::/64"}) {
		t.Errorf("peer set after the churn: %v", got)
	}

	// Antrea's hybrid-mode rule: only peers in this node's transport subnet are accelerated.
	createNode(t, k8stest.Node("far", []string{"10.244.99.0/24"}, "192.168.50.7"))
	hybrid := startSource(t, admin, k8s.Options{Peers: k8s.PeersSameSubnet,
		PeerSubnets: []netip.Prefix{netip.MustParsePrefix("172.18.0.0/24"), netip.MustParsePrefix("fc00::/64")}})
	if got := cfg(t, hybrid).Node.PeerPodCIDRs; !slices.Equal(got, []string{"10.244.1.0/24", "fd00:10:244:1::/64"}) {
		t.Errorf("same-subnet peers = %v (far is tunnelled)", got)
	}
	if got := cfg(t, s).Node.PeerPodCIDRs; !slices.Contains(got, "10.244.99.0/24") {
		t.Errorf("peers: all = %v, want far's CIDR too", got)
	}
}

func itoa(i int) string { return strconv.Itoa(i) }

func createNamespace(t *testing.T, name string) {
	t.Helper()
	ctx := context.Background()
	if _, err := admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// Without a controller-manager nothing empties a deleted namespace: delete what the tests
	// create in it, so that later tests start clean.
	t.Cleanup(func() {
		_ = admin.DiscoveryV1().EndpointSlices(name).DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{})
		if l, err := admin.CoreV1().Services(name).List(ctx, metav1.ListOptions{}); err == nil {
			for _, s := range l.Items {
				_ = admin.CoreV1().Services(name).Delete(ctx, s.Name, metav1.DeleteOptions{})
			}
		}
		_ = admin.CoreV1().Namespaces().Delete(ctx, name, metav1.DeleteOptions{})
	})
}

// lbService returns the derived load balancer service for a front of default/web.
func lbService(c *config.Config, ns, front string) *lb.Service {
	for _, s := range c.LoadBalancer.Services {
		if strings.HasPrefix(s.Name, ns+"-web-http-"+front[:4]) {
			return &s
		}
	}
	return nil
}

// A Service with EndpointSlices -> the load balancer's services; endpoints going not ready
// -> drained; sessionAffinity -> persistence.
func TestServicesAndEndpointSlices(t *testing.T) {
	requireEnv(t)
	ctx := context.Background()
	createNode(t, k8stest.Node("self", []string{"10.244.0.0/24"}, "172.18.0.2"))
	createNode(t, k8stest.Node("peer-1", []string{"10.244.1.0/24"}, "172.18.0.3"))
	const ns = "shop"
	createNamespace(t, ns)
	s := startSource(t, admin, k8s.Options{Services: k8s.ServicesLabeled})

	svc, err := admin.CoreV1().Services(ns).Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "web", Labels: map[string]string{k8s.LabelServiceProxyName: k8s.DefaultProxyName}},
		Spec: corev1.ServiceSpec{
			Type:     corev1.ServiceTypeLoadBalancer,
			Selector: map[string]string{"app": "web"},
			Ports:    []corev1.ServicePort{{Name: "http", Port: 80, TargetPort: intstr.FromInt32(8080), Protocol: corev1.ProtocolTCP}},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	clusterIP, nodePort := svc.Spec.ClusterIP, int(svc.Spec.Ports[0].NodePort)
	t.Logf("the API server allocated ClusterIP %s and NodePort %d", clusterIP, nodePort)
	svc.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: "172.18.0.151"}}
	if _, err := admin.CoreV1().Services(ns).UpdateStatus(ctx, svc, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	// A Service kube-proxy keeps (no service-proxy-name label): its LoadBalancer IP still feeds
	// the external-to-loadbalancer class, but hostaccel does not balance it.
	_, err = admin.CoreV1().Services(ns).Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "kube-proxied"},
		Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeClusterIP, ExternalIPs: []string{"203.0.113.9"},
			Ports: []corev1.ServicePort{{Port: 53, Protocol: corev1.ProtocolUDP}}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	es := k8stest.EndpointSlice(ns, "web", "web-1", "http", 8080,
		k8stest.Up("10.244.0.10", "self"),
		k8stest.Up("10.244.1.10", "peer-1"))
	if es, err = admin.DiscoveryV1().EndpointSlices(ns).Create(ctx, es, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	es2 := k8stest.EndpointSlice(ns, "web", "web-2", "http", 8080, k8stest.Up("10.244.1.11", "peer-1"))
	if _, err = admin.DiscoveryV1().EndpointSlices(ns).Create(ctx, es2, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	backends := func(states ...string) []lb.Backend {
		var out []lb.Backend
		for i, a := range []string{"10.244.0.10", "10.244.1.10", "10.244.1.11"} {
			out = append(out, lb.Backend{Address: a, Port: 8080, State: states[i]})
		}
		return out
	}
	want := func(persistence *lb.Duration, states ...string) map[string]lb.Service {
		return map[string]lb.Service{
			// (clients other than this node's Pods are masqueraded: off the cluster, the node)
			"cluster": {VIPs: []string{clusterIP}, Port: 80, Protocol: "tcp", Topology: lb.DNAT, Hairpin: true, MasqueradeExcept: []string{"10.244.0.0/24"},
				Persistence: persistence, Backends: backends(states...)},
			// NodePort: this node's IPs; externalTrafficPolicy Cluster masquerades.
			"nodeport": {VIPs: []string{"172.18.0.2"}, Port: nodePort, Protocol: "tcp", Topology: lb.SNAT, Persistence: persistence, Backends: backends(states...)},
			"external": {VIPs: []string{"172.18.0.151"}, Port: 80, Protocol: "tcp", Topology: lb.SNAT, Persistence: persistence, Backends: backends(states...)},
		}
	}
	matches := func(w map[string]lb.Service) bool {
		c := cfg(t, s)
		if len(c.LoadBalancer.Services) != len(w) {
			return false
		}
		for front, ws := range w {
			got := lbService(c, ns, front)
			if got == nil {
				return false
			}
			ws.Name = got.Name
			if !reflect.DeepEqual(*got, ws) {
				return false
			}
		}
		return true
	}
	dump := func() string {
		y, _ := s.Derived().YAML()
		return string(y)
	}
	d := k8stest.WaitFor(t, "the Service's load balancer services", 5*time.Second, func() bool {
		return matches(want(nil, lb.StateUp, lb.StateUp, lb.StateUp))
	})
	t.Logf("Service + EndpointSlices -> 3 load balancer services (cluster, nodeport, external) in %s", d.Round(time.Millisecond))
	if got := cfg(t, s).Node.LoadBalancerIPs; !slices.Equal(got, []string{"172.18.0.151/32", "203.0.113.9/32"}) {
		t.Errorf("loadBalancerIPs = %v", got)
	}

	// 10.244.1.10 goes not ready (readiness probe failing): down (no new connections, nor
	// session-affinity clients; established ones keep it).
	es.Endpoints[1].Conditions.Ready = ptr(false)
	es.Endpoints[1].Conditions.Serving = ptr(false)
	if es, err = admin.DiscoveryV1().EndpointSlices(ns).Update(ctx, es, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	d = k8stest.WaitFor(t, "not-ready endpoint down", 5*time.Second, func() bool {
		return matches(want(nil, lb.StateUp, lb.StateDown, lb.StateUp))
	})
	t.Logf("endpoint not ready -> backend down in %s", d.Round(time.Millisecond))

	// 10.244.0.10 terminates (serving while it shuts down): drained, another is ready.
	es.Endpoints[0].Conditions.Ready = ptr(false)
	es.Endpoints[0].Conditions.Serving = ptr(true)
	es.Endpoints[0].Conditions.Terminating = ptr(true)
	if es, err = admin.DiscoveryV1().EndpointSlices(ns).Update(ctx, es, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	k8stest.WaitFor(t, "terminating endpoint drained", 5*time.Second, func() bool {
		return matches(want(nil, lb.StateDrain, lb.StateDown, lb.StateUp))
	})

	// sessionAffinity: ClientIP -> persistence (timeoutSeconds, default 3h).
	svc, err = admin.CoreV1().Services(ns).Get(ctx, "web", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	svc.Spec.SessionAffinity = corev1.ServiceAffinityClientIP
	svc.Spec.SessionAffinityConfig = &corev1.SessionAffinityConfig{ClientIP: &corev1.ClientIPConfig{TimeoutSeconds: ptr(int32(900))}}
	if _, err := admin.CoreV1().Services(ns).Update(ctx, svc, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	d = k8stest.WaitFor(t, "persistence", 5*time.Second, func() bool {
		return matches(want(lb.D(900*time.Second), lb.StateDrain, lb.StateDown, lb.StateUp))
	})
	t.Logf("sessionAffinity ClientIP -> persistence 15m in %s", d.Round(time.Millisecond))

	// The slice goes away (Pods deleted): its backends leave the services.
	if err := admin.DiscoveryV1().EndpointSlices(ns).Delete(ctx, "web-1", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	k8stest.WaitFor(t, "backends of a deleted slice removed", 5*time.Second, func() bool {
		c := cfg(t, s)
		f := lbService(c, ns, "cluster")
		return f != nil && len(f.Backends) == 1 && f.Backends[0].Address == "10.244.1.11"
	})
	// Unlabeled: hostaccel steps back, kube-proxy's again.
	svc, _ = admin.CoreV1().Services(ns).Get(ctx, "web", metav1.GetOptions{})
	delete(svc.Labels, k8s.LabelServiceProxyName)
	if _, err := admin.CoreV1().Services(ns).Update(ctx, svc, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	k8stest.WaitFor(t, "unlabeled Service no longer balanced", 5*time.Second, func() bool { return len(cfg(t, s).LoadBalancer.Services) == 0 })
	if t.Failed() {
		t.Log(dump())
	}
}

func ptr[T any](v T) *T { return &v }

// The API server stops: the source keeps its config and says it is disconnected; the server
// comes back: the source reconnects, and the config follows the API again.
func TestAPIServerRestart(t *testing.T) {
	requireEnv(t)
	ctx := context.Background()
	createNode(t, k8stest.Node("self", []string{"10.244.0.0/24"}, "172.18.0.2"))
	createNode(t, k8stest.Node("peer-1", []string{"10.244.1.0/24"}, "172.18.0.3"))
	s := startSource(t, admin, k8s.Options{})
	before := cfg(t, s)
	k8stest.WaitFor(t, "connected", 5*time.Second, func() bool { return s.Status().Connected })

	env.KillAPIServer()
	d := k8stest.WaitFor(t, "disconnected", 10*time.Second, func() bool { return !s.Status().Connected })
	t.Logf("source reports disconnected %s after the stop", d.Round(time.Millisecond))
	time.Sleep(2 * time.Second) // informers retry meanwhile
	st := s.Status()
	if st.DisconnectedSince.IsZero() || st.LastAPIError == "" {
		t.Errorf("status while down: %+v", st)
	}
	notes := s.Notes()
	if len(notes) != 1 || !strings.Contains(notes[0], "unreachable since") || !strings.Contains(notes[0], "keeping the last applied state") {
		t.Errorf("notes while down: %q", notes)
	}
	if c := cfg(t, s); !reflect.DeepEqual(c, before) {
		t.Errorf("the config changed while the API server was down:\n%+v\n%+v", c, before)
	}
	t.Logf("while down: %s", notes[0])

	t0 := time.Now()
	if err := env.StartAPIServer(ctx); err != nil {
		t.Fatal(err)
	}
	t.Logf("kube-apiserver ready again in %s", time.Since(t0).Round(time.Millisecond))
	d = k8stest.WaitFor(t, "reconnected", 10*time.Second, func() bool { return s.Status().Connected && len(s.Notes()) == 0 })
	t.Logf("source reconnected %s after /readyz", d.Round(time.Millisecond))

	// The informers watch again: a change after the restart is followed.
	t0 = time.Now()
	createNode(t, k8stest.Node("peer-2", []string{"10.244.2.0/24"}, "172.18.0.4"))
	deleteNode(t, "peer-1")
	d = k8stest.WaitFor(t, "resync after the restart", 60*time.Second, func() bool {
		return slices.Equal(cfg(t, s).Node.PeerPodCIDRs, []string{"10.244.2.0/24"})
	})
	t.Logf("first change after the restart followed in %s (includes the informers' watch retry backoff)", d.Round(time.Millisecond))
}

// The deploy/ manifests apply to a real API server, and their RBAC is enough for the agent:
// the source runs with a token of the hostaccel ServiceAccount, bound to exactly that role,
// and that token can do nothing else of note.
func TestDeployManifestsRBAC(t *testing.T) {
	requireEnv(t)
	ctx := context.Background()
	_, file, _, _ := runtime.Caller(0)
	deploy := filepath.Join(filepath.Dir(file), "..", "..", "deploy")
	out, err := env.Kubectl(ctx, "apply", "--server-side", "-k", deploy)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("kubectl apply -k deploy/:\n%s", strings.TrimSpace(out))
	t.Cleanup(func() {
		_, _ = env.Kubectl(context.Background(), "delete", "--ignore-not-found", "--wait=false", "-k", deploy)
	})

	token, err := env.ServiceAccountToken(ctx, "hostaccel-system", "hostaccel", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	agent, err := kubernetes.NewForConfig(env.Config(token))
	if err != nil {
		t.Fatal(err)
	}
	createNode(t, k8stest.Node("self", []string{"10.244.0.0/24"}, "172.18.0.2"))
	createNode(t, k8stest.Node("peer-1", []string{"10.244.1.0/24"}, "172.18.0.3"))
	// Every informer (EndpointSlices too: services labeled) and the probe, with the agent's token.
	s := startSource(t, agent, k8s.Options{Services: k8s.ServicesLabeled})
	if got := cfg(t, s).Node.PeerPodCIDRs; !slices.Equal(got, []string{"10.244.1.0/24"}) {
		t.Errorf("peers with the agent's token: %v", got)
	}
	k8stest.WaitFor(t, "connected with the agent's token", 5*time.Second, func() bool { return s.Status().Connected })
	if st := s.Status(); st.LastAPIError != "" {
		t.Errorf("API error with the agent's token: %s", st.LastAPIError)
	}

	// And nothing more: no writes, no Secrets, no Pods.
	allowed := func(verb, group, resource string) bool {
		r, err := agent.AuthorizationV1().SelfSubjectAccessReviews().Create(ctx, &authorizationv1.SelfSubjectAccessReview{
			Spec: authorizationv1.SelfSubjectAccessReviewSpec{ResourceAttributes: &authorizationv1.ResourceAttributes{
				Verb: verb, Group: group, Resource: resource}},
		}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return r.Status.Allowed
	}
	for _, r := range []struct{ group, resource string }{{"", "nodes"}, {"", "services"}, {"discovery.k8s.io", "endpointslices"}} {
		for _, v := range []string{"get", "list", "watch"} {
			if !allowed(v, r.group, r.resource) {
				t.Errorf("%s %s denied", v, r.resource)
			}
		}
		for _, v := range []string{"create", "update", "patch", "delete"} {
			if allowed(v, r.group, r.resource) {
				t.Errorf("%s %s allowed: more than the agent needs", v, r.resource)
			}
		}
	}
	for _, r := range []struct{ group, resource string }{{"", "secrets"}, {"", "pods"}, {"", "configmaps"}, {"", "endpoints"}} {
		if allowed("list", r.group, r.resource) {
			t.Errorf("list %s allowed: more than the agent needs", r.resource)
		}
	}
	if _, err := agent.CoreV1().Nodes().Create(ctx, k8stest.Node("intruder", nil), metav1.CreateOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("creating a Node with the agent's token: %v, want Forbidden", err)
	}

	// A ServiceAccount without the role gets no config, and the error says why.
	if _, err := admin.CoreV1().ServiceAccounts("hostaccel-system").Create(ctx,
		&corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "nobody"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	token, err = env.ServiceAccountToken(ctx, "hostaccel-system", "nobody", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	nobody, err := kubernetes.NewForConfig(env.Config(token))
	if err != nil {
		t.Fatal(err)
	}
	src, err := k8s.New(nobody, k8s.Options{NodeName: "self", Log: testLog(t), ProbeInterval: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { src.Run(rctx); close(done) }()
	wctx, wcancel := context.WithTimeout(ctx, 3*time.Second)
	err = src.WaitReady(wctx)
	wcancel()
	cancel()
	<-done
	if err == nil || !strings.Contains(err.Error(), "forbidden") {
		t.Errorf("a source without the role: %v, want a forbidden error", err)
	} else {
		t.Logf("without the role: %v", err)
	}
}
