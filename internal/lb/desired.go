package lb

import (
	"fmt"
	"hash/fnv"
	"net"
	"net/netip"
	"reflect"
	"slices"
	"strings"
	"time"
)

// HealthState is what the checker knows about a backend.
type HealthState string

const (
	HealthUnknown HealthState = "unknown" // not checked yet, or no check: counts as up
	HealthUp      HealthState = "up"
	HealthDown    HealthState = "down"
)

// Health is the checker's view of one backend.
type Health struct {
	State       HealthState `json:"state"`
	LastCheck   time.Time   `json:"lastCheck,omitzero"`
	LastChange  time.Time   `json:"lastChange,omitzero"`
	LastError   string      `json:"lastError,omitempty"`
	Transitions int         `json:"transitions"`
	Checks      int         `json:"checks"`
	Failures    int         `json:"failures"`

	streak int // consecutive successes (> 0) or failures (< 0)
}

// Env is what rendering needs to know about this host: the interfaces present with their
// MAC addresses, and (dsr) the neighbours on them.
type Env struct {
	Links     map[string]net.HardwareAddr
	Neighbors map[string]map[netip.Addr]net.HardwareAddr // interface -> IP -> MAC
	// Failed (dsr) are the neighbours the kernel tried to resolve and could not (FAILED):
	// interface -> IPs. An address in neither map has no entry (never resolved, or its entry
	// expired): the agent keeps the MAC it last saw for it (Runtime.neighbours).
	Failed map[string]map[netip.Addr]bool
	// Local lists this host's addresses: stateless-dnat does not rewrite packets to them
	// (health checks' replies).
	Local []netip.Addr
}

// Desired is the load balancer as it should be now: the services with every backend's
// effective state. It is what Render consumes and what status reports.
type Desired struct {
	Services []*ServiceState
	Local    []netip.Addr
}

// ServiceState is one service resolved against health and the host.
type ServiceState struct {
	Service  Service // as configured (defaults not filled in)
	Topology string
	Protocol string
	Sched    string
	VIPs     []netip.Addr
	Ports    []int
	Backends []*BackendState
	// Skipped says why the service is not installed at all (a missing interface).
	Skipped string
	// OutMAC (dsr): the MAC of the backend interface, the source of forwarded frames.
	OutMAC net.HardwareAddr
}

// BackendState is one backend with what the load balancer does with it.
type BackendState struct {
	Backend
	Weight int    // the backend's weight, or the default 1
	Key    string // "10.0.0.1" or "10.0.0.1:8080": unique within its service
	Addr   netip.Addr
	// ID identifies the backend in flow tables and persistent-client maps (written as an
	// address or a MAC: see idAddr, idMAC); derived from the service and the backend, so that
	// it survives restarts and reordering.
	ID     uint32
	MAC    net.HardwareAddr // dsr
	Health Health
	// Active: in the maps that pick backends for new connections.
	Active bool
	// Known: established connections (and persistent clients) keep it: active, draining, or a
	// healthy backup (failback is graceful: the clients a failover gave it stay, as a draining
	// backend's; a backup never active has none).
	Known bool
	// Reason says why a backend is not active.
	Reason string
}

// BackendKey identifies a backend within its service.
func BackendKey(addr string, port int) string {
	if port == 0 {
		return addr
	}
	a, err := netip.ParseAddr(addr)
	if err != nil {
		return fmt.Sprintf("%s:%d", addr, port)
	}
	return backendKey(addr, a, port)
}

// backendKey is BackendKey of addr, parsed as a.
func backendKey(addr string, a netip.Addr, port int) string {
	if port == 0 {
		return addr
	}
	return netip.AddrPortFrom(a, uint16(port)).String()
}

// HealthKey identifies a backend across services.
func HealthKey(service, backend string) string { return service + "/" + backend }

// Resolve computes the desired state of validated services. health is keyed by HealthKey.
func Resolve(svcs []Service, health map[string]Health, env Env) *Desired {
	d := &Desired{Local: slices.Clone(env.Local)}
	slices.SortFunc(d.Local, netip.Addr.Compare)
	for _, s := range svcs {
		d.Services = append(d.Services, resolveService(s, health, env))
	}
	return d
}

func resolveService(s Service, health map[string]Health, env Env) *ServiceState {
	ss := &ServiceState{Service: s, Topology: s.topology(), Protocol: s.proto(), Sched: s.scheduler(), Ports: s.ports()}
	for _, v := range s.VIPs {
		ss.VIPs = append(ss.VIPs, netip.MustParseAddr(v))
	}
	if ss.Topology == DSR || ss.Topology == StatelessDNAT {
		for _, dev := range []string{s.Interface, s.backendInterface()} {
			mac, ok := env.Links[dev]
			if !ok {
				ss.Skipped = fmt.Sprintf("interface %q does not exist", dev)
			}
			ss.OutMAC = mac // the backend interface is last
		}
		if ss.Skipped == "" && ss.Topology == DSR && len(ss.OutMAC) != 6 {
			ss.Skipped = fmt.Sprintf("interface %q has no Ethernet address", s.backendInterface())
		}
	}
	ids := make(map[uint32]bool, len(s.Backends))
	states := make([]BackendState, len(s.Backends)) // one allocation, not one per backend
	if len(s.Backends) > 0 {
		ss.Backends = make([]*BackendState, len(s.Backends))
	}
	for i, b := range s.Backends {
		a := netip.MustParseAddr(b.Address)
		bs := &states[i]
		*bs = BackendState{Backend: b, Key: backendKey(b.Address, a, b.Port), Addr: a}
		if bs.Port == 0 && len(ss.Ports) == 1 && ss.Topology != DSR {
			bs.Port = ss.Ports[0]
		}
		bs.Weight = b.weight()
		if bs.State == "" {
			bs.State = StateUp
		}
		bs.ID = backendID(s.Name, bs.Key, ids)
		if len(health) > 0 {
			bs.Health = health[HealthKey(s.Name, bs.Key)]
		}
		if bs.Health.State == "" {
			bs.Health.State = HealthUnknown
		}
		if ss.Topology == DSR {
			if b.MAC != "" {
				bs.MAC, _ = net.ParseMAC(b.MAC)
			} else {
				bs.MAC = env.Neighbors[s.backendInterface()][bs.Addr]
			}
		}
		ss.Backends[i] = bs
	}
	ss.pick()
	return ss
}

// pick decides which backends are active: per family (dsr: all together), the eligible
// backends (admin up, not failed, reachable) with the lowest priority number.
func (ss *ServiceState) pick() {
	const draining = "draining: no new connections"
	eligible := func(b *BackendState) string {
		switch {
		case ss.Skipped != "":
			return ss.Skipped
		case b.State == StateDown:
			return "admin state down"
		case b.Health.State == HealthDown:
			return "health check failing: " + b.Health.LastError
		case ss.Topology == DSR && b.MAC == nil:
			return fmt.Sprintf("MAC address unknown (no usable neighbour entry on %s: not resolved yet, or FAILED: the host does not answer)", ss.Service.backendInterface())
		case b.State == StateDrain:
			return draining
		}
		return ""
	}
	var best [2]int // family (dsr: 0) -> lowest priority among eligible
	var seen [2]bool
	fam := func(b *BackendState) int { return famIndex(ss.Topology != DSR && b.Addr.Is6()) }
	for _, b := range ss.Backends {
		b.Reason = eligible(b)
		b.Known = b.Reason == "" || b.Reason == draining
		if f := fam(b); b.Reason == "" && (!seen[f] || b.Priority < best[f]) {
			best[f], seen[f] = b.Priority, true
		}
	}
	for _, b := range ss.Backends {
		if b.Reason != "" {
			continue
		}
		f := fam(b)
		if b.Priority == best[f] {
			b.Active = true
		} else {
			b.Reason = fmt.Sprintf("backup: backends with priority %d are up", best[f])
		}
	}
}

func (s *Service) backendInterface() string {
	if s.BackendInterface != "" {
		return s.BackendInterface
	}
	return s.Interface
}

// backendID derives a non-zero 31-bit id from the service and the backend; collisions
// within the service (rare) take the next free number.
func backendID(svc, key string, used map[uint32]bool) uint32 {
	h := fnv.New32a() // of "svc/key", written without formatting (10,000 backends: ~2 ms)
	h.Write([]byte(svc))
	h.Write([]byte{'/'})
	h.Write([]byte(key))
	id := h.Sum32()&0x7fffffff | 1<<20 // never small, never zero
	for used[id] {
		id = (id+1)&0x7fffffff | 1<<20
	}
	used[id] = true
	return id
}

// slots returns the backends for numgen/hash slots 0..n-1: each active backend of the family
// appears weight/gcd times, interleaved (smooth weighted round robin), so that rr rotates
// evenly and every scheduler's share is proportional to the weights.
func (ss *ServiceState) slots(is6 bool) []*BackendState {
	var act []*BackendState
	g := 0
	for _, b := range ss.Backends {
		if b.Active && (ss.Topology == DSR || b.Addr.Is6() == is6) {
			act = append(act, b)
			g = gcd(g, b.Weight)
		}
	}
	total := 0
	w := make([]int, len(act))
	for i, b := range act {
		w[i] = b.Weight / g
		total += w[i]
	}
	if total == len(act) {
		// Equal weights: the rotation below picks the backends in order, one slot each (a
		// service of 50,000 backends took 20 s of the loop's n² steps).
		return act
	}
	cur := make([]int, len(act))
	out := make([]*BackendState, 0, total)
	for range total {
		best := -1
		for i := range act {
			cur[i] += w[i]
			if best < 0 || cur[i] > cur[best] {
				best = i
			}
		}
		cur[best] -= total
		out = append(out, act[best])
	}
	return out
}

func gcd(a, b int) int {
	for b != 0 {
		a, b = b, a%b
	}
	return a
}

// families returns the VIP families of the service (false: IPv4, true: IPv6), IPv4 first.
func (ss *ServiceState) families() []bool {
	var out []bool
	for _, f := range []bool{false, true} {
		if slices.ContainsFunc(ss.VIPs, func(a netip.Addr) bool { return a.Is6() == f }) {
			out = append(out, f)
		}
	}
	return out
}

// Resolver resolves as Resolve does, and keeps each service's state for the next Resolve:
// a service whose inputs did not change (its definition, its backends' health, the host's
// interfaces and neighbours it uses) keeps its *ServiceState, which a Renderer then does not
// render again. Not safe for concurrent use.
type Resolver struct {
	prev map[string]*resolved
}

// resolved is what a ServiceState was resolved from.
type resolved struct {
	svc    Service
	health []Health // by backend, as in ss.Backends
	env    string   // envKey
	ss     *ServiceState
}

// Resolve computes the desired state of validated services, reusing the states of the
// services whose inputs are those of the last Resolve.
func (rv *Resolver) Resolve(svcs []Service, health map[string]Health, env Env) *Desired {
	d := &Desired{Local: slices.Clone(env.Local), Services: make([]*ServiceState, 0, len(svcs))}
	slices.SortFunc(d.Local, netip.Addr.Compare)
	next := make(map[string]*resolved, len(svcs))
	for _, s := range svcs {
		p := rv.prev[s.Name]
		ek := envKey(s, env)
		if p == nil || p.env != ek || !sameDefinition(&p.svc, &s) || !p.sameHealth(health) {
			ss := resolveService(s, health, env)
			p = &resolved{svc: s.Clone(), env: ek, ss: ss, health: make([]Health, len(ss.Backends))}
			for i, b := range ss.Backends {
				p.health[i] = health[HealthKey(s.Name, b.Key)]
			}
		}
		next[s.Name] = p
		d.Services = append(d.Services, p.ss)
	}
	rv.prev = next
	return d
}

// sameHealth reports whether health says of p's backends what it said when p was resolved.
func (p *resolved) sameHealth(health map[string]Health) bool {
	for i, b := range p.ss.Backends {
		if len(health) == 0 {
			if p.health[i] != (Health{}) {
				return false
			}
			continue
		}
		if health[HealthKey(p.svc.Name, b.Key)] != p.health[i] {
			return false
		}
	}
	return true
}

// envKey is what resolving s reads of env: for dsr and stateless-dnat, its interfaces'
// MACs (and whether they exist) and, for dsr, the neighbours' MACs of its backends.
func envKey(s Service, env Env) string {
	t := s.topology()
	if t != DSR && t != StatelessDNAT {
		return ""
	}
	var k strings.Builder
	for _, dev := range []string{s.Interface, s.backendInterface()} {
		mac, ok := env.Links[dev]
		fmt.Fprintf(&k, "%s=%v/%s;", dev, ok, mac)
	}
	if t == DSR {
		nb := env.Neighbors[s.backendInterface()]
		for _, b := range s.Backends {
			if a, err := netip.ParseAddr(b.Address); err == nil && b.MAC == "" {
				k.WriteString(nb[a].String() + ";")
			}
		}
	}
	return k.String()
}

// sameDefinition reports whether a and b are the same definition. A new field of Service or
// Backend must be compared here (TestSameServiceFields).
func sameDefinition(a, b *Service) bool {
	if a.Name != b.Name || a.Port != b.Port || a.Protocol != b.Protocol || a.Topology != b.Topology ||
		a.Interface != b.Interface || a.BackendInterface != b.BackendInterface || a.Scheduler != b.Scheduler ||
		a.FlushConntrack != b.FlushConntrack || a.Hairpin != b.Hairpin || a.NoBackend != b.NoBackend || !slices.Equal(a.VIPs, b.VIPs) || !slices.Equal(a.Ports, b.Ports) ||
		!slices.Equal(a.SNATAddresses, b.SNATAddresses) || !slices.Equal(a.HashFields, b.HashFields) ||
		!slices.Equal(a.SourceRanges, b.SourceRanges) || !SameInternal(a.Internal, b.Internal) || a.InternalOnly != b.InternalOnly || !slices.Equal(a.MasqueradeExcept, b.MasqueradeExcept) ||
		!samePtr(a.Persistence, b.Persistence) || !samePtr(a.FlowTimeout, b.FlowTimeout) || a.FlowTableSize != b.FlowTableSize ||
		!(a.HealthCheck == b.HealthCheck || a.HealthCheck != nil && b.HealthCheck != nil && reflect.DeepEqual(*a.HealthCheck, *b.HealthCheck)) ||
		len(a.Backends) != len(b.Backends) {
		return false
	}
	for i := range a.Backends {
		if !SameBackend(&a.Backends[i], &b.Backends[i]) {
			return false
		}
	}
	return true
}

// SameInternal reports whether a and b are the same internal clients' definition.
func SameInternal(a, b *Internal) bool {
	return a == b || a != nil && b != nil && a.Service == b.Service && a.LocalHost == b.LocalHost && slices.Equal(a.Sources, b.Sources)
}

// SameBackend reports whether x and y are the same backend definition, field by field
// (TestSameServiceFields keeps it in step with Backend).
func SameBackend(x, y *Backend) bool {
	return x.Address == y.Address && x.Port == y.Port && samePtr(x.Weight, y.Weight) && x.Priority == y.Priority &&
		x.State == y.State && x.MAC == y.MAC
}

// Clone copies s deep enough that changing either copy in place (a backend's state) does not
// change the other.
func (s Service) Clone() Service {
	s.VIPs, s.Ports, s.SNATAddresses, s.HashFields = slices.Clone(s.VIPs), slices.Clone(s.Ports), slices.Clone(s.SNATAddresses), slices.Clone(s.HashFields)
	s.SourceRanges, s.MasqueradeExcept = slices.Clone(s.SourceRanges), slices.Clone(s.MasqueradeExcept)
	if s.Internal != nil {
		in := *s.Internal
		in.Sources = slices.Clone(in.Sources)
		s.Internal = &in
	}
	s.Persistence, s.FlowTimeout = clonePtr(s.Persistence), clonePtr(s.FlowTimeout)
	if s.HealthCheck != nil {
		hc := *s.HealthCheck
		hc.Command = slices.Clone(hc.Command)
		s.HealthCheck = &hc
	}
	s.Backends = slices.Clone(s.Backends)
	for i := range s.Backends {
		s.Backends[i].Weight = clonePtr(s.Backends[i].Weight)
	}
	return s
}

func clonePtr[T any](p *T) *T {
	if p == nil {
		return nil
	}
	v := *p
	return &v
}

func samePtr[T comparable](a, b *T) bool {
	return a == b || a != nil && b != nil && *a == *b
}
