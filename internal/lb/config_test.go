package lb

import (
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/yaml"
)

func valid() Service {
	return Service{Name: "web", VIPs: []string{"192.0.2.10", "2001:db8::10"}, Port: 80,
		Backends: []Backend{{Address: "10.0.1.11", Port: 8080}, {Address: "fd00:1::11", Port: 8080}}}
}

func byIndex(i int) string { return fmt.Sprintf("loadBalancer.services[%d]", i) }

func TestValidServices(t *testing.T) {
	dsr := valid()
	dsr.Name, dsr.Topology, dsr.Interface, dsr.Scheduler, dsr.Backends = "dsr", DSR, "eth0", Hash, []Backend{{Address: "10.0.1.12", MAC: "02:00:00:00:00:01"}}
	dsr.VIPs, dsr.HashFields = []string{"192.0.2.11"}, []string{"src-ip", "src-port"}
	multi := valid()
	multi.Name, multi.Port, multi.Ports, multi.Protocol = "multi", 0, []int{80, 443}, "udp"
	multi.Backends = []Backend{{Address: "10.0.1.11"}, {Address: "fd00:1::11", Priority: 1, State: StateDrain}}
	// A timeout above the interval is valid: the next check starts when the previous one ends.
	multi.HealthCheck = &HealthCheck{Type: "dns", Query: "example.org", Interval: Duration{Duration: time.Second}, Timeout: Duration{Duration: 3 * time.Second}}
	sl := valid()
	sl.Name, sl.Topology, sl.Interface, sl.BackendInterface, sl.VIPs = "sl", StatelessDNAT, "eth0", "eth1", []string{"192.0.2.12"}
	sl.Backends, sl.Persistence = []Backend{{Address: "10.0.1.13", Port: 8080}}, D(time.Minute)
	// A dsr service's single port given as ports: [80] is its port: a backend on port 80
	// needs no translation (it was refused: "dsr cannot translate ports (80 != 0)").
	dsr80 := dsr
	dsr80.Name, dsr80.VIPs, dsr80.Port, dsr80.Ports = "dsr80", []string{"192.0.2.13"}, 0, []int{80}
	dsr80.Backends = []Backend{{Address: "10.0.1.12", Port: 80, MAC: "02:00:00:00:00:01"}}
	if errs := ValidateServices([]Service{valid(), dsr, multi, sl, dsr80}, byIndex); len(errs) > 0 {
		t.Fatal(errs)
	}
	// On a service of several ports a backend without a port keeps the client's: the same
	// address on each of them is one backend, not two.
	multi.Backends = append(multi.Backends, Backend{Address: "10.0.1.12"})
	if errs := ValidateServices([]Service{multi}, byIndex); len(errs) > 0 {
		t.Fatal(errs)
	}
}

func TestValidationErrors(t *testing.T) {
	for _, c := range []struct {
		want   string
		mutate func(s *Service)
	}{
		{`services[0].name: "Web_1" is not a valid name`, func(s *Service) { s.Name = "Web_1" }},
		{`services[0].port: 0 is not a valid port`, func(s *Service) { s.Port = 0 }},
		{`services[0].port: 70000 is not a valid port`, func(s *Service) { s.Port = 70000 }},
		{`services[0].ports: give either port or ports, not both`, func(s *Service) { s.Ports = []int{80} }},
		{`services[0].ports[1]: 80 is listed twice`, func(s *Service) { s.Port, s.Ports = 0, []int{80, 80} }},
		{`services[0].vips: at least one virtual IP is required`, func(s *Service) { s.VIPs = nil }},
		{`services[0].vips[0]: "192.0.2.300" is not a valid IP address`, func(s *Service) { s.VIPs[0] = "192.0.2.300" }},
		{`services[0].vips[0]: 0.0.0.0 cannot be a virtual IP`, func(s *Service) { s.VIPs[0] = "0.0.0.0" }},
		{`services[0].vips[1]: 192.0.2.10 is listed twice`, func(s *Service) { s.VIPs[1] = "192.0.2.10" }},
		{`services[0].topology: "nat" is not one of snat, dnat, dsr, stateless-dnat`, func(s *Service) { s.Topology = "nat" }},
		{`services[0].protocol: "icmp" is not one of tcp, udp, sctp`, func(s *Service) { s.Protocol = "icmp" }},
		{`services[0].scheduler: "lc" is not one of rr, weight, hash, symhash`, func(s *Service) { s.Scheduler = "lc" }},
		{`services[0].hashFields: only the hash scheduler hashes fields`, func(s *Service) { s.HashFields = []string{"src-ip"} }},
		{`services[0].hashFields[0]: "mac" is not one of src-ip, src-port, dst-ip, dst-port`, func(s *Service) { s.Scheduler, s.HashFields = Hash, []string{"mac"} }},
		{`services[0].backends: a dsr service needs at least one backend`, func(s *Service) { s.Topology, s.Interface, s.Backends = DSR, "eth0", nil }},
		{`services[0].backends[0].address: "backend1" is not a valid IP address`, func(s *Service) { s.Backends[0].Address = "backend1" }},
		{`services[0].backends[1]: 10.0.1.11 port 8080 is listed twice`, func(s *Service) { s.Backends[1].Address = "10.0.1.11" }},
		// a backend without a port is on the service's: 10.0.1.11 is 10.0.1.11:80 (it was
		// accepted twice: twice the weight, checked twice, and draining one left it in)
		{`services[0].backends[2]: 10.0.1.11 port 80 is listed twice`, func(s *Service) {
			s.Backends[0].Port = 80
			s.Backends = append(s.Backends, Backend{Address: "10.0.1.11"})
		}},
		{`services[0].backends[2]: 10.0.1.11 port 80 is listed twice`, func(s *Service) {
			s.Port, s.Ports, s.Backends[0].Port = 0, []int{80}, 0
			s.Backends = append(s.Backends, Backend{Address: "10.0.1.11", Port: 80})
		}},
		{`services[0].backends[1]: 10.0.1.11 port 80 is listed twice`, func(s *Service) {
			s.Topology, s.Interface, s.VIPs = DSR, "eth0", s.VIPs[:1]
			s.Backends = []Backend{{Address: "10.0.1.11", Port: 80}, {Address: "10.0.1.11"}}
		}},
		{`services[0].backends[0].weight: 1001 is not between 1 and 1000`, func(s *Service) { s.Backends[0].Weight = new(1001) }},
		{`services[0].backends[0].weight: 0 is not between 1 and 1000`, func(s *Service) { s.Backends[0].Weight = new(0) }},
		{`services[0].backends[1].weight: -2 is not between 1 and 1000`, func(s *Service) { s.Backends[1].Weight = new(-2) }},
		{`services[0].backends[0].priority: -1 is negative`, func(s *Service) { s.Backends[0].Priority = -1 }},
		{`services[0].backends[0].state: "paused" is not one of up, drain, down`, func(s *Service) { s.Backends[0].State = "paused" }},
		{`services[0].backends[0].mac: only dsr backends are reached by their MAC address`, func(s *Service) { s.Backends[0].MAC = "02:00:00:00:00:01" }},
		{`services[0].vips[1]: 2001:db8::10 is IPv6 but no backend is (dnat cannot translate between families)`, func(s *Service) { s.Backends = s.Backends[:1] }},
		{`services[0].backends[0].port: a service with several ports keeps the client's port`, func(s *Service) { s.Port, s.Ports = 0, []int{80, 443} }},
		{`services[0].interface: a dsr service needs the interface its clients' packets arrive on`, func(s *Service) { s.Topology = DSR }},
		{`services[0].backends[0].port: dsr cannot translate ports (8080 != 80)`, func(s *Service) { s.Topology, s.Interface = DSR, "eth0" }},
		{`services[0].backends[0].port: dsr cannot translate ports (8080 != 80)`, func(s *Service) { s.Topology, s.Interface, s.Port, s.Ports = DSR, "eth0", 0, []int{80} }},
		{`services[0].interface: only dsr and stateless-dnat services attach to an interface`, func(s *Service) { s.Interface = "eth0" }},
		{`services[0].flowTimeout: only dsr and stateless-dnat services keep their own flow table`, func(s *Service) { s.FlowTimeout = D(time.Minute) }},
		{`services[0].flowTableSize: only dsr and stateless-dnat services, and services with persistence, keep a table of their own`, func(s *Service) { s.FlowTableSize = 1000 }},
		{`services[0].flowTableSize: -1 is not between 1 and 16777216`, func(s *Service) { s.FlowTableSize, s.Persistence = -1, D(time.Minute) }},
		{`services[0].flowTableSize: 16777217 is not between 1 and 16777216`, func(s *Service) {
			s.Topology, s.Interface, s.FlowTableSize = StatelessDNAT, "eth0", 1<<24+1
		}},
		{`services[0].interface: "eth0/1" is not a valid interface name`, func(s *Service) { s.Topology, s.Interface = StatelessDNAT, "eth0/1" }},
		{`services[0].backendInterface: "\\1\\" is not a valid interface name`, func(s *Service) {
			s.Topology, s.Interface, s.BackendInterface = StatelessDNAT, "eth0", `\1\`
		}},
		{`services[0].vips: a stateless-dnat service has at most one VIP per family`, func(s *Service) {
			s.Topology, s.Interface, s.VIPs = StatelessDNAT, "eth0", []string{"192.0.2.10", "192.0.2.11", "2001:db8::10"}
		}},
		{`services[0].snatAddresses: only a snat service translates source addresses`, func(s *Service) { s.SNATAddresses = []string{"192.0.2.1"} }},
		{`services[0].snatAddresses[1]: 192.0.2.2: one source address per family`, func(s *Service) { s.Topology, s.SNATAddresses = SNAT, []string{"192.0.2.1", "192.0.2.2"} }},
		{`services[0].persistence: 500ms is not between 1s and 24h`, func(s *Service) { s.Persistence = D(500 * time.Millisecond) }},
		{`services[0].backends: the IPv4 weights divided by their gcd (1) add up to 263001 map entries (at most 262144)`, func(s *Service) {
			for i := range 263 {
				s.Backends = append(s.Backends, Backend{Address: fmt.Sprintf("10.0.%d.%d", 2+i/250, i%250), Weight: new(1000)})
			}
		}},
		{`services[0].healthCheck.type: "icmp" is not one of tcp, http, https, udp, dns, command, none`, func(s *Service) { s.HealthCheck = &HealthCheck{Type: "icmp"} }},
		{`services[0].healthCheck.timeout: -1s is not between 0 and 1h`, func(s *Service) { s.HealthCheck = &HealthCheck{Type: "tcp", Timeout: Duration{Duration: -time.Second}} }},
		{`services[0].healthCheck.send: a udp check needs a request payload`, func(s *Service) { s.HealthCheck = &HealthCheck{Type: "udp"} }},
		{`services[0].healthCheck.command: a command check needs a command`, func(s *Service) { s.HealthCheck = &HealthCheck{Type: "command"} }},
		{`services[0].healthCheck.path, host, expectStatus: only for http and https checks`, func(s *Service) { s.HealthCheck = &HealthCheck{Type: "tcp", Path: "/"} }},
		{`services[0].hairpin: only for dnat services (snat masquerades every connection)`, func(s *Service) { s.Topology, s.Hairpin = SNAT, true }},
		{`services[0].sourceRanges[0]: "10.0.0.1" is not a CIDR`, func(s *Service) { s.SourceRanges = []string{"10.0.0.1"} }},
		{`services[0].sourceRanges: only for snat and dnat services`, func(s *Service) {
			s.Topology, s.Interface, s.SourceRanges = DSR, "eth0", []string{"10.0.0.0/8"}
		}},
		{`services[0].noBackend: "silence" is not one of reject, drop`, func(s *Service) { s.NoBackend = "silence" }},
		{`services[0].noBackend: only for snat and dnat services`, func(s *Service) { s.Topology, s.Interface, s.NoBackend = DSR, "eth0", NoBackendDrop }},
		{`services[0].masqueradeExcept: only for dnat services`, func(s *Service) { s.Topology, s.MasqueradeExcept = SNAT, []string{"10.244.0.0/24"} }},
		{`services[0].masqueradeExcept[0]: "10.244.0.0" is not a CIDR`, func(s *Service) { s.MasqueradeExcept = []string{"10.244.0.0"} }},
		{`services[0].internal: only for snat and dnat services`, func(s *Service) {
			s.Topology, s.Interface, s.Internal = DSR, "eth0", &Internal{Service: "other", LocalHost: true}
		}},
		{`services[0].internal.service: the service that serves internal clients is required`, func(s *Service) { s.Internal = &Internal{LocalHost: true} }},
		{`services[0].internal.service: "web" is this service`, func(s *Service) { s.Internal = &Internal{Service: "web", LocalHost: true} }},
		{`services[0].internal: give sources, localHost or both`, func(s *Service) { s.Internal = &Internal{Service: "other"} }},
		{`services[0].internal.sources[1]: "10.244.0.1" is not a CIDR`, func(s *Service) {
			s.Internal = &Internal{Service: "other", Sources: []string{"10.244.0.0/24", "10.244.0.1"}}
		}},
		// settings every check would fail on (the backends down at their first check)
		{`services[0].healthCheck.path: "/%zz" is not a valid request path`, func(s *Service) { s.HealthCheck = &HealthCheck{Type: "http", Path: "/%zz"} }},
		{`services[0].healthCheck.path: "/a\nb" is not a valid request path`, func(s *Service) { s.HealthCheck = &HealthCheck{Type: "http", Path: "/a\nb"} }},
		{`services[0].healthCheck.host: "a b" is not a valid Host header`, func(s *Service) { s.HealthCheck = &HealthCheck{Type: "https", Host: "a b"} }},
		{`services[0].healthCheck.query: "` + strings.Repeat("a", 64) + `"…(72 bytes) has an empty label or one longer than 63 bytes`, func(s *Service) {
			s.Protocol, s.HealthCheck = "udp", &HealthCheck{Type: "dns", Query: strings.Repeat("a", 64) + ".example"}
		}},
		{`services[0].healthCheck.query: "a..example" has an empty label or one longer than 63 bytes`, func(s *Service) {
			s.Protocol, s.HealthCheck = "udp", &HealthCheck{Type: "dns", Query: "a..example"}
		}},
		{`services[0].healthCheck.interval: 10ms is not between 50ms and 1h`, func(s *Service) {
			s.HealthCheck = &HealthCheck{Type: "tcp", Interval: Duration{Duration: 10 * time.Millisecond}, Timeout: Duration{Duration: 5 * time.Millisecond}}
		}},
	} {
		s := valid()
		s.VIPs = append([]string(nil), s.VIPs...)
		s.Backends = append([]Backend(nil), s.Backends...)
		c.mutate(&s)
		errs := ValidateServices([]Service{s}, func(int) string { return "services[0]" })
		if !strings.Contains(fmt.Sprint(errs), c.want) {
			t.Errorf("want %q, got %v", c.want, errs)
		}
	}
}

func TestValidationAcrossServices(t *testing.T) {
	a, b := valid(), valid()
	b.Name = "api"
	errs := fmt.Sprint(ValidateServices([]Service{a, b}, byIndex))
	for _, want := range []string{
		`loadBalancer.services[1].vips[0]: 192.0.2.10 tcp/80 is already used by service "web" (loadBalancer.services[0])`,
		`loadBalancer.services[1].vips[1]: 2001:db8::10 tcp/80 is already used by service "web"`,
	} {
		if !strings.Contains(errs, want) {
			t.Errorf("want %q in %s", want, errs)
		}
	}
	b.Name = "web"
	b.VIPs = []string{"192.0.2.20"}
	b.Backends = b.Backends[:1]
	if errs := fmt.Sprint(ValidateServices([]Service{a, b}, byIndex)); !strings.Contains(errs, `loadBalancer.services[1].name: "web" is already used by loadBalancer.services[0]`) {
		t.Error(errs)
	}
	// The same VIP on another port or protocol is fine; a stateless-dnat backend is not shared.
	b.Name, b.VIPs, b.Protocol = "api", []string{"192.0.2.10"}, "udp"
	if errs := ValidateServices([]Service{a, b}, byIndex); len(errs) > 0 {
		t.Error(errs)
	}
	b.Protocol, b.Port, b.Topology, b.Interface = "tcp", 81, StatelessDNAT, "eth0"
	if errs := fmt.Sprint(ValidateServices([]Service{a, b}, byIndex)); !strings.Contains(errs,
		`loadBalancer.services[1].backends[0]: 10.0.1.11 tcp/8080 is also a backend of service "web" (loadBalancer.services[0]), and one of them is stateless-dnat`) {
		t.Error(errs)
	}
}

// A service's internal clients go to another snat or dnat service of its protocol with a VIP
// of each of its families, which has no internal clients of its own; the service then needs
// no backend (outside clients are refused).
func TestValidationOfInternalClients(t *testing.T) {
	cluster := valid()
	cluster.Name, cluster.VIPs = "cluster", []string{"10.96.0.10", "fd00:96::10"}
	local := valid()
	local.Backends, local.Internal = nil, &Internal{Service: "cluster", Sources: []string{"10.244.0.0/24"}, LocalHost: true}
	if errs := ValidateServices([]Service{cluster, local}, byIndex); len(errs) > 0 {
		t.Fatalf("valid: %v", errs)
	}
	for _, c := range []struct {
		want   string
		mutate func(cluster, local *Service)
	}{
		{`loadBalancer.services[1].internal.service: no service is named "cluster"`, func(c, l *Service) { c.Name = "other" }},
		{`loadBalancer.services[1].internal.service: "cluster" (loadBalancer.services[0]) has internal clients of its own (one step only)`, func(c, l *Service) {
			c.Internal = &Internal{Service: "web", LocalHost: true}
		}},
		{`loadBalancer.services[1].internal.service: "cluster" (loadBalancer.services[0]) is snat, not dnat`, func(c, l *Service) { c.Topology = SNAT }},
		{`loadBalancer.services[1].internal.service: both services must have one port (port, not ports)`, func(c, l *Service) {
			l.Port, l.Ports = 0, []int{80, 81}
		}},
		{`loadBalancer.services[1].internal.service: both services must have one port (port, not ports)`, func(c, l *Service) {
			c.Port, c.Ports = 0, []int{80, 81}
			for i := range c.Backends {
				c.Backends[i].Port = 0
			}
		}},
		{`loadBalancer.services[1].internal.service: "cluster" (loadBalancer.services[0]) is dsr, not dnat`, func(c, l *Service) {
			c.Topology, c.Interface, c.VIPs = DSR, "eth0", []string{"10.96.0.10"}
			c.Backends = []Backend{{Address: "10.0.1.11"}}
		}},
		{`loadBalancer.services[1].internal.service: "cluster" (loadBalancer.services[0]) is udp, this service tcp`, func(c, l *Service) { c.Protocol = "udp" }},
		{`loadBalancer.services[1].internal.service: "cluster" (loadBalancer.services[0]) has no IPv6 VIP (vips[1] is 2001:db8::10)`, func(c, l *Service) {
			c.VIPs, c.Backends = c.VIPs[:1], c.Backends[:1]
		}},
	} {
		c0, l0 := cluster.Clone(), local.Clone()
		c.mutate(&c0, &l0)
		if errs := fmt.Sprint(ValidateServices([]Service{c0, l0}, byIndex)); !strings.Contains(errs, c.want) {
			t.Errorf("want %q, got %s", c.want, errs)
		}
	}
}

func TestConfigSection(t *testing.T) {
	var c Config
	if c.InUse() || c.APIConfig() != nil || c.StatePath() != DefaultStateFile {
		t.Errorf("empty section: %+v", c)
	}
	c.Services = []Service{valid()}
	if a := c.APIConfig(); a == nil || a.Socket != DefaultSocket {
		t.Errorf("default API: %+v", a)
	}
	c.API = &API{Disabled: true}
	if c.APIConfig() != nil {
		t.Error("disabled API served")
	}
	c.API = &API{Listen: "0.0.0.0:9466"}
	if errs := fmt.Sprint(c.Validate()); !strings.Contains(errs, `loadBalancer.api.listen: "0.0.0.0:9466" needs loadBalancer.api.keyFile`) {
		t.Error(errs)
	}
	// Strict decoding: unknown fields are errors.
	if _, err := DecodeService([]byte("name: x\nbogus: 1\n")); err == nil || err.Error() != `service: unknown field "bogus"` {
		t.Errorf("unknown field: %v", err)
	}
	var round Config
	b, _ := yaml.Marshal(Config{Services: []Service{{Name: "x", Persistence: D(time.Minute), HealthCheck: &HealthCheck{Type: "tcp", Interval: Duration{Duration: time.Second}}}}})
	if err := yaml.UnmarshalStrict(b, &round); err != nil || round.Services[0].Persistence.Duration != time.Minute {
		t.Errorf("round trip: %v %s", err, b)
	}
}

// A weight written as 0 is refused (it used to count as 1); a weight left out is 1.
func TestWeightZeroRefused(t *testing.T) {
	s, err := DecodeService([]byte("name: web\nvips: [192.0.2.10]\nport: 80\nbackends:\n- {address: 10.0.1.11}\n- {address: 10.0.1.12, weight: 0}\n"))
	if err != nil {
		t.Fatal(err)
	}
	errs := fmt.Sprint(ValidateServices([]Service{s}, byIndex))
	if want := "loadBalancer.services[0].backends[1].weight: 0 is not between 1 and 1000"; !strings.Contains(errs, want) {
		t.Errorf("got %s, want %q", errs, want)
	}
	s.Backends = s.Backends[:1]
	if errs := ValidateServices([]Service{s}, byIndex); len(errs) > 0 {
		t.Fatal(errs)
	}
	if w := Resolve([]Service{s}, nil, Env{}).Services[0].Backends[0].Weight; w != 1 {
		t.Errorf("default weight %d", w)
	}
	if b, _ := yaml.Marshal(s); strings.Contains(string(b), "weight") {
		t.Errorf("a default weight is written out:\n%s", b)
	}
}

// The slot limit counts what the render makes: weight/gcd slots per backend (docs/lb.md). A
// review found 300 backends of weight 1000 (300 slots) refused as 300,000 map entries.
func TestSlotLimitAfterTheGCD(t *testing.T) {
	for _, c := range []struct {
		topo, weights string
		n             int
		want          string // "" accepted
	}{
		{DNAT, "1000", 300, ""},
		{DNAT, "4", maxSlots, ""},
		{DNAT, "4 and one of 2", maxSlots, "the IPv4 weights divided by their gcd (2) add up to 524289 map entries (at most 262144)"},
		{DSR, "1 over both families", maxSlots + 1, "the weights divided by their gcd (1) add up to 262145 map entries (at most 262144)"},
	} {
		s := valid()
		s.Name, s.Topology, s.VIPs, s.Backends = "web", c.topo, []string{"192.0.2.10"}, nil
		if c.topo == DSR {
			s.Interface = "eth0"
		}
		for i := range c.n {
			b := Backend{Address: netip.AddrFrom4([4]byte{10, byte(i >> 16), byte(i >> 8), byte(i)}).String(), Weight: new(1000)}
			switch c.weights {
			case "4", "4 and one of 2":
				b.Weight = new(4)
			case "1 over both families":
				b.Weight = nil
				if i%2 == 1 {
					b.Address = netip.AddrFrom16([16]byte{0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, byte(i >> 24), byte(i >> 16), byte(i >> 8), byte(i)}).String()
				}
			}
			if c.topo != DSR {
				b.Port = 8080
			}
			s.Backends = append(s.Backends, b)
		}
		if c.weights == "4 and one of 2" {
			s.Backends = append(s.Backends, Backend{Address: "10.255.0.1", Port: 8080, Weight: new(2)})
		}
		errs := fmt.Sprint(ValidateServices([]Service{s}, byIndex))
		if c.want == "" && errs != "[]" || c.want != "" && !strings.Contains(errs, c.want) {
			t.Errorf("%s, %d backends of weight %s: %s, want %q", c.topo, c.n, c.weights, errs, c.want)
		}
		if c.want == "" && c.n == 300 {
			if n := len(Resolve([]Service{s}, nil, Env{}).Services[0].slots(false)); n != 300 {
				t.Errorf("%d slots rendered, want 300", n)
			}
		}
	}
}

// Errors about the files and sockets the section names say which field they come from (a
// state file that is a directory used to give just "read /x: is a directory").
func TestFileFieldErrorsNameTheField(t *testing.T) {
	dir := t.TempDir()
	if _, err := Effective(Config{StateFile: dir, Services: []Service{valid()}}); err == nil ||
		!strings.HasPrefix(err.Error(), "loadBalancer.stateFile: ") || !strings.Contains(err.Error(), dir) {
		t.Errorf("state file is a directory: %v", err)
	}
	bad := filepath.Join(dir, "bad.yaml")
	os.WriteFile(bad, []byte("services:\n- {name: x, persistence: 10}\n"), 0o600)
	if _, err := Effective(Config{StateFile: bad}); err == nil ||
		err.Error() != "loadBalancer.stateFile: "+bad+`: services[0].persistence: 10 is not a duration; write one such as "30s" or "1m30s"` {
		t.Errorf("bad state file: %v", err)
	}
	file := filepath.Join(dir, "file")
	os.WriteFile(file, nil, 0o600)
	r := NewRuntime(slog.New(slog.NewTextHandler(io.Discard, nil)), func() {})
	if _, err := r.startAPI(API{Socket: filepath.Join(file, "lb.sock")}); err == nil || !strings.HasPrefix(err.Error(), "loadBalancer.api.socket: ") {
		t.Errorf("socket under a file: %v", err)
	}
	key := filepath.Join(dir, "key")
	os.WriteFile(key, []byte("0123456789abcdef0123"), 0o600)
	// A file at the socket's path is not removed (a typo naming a config file), nor is a
	// socket another process serves on.
	if _, err := r.startAPI(API{Socket: file}); err == nil || err.Error() != "loadBalancer.api.socket: "+file+" exists and is not a socket" {
		t.Errorf("socket path of a file: %v", err)
	}
	if _, err := os.Stat(file); err != nil {
		t.Errorf("the file at the socket's path: %v", err)
	}
	other := filepath.Join(dir, "other.sock")
	oln, err := net.Listen("unix", other)
	if err != nil {
		t.Fatal(err)
	}
	defer oln.Close()
	if _, err := r.startAPI(API{Socket: other}); err == nil || !strings.Contains(err.Error(), "another process serves on it") {
		t.Errorf("socket path of a socket another process serves: %v", err)
	}
	// The unix socket serves still where the TCP listener cannot (tried again at every sync).
	s, err := r.startAPI(API{Socket: filepath.Join(dir, "lb.sock"), Listen: "192.0.2.1:99999", KeyFile: key})
	if err != nil {
		t.Fatalf("socket: %v", err)
	}
	defer s.close(false)
	if s.tcpErr == nil || !strings.HasPrefix(s.tcpErr.Error(), "loadBalancer.api.listen: ") {
		t.Errorf("listen: %v", s.tcpErr)
	}
}

func TestPathLengths(t *testing.T) {
	long := "/" + strings.Repeat("d", 4095)
	c := Config{StateFile: long, API: &API{Socket: "/run/" + strings.Repeat("s", 103), KeyFile: long}}
	errs := fmt.Sprint(c.Validate())
	for _, want := range []string{
		`loadBalancer.api.socket: "/run/sss`, `…(108 bytes) is longer than 107 bytes, the limit of a unix socket's path`,
		`loadBalancer.api.keyFile: "/ddd`, `…(4096 bytes) is longer than 4095 bytes`,
		`loadBalancer.stateFile: "/ddd`,
	} {
		if !strings.Contains(errs, want) {
			t.Errorf("want %q in %s", want, errs)
		}
	}
	c = Config{StateFile: long[:4095], API: &API{Socket: "/run/" + strings.Repeat("s", 102), KeyFile: long[:4095]}}
	if errs := c.Validate(); len(errs) > 0 {
		t.Error(errs)
	}
}

// A one-shot apply does not check the config's services a second time (config.Load did),
// but a state file's services are checked together with them: a conflict is refused, and an
// error in the state file names the field as Effective does.
func TestCheckedEffectiveChecksWhatTheStateFileMergesIn(t *testing.T) {
	dir := t.TempDir()
	cfg := Config{StateFile: filepath.Join(dir, "none.yaml"), Services: []Service{valid()}}
	svcs, err := checkedEffective(cfg)
	if err != nil || len(svcs) != 1 || svcs[0].Name != "web" {
		t.Fatalf("no state file: %v %+v", err, svcs)
	}
	clash := valid()
	clash.Name = "api"
	cfg.StateFile = filepath.Join(dir, "state.yaml")
	if err := (Overlay{Services: []Service{clash}}).Save(cfg.StateFile); err != nil {
		t.Fatal(err)
	}
	if _, err := checkedEffective(cfg); err == nil || !strings.Contains(err.Error(), "192.0.2.10 tcp/80 is already used by service") {
		t.Errorf("a state file's service on the config's VIP: %v", err)
	}
	cfg.StateFile = dir
	if _, err := checkedEffective(cfg); err == nil || !strings.HasPrefix(err.Error(), "loadBalancer.stateFile: ") {
		t.Errorf("state file is a directory: %v", err)
	}
}

// The NAT VIPs the datapaths' external-to-loadbalancer class takes are those of the services
// in effect: a service added through the API (the state file) joins, one the API deleted
// leaves. Before (a review), only the config file's services counted, so an API service's
// connections were never offloaded.
func TestNATVIPsOfTheServicesInEffect(t *testing.T) {
	dir := t.TempDir()
	web := valid() // 192.0.2.10
	cfg := Config{StateFile: filepath.Join(dir, "state.yaml"), Services: []Service{web}}
	api := valid()
	api.Name, api.VIPs = "api", []string{"192.0.2.20"}
	if err := (Overlay{Services: []Service{api}, Deleted: []string{"web"}}).Save(cfg.StateFile); err != nil {
		t.Fatal(err)
	}
	r := &Runtime{}
	for name, f := range map[string]func(Config) ([]netip.Addr, bool){"agent": r.NATVIPs, "one-shot": (&OneShot{}).NATVIPs} {
		if got, ok := f(cfg); !ok || fmt.Sprint(got) != "[192.0.2.20]" {
			t.Errorf("%s: %v %v, want [192.0.2.20] (the API's service in, the deleted one out)", name, got, ok)
		}
	}
	clash := valid()
	clash.Name = "clash" // on web's VIP: not a valid merge once web is back
	if err := (Overlay{Services: []Service{clash}}).Save(cfg.StateFile); err != nil {
		t.Fatal(err)
	}
	if _, ok := (&OneShot{}).NATVIPs(cfg); ok {
		t.Error("a merge that does not validate: ok")
	}
}

// An internalOnly service (Kubernetes: every endpoint of a Service whose traffic policies are
// both Local, for its node port's internal clients) may share its VIPs and port with another
// service, which keeps them (services-*: TestRender's internal-only); it must be dnat and have
// no clients of its own to restrict, masquerade or send on.
func TestValidationOfInternalOnly(t *testing.T) {
	cluster := valid()
	cluster.Name, cluster.VIPs = "cluster", []string{"10.96.0.10", "fd00:96::10"}
	every := cluster.Clone()
	every.Name, every.InternalOnly = "every", true
	local := valid()
	local.Backends, local.Internal = nil, &Internal{Service: "every", Sources: []string{"10.244.0.0/24"}, LocalHost: true}
	if errs := ValidateServices([]Service{cluster, every, local}, byIndex); len(errs) > 0 {
		t.Fatalf("valid: %v", errs)
	}
	// (without internalOnly, the shared VIPs are an error: what the test sees is the field)
	shared := every.Clone()
	shared.InternalOnly = false
	if errs := fmt.Sprint(ValidateServices([]Service{cluster, shared}, byIndex)); !strings.Contains(errs, `loadBalancer.services[1].vips[0]: 10.96.0.10 tcp/80 is already used by service "cluster"`) {
		t.Errorf("the same VIPs without internalOnly: %s", errs)
	}
	for _, c := range []struct {
		want   string
		mutate func(e *Service)
	}{
		{`loadBalancer.services[1].internalOnly: only for dnat services`, func(e *Service) { e.Topology = SNAT }},
		{`loadBalancer.services[1].internalOnly: a service that serves only internal clients has no internal clients of its own`, func(e *Service) {
			e.Internal = &Internal{Service: "cluster", LocalHost: true}
		}},
		{`loadBalancer.services[1].sourceRanges: an internalOnly service has no clients of its own`, func(e *Service) { e.SourceRanges = []string{"10.0.0.0/8"} }},
		{`loadBalancer.services[1].hairpin: an internalOnly service has no clients of its own`, func(e *Service) { e.Hairpin = true }},
		{`loadBalancer.services[1].masqueradeExcept: an internalOnly service has no clients of its own`, func(e *Service) { e.MasqueradeExcept = []string{"10.244.0.0/24"} }},
	} {
		e := every.Clone()
		c.mutate(&e)
		if errs := fmt.Sprint(ValidateServices([]Service{cluster, e, local}, byIndex)); !strings.Contains(errs, c.want) {
			t.Errorf("want %q, got %s", c.want, errs)
		}
	}
	// The incremental check (a change of one service among many) takes the shared VIPs too.
	if errs := ValidateChange([]Service{cluster, local}, []Service{cluster, every, local}, byIndex); len(errs) > 0 {
		t.Errorf("incremental: %v", errs)
	}
}
