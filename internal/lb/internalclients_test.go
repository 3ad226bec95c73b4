package lb

import (
	"io"
	"log/slog"
	"net/netip"
	"slices"
	"strings"
	"testing"
)

// A UDP service whose internal clients go to another: when a backend of the serving service
// goes down, the conntrack entries of the internal clients' connections to it (their original
// destination is this service's VIP and port) must be flushed too, as kube-proxy does for a
// node port or load balancer IP of an externalTrafficPolicy Local Service.
func TestInternalClientsFlushConntrack(t *testing.T) {
	svcs := func(state string) []Service {
		return []Service{
			{Name: "cluster", VIPs: []string{"10.96.0.10"}, Port: 53, Protocol: "udp", Topology: DNAT, FlushConntrack: true,
				Backends: []Backend{{Address: "10.244.2.2", Port: 5353, State: state}, {Address: "10.244.3.2", Port: 5353}}},
			{Name: "local", VIPs: []string{"192.0.2.1"}, Port: 30053, Protocol: "udp", Topology: DNAT, FlushConntrack: true,
				Internal: &Internal{Service: "cluster", Sources: []string{"10.244.1.0/24"}, LocalHost: true}},
		}
	}
	for _, s := range [][]Service{svcs(""), svcs(StateDown)} {
		if errs := ValidateServices(s, func(i int) string { return s[i].Name }); len(errs) > 0 {
			t.Fatal(errs)
		}
	}
	type call struct {
		VIPs    []netip.Addr
		Ports   []int
		Backend netip.Addr
	}
	var calls []call
	r := &Runtime{Log: slog.New(slog.NewTextHandler(io.Discard, nil)),
		FlushConntrack: func(fs []ConntrackFlush) error {
			for _, f := range fs {
				calls = append(calls, call{f.VIPs, f.Ports, f.Backend})
			}
			return nil
		}}
	r.flush(Resolve(svcs(""), nil, Env{}), Resolve(svcs(StateDown), nil, Env{}))
	t.Logf("flush calls: %+v", calls)
	if !slices.ContainsFunc(calls, func(c call) bool {
		return slices.Contains(c.VIPs, netip.MustParseAddr("192.0.2.1")) && slices.Contains(c.Ports, 30053) && c.Backend == netip.MustParseAddr("10.244.2.2")
	}) {
		t.Errorf("the internal clients' entries (192.0.2.1 udp/30053 -> 10.244.2.2) are not flushed: only %+v", calls)
	}
}

// Status says who a service's internal clients are and which service serves them.
func TestStatusShowsInternalClients(t *testing.T) {
	var b strings.Builder
	WriteService(&b, ServiceStatus{Name: "local", Origin: "config", Topology: DNAT, Protocol: "tcp", VIPs: []string{"192.0.2.1"}, Ports: []int{80},
		Service: Service{Internal: &Internal{Service: "cluster", Sources: []string{"10.244.0.0/24"}, LocalHost: true}}})
	if want := "internal clients (10.244.0.0/24, this host): served by cluster"; !strings.Contains(b.String(), want) {
		t.Errorf("status:\n%s\nwant %q", b.String(), want)
	}
}

// A UDP backend that leaves by removal (a Pod whose endpoint went terminating-serving, drain,
// then left the EndpointSlice), or with its whole service, has its conntrack entries flushed,
// for the service's own VIPs and for the internal clients it serves, as kube-proxy's
// CleanStaleEntries does for every entry whose reply source is no serving endpoint. Before,
// only backends still in the config that went down were flushed.
func TestRemovedBackendFlushed(t *testing.T) {
	svcs := func(bes ...Backend) []Service {
		return []Service{
			{Name: "cluster", VIPs: []string{"10.96.0.10"}, Port: 53, Protocol: "udp", Topology: DNAT, FlushConntrack: true, Backends: bes},
			{Name: "local", VIPs: []string{"192.0.2.1"}, Port: 30053, Protocol: "udp", Topology: DNAT, FlushConntrack: true,
				Internal: &Internal{Service: "cluster", Sources: []string{"10.244.1.0/24"}, LocalHost: true}},
		}
	}
	gone := Backend{Address: "10.244.2.2", Port: 5353, State: StateDrain}
	stay := Backend{Address: "10.244.3.2", Port: 5353}
	var flushed []string
	calls := 0
	r := &Runtime{Log: slog.New(slog.NewTextHandler(io.Discard, nil)),
		FlushConntrack: func(fs []ConntrackFlush) error {
			calls++
			for _, f := range fs {
				flushed = append(flushed, f.VIPs[0].String()+"->"+f.Backend.String())
			}
			return nil
		}}
	r.flush(Resolve(svcs(gone, stay), nil, Env{}), Resolve(svcs(stay), nil, Env{}))
	if want := []string{"10.96.0.10->10.244.2.2", "192.0.2.1->10.244.2.2"}; !slices.Equal(flushed, want) {
		t.Errorf("backend 10.244.2.2 removed (was drain): flushed %v, want %v", flushed, want)
	}
	flushed = nil
	r.flush(Resolve(svcs(stay), nil, Env{}), Resolve(nil, nil, Env{}))
	if want := []string{"10.96.0.10->10.244.3.2", "192.0.2.1->10.244.3.2"}; !slices.Equal(flushed, want) {
		t.Errorf("both services removed: flushed %v, want %v", flushed, want)
	}
	// one reading of the conntrack table per sync, whatever the number of backends
	if calls != 2 {
		t.Errorf("%d flushes of the conntrack table in two syncs, want 2", calls)
	}
}

// A UDP backend that leaves an internalOnly service (Kubernetes: the short-circuit front, after
// topology hints sent this node's endpoint to another zone) while the service that owns the
// VIPs (the cluster front) and the service whose internal clients it serves (the node port)
// keep it: no entry is flushed, as kube-proxy keeps every entry whose reply source still
// serves the Service. Before, the flush took both the ClusterIP's and the node port's entries
// to it. When it leaves them all, the entries of each are flushed.
func TestInternalOnlyBackendLeavingFlushesWhatNoOneKeeps(t *testing.T) {
	a := Backend{Address: "10.244.0.5", Port: 5353} // this node's endpoint
	b := Backend{Address: "10.244.1.5", Port: 5353} // another node's
	svcs := func(local []Backend, every ...Backend) []Service {
		return []Service{
			{Name: "cluster", VIPs: []string{"10.96.0.10"}, Port: 53, Protocol: "udp", Topology: DNAT, FlushConntrack: true, Backends: local},
			{Name: "every", VIPs: []string{"10.96.0.10"}, Port: 53, Protocol: "udp", Topology: DNAT, FlushConntrack: true, InternalOnly: true, Backends: every},
			{Name: "local", VIPs: []string{"192.0.2.1"}, Port: 30053, Protocol: "udp", Topology: DNAT, FlushConntrack: true, Backends: local,
				Internal: &Internal{Service: "every", Sources: []string{"10.244.0.0/24"}, LocalHost: true}},
		}
	}
	for _, c := range []struct {
		name     string
		from, to []Service
		want     []string
	}{
		{"it leaves the internalOnly service only", svcs([]Backend{a}, a, b), svcs([]Backend{a}, b), nil},
		{"it leaves every service", svcs([]Backend{a}, a, b), svcs(nil, b), []string{"10.96.0.10->10.244.0.5", "192.0.2.1->10.244.0.5"}},
	} {
		for _, s := range [][]Service{c.from, c.to} {
			if errs := ValidateServices(s, func(i int) string { return s[i].Name }); len(errs) > 0 {
				t.Fatal(errs)
			}
		}
		var flushed []string
		r := &Runtime{Log: slog.New(slog.NewTextHandler(io.Discard, nil)),
			FlushConntrack: func(fs []ConntrackFlush) error {
				for _, f := range fs {
					flushed = append(flushed, f.VIPs[0].String()+"->"+f.Backend.String())
				}
				return nil
			}}
		r.flush(Resolve(c.from, nil, Env{}), Resolve(c.to, nil, Env{}))
		slices.Sort(flushed)
		if flushed = slices.Compact(flushed); !slices.Equal(flushed, c.want) {
			t.Errorf("%s: flushed %v, want %v", c.name, flushed, c.want)
		}
	}
}
