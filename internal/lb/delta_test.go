package lb

import (
	"context"
	"fmt"
	"maps"
	"math/rand/v2"
	"reflect"
	"slices"
	"testing"
	"time"

	"sigs.k8s.io/knftables"
)

// incSet is many dnat services (the control-plane bench's shape) and one of each other
// topology, with persistence on one.
func incSet(n int) []Service {
	svcs := scaleServices(n, 5)
	p := rename(fixture(DNAT, Weighted), "sticky", "192.0.2.20")
	p.Persistence = D(time.Minute)
	for i := range p.Backends {
		p.Backends[i].Port = 8081
	}
	return append(svcs, append(svcSet(), p)...)
}

// withBackend returns svcs with service i's backend j changed by fn, as the API changes
// one: a new Service with a new backend slice, the others shared.
func withBackend(svcs []Service, i, j int, fn func(*Backend)) []Service {
	out := slices.Clone(svcs)
	out[i].Backends = slices.Clone(out[i].Backends)
	fn(&out[i].Backends[j])
	return out
}

// An API drain among hundreds of services resolves, renders and diffs that service only:
// the others keep their *ServiceState and their part of the table (the same objects), the
// apply's scope is the table's own objects and that service's, and the transaction is a
// handful of operations.
func TestSyncOfOneServiceDiffsThatService(t *testing.T) {
	m, f := NewFakeManager()
	m.FullEvery = time.Hour
	var rv Resolver
	var rr Renderer
	ctx := context.Background()
	svcs := incSet(300)
	d0 := rv.Resolve(svcs, nil, testEnv)
	r0 := rr.Render(d0)
	if _, err := m.Apply(ctx, r0); err != nil {
		t.Fatal(err)
	}
	for _, step := range []struct {
		what    string
		state   string
		changes bool // the kernel (a drained backend going down changes nothing there)
	}{{"drain", StateDrain, true}, {"down", StateDown, false}, {"up again", "", true}} {
		svcs = withBackend(svcs, 7, 2, func(b *Backend) { b.State = step.state })
		d := rv.Resolve(svcs, nil, testEnv)
		for i, ss := range d.Services {
			if (ss == d0.Services[i]) != (i != 7) {
				t.Fatalf("%s: service %d resolved anew: %v (only the changed one must be)", step.what, i, ss != d0.Services[i])
			}
		}
		r := rr.Render(d)
		var changed []string
		for _, tb := range r.Tables {
			was := tableOf(r0, tb.ref())
			for i, p := range tb.parts {
				if i >= len(was.parts) || p != was.parts[i] {
					changed = append(changed, tb.Name+" "+p.owner)
				}
			}
		}
		// Each table's own part is rendered anew (a few objects), of the services' only s7's.
		if want := []string{NATTable + " ", NATTable + " s7", IngressTablePrefix + "eth0 ", IngressTablePrefix + "eth1 "}; !slices.Equal(changed, want) {
			t.Errorf("%s: parts rendered anew %q, want the tables' own and s7's: %q", step.what, changed, want)
		}
		nat := tableOf(r, TableRef{knftables.InetFamily, NATTable})
		s, ok := scopeOf(m.cache.rendered[nat.ref()], nat, m.cache.tables[nat.ref()])
		if !ok {
			t.Fatalf("%s: no partial scope", step.what)
		}
		if want := []string{"output", "postrouting", "prerouting", "raw", "svc-s7-v4"}; !slices.Equal(slices.Sorted(maps.Keys(s.chains)), want) {
			t.Errorf("%s: chains in scope %v, want %v", step.what, slices.Sorted(maps.Keys(s.chains)), want)
		}
		if n := len(s.shared["services-v4"]); n != 1 {
			t.Errorf("%s: %d elements of services-v4 in scope, want s7's 1", step.what, n)
		}
		res, err := m.ApplyChanges(ctx, r)
		if err != nil {
			t.Fatal(err)
		}
		var chains []string
		if step.changes {
			chains = []string{NATTable + " svc-s7-v4"}
		}
		if res.Operations > 6 || res.Changed() != step.changes || res.ElementsAdded+res.ElementsRemoved > 3 || !slices.Equal(res.ChainsRewritten, chains) {
			t.Errorf("%s: %d operations, +%d -%d elements, chains %v; want a handful in svc-s7-v4: %+v",
				step.what, res.Operations, res.ElementsAdded, res.ElementsRemoved, res.ChainsRewritten, res)
		}
		checkKernel(t, f, freshDump(t, d), step.what)
		d0, r0 = d, r
	}
	// Nothing changed: no operation, no part rendered anew.
	r := rr.Render(rv.Resolve(svcs, nil, testEnv))
	if res, err := m.ApplyChanges(ctx, r); err != nil || res.Changed() {
		t.Errorf("no change: %+v, %v", res, err)
	}
	for _, tb := range r.Tables {
		if was := tableOf(r0, tb.ref()); !slices.Equal(tb.parts[1:], was.parts[1:]) {
			t.Errorf("no change: %s rendered anew", tb.Name)
		}
	}
}

func tableOf(r *Ruleset, ref TableRef) *Table {
	for _, t := range r.Tables {
		if t.ref() == ref {
			return t
		}
	}
	return nil
}

// Random changes (backends drained, down, failing, removed, added, reweighted; services
// removed, added back, rescheduled, flow tables resized) applied by the agent's path (Resolver, Renderer,
// ApplyChanges: the partial diff) leave the kernel exactly as the whole diff against the
// kernel read back (a fresh render, Apply reading the tables on every call) does, slot for
// slot.
func TestPartialDiffEqualsWholeDiff(t *testing.T) {
	inc, fi := NewFakeManager()
	inc.FullEvery = time.Hour
	whole, fw := NewFakeManager()
	whole.FullEvery = 0
	var rv Resolver
	var rr Renderer
	ctx := context.Background()
	all := incSet(30)
	svcs := slices.Clone(all)
	health := map[string]Health{}
	rnd := rand.New(rand.NewPCG(13, 1))
	next := 0
	for step := range 200 {
		what := "start"
		if step > 0 {
			cand := slices.Clone(svcs)
			i := rnd.IntN(len(cand))
			s := &cand[i]
			s.Backends = slices.Clone(s.Backends)
			j := rnd.IntN(max(1, len(s.Backends)))
			switch k := rnd.IntN(10); {
			case len(s.Backends) == 0 || k == 0:
				next++
				s.Backends = append(s.Backends, Backend{Address: fmt.Sprintf("10.9.%d.%d", next/250, 1+next%250), Port: 8080})
				what = "add a backend to " + s.Name
			case k == 1:
				s.Backends = slices.Delete(s.Backends, j, j+1)
				what = "remove a backend of " + s.Name
			case k == 2:
				s.Backends[j].Weight = new(1 + rnd.IntN(4))
				what = "reweight a backend of " + s.Name
			case k == 3:
				cand = slices.Delete(cand, i, i+1)
				what = "remove " + s.Name
			case k == 4:
				if gone := slices.DeleteFunc(slices.Clone(all), func(a Service) bool {
					return slices.ContainsFunc(cand, func(b Service) bool { return a.Name == b.Name })
				}); len(gone) > 0 {
					cand = append(cand, gone[rnd.IntN(len(gone))])
				}
				what = "add a service back"
			case k == 5:
				s.Scheduler = []string{RoundRobin, Weighted}[rnd.IntN(2)]
				what = "reschedule " + s.Name
			case k == 6:
				key := HealthKey(s.Name, BackendKey(s.Backends[j].Address, s.Backends[j].Port))
				health[key] = Health{State: []HealthState{HealthUp, HealthDown}[rnd.IntN(2)], LastError: "refused"}
				what = "health of a backend of " + s.Name
			case k == 7:
				var tables []int // the services that keep a table of their own
				for i, c := range cand {
					if c.Topology == DSR || c.Topology == StatelessDNAT || c.Persistence != nil {
						tables = append(tables, i)
					}
				}
				if len(tables) == 0 {
					continue
				}
				s = &cand[tables[rnd.IntN(len(tables))]]
				s.FlowTableSize = []int{0, 16, 1 << 20}[rnd.IntN(3)]
				what = "resize the flow table of " + s.Name
			default:
				s.Backends[j].State = []string{StateUp, StateDrain, StateDown}[rnd.IntN(3)]
				what = "admin state of a backend of " + s.Name
			}
			if errs := ValidateServices(cand, fieldByName(cand)); len(errs) > 0 {
				continue
			}
			svcs = cand
		}
		h := maps.Clone(health)
		if _, err := inc.ApplyChanges(ctx, rr.Render(rv.Resolve(svcs, h, testEnv))); err != nil {
			t.Fatalf("step %d (%s): %v", step, what, err)
		}
		if _, err := whole.Apply(ctx, Render(Resolve(svcs, h, testEnv))); err != nil {
			t.Fatalf("step %d (%s): %v", step, what, err)
		}
		if a, b := dumpOf(fi), dumpOf(fw); a != b {
			t.Fatalf("step %d (%s): the partial diff left\n%s\n\nthe whole diff\n%s", step, what, a, b)
		}
	}
}

// sameDefinition compares every field of Service and Backend: changing any one of them
// makes another definition (a new field must be added there, or this fails).
func TestSameDefinitionFields(t *testing.T) {
	base := Service{Name: "a", VIPs: []string{"192.0.2.1"}, Port: 80, Backends: []Backend{{Address: "10.0.0.1"}}}
	perturb := func(v reflect.Value) {
		switch v.Kind() {
		case reflect.String:
			v.SetString(v.String() + "x")
		case reflect.Int:
			v.SetInt(v.Int() + 1)
		case reflect.Bool:
			v.SetBool(!v.Bool())
		case reflect.Slice:
			v.Set(reflect.Append(v, reflect.Zero(v.Type().Elem())))
		case reflect.Pointer:
			v.Set(reflect.New(v.Type().Elem()))
		default:
			t.Fatalf("field of kind %s: teach this test (and sameDefinition) about it", v.Kind())
		}
	}
	st := reflect.TypeOf(base)
	for i := range st.NumField() {
		s := base.Clone()
		perturb(reflect.ValueOf(&s).Elem().Field(i))
		if sameDefinition(&base, &s) {
			t.Errorf("Service.%s changed: still the same definition", st.Field(i).Name)
		}
	}
	bt := reflect.TypeOf(Backend{})
	for i := range bt.NumField() {
		s := base.Clone()
		perturb(reflect.ValueOf(&s.Backends[0]).Elem().Field(i))
		if sameDefinition(&base, &s) {
			t.Errorf("Backend.%s changed: still the same definition", bt.Field(i).Name)
		}
	}
	s := base.Clone()
	if !sameDefinition(&base, &s) {
		t.Error("a clone is another definition")
	}
	// A backend changed in place (the caller's slice) is seen: the Resolver keeps a clone.
	var rv Resolver
	svcs := []Service{base}
	d1 := rv.Resolve(svcs, nil, testEnv)
	svcs[0].Backends[0].State = StateDrain
	if d2 := rv.Resolve(svcs, nil, testEnv); d2.Services[0] == d1.Services[0] || d2.Services[0].Backends[0].Active {
		t.Error("a backend drained in place: the service was not resolved anew")
	}
}

// ValidateChange says what ValidateServices says of a list that differs from a valid one in
// a service: names, VIPs and backends clashing with others (stateless-dnat), invalid fields.
func TestValidateChangeEqualsValidateServices(t *testing.T) {
	was := incSet(20)
	was[1].Internal = &Internal{Service: was[5].Name, Sources: []string{"10.244.0.0/24"}}
	if errs := ValidateServices(was, fieldByName(was)); len(errs) > 0 {
		t.Fatal(errs)
	}
	sl := slices.IndexFunc(was, func(s Service) bool { return s.Topology == StatelessDNAT })
	for _, c := range []struct {
		what string
		fn   func(svcs []Service) []Service
	}{
		{"a drain", func(s []Service) []Service { return withBackend(s, 3, 1, func(b *Backend) { b.State = StateDrain }) }},
		{"a removal", func(s []Service) []Service { return slices.Delete(s, 2, 3) }},
		{"a name taken", func(s []Service) []Service { s[4].Name = s[9].Name; return s }},
		{"a new service of a name taken", func(s []Service) []Service { return append(s, s[5]) }},
		{"a VIP taken", func(s []Service) []Service { s[4].VIPs = []string{s[9].VIPs[0]}; return s }},
		{"a VIP taken (another spelling)", func(s []Service) []Service {
			s[len(s)-2].VIPs = []string{"2001:db8:0::10"}
			return s
		}},
		{"a stateless-dnat backend shared", func(s []Service) []Service {
			return withBackend(s, 6, 0, func(b *Backend) { *b = s[sl].Backends[0] })
		}},
		{"a dnat backend shared", func(s []Service) []Service {
			return withBackend(s, 6, 0, func(b *Backend) { *b = s[8].Backends[0] })
		}},
		{"a bad weight", func(s []Service) []Service { return withBackend(s, 6, 0, func(b *Backend) { b.Weight = new(0) }) }},
		{"a bad address", func(s []Service) []Service { return withBackend(s, 6, 0, func(b *Backend) { b.Address = "10.0.0" }) }},
		// internal clients: the service that serves them removed, or changed to a protocol of
		// its own, and a service that gets them
		{"an internal service removed", func(s []Service) []Service { return slices.Delete(s, 5, 6) }},
		{"an internal service changed", func(s []Service) []Service { s[5].Protocol = "udp"; return s }},
		{"internal clients to a service of another protocol", func(s []Service) []Service {
			s[5].Protocol = "udp"
			s[7].Internal = &Internal{Service: s[5].Name, LocalHost: true}
			return s
		}},
		{"internal clients of a service that serves some", func(s []Service) []Service {
			s[3].Internal = &Internal{Service: s[1].Name, LocalHost: true}
			return s
		}},
		{"internal clients added", func(s []Service) []Service {
			s[8].Internal = &Internal{Service: s[9].Name, LocalHost: true}
			return s
		}},
	} {
		svcs := c.fn(slices.Clone(was))
		want, got := ValidateServices(svcs, fieldByName(svcs)), ValidateChange(was, svcs, fieldByName(svcs))
		if fmt.Sprint(want) != fmt.Sprint(got) {
			t.Errorf("%s: ValidateChange %v, ValidateServices %v", c.what, got, want)
		}
		if valid := slices.Contains([]string{"a drain", "a removal", "a dnat backend shared", "internal clients added"}, c.what); valid != (len(want) == 0) {
			t.Errorf("%s: %v (the case is wrong)", c.what, want)
		}
	}

	// The service that keeps its definition spells its VIP otherwise (ValidateChange parses
	// the others' addresses only when they may share one: an IPv6 address always may).
	was6 := append(slices.Clone(was), Service{Name: "v6", VIPs: []string{"2001:db8:0:0:0:0:0:99"}, Port: 80, Topology: DNAT,
		Backends: []Backend{{Address: "2001:db8:1::1", Port: 8080}}})
	if errs := ValidateServices(was6, fieldByName(was6)); len(errs) > 0 {
		t.Fatal(errs)
	}
	svcs := slices.Clone(was6)
	svcs[4].VIPs, svcs[4].Port = []string{"2001:db8::99"}, 80
	svcs[4].Backends = []Backend{{Address: "2001:db8:1::2", Port: 8080}}
	want, got := ValidateServices(svcs, fieldByName(svcs)), ValidateChange(was6, svcs, fieldByName(svcs))
	if len(want) == 0 || fmt.Sprint(want) != fmt.Sprint(got) {
		t.Errorf("a VIP taken, spelled otherwise by the service that kept it: ValidateChange %v, ValidateServices %v", got, want)
	}
}

// The counter maps CounterTables hands out are read without the Manager's lock (the agent's
// status and metrics while it syncs): a partial apply that changes a service's counters
// must leave them as they were, not write them in place.
func TestCounterTablesNotWrittenByPartialApply(t *testing.T) {
	m, _ := NewFakeManager()
	m.FullEvery = time.Hour
	ctx := context.Background()
	web, other := fixture(DNAT, RoundRobin), rename(fixture(DNAT, RoundRobin), "other", "192.0.2.30")
	var rv Resolver
	var rr Renderer
	if _, err := m.Apply(ctx, rr.Render(rv.Resolve([]Service{web, other}, nil, testEnv))); err != nil {
		t.Fatal(err)
	}
	handed := m.CounterTables()
	was := map[TableRef]map[string]Counter{}
	for ref, cs := range handed {
		was[ref] = maps.Clone(cs)
	}
	res, err := m.ApplyChanges(ctx, rr.Render(rv.Resolve([]Service{web}, nil, testEnv))) // other's counters go
	if err != nil || res.FullRead || res.Operations == 0 {
		t.Fatalf("want a partial apply that changes something: %+v %v", res, err)
	}
	if !reflect.DeepEqual(handed, was) {
		t.Error("the partial apply wrote the counter maps CounterTables had handed out")
	}
	if now := m.CounterTables(); reflect.DeepEqual(now, was) {
		t.Error("the Manager's counters did not follow the apply")
	}
}
