package lbtest

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"time"

	"sigs.k8s.io/yaml"

	"github.com/hostaccel/hostaccel/internal/lb"
	"github.com/hostaccel/hostaccel/internal/testbed"
)

var topologies = []string{lb.SNAT, lb.DNAT, lb.DSR, lb.StatelessDNAT}

// scenario is one service per topology, on its own port.
type scenario struct {
	name   string
	port   int // backend port (dsr: the VIP's port too)
	mutate func(*lb.Service)
}

var weights = []int{1, 2, 3}

const (
	checkInterval = 200 * time.Millisecond
	rise, fall    = 2, 2
)

var scenarios = []scenario{
	{"rr", 81, nil},
	{"weight", 82, func(s *lb.Service) {
		s.Scheduler = lb.Weighted
		for i := range s.Backends {
			s.Backends[i].Weight = new(weights[i%3])
		}
	}},
	{"hash", 83, func(s *lb.Service) { s.Scheduler, s.HashFields = lb.Hash, []string{"src-ip"} }},
	{"persist", 84, func(s *lb.Service) { s.Persistence = lb.D(time.Minute) }},
	{"health", 90, func(s *lb.Service) {
		s.HealthCheck = &lb.HealthCheck{Type: "http", Path: "/", Interval: lb.Duration{Duration: checkInterval},
			Timeout: lb.Duration{Duration: 150 * time.Millisecond}, Rise: rise, Fall: fall}
		s.FlushConntrack = true
	}},
	{"drain", 85, nil},
}

func sc(name string) scenario {
	for _, s := range scenarios {
		if s.name == name {
			return s
		}
	}
	panic(name)
}

var shortTopo = map[string]string{lb.SNAT: "snat", lb.DNAT: "dnat", lb.DSR: "dsr", lb.StatelessDNAT: "sdnat"}

func svcName(topo string, s scenario) string { return shortTopo[topo] + "-" + s.name }

func vip(topo string, fam int) netip.Addr {
	if topo == lb.DSR {
		return dsrVIP(fam)
	}
	n := map[string]byte{lb.SNAT: 1, lb.DNAT: 2, lb.StatelessDNAT: 4}[topo]
	if fam == 0 {
		return netip.AddrFrom4([4]byte{10, 100, 0, n})
	}
	return netip.MustParseAddr(fmt.Sprintf("fd00:100::%d", n))
}

func dsrVIP(fam int) netip.Addr {
	return [2]netip.Addr{netip.MustParseAddr("10.200.0.3"), netip.MustParseAddr("fd00:200::3")}[fam]
}

// vipPort: dsr cannot translate ports; the others listen on 8000+backend port.
func vipPort(topo string, s scenario) int {
	if topo == lb.DSR {
		return s.port
	}
	return 8000 + bport(topo, s)
}

func target(topo string, s scenario, fam int) netip.AddrPort {
	return netip.AddrPortFrom(vip(topo, fam), uint16(vipPort(topo, s)))
}

// source is the client address that reaches a topology's VIPs (dsr: the back segment).
func source(topo string, fam int) netip.Addr {
	if topo == lb.DSR {
		return clBack[fam]
	}
	return clFront[fam]
}

// bport is the backend port of a scenario: stateless-dnat services have their own (no other
// service may share a stateless-dnat backend).
func bport(topo string, s scenario) int {
	if topo == lb.StatelessDNAT {
		return s.port + 10
	}
	return s.port
}

func service(topo string, s scenario) lb.Service {
	svc := lb.Service{Name: svcName(topo, s), VIPs: []string{vip(topo, 0).String(), vip(topo, 1).String()},
		Port: vipPort(topo, s), Topology: topo}
	switch topo {
	case lb.DSR:
		svc.Interface = "eth1"
		for i := range 3 {
			svc.Backends = append(svc.Backends, lb.Backend{Address: backendAddr(i, 0).String()})
		}
	default:
		if topo == lb.StatelessDNAT {
			svc.Interface, svc.BackendInterface = "eth0", "eth1"
		}
		for fam := range 2 {
			for i := range 3 {
				svc.Backends = append(svc.Backends, lb.Backend{Address: backendAddr(i, fam).String(), Port: bport(topo, s)})
			}
		}
	}
	if s.mutate != nil {
		s.mutate(&svc)
	}
	return svc
}

// backendKey is how the API names backend i of a service for family fam.
func backendKey(topo string, s scenario, i, fam int) string {
	if topo == lb.DSR {
		return backendAddr(i, 0).String()
	}
	return lb.BackendKey(backendAddr(i, fam).String(), bport(topo, s))
}

// udpServices: dnat and dsr over UDP, rr, to the backends' UDP servers on port 53.
func udpServices() []lb.Service {
	var out []lb.Service
	for _, topo := range []string{lb.DNAT, lb.DSR} {
		s := service(topo, scenario{name: "udp", port: 53})
		s.Protocol = "udp"
		s.HealthCheck = &lb.HealthCheck{Type: "dns", Query: "health.check", Interval: lb.Duration{Duration: time.Second}}
		out = append(out, s)
	}
	return out
}

func allServices() []lb.Service {
	var svcs []lb.Service
	for _, topo := range topologies {
		for _, s := range scenarios {
			svcs = append(svcs, service(topo, s))
		}
	}
	return append(svcs, udpServices()...)
}

func agentConfig(t *lbTopo) string {
	svcs := allServices()
	cfg := map[string]any{
		"datapath": "none",
		"agent":    map[string]string{"resyncPeriod": "3s", "minSyncInterval": "20ms"},
		"loadBalancer": lb.Config{
			API:       &lb.API{Socket: t.socket},
			StateFile: t.stateFile,
			Services:  svcs,
		},
	}
	b, err := yaml.Marshal(cfg)
	if err != nil {
		panic(err)
	}
	return string(b)
}

// get makes one HTTP request on a new connection from src (the caller is in the client's
// namespace) and returns the body: the backend's name.
func get(src netip.Addr, dst netip.AddrPort) (string, error) {
	c, err := dial(src, dst)
	if err != nil {
		return "", err
	}
	defer c.Close()
	return roundTrip(bufio.NewReader(c), c, true)
}

var (
	portMu   sync.Mutex
	lastPort = map[[2]string]int{}
)

// dial connects from a source port not used before towards dst in this run: the kernel
// may reuse a client port at once (the server closes first), and a dsr or stateless-dnat
// flow table rightly sends a reused 4-tuple to the backend it had, which would blur the
// exact rotation the tests check.
func dial(src netip.Addr, dst netip.AddrPort) (net.Conn, error) {
	for {
		p, err := nextPort(src, dst)
		if err != nil {
			return nil, err
		}
		d := net.Dialer{Timeout: 2 * time.Second, LocalAddr: &net.TCPAddr{IP: src.AsSlice(), Port: p}}
		c, err := d.Dial("tcp", dst.String())
		if errors.Is(err, syscall.EADDRINUSE) {
			continue
		}
		return c, err
	}
}

// portKey is lastPort's key of the source ports from src to dst.
func portKey(src netip.Addr, dst netip.AddrPort) [2]string {
	return [2]string{src.String(), dst.String()}
}

// usedPorts is the last source port nextPort gave from src to dst (below 20000: none yet).
func usedPorts(src netip.Addr, dst netip.AddrPort) int {
	portMu.Lock()
	defer portMu.Unlock()
	return max(lastPort[portKey(src, dst)], 19999)
}

// nextPort returns a source port from src to dst not used before in this run.
func nextPort(src netip.Addr, dst netip.AddrPort) (int, error) {
	portMu.Lock()
	defer portMu.Unlock()
	k := portKey(src, dst)
	p := max(lastPort[k]+1, 20000)
	lastPort[k] = p
	if p > 65000 {
		return 0, fmt.Errorf("out of source ports from %s to %s", src, dst)
	}
	return p, nil
}

func roundTrip(r *bufio.Reader, c net.Conn, closeAfter bool) (string, error) {
	c.SetDeadline(time.Now().Add(3 * time.Second))
	conn := "keep-alive"
	if closeAfter {
		conn = "close"
	}
	if _, err := fmt.Fprintf(c, "GET / HTTP/1.1\r\nHost: lb\r\nConnection: %s\r\n\r\n", conn); err != nil {
		return "", err
	}
	resp, err := http.ReadResponse(r, nil)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return string(b), err
}

// requests makes n requests from the client namespace, each on a new connection.
func requests(src netip.Addr, dst netip.AddrPort, n int) ([]string, error) {
	var out []string
	err := topo.client.Do(func() error {
		for i := range n {
			b, err := get(src, dst)
			if err != nil {
				return fmt.Errorf("request %d from %s to %s: %w", i, src, dst, err)
			}
			out = append(out, b)
		}
		return nil
	})
	return out, err
}

// keepAlive is a persistent HTTP connection from the client namespace.
type keepAlive struct {
	c net.Conn
	r *bufio.Reader
}

func dialKeepAlive(ns *testbed.NS, src netip.Addr, dst netip.AddrPort) (*keepAlive, error) {
	var c net.Conn
	err := ns.Do(func() (err error) {
		c, err = dial(src, dst)
		return err
	})
	if err != nil {
		return nil, err
	}
	return &keepAlive{c, bufio.NewReader(c)}, nil
}

func (k *keepAlive) get() (string, error) { return roundTrip(k.r, k.c, false) }

func count(names []string) map[string]int {
	m := map[string]int{}
	for _, n := range names {
		m[n]++
	}
	return m
}

func famName(fam int) string { return []string{"v4", "v6"}[fam] }

func short(s []string) string {
	if len(s) > 12 {
		return strings.Join(s[:12], " ") + " ..."
	}
	return strings.Join(s, " ")
}

var regexpCounter = regexp.MustCompile(`"counter":\{[^}]*\}`)

func netipMustParseAddrPort(s string) netip.AddrPort { return netip.MustParseAddrPort(s) }
