package lb

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"net/netip"
	"path/filepath"
	"testing"
	"time"

	"sigs.k8s.io/knftables"
)

// scaleServices is the control-plane bench's shape (bench control-plane, lb-api): n dnat
// services of backends each.
func scaleServices(n, backends int) []Service {
	svcs := make([]Service, 0, n)
	k := 0
	for s := range n {
		svc := Service{Name: fmt.Sprintf("s%d", s), VIPs: []string{netip.AddrFrom4([4]byte{198, 18, byte(s >> 8), byte(s)}).String()},
			Port: 80, Topology: DNAT, Scheduler: RoundRobin}
		for range backends {
			svc.Backends = append(svc.Backends, Backend{Address: netip.AddrFrom4([4]byte{10, byte(k >> 16), byte(k >> 8), byte(k)}).String(), Port: 8080})
			k++
		}
		svcs = append(svcs, svc)
	}
	return svcs
}

// BenchmarkDrainOneOf2000 is one backend drained and undrained among 2,000 services of 5
// backends, as the agent's sync does it (Resolver, Renderer, ApplyChanges) on the Fake: for
// profiles (go test -bench DrainOneOf -cpuprofile), not a pass/fail test.
func BenchmarkDrainOneOf2000(b *testing.B) {
	m, _ := NewFakeManager()
	m.FullEvery = time.Hour
	svcs := scaleServices(2000, 5)
	var rv Resolver
	var rr Renderer
	if _, err := m.Apply(context.Background(), rr.Render(rv.Resolve(svcs, nil, testEnv))); err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	for i := range b.N {
		svcs[7].Backends[2].State = []string{StateDrain, StateUp}[i%2]
		if _, err := m.ApplyChanges(context.Background(), rr.Render(rv.Resolve(svcs, nil, testEnv))); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkDrainOneOf2000Whole is BenchmarkDrainOneOf2000 rendering every service anew
// (Resolve, Render): the whole diff, as before issue 13.
func BenchmarkDrainOneOf2000Whole(b *testing.B) {
	m, _ := NewFakeManager()
	m.FullEvery = time.Hour
	svcs := scaleServices(2000, 5)
	if _, err := m.Apply(context.Background(), Render(Resolve(svcs, nil, testEnv))); err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	for i := range b.N {
		svcs[7].Backends[2].State = []string{StateDrain, StateUp}[i%2]
		if _, err := m.ApplyChanges(context.Background(), Render(Resolve(svcs, nil, testEnv))); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkAPIDrainOneOf2000 is one backend drained and undrained by an API request among
// 2,000 services of 5 backends, through the Runtime (validation, state file, sync) on the
// Fake: for profiles, not a pass/fail test.
func BenchmarkAPIDrainOneOf2000(b *testing.B) {
	cfg := Config{API: &API{Disabled: true}, StateFile: filepath.Join(b.TempDir(), "lb-state.yaml"), Services: scaleServices(2000, 5)}
	r, c, _ := testRuntime(b, cfg)
	r.mgr.FullEvery = time.Hour
	ctx := context.Background()
	b.ResetTimer()
	for i := range b.N {
		state := []string{StateDrain, StateUp}[i%2]
		if err := c.Do(ctx, http.MethodPatch, BackendPath("s7", "10.0.0.37:8080"), map[string]any{"state": state}, nil); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkParseTable5000 reads back the table of 5,000 services of 2 backends as the agent's
// periodic full read does (parseTable of nft's JSON, written with nft 1.0.6's spaces).
func BenchmarkParseTable5000(b *testing.B) {
	m, _ := NewFakeManager()
	var rv Resolver
	var rr Renderer
	if _, err := m.Apply(context.Background(), rr.Render(rv.Resolve(scaleServices(5000, 2), nil, testEnv))); err != nil {
		b.Fatal(err)
	}
	ref := TableRef{Family: knftables.InetFamily, Name: NATTable}
	out, err := m.List(context.Background(), "list", "table", string(ref.Family), ref.Name)
	if err != nil {
		b.Fatal(err)
	}
	out = bytes.ReplaceAll(bytes.ReplaceAll(out, []byte(`","`), []byte(`", "`)), []byte(`":`), []byte(`": `))
	b.SetBytes(int64(len(out)))
	for b.Loop() {
		if _, err := parseTable(ref, out); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkValidateResolve10k is one service of 10,000 backends checked and resolved, as a
// one-shot `apply` of the control-plane bench's lb-one does after the parse: for profiles,
// not a pass/fail test.
func BenchmarkValidateResolve10k(b *testing.B) {
	svcs := scaleServices(1, 10000)
	field := func(int) string { return "services[0]" }
	for b.Loop() {
		if errs := ValidateServices(svcs, field); len(errs) > 0 {
			b.Fatal(errs)
		}
		Resolve(svcs, nil, testEnv)
	}
}
