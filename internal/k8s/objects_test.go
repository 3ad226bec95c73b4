package k8s

import (
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// Builders for the API objects the tests use.

func node(name string, podCIDRs []string, ips ...string) *corev1.Node {
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

func service(ns, name string, typ corev1.ServiceType, clusterIP string, ports ...corev1.ServicePort) *corev1.Service {
	s := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: map[string]string{LabelServiceProxyName: DefaultProxyName}},
		Spec:       corev1.ServiceSpec{Type: typ, ClusterIP: clusterIP, ClusterIPs: []string{clusterIP}, Ports: ports},
	}
	return s
}

func port(name string, p, target, nodePort int32) corev1.ServicePort {
	return corev1.ServicePort{Name: name, Protocol: corev1.ProtocolTCP, Port: p, TargetPort: intstr.FromInt32(target), NodePort: nodePort}
}

type ep struct {
	ip                          string
	ready, serving, terminating bool
	node                        string
}

func slice(ns, svc, name string, portName string, p int32, eps ...ep) *discoveryv1.EndpointSlice {
	proto := corev1.ProtocolTCP
	es := &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Namespace: ns, Name: name, Labels: map[string]string{discoveryv1.LabelServiceName: svc}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: &portName, Port: &p, Protocol: &proto}},
	}
	for _, e := range eps {
		e := e
		es.Endpoints = append(es.Endpoints, discoveryv1.Endpoint{
			Addresses:  []string{e.ip},
			Conditions: discoveryv1.EndpointConditions{Ready: &e.ready, Serving: &e.serving, Terminating: &e.terminating},
			NodeName:   &e.node,
		})
	}
	return es
}

func up(ip, node string) ep       { return ep{ip: ip, ready: true, serving: true, node: node} }
func notReady(ip, node string) ep { return ep{ip: ip, node: node} }
func terminating(ip, node string) ep {
	return ep{ip: ip, serving: true, terminating: true, node: node}
}
