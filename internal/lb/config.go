// Package lb is hostaccel's nftables L4 load balancer (docs/lb.md): services with virtual IPs,
// schedulers (numgen, jhash, symhash), persistence, four topologies (snat, dnat, dsr at the
// netdev ingress hook, stateless dnat at ingress), health checks and a local API.
//
// The data flows one way: Config (validated) -> Desired (with health) -> Render (pure,
// knftables objects) -> Manager.Apply (the only code that touches the kernel).
package lb

import (
	"cmp"
	"fmt"
	"net"
	"net/netip"
	"net/url"
	"regexp"
	"slices"
	"strings"
	"time"
	"unicode"

	"github.com/hostaccel/hostaccel/internal/model"
)

// Topologies.
const (
	SNAT          = "snat"           // DNAT to the backend and source NAT (masquerade or a given address)
	DNAT          = "dnat"           // DNAT only: backends route their replies through this host
	DSR           = "dsr"            // direct server return: ingress rewrites MACs only, replies bypass this host
	StatelessDNAT = "stateless-dnat" // ingress rewrites addresses both ways, no conntrack
)

// Schedulers.
const (
	RoundRobin = "rr"      // numgen inc: exact (weighted) rotation
	Weighted   = "weight"  // numgen random: proportional to the weights
	Hash       = "hash"    // jhash over hashFields
	SymHash    = "symhash" // symmetric hash of the flow
)

// Backend admin states.
const (
	StateUp    = "up"
	StateDrain = "drain" // no new connections; established ones keep their backend
	StateDown  = "down"  // out of every map; its flows are forgotten
)

// What a snat or dnat service does with a new connection while no backend is available.
const (
	NoBackendReject = "reject" // a TCP reset or ICMP unreachable: the client fails at once
	NoBackendDrop   = "drop"   // silence: the client retries
)

// Defaults.
const (
	DefaultSocket      = "/run/hostaccel/lb.sock"
	DefaultStateFile   = "/var/lib/hostaccel/lb-services.yaml"
	defaultFlowTimeout = 5 * time.Minute
	maxFlowTableSize   = 1 << 24
	maxSlots           = 1 << 18 // map entries of one service and family, after dividing weights by their gcd (docs/lb.md)
	maxWeight          = 1000
	maxPath            = 4095 // PATH_MAX less the NUL
	maxSocketPath      = 107  // sun_path less the NUL
)

var (
	topologies = []string{SNAT, DNAT, DSR, StatelessDNAT}
	schedulers = []string{RoundRobin, Weighted, Hash, SymHash}
	protocols  = []string{"tcp", "udp", "sctp"}
	states     = []string{StateUp, StateDrain, StateDown}
	hashFields = []string{"src-ip", "src-port", "dst-ip", "dst-port"}
	checkTypes = []string{"tcp", "http", "https", "udp", "dns", "command", "none"}
	validName  = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]{0,30}[a-z0-9])?$`)
)

// Config is the `loadBalancer` section of the config file.
type Config struct {
	// API is the local API (`hostaccel lb ...`). It serves on Socket whenever the section has
	// services or an api key; set disabled to turn it off.
	API *API `json:"api,omitempty"`
	// StateFile keeps the services changed through the API (default
	// /var/lib/hostaccel/lb-services.yaml); they override the file's services of the same name.
	StateFile string    `json:"stateFile,omitempty"`
	Services  []Service `json:"services,omitempty"`
}

// API configures the local API server.
type API struct {
	Disabled bool   `json:"disabled,omitempty"`
	Socket   string `json:"socket,omitempty"`  // unix socket, mode 0600 (default /run/hostaccel/lb.sock)
	Listen   string `json:"listen,omitempty"`  // optional TCP address; requires keyFile
	KeyFile  string `json:"keyFile,omitempty"` // bearer key for TCP clients
}

// Service is one load-balanced service: VIPs x ports of one protocol.
type Service struct {
	Name     string   `json:"name"`
	VIPs     []string `json:"vips"`
	Port     int      `json:"port,omitempty"`
	Ports    []int    `json:"ports,omitempty"`
	Protocol string   `json:"protocol,omitempty"` // tcp (default), udp, sctp
	Topology string   `json:"topology,omitempty"` // dnat (default), snat, dsr, stateless-dnat
	// SNATAddresses (snat only): the source address per family; a family without one is
	// masqueraded (the address of the outgoing interface).
	SNATAddresses []string `json:"snatAddresses,omitempty"`
	// Interface (dsr, stateless-dnat): where clients' packets arrive (the ingress hook).
	Interface string `json:"interface,omitempty"`
	// BackendInterface (dsr, stateless-dnat): where the backends are (dsr forwards out of it,
	// stateless-dnat rewrites replies arriving on it); default: Interface.
	BackendInterface string   `json:"backendInterface,omitempty"`
	Scheduler        string   `json:"scheduler,omitempty"`  // rr (default), weight, hash, symhash
	HashFields       []string `json:"hashFields,omitempty"` // hash: src-ip (default), src-port, dst-ip, dst-port
	// Persistence sends a client (source address) to the backend it had, for this long after
	// its last new connection.
	Persistence *Duration `json:"persistence,omitempty"`
	// FlowTimeout (dsr, stateless-dnat): how long an idle flow keeps its backend (default 5m).
	FlowTimeout *Duration `json:"flowTimeout,omitempty"`
	// FlowTableSize (dsr, stateless-dnat, or persistence): the most flows (clients, with
	// persistence) the service's table holds per family (default 65,536). Past it, a new
	// key is sent by a hash of it and not recorded (docs/lb.md).
	FlowTableSize int `json:"flowTableSize,omitempty"`
	// SourceRanges (snat, dnat): only clients in these CIDRs reach the service; packets of
	// others to its VIPs are dropped (Kubernetes' loadBalancerSourceRanges). Empty: all.
	SourceRanges []string `json:"sourceRanges,omitempty"`
	// Hairpin (dnat): a backend that is a client of the service and is picked for its own
	// connection has that connection's source masqueraded; else its reply, from itself to
	// itself, would skip the un-DNAT (kube-proxy masquerades these). snat does so anyway.
	Hairpin bool `json:"hairpin,omitempty"`
	// FlushConntrack deletes a backend's conntrack entries (snat, dnat) when it goes down or
	// fails its health check, so that clients see a reset at once instead of a timeout.
	FlushConntrack bool         `json:"flushConntrack,omitempty"`
	HealthCheck    *HealthCheck `json:"healthCheck,omitempty"`
	// MasqueradeExcept (dnat): clients outside these CIDRs are masqueraded, so that replies
	// come back through this host when the backend is elsewhere (kube-proxy's masquerade of
	// off-cluster clients to a ClusterIP); a family without one masquerades every client of
	// it. Empty: none is.
	MasqueradeExcept []string `json:"masqueradeExcept,omitempty"`
	// Internal (snat, dnat): internal clients are served by another service's backends.
	Internal *Internal `json:"internal,omitempty"`
	// InternalOnly (dnat): the service serves only the internal clients of the services whose
	// internal.service names it; packets to its own VIPs are not sent to it. Its VIPs give its
	// families (one per family its callers have) and may be another service's: Kubernetes'
	// short-circuit of a Service with both traffic policies Local, whose node's Pods reach
	// every endpoint through its load balancer IP or node port and only this node's through
	// its ClusterIP (the other service of the same VIP and port).
	InternalOnly bool `json:"internalOnly,omitempty"`
	// NoBackend (snat, dnat): what a new connection gets while no backend is available (none
	// listed, or all down): "reject" (the default: a TCP reset or an ICMP unreachable, the
	// client fails at once) or "drop" (silence: the client retries, as kube-proxy drops the
	// packets of a Service's external traffic on a node without local endpoints).
	NoBackend string    `json:"noBackend,omitempty"`
	Backends  []Backend `json:"backends"`
}

// Internal says which clients of a service are internal, and the service that serves them:
// Kubernetes' short-circuit of externalTrafficPolicy Local, where a node's own Pods and the
// node itself reach every endpoint of a Service through its load balancer IP or node port,
// and outside clients only this node's. Service is another dnat service of the same
// protocol, with a VIP of each of this one's families, no Internal of its own and, as this
// one, a single port; its schedule, persistence and counters apply. Source NAT is this
// service's (its post chain is keyed by its VIPs): connections of this host are masqueraded
// (their source may be the VIP itself, which the chosen backend would answer elsewhere), and
// its own hairpin (its backends), not the serving service's hairpin or masqueradeExcept. With
// no backends of its own, it refuses outside clients.
type Internal struct {
	Service string `json:"service"`
	// Sources: clients in these CIDRs are internal.
	Sources []string `json:"sources,omitempty"`
	// LocalHost: clients on this host are internal.
	LocalHost bool `json:"localHost,omitempty"`
}

// Backend is one real server of a service.
type Backend struct {
	Address string `json:"address"`
	// Port the backend listens on; 0 keeps the port the client asked for.
	Port int `json:"port,omitempty"`
	// Weight (1-1000, default 1): the share of new connections, relative to the others.
	// nil is the default; an explicit 0 is an error (not "off": use state drain or down).
	Weight *int `json:"weight,omitempty"`
	// Priority: 0 (default) for primaries; backends with a higher number are used only when
	// no backend with a lower number is up.
	Priority int    `json:"priority,omitempty"`
	State    string `json:"state,omitempty"` // up (default), drain, down
	// MAC (dsr): the backend's MAC address; default: from the neighbour table.
	MAC string `json:"mac,omitempty"`
}

// HealthCheck says how the agent checks a service's backends.
type HealthCheck struct {
	Type string `json:"type"` // tcp, http, https, udp, dns, command, none
	// Port to check; default: the backend's port (or the service's first port).
	Port int `json:"port,omitempty"`
	// HTTP(S): path (default /), Host header, expected status (default 200), and an optional
	// string the body must contain.
	Path         string `json:"path,omitempty"`
	Host         string `json:"host,omitempty"`
	ExpectStatus int    `json:"expectStatus,omitempty"`
	// Send (udp): the request payload; Expect (udp, http): a string the reply must contain.
	Send   string `json:"send,omitempty"`
	Expect string `json:"expect,omitempty"`
	// Query (dns): the name asked for (type A; default "."); any answer with the same id and
	// rcode NOERROR or NXDOMAIN is healthy.
	Query string `json:"query,omitempty"`
	// Command (command): argv, run with HOSTACCEL_BACKEND_ADDRESS and HOSTACCEL_BACKEND_PORT
	// in its environment; exit status 0 is healthy.
	Command  []string `json:"command,omitempty"`
	Interval Duration `json:"interval,omitempty"` // default 5s
	Timeout  Duration `json:"timeout,omitempty"`  // default 2s (at most the interval); may exceed the interval
	Rise     int      `json:"rise,omitempty"`     // successes to go up (default 2)
	Fall     int      `json:"fall,omitempty"`     // failures to go down (default 3)
}

// Duration is model.Duration: a time.Duration written as "30s".
type Duration = model.Duration

// D returns a *Duration (for literals).
func D(d time.Duration) *Duration { return &Duration{Duration: d} }

// InUse reports whether the section asks for anything: services, or an API to add them.
func (c *Config) InUse() bool {
	return len(c.Services) > 0 || (c.API != nil && !c.API.Disabled)
}

// APIConfig returns the API settings with defaults; nil when the API is off.
func (c *Config) APIConfig() *API {
	if !c.InUse() || (c.API != nil && c.API.Disabled) {
		return nil
	}
	a := API{}
	if c.API != nil {
		a = *c.API
	}
	if a.Socket == "" {
		a.Socket = DefaultSocket
	}
	return &a
}

// StatePath returns the state file's path.
func (c *Config) StatePath() string {
	if c.StateFile == "" {
		return DefaultStateFile
	}
	return c.StateFile
}

// Validate checks the section; errors name the field (loadBalancer.services[1].port: ...).
func (c *Config) Validate() []error { return c.validate(nil, false) }

// ValidateChange is Validate for a section whose services differ from was, services that
// passed Validate, in a few: it checks them with ValidateChange (same errors, fewer services
// checked again when there are none).
func (c *Config) ValidateChange(was []Service) []error { return c.validate(was, true) }

func (c *Config) validate(was []Service, change bool) []error {
	var errs []error
	if a := c.API; a != nil {
		if a.Listen != "" {
			if _, _, err := net.SplitHostPort(a.Listen); err != nil {
				errs = append(errs, fmt.Errorf("loadBalancer.api.listen: %s is not host:port", model.Quote(a.Listen)))
			}
			if a.KeyFile == "" {
				errs = append(errs, fmt.Errorf("loadBalancer.api.listen: %s needs loadBalancer.api.keyFile (TCP clients must present the key)", model.Quote(a.Listen)))
			}
		}
		if a.Socket != "" && !strings.HasPrefix(a.Socket, "/") {
			errs = append(errs, fmt.Errorf("loadBalancer.api.socket: %s is not an absolute path", model.Quote(a.Socket)))
		} else if len(a.Socket) > maxSocketPath {
			errs = append(errs, fmt.Errorf("loadBalancer.api.socket: %s is longer than %d bytes, the limit of a unix socket's path", model.Quote(a.Socket), maxSocketPath))
		}
		if len(a.KeyFile) > maxPath {
			errs = append(errs, fmt.Errorf("loadBalancer.api.keyFile: %s is longer than %d bytes", model.Quote(a.KeyFile), maxPath))
		}
	}
	if c.StateFile != "" && !strings.HasPrefix(c.StateFile, "/") {
		errs = append(errs, fmt.Errorf("loadBalancer.stateFile: %s is not an absolute path", model.Quote(c.StateFile)))
	} else if len(c.StateFile) > maxPath {
		errs = append(errs, fmt.Errorf("loadBalancer.stateFile: %s is longer than %d bytes", model.Quote(c.StateFile), maxPath))
	}
	field := func(i int) string { return fmt.Sprintf("loadBalancer.services[%d]", i) }
	if change {
		return append(errs, ValidateChange(was, c.Services, field)...)
	}
	return append(errs, ValidateServices(c.Services, field)...)
}

// ValidateService checks s alone, f naming it in errors: what ValidateServices checks of each
// service, not what it checks across them (names, VIPs, internal clients' service).
func ValidateService(s *Service, f string) []error { return s.validate(f) }

// ValidateServices checks each service and the services together (names, VIPs and reverse
// paths must not collide). field names a service in errors.
func ValidateServices(svcs []Service, field func(i int) string) []error {
	var errs []error
	names := map[string]int{}
	type vipKey struct {
		addr  netip.Addr
		proto string
		port  int
	}
	vips := map[vipKey]int{}
	reverse := map[vipKey]int{}
	stateless := slices.ContainsFunc(svcs, func(s Service) bool { return s.Topology == StatelessDNAT })
	for i := range svcs {
		s := &svcs[i]
		f := field(i)
		errs = append(errs, s.validate(f)...)
		if j, dup := names[s.Name]; dup && s.Name != "" {
			errs = append(errs, fmt.Errorf("%s.name: %s is already used by %s", f, model.Quote(s.Name), field(j)))
		}
		names[s.Name] = i
		proto := s.proto()
		for k, v := range s.dispatched() {
			a, err := model.ParseAddr(v)
			if err != nil {
				continue
			}
			for _, p := range s.ports() {
				key := vipKey{a, proto, p}
				if j, dup := vips[key]; dup && j != i {
					errs = append(errs, fmt.Errorf("%s.vips[%d]: %s %s/%d is already used by service %s (%s)", f, k, a, proto, p, model.Quote(svcs[j].Name), field(j)))
				}
				vips[key] = i
			}
		}
		// Replies from a stateless-dnat backend are rewritten to its VIP at the ingress hook,
		// so no other service (but dsr, whose replies bypass this host) may share the backend.
		// Without a stateless-dnat service no backend can clash: the index is not built (at
		// 10,000 backends it was ~2 ms of a one-shot apply).
		if stateless && s.topology() != DSR {
			for k, b := range s.Backends {
				a, err := model.ParseAddr(b.Address)
				if err != nil {
					continue
				}
				for _, p := range s.ports() {
					key := vipKey{a, proto, cmp.Or(b.Port, p)}
					if j, dup := reverse[key]; dup && j != i && (s.Topology == StatelessDNAT || svcs[j].Topology == StatelessDNAT) {
						errs = append(errs, fmt.Errorf("%s.backends[%d]: %s %s/%d is also a backend of service %s (%s), and one of them is stateless-dnat: replies could not be told apart",
							f, k, a, proto, key.port, model.Quote(svcs[j].Name), field(j)))
					}
					if _, dup := reverse[key]; !dup || s.Topology == StatelessDNAT {
						reverse[key] = i
					}
				}
			}
		}
	}
	for i := range svcs {
		if in := svcs[i].Internal; in != nil && in.Service != "" && in.Service != svcs[i].Name {
			errs = append(errs, checkInternal(svcs, i, names, field)...)
		}
	}
	return errs
}

// checkInternal checks that service i's internal.service (i has one, not itself) can serve
// its internal clients; names indexes the services by name.
func checkInternal(svcs []Service, i int, names map[string]int, field func(int) string) []error {
	s := &svcs[i]
	f := field(i) + ".internal.service"
	j, ok := names[s.Internal.Service]
	if !ok {
		return []error{fmt.Errorf("%s: no service is named %s", f, model.Quote(s.Internal.Service))}
	}
	return checkServes(s, &svcs[j], f, field(j))
}

// ServesInternal reports whether t can serve s's internal clients, as ValidateServices checks
// it of s's internal.service (Kubernetes' derivation asks it before it names t).
func ServesInternal(s, t *Service) bool { return len(checkServes(s, t, "", "")) == 0 }

// checkServes checks that t can serve s's internal clients: f names s's internal.service
// and tf t in errors.
func checkServes(s, t *Service, f, tf string) []error {
	switch {
	case t.Internal != nil:
		return []error{fmt.Errorf("%s: %s (%s) has internal clients of its own (one step only)", f, model.Quote(t.Name), tf)}
	case t.topology() != DNAT:
		// (a snat service's source NAT is keyed by its own VIPs: internal clients, whose
		// connections are to this service's, would keep their address)
		return []error{fmt.Errorf("%s: %s (%s) is %s, not dnat", f, model.Quote(t.Name), tf, t.topology())}
	case t.proto() != s.proto():
		return []error{fmt.Errorf("%s: %s (%s) is %s, this service %s", f, model.Quote(t.Name), tf, t.proto(), s.proto())}
	case len(s.ports()) != 1 || len(t.ports()) != 1:
		// (the serving service's backends have its port: a second port of this service would
		// reach the same backend port, a serving service of several ports keeps this one's)
		return []error{fmt.Errorf("%s: both services must have one port (port, not ports)", f)}
	}
	var has [2]bool
	for _, v := range t.VIPs {
		if a, err := netip.ParseAddr(v); err == nil {
			has[famIndex(a.Is6())] = true
		}
	}
	for k, v := range s.VIPs {
		if a, err := netip.ParseAddr(v); err == nil && !has[famIndex(a.Is6())] {
			return []error{fmt.Errorf("%s: %s (%s) has no %s VIP (vips[%d] is %s)", f, model.Quote(t.Name), tf, famName(a.Is6()), k, a)}
		}
	}
	return nil
}

// dispatched are the VIPs whose packets go to the service: none of an internalOnly one.
func (s *Service) dispatched() []string {
	if s.InternalOnly {
		return nil
	}
	return s.VIPs
}

func (s *Service) proto() string {
	if s.Protocol == "" {
		return "tcp"
	}
	return s.Protocol
}

func (s *Service) topology() string {
	if s.Topology == "" {
		return DNAT
	}
	return s.Topology
}

func (s *Service) scheduler() string {
	if s.Scheduler == "" {
		return RoundRobin
	}
	return s.Scheduler
}

func (s *Service) ports() []int {
	if s.Port != 0 {
		return []int{s.Port}
	}
	return s.Ports
}

// backendPort is the port a backend given port p is reached on: p, else the service's port
// when it has one only (Resolve fills it in; a dsr backend keeps the client's, that one). A
// service of several ports keeps each client's: 0.
func (s *Service) backendPort(p int) int {
	switch {
	case p != 0:
		return p
	case s.Port != 0: // (s.ports() without its allocation: once per backend)
		return s.Port
	case len(s.Ports) == 1:
		return s.Ports[0]
	}
	return 0
}

// sameBackend is the index of s's backend that b is (the same address and port it is reached
// on, backendPort), or -1.
func (s *Service) sameBackend(b Backend) int {
	a, err := netip.ParseAddr(b.Address)
	if err != nil {
		return -1
	}
	p := s.backendPort(b.Port)
	return slices.IndexFunc(s.Backends, func(o Backend) bool {
		oa, err := netip.ParseAddr(o.Address)
		return err == nil && oa == a && s.backendPort(o.Port) == p
	})
}

func (s *Service) validate(f string) []error {
	var errs []error
	bad := func(format string, a ...any) { errs = append(errs, fmt.Errorf("%s.%s", f, fmt.Sprintf(format, a...))) }
	if !validName.MatchString(s.Name) {
		bad("name: %s is not a valid name (lower-case letters, digits and '-', at most 32, e.g. \"web\")", model.Quote(s.Name))
	}
	topo := s.topology()
	if !slices.Contains(topologies, topo) {
		bad("topology: %s is not one of %s", model.Quote(s.Topology), strings.Join(topologies, ", "))
	}
	if !slices.Contains(protocols, s.proto()) {
		bad("protocol: %s is not one of tcp, udp, sctp", model.Quote(s.Protocol))
	}
	sched := s.scheduler()
	if !slices.Contains(schedulers, sched) {
		bad("scheduler: %s is not one of %s", model.Quote(s.Scheduler), strings.Join(schedulers, ", "))
	}

	// VIPs.
	families := map[bool]int{} // is6 -> count
	if len(s.VIPs) == 0 {
		bad("vips: at least one virtual IP is required")
	}
	seen := map[netip.Addr]bool{}
	for i, v := range s.VIPs {
		a, err := model.ParseAddr(v)
		switch {
		case err != nil:
			bad("vips[%d]: %v", i, err)
			continue
		case a.IsUnspecified() || a.IsMulticast() || a.IsLoopback():
			bad("vips[%d]: %s cannot be a virtual IP", i, a)
			continue
		case seen[a]:
			bad("vips[%d]: %s is listed twice", i, a)
		}
		seen[a] = true
		families[a.Is6()]++
	}

	// Ports.
	switch {
	case s.Port != 0 && len(s.Ports) > 0:
		bad("ports: give either port or ports, not both")
	case s.Port == 0 && len(s.Ports) == 0:
		bad("port: 0 is not a valid port")
	}
	if s.Port < 0 || s.Port > 65535 {
		bad("port: %d is not a valid port", s.Port)
	}
	for i, p := range s.Ports {
		if p <= 0 || p > 65535 {
			bad("ports[%d]: %d is not a valid port", i, p)
		} else if slices.Index(s.Ports, p) != i {
			bad("ports[%d]: %d is listed twice", i, p)
		}
	}
	multiPort := len(s.Ports) > 1

	// Topology-specific fields.
	ingress := topo == DSR || topo == StatelessDNAT
	if len(s.SNATAddresses) > 0 && topo != SNAT {
		bad("snatAddresses: only a snat service translates source addresses")
	}
	if s.Hairpin && topo != DNAT {
		bad("hairpin: only for dnat services (snat masquerades every connection)")
	}
	if len(s.SourceRanges) > 0 && topo != SNAT && topo != DNAT {
		bad("sourceRanges: only for snat and dnat services")
	}
	for i, v := range s.SourceRanges {
		if _, err := netip.ParsePrefix(v); err != nil {
			bad("sourceRanges[%d]: %s is not a CIDR", i, model.Quote(v))
		}
	}
	switch s.NoBackend {
	case "", NoBackendReject, NoBackendDrop:
		if s.NoBackend != "" && topo != SNAT && topo != DNAT {
			bad("noBackend: only for snat and dnat services (the others have no backend to fall back on: they are refused without one)")
		}
	default:
		bad("noBackend: %s is not one of %s, %s", model.Quote(s.NoBackend), NoBackendReject, NoBackendDrop)
	}
	if len(s.MasqueradeExcept) > 0 && topo != DNAT {
		bad("masqueradeExcept: only for dnat services (snat masquerades every connection)")
	}
	for i, v := range s.MasqueradeExcept {
		if _, err := netip.ParsePrefix(v); err != nil {
			bad("masqueradeExcept[%d]: %s is not a CIDR", i, model.Quote(v))
		}
	}
	if s.InternalOnly {
		// (the callers' source NAT applies to their clients: the serving service's
		// hairpin, masqueradeExcept, source ranges and internal clients would never match)
		switch {
		case topo != DNAT:
			bad("internalOnly: only for dnat services (the services it serves are dnat, and their internal clients go to its chain)")
		case s.Internal != nil:
			bad("internalOnly: a service that serves only internal clients has no internal clients of its own (internal)")
		case len(s.SourceRanges) > 0:
			bad("sourceRanges: an internalOnly service has no clients of its own to restrict (the services it serves check theirs)")
		case s.Hairpin:
			bad("hairpin: an internalOnly service has no clients of its own (the hairpin of the services it serves applies)")
		case len(s.MasqueradeExcept) > 0:
			bad("masqueradeExcept: an internalOnly service has no clients of its own (the services it serves masquerade theirs)")
		}
	}
	if in := s.Internal; in != nil {
		if topo != SNAT && topo != DNAT {
			bad("internal: only for snat and dnat services")
		}
		switch {
		case in.Service == "":
			bad("internal.service: the service that serves internal clients is required")
		case in.Service == s.Name:
			bad("internal.service: %s is this service", model.Quote(in.Service))
		}
		if len(in.Sources) == 0 && !in.LocalHost {
			bad("internal: give sources, localHost or both (no client is internal)")
		}
		for i, v := range in.Sources {
			if _, err := netip.ParsePrefix(v); err != nil {
				bad("internal.sources[%d]: %s is not a CIDR", i, model.Quote(v))
			}
		}
	}
	snatFam := map[bool]bool{}
	for i, v := range s.SNATAddresses {
		a, err := model.ParseAddr(v)
		if err != nil {
			bad("snatAddresses[%d]: %v", i, err)
			continue
		}
		if snatFam[a.Is6()] {
			bad("snatAddresses[%d]: %s: one source address per family", i, a)
		}
		snatFam[a.Is6()] = true
	}
	if ingress {
		if s.Interface == "" {
			bad("interface: a %s service needs the interface its clients' packets arrive on", topo)
		} else if !model.ValidInterfaceName(s.Interface) {
			bad("interface: %s is not a valid interface name", model.Quote(s.Interface))
		}
		if s.BackendInterface != "" && !model.ValidInterfaceName(s.BackendInterface) {
			bad("backendInterface: %s is not a valid interface name", model.Quote(s.BackendInterface))
		}
	} else {
		if s.Interface != "" {
			bad("interface: only dsr and stateless-dnat services attach to an interface")
		}
		if s.BackendInterface != "" {
			bad("backendInterface: only dsr and stateless-dnat services attach to an interface")
		}
		if s.FlowTimeout != nil {
			bad("flowTimeout: only dsr and stateless-dnat services keep their own flow table (snat and dnat use conntrack)")
		}
	}
	if topo == StatelessDNAT && (families[false] > 1 || families[true] > 1) {
		bad("vips: a stateless-dnat service has at most one VIP per family (replies are rewritten back to it)")
	}
	if s.FlowTimeout != nil && (s.FlowTimeout.Duration < time.Second || s.FlowTimeout.Duration > 24*time.Hour) {
		bad("flowTimeout: %s is not between 1s and 24h", s.FlowTimeout.Duration)
	}
	if s.Persistence != nil && (s.Persistence.Duration < time.Second || s.Persistence.Duration > 24*time.Hour) {
		bad("persistence: %s is not between 1s and 24h", s.Persistence.Duration)
	}
	if s.FlowTableSize != 0 {
		if !ingress && s.Persistence == nil {
			bad("flowTableSize: only dsr and stateless-dnat services, and services with persistence, keep a table of their own (snat and dnat use conntrack)")
		} else if s.FlowTableSize < 1 || s.FlowTableSize > maxFlowTableSize {
			bad("flowTableSize: %d is not between 1 and %d", s.FlowTableSize, maxFlowTableSize)
		}
	}
	if len(s.HashFields) > 0 && sched != Hash {
		bad("hashFields: only the hash scheduler hashes fields (scheduler is %s)", model.Quote(sched))
	}
	for i, h := range s.HashFields {
		if !slices.Contains(hashFields, h) {
			bad("hashFields[%d]: %s is not one of %s", i, model.Quote(h), strings.Join(hashFields, ", "))
		} else if slices.Index(s.HashFields, h) != i {
			bad("hashFields[%d]: %s is listed twice", i, model.Quote(h))
		}
	}

	// Backends.
	// (a snat or dnat service without backends refuses its clients, as one whose backends are
	// all down: Kubernetes' Services without endpoints)
	if len(s.Backends) == 0 && topo != SNAT && topo != DNAT {
		bad("backends: a %s service needs at least one backend", topo)
	}
	type bkey struct {
		a netip.Addr
		p int
	}
	// (sized once: at 10,000 backends growing the set cost a one-shot apply ~3 ms; per family,
	// 0 IPv4 and 1 IPv6, the backends and their map entries)
	bseen := make(map[bkey]bool, len(s.Backends))
	servicePort := s.backendPort(0) // given as port or ports: [80] (0 for several)
	var bfam, weights, wgcd [2]int
	for i, b := range s.Backends {
		bf := listEntry{"backends", i} // spelled only in an error
		a, err := model.ParseAddr(b.Address)
		if err != nil {
			bad("%s.address: %v", bf, err)
		} else if a.IsUnspecified() || a.IsMulticast() {
			bad("%s.address: %s cannot be a backend", bf, a)
		} else {
			// on the port it is reached on: 10.1.0.11 and 10.1.0.11:80 of a port-80 service are
			// one backend (twice the weight, checked twice, and draining one left it in)
			n, p := len(bseen), s.backendPort(b.Port)
			if bseen[bkey{a, p}] = true; len(bseen) == n {
				bad("%s: %s port %d is listed twice", bf, a, p)
			}
			bfam[famIndex(a.Is6())]++
		}
		switch {
		case b.Port < 0 || b.Port > 65535:
			bad("%s.port: %d is not a valid port", bf, b.Port)
		case b.Port != 0 && multiPort:
			bad("%s.port: a service with several ports keeps the client's port; leave the backend's port out", bf)
		case b.Port != 0 && topo == DSR && b.Port != servicePort:
			bad("%s.port: dsr cannot translate ports (%d != %d); leave the backend's port out", bf, b.Port, servicePort)
		}
		if b.Weight != nil && (*b.Weight < 1 || *b.Weight > maxWeight) {
			bad("%s.weight: %d is not between 1 and %d", bf, *b.Weight, maxWeight)
		}
		if a.IsValid() {
			fi := famIndex(topo != DSR && a.Is6()) // dsr's slots pool both families
			weights[fi] += b.weight()
			wgcd[fi] = gcd(wgcd[fi], b.weight())
		}
		if b.Priority < 0 {
			bad("%s.priority: %d is negative (0 is a primary, higher numbers are backups)", bf, b.Priority)
		}
		if b.State != "" && !slices.Contains(states, b.State) {
			bad("%s.state: %s is not one of up, drain, down", bf, model.Quote(b.State))
		}
		if b.MAC != "" {
			if topo != DSR {
				bad("%s.mac: only dsr backends are reached by their MAC address", bf)
			} else if hw, err := net.ParseMAC(b.MAC); err != nil || len(hw) != 6 {
				bad("%s.mac: %s is not an Ethernet MAC address", bf, model.Quote(b.MAC))
			}
		}
	}
	for fi, w := range weights {
		// each backend has weight/gcd slots; an active subset's gcd is a multiple of this
		// one, so it never needs more (ServiceState.slots)
		if w > 0 && w/wgcd[fi] > maxSlots {
			fam := famName(fi == 1) + " "
			if topo == DSR {
				fam = ""
			}
			bad("backends: the %sweights divided by their gcd (%d) add up to %d map entries (at most %d)", fam, wgcd[fi], w/wgcd[fi], maxSlots)
		}
	}
	if topo != DSR && len(s.Backends) > 0 {
		// NAT cannot change the family: every VIP family needs backends of its own.
		for i, v := range s.VIPs {
			if a, err := netip.ParseAddr(v); err == nil && bfam[famIndex(a.Is6())] == 0 {
				bad("vips[%d]: %s is %s but no backend is (%s cannot translate between families)", i, a, famName(a.Is6()), topo)
			}
		}
	}
	if hc := s.HealthCheck; hc != nil {
		errs = append(errs, hc.validate(f+".healthCheck")...)
	}
	return errs
}

// weight is the backend's weight, 1 when it has none.
func (b *Backend) weight() int {
	if b.Weight == nil {
		return 1
	}
	return *b.Weight
}

// famIndex is a family's index: 0 IPv4, 1 IPv6.
func famIndex(is6 bool) int {
	if is6 {
		return 1
	}
	return 0
}

// listEntry names entry i of a list in an error: list[i].
type listEntry struct {
	list string
	i    int
}

func (e listEntry) String() string { return fmt.Sprintf("%s[%d]", e.list, e.i) }

func famName(is6 bool) string {
	if is6 {
		return "IPv6"
	}
	return "IPv4"
}

func (h *HealthCheck) validate(f string) []error {
	var errs []error
	bad := func(format string, a ...any) { errs = append(errs, fmt.Errorf("%s.%s", f, fmt.Sprintf(format, a...))) }
	if !slices.Contains(checkTypes, h.Type) {
		bad("type: %s is not one of %s", model.Quote(h.Type), strings.Join(checkTypes, ", "))
	}
	if h.Port < 0 || h.Port > 65535 {
		bad("port: %d is not a valid port", h.Port)
	}
	web := h.Type == "http" || h.Type == "https"
	if !web && (h.Path != "" || h.Host != "" || h.ExpectStatus != 0) {
		bad("path, host, expectStatus: only for http and https checks")
	}
	if h.Path != "" && !strings.HasPrefix(h.Path, "/") {
		bad("path: %s does not start with /", model.Quote(h.Path))
	} else if h.Path != "" {
		// every check would fail on it (the backend marked down at its first check)
		if _, err := url.ParseRequestURI(h.Path); err != nil || strings.ContainsFunc(h.Path, unicode.IsControl) {
			bad("path: %s is not a valid request path", model.Quote(h.Path))
		}
	}
	if h.Host != "" && (strings.ContainsFunc(h.Host, func(r rune) bool { return unicode.IsControl(r) || unicode.IsSpace(r) || r == '/' })) {
		bad("host: %s is not a valid Host header", model.Quote(h.Host))
	}
	if h.Query != "" {
		if name := strings.TrimSuffix(h.Query, "."); len(name) > 253 {
			bad("query: %s is longer than 253 bytes", model.Quote(h.Query))
		} else if slices.ContainsFunc(strings.Split(name, "."), func(l string) bool { return l == "" || len(l) > 63 }) {
			bad("query: %s has an empty label or one longer than 63 bytes", model.Quote(h.Query))
		}
	}
	if h.ExpectStatus != 0 && (h.ExpectStatus < 100 || h.ExpectStatus > 599) {
		bad("expectStatus: %d is not an HTTP status", h.ExpectStatus)
	}
	if h.Type == "udp" && h.Send == "" {
		bad("send: a udp check needs a request payload")
	}
	if h.Send != "" && h.Type != "udp" {
		bad("send: only for udp checks")
	}
	if h.Expect != "" && h.Type != "udp" && !web {
		bad("expect: only for udp, http and https checks")
	}
	if h.Query != "" && h.Type != "dns" {
		bad("query: only for dns checks")
	}
	if (h.Type == "command") != (len(h.Command) > 0) {
		bad("command: a command check needs a command, and only a command check has one")
	}
	if h.Type == "command" && len(h.Command) > 0 && !strings.HasPrefix(h.Command[0], "/") {
		bad("command[0]: %s is not an absolute path", model.Quote(h.Command[0]))
	}
	iv, to := h.interval(), h.timeout()
	if iv < 50*time.Millisecond || iv > time.Hour {
		bad("interval: %s is not between 50ms and 1h", iv)
	}
	// A timeout above the interval is fine: a backend's checks never overlap (the next
	// starts when the previous one ends).
	if to <= 0 || to > time.Hour {
		bad("timeout: %s is not between 0 and 1h", to)
	}
	if h.Rise < 0 || h.Rise > 100 {
		bad("rise: %d is not between 1 and 100", h.Rise)
	}
	if h.Fall < 0 || h.Fall > 100 {
		bad("fall: %d is not between 1 and 100", h.Fall)
	}
	return errs
}

func (h *HealthCheck) interval() time.Duration {
	if h.Interval.Duration == 0 {
		return 5 * time.Second
	}
	return h.Interval.Duration
}

func (h *HealthCheck) timeout() time.Duration {
	if h.Timeout.Duration == 0 {
		return min(2*time.Second, h.interval())
	}
	return h.Timeout.Duration
}

func (h *HealthCheck) rise() int { return cmp.Or(h.Rise, 2) }
func (h *HealthCheck) fall() int { return cmp.Or(h.Fall, 3) }

// ValidateChange is ValidateServices(svcs, field) for svcs that differ from was, a list that
// passed it, in a few services (an API change): it validates the services that differ from
// was's of their name, with the services that share a name, a VIP or a backend with them,
// and not the others again (at 2,000 services the whole list took ~10 ms of every API call).
// When something is wrong it answers ValidateServices(svcs, field), whose errors name the
// fields.
func ValidateChange(was, svcs []Service, field func(int) string) []error {
	old := make(map[string]*Service, len(was))
	for i := range was {
		old[was[i].Name] = &was[i]
	}
	names := make(map[string]int, len(svcs))
	var changed []int
	isChanged := make([]bool, len(svcs))
	for i := range svcs {
		s := &svcs[i]
		names[s.Name]++
		if o := old[s.Name]; o == nil || !sameDefinition(o, s) {
			changed = append(changed, i)
			isChanged[i] = true
		}
	}
	// Services with internal clients, by the service that serves them: a change to either
	// checks both; a service removed that one still names is an error.
	var internalOf map[string][]int
	for i := range svcs {
		if in := svcs[i].Internal; in != nil {
			if names[in.Service] == 0 {
				return ValidateServices(svcs, field)
			}
			if internalOf == nil {
				internalOf = map[string][]int{}
			}
			internalOf[in.Service] = append(internalOf[in.Service], i)
		}
	}
	if len(changed) == 0 && len(names) == len(svcs) {
		return nil // services removed, or none changed: no new conflict
	}
	type key struct {
		addr  netip.Addr
		proto string
		port  int
	}
	vips, backends, mine := map[key]bool{}, map[key]bool{}, map[string]bool{}
	// keys calls fn with each VIP and backend key of s, as ValidateServices compares them;
	// with may, only for the addresses that may says may match (the others are not parsed).
	keys := func(s *Service, may func(string) bool, fn func(vip bool, k key) bool) bool {
		parse := func(v string) (netip.Addr, bool) {
			if may != nil && !may(v) {
				return netip.Addr{}, false
			}
			a, err := netip.ParseAddr(v)
			return a, err == nil
		}
		proto, ports := s.proto(), s.ports()
		for _, v := range s.dispatched() {
			if a, ok := parse(v); ok {
				for _, p := range ports {
					if fn(true, key{a, proto, p}) {
						return true
					}
				}
			}
		}
		if s.topology() == DSR {
			return false
		}
		for _, b := range s.Backends {
			if a, ok := parse(b.Address); ok {
				for _, p := range ports {
					if fn(false, key{a, proto, cmp.Or(b.Port, p)}) {
						return true
					}
				}
			}
		}
		return false
	}
	// addrs: the changed services' addresses as netip writes them. An IPv4 address that
	// netip.ParseAddr takes is written so already (no leading zeros, no zone), so an address
	// without a colon that is not in addrs shares no key with them: the others' addresses are
	// parsed only when they may (most of them are not).
	addrs := map[string]bool{}
	for _, i := range changed {
		mine[svcs[i].Name] = true
		keys(&svcs[i], nil, func(vip bool, k key) bool {
			if vip {
				vips[k] = true
			} else {
				backends[k] = true
			}
			addrs[k.addr.String()] = true
			return false
		})
	}
	may := func(a string) bool { return addrs[a] || strings.IndexByte(a, ':') >= 0 }
	// (the services that serve changed ones' internal clients, and the others they serve)
	served := map[string]bool{}
	for _, i := range changed {
		if in := svcs[i].Internal; in != nil {
			served[in.Service] = true
		}
		for _, j := range internalOf[svcs[i].Name] {
			mine[svcs[j].Name] = true
		}
	}
	var idx []int
	for i := range svcs {
		s := &svcs[i]
		if isChanged[i] || mine[s.Name] || served[s.Name] || names[s.Name] > 1 ||
			keys(s, may, func(vip bool, k key) bool { return vip && vips[k] || !vip && backends[k] }) {
			idx = append(idx, i)
		}
	}
	sub := make([]Service, len(idx))
	for j, i := range idx {
		sub[j] = svcs[i]
	}
	if len(ValidateServices(sub, func(j int) string { return field(idx[j]) })) == 0 {
		return nil
	}
	return ValidateServices(svcs, field)
}
