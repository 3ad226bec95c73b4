package k8s

import (
	"fmt"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
)

// scaleSnapshot is the control-plane benchmark's cluster (docs/benchmarks/control-plane.md,
// Kubernetes mode): n ClusterIP Services of one port, each with an EndpointSlice of 2 ready
// endpoints, on n/5 Nodes.
func scaleSnapshot(n int) Snapshot {
	var snap Snapshot
	for i := range max(n/5, 1) {
		name := "self"
		if i > 0 {
			name = fmt.Sprintf("node-%d", i)
		}
		snap.Nodes = append(snap.Nodes, node(name, []string{fmt.Sprintf("10.%d.%d.0/24", 128+i/256, i%256)}, fmt.Sprintf("172.18.%d.%d", i/250, i%250+2)))
	}
	for i := range n {
		name := fmt.Sprintf("svc-%d", i)
		snap.Services = append(snap.Services, service("default", name, corev1.ServiceTypeClusterIP,
			fmt.Sprintf("10.96.%d.%d", i/250, i%250+1), port("http", 80, 8080, 0)))
		snap.EndpointSlices = append(snap.EndpointSlices, slice("default", name, name+"-a", "http", 8080,
			up(fmt.Sprintf("10.%d.%d.%d", 128+i/256%4, i%256, 10), "node-1"), up(fmt.Sprintf("10.%d.%d.%d", 128+i/256%4, i%256, 11), "node-2")))
	}
	return snap
}

// BenchmarkDeriveEndpointChange is one derivation after one EndpointSlice changed, at 5,000
// Services (the Source's derivation, with what it keeps from the last one).
func BenchmarkDeriveEndpointChange(b *testing.B) {
	snap := scaleSnapshot(5000)
	base, err := ParseBase([]byte(baseYAML))
	if err != nil {
		b.Fatal(err)
	}
	p := Params{NodeName: "self"}
	var dr deriver
	if _, err := dr.derive(base, snap, p); err != nil {
		b.Fatal(err)
	}
	cpu0 := cpuTime()
	n := 0
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		n++
		es := snap.EndpointSlices[i%len(snap.EndpointSlices)].DeepCopy()
		ready := i/len(snap.EndpointSlices)%2 == 1
		es.Endpoints[0].Conditions.Ready = &ready
		snap.EndpointSlices = append([]*discoveryv1.EndpointSlice{}, snap.EndpointSlices...)
		snap.EndpointSlices[i%len(snap.EndpointSlices)] = es
		if _, err := dr.derive(base, snap, p); err != nil {
			b.Fatal(err)
		}
	}
	// The process's CPU time (the garbage collector's included), which a busy machine
	// stretches less than the wall time.
	b.ReportMetric(float64((cpuTime()-cpu0).Microseconds())/1000/float64(n), "cpu-ms/op")
}

func cpuTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkDeriveFirst is a first derivation at 5,000 Services (the agent's start, or Derive).
func BenchmarkDeriveFirst(b *testing.B) {
	snap := scaleSnapshot(5000)
	base, err := ParseBase([]byte(baseYAML))
	if err != nil {
		b.Fatal(err)
	}
	p := Params{NodeName: "self"}
	cpu0, n := cpuTime(), 0
	for b.Loop() {
		n++
		if _, err := new(deriver).derive(base, snap, p); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64((cpuTime()-cpu0).Microseconds())/1000/float64(n), "cpu-ms/op")
}
