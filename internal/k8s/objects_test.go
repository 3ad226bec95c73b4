package k8s

import (
	corev1 "k8s.io/api/core/v1"

	"github.com/hostaccel/hostaccel/internal/k8s/k8stest"
)

// Builders for the API objects the tests use (shared with test/k8s in k8stest).

var (
	node        = k8stest.Node
	port        = k8stest.Port
	slice       = k8stest.EndpointSlice
	up          = k8stest.Up
	notReady    = k8stest.NotReady
	terminating = k8stest.Terminating
)

type ep = k8stest.Endpoint

// service returns a Service labelled for hostaccel's load balancer.
func service(ns, name string, typ corev1.ServiceType, clusterIP string, ports ...corev1.ServicePort) *corev1.Service {
	s := k8stest.Service(ns, name, typ, clusterIP, ports...)
	s.Labels = map[string]string{LabelServiceProxyName: DefaultProxyName}
	return s
}
