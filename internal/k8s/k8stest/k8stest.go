// Package k8stest holds what the tests of the Kubernetes mode share, against
// client-go's fake clientset (internal/k8s) and against a real API server
// (test/k8s): builders of the API objects and the running of a Source.
//
// It does not import internal/k8s, so that package's own tests can use it.
package k8stest

import (
	"context"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// Node returns a Node with its Pod CIDRs (the first also as spec.podCIDR), ips as
// InternalIP addresses and its name as Hostname address.
func Node(name string, podCIDRs []string, ips ...string) *corev1.Node {
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: corev1.NodeSpec{PodCIDRs: podCIDRs}}
	if len(podCIDRs) > 0 {
		n.Spec.PodCIDR = podCIDRs[0]
	}
	for _, ip := range ips {
		n.Status.Addresses = append(n.Status.Addresses, corev1.NodeAddress{Type: corev1.NodeInternalIP, Address: ip})
	}
	n.Status.Addresses = append(n.Status.Addresses, corev1.NodeAddress{Type: corev1.NodeHostName, Address: name})
	return n
}

// Service returns a Service of type typ with one ClusterIP and ports.
func Service(ns, name string, typ corev1.ServiceType, clusterIP string, ports ...corev1.ServicePort) *corev1.Service {
	return &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec:       corev1.ServiceSpec{Type: typ, ClusterIP: clusterIP, ClusterIPs: []string{clusterIP}, Ports: ports},
	}
}

// Port returns a TCP Service port.
func Port(name string, port, target, nodePort int32) corev1.ServicePort {
	return corev1.ServicePort{Name: name, Protocol: corev1.ProtocolTCP, Port: port, TargetPort: intstr.FromInt32(target), NodePort: nodePort}
}

// Endpoint is one address of an EndpointSlice with its conditions.
type Endpoint struct {
	IP, Node                    string
	Ready, Serving, Terminating bool
}

// Up is a ready endpoint on node.
func Up(ip, node string) Endpoint { return Endpoint{IP: ip, Node: node, Ready: true, Serving: true} }

// NotReady is an endpoint on node that is neither ready nor serving.
func NotReady(ip, node string) Endpoint { return Endpoint{IP: ip, Node: node} }

// Terminating is an endpoint on node that still serves while it terminates.
func Terminating(ip, node string) Endpoint {
	return Endpoint{IP: ip, Node: node, Serving: true, Terminating: true}
}

// EndpointSlice returns an IPv4 EndpointSlice of Service svc with one TCP port.
func EndpointSlice(ns, svc, name, portName string, port int32, eps ...Endpoint) *discoveryv1.EndpointSlice {
	proto := corev1.ProtocolTCP
	es := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: map[string]string{
			discoveryv1.LabelServiceName: svc, discoveryv1.LabelManagedBy: "hostaccel-test"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: &portName, Port: &port, Protocol: &proto}},
	}
	for _, e := range eps {
		es.Endpoints = append(es.Endpoints, discoveryv1.Endpoint{
			Addresses:  []string{e.IP},
			NodeName:   &e.Node,
			Conditions: discoveryv1.EndpointConditions{Ready: &e.Ready, Serving: &e.Serving, Terminating: &e.Terminating},
		})
	}
	return es
}

// Runner is what Run starts: a k8s.Source.
type Runner interface {
	Run(ctx context.Context)
	WaitReady(ctx context.Context) error
}

// Run runs r until the test ends and waits up to timeout for it to be ready,
// failing t if it is not.
func Run(t testing.TB, r Runner, timeout time.Duration) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { r.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	wctx, wcancel := context.WithTimeout(ctx, timeout)
	defer wcancel()
	if err := r.WaitReady(wctx); err != nil {
		t.Fatal(err)
	}
}

// WaitFor polls cond every 5ms until it holds and returns how long that took,
// failing t if it does not hold within timeout.
func WaitFor(t testing.TB, what string, timeout time.Duration, cond func() bool) time.Duration {
	t.Helper()
	t0 := time.Now()
	for !cond() {
		if time.Since(t0) > timeout {
			t.Fatalf("%s: not within %s", what, timeout)
		}
		time.Sleep(5 * time.Millisecond)
	}
	return time.Since(t0)
}
