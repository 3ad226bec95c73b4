// Package lbtest drives the hostaccel binary's load balancer with real traffic on this host's
// kernel: a client namespace, a load balancer namespace running `hostaccel agent`, and three
// Go net/http backends, all in network namespaces (internal/testbed).
//
//	client eth0 ───────────── eth0 lb                     (front: 10.0.0.0/24, fd00:f::/64)
//	client eth1 ─┐            eth1 ─┐                     (back:  10.1.0.0/24, fd00:b::/64)
//	             └── sw (bridge br0) ┴── b1, b2, b3 eth0
//
// snat, dnat and stateless-dnat VIPs (10.100.0.0/24, fd00:100::/64) are routed by the client
// to the load balancer's front address; dsr VIPs (10.200.0.0/24, fd00:200::/64) to its back
// address, so that backends (which have the dsr VIPs on lo) answer the client directly over
// the bridge. Backends route everything else through the load balancer.
package lbtest

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/hostaccel/hostaccel/internal/lb"
	"github.com/hostaccel/hostaccel/internal/testbed"
)

var (
	hostaccel string // the binary under test
	topo      *lbTopo
)

func TestMain(m *testing.M) { os.Exit(run(m)) }

func run(m *testing.M) int {
	if code, ok := testbed.MainRequireRoot("load balancer tests"); !ok {
		return code
	}
	bin, cleanup, ok := testbed.MainBinary()
	if !ok {
		return 1
	}
	defer cleanup()
	hostaccel = bin
	dir, err := os.MkdirTemp("", "hostaccel-lb")
	if err != nil {
		panic(err)
	}
	defer os.RemoveAll(dir)
	topo, err = newTopo(dir)
	if topo != nil {
		defer topo.close()
	}
	if err != nil {
		fmt.Println("FAIL: topology:", err)
		return 1
	}
	if os.Getenv("HOSTACCEL_IN_VM") == "1" {
		// (a kernel the run owns: the persistence tests filled the VM's 8,192 entries within
		// a few runs, and connections timed out; never the host's)
		defer testbed.RaiseConntrackMax(65536)()
	}
	return m.Run()
}

// Addresses.
var (
	lbFront   = [2]netip.Addr{netip.MustParseAddr("10.0.0.1"), netip.MustParseAddr("fd00:f::1")}
	lbBack    = [2]netip.Addr{netip.MustParseAddr("10.1.0.1"), netip.MustParseAddr("fd00:b::1")}
	clFront   = [2]netip.Addr{netip.MustParseAddr("10.0.0.2"), netip.MustParseAddr("fd00:f::2")}
	clBack    = [2]netip.Addr{netip.MustParseAddr("10.1.0.100"), netip.MustParseAddr("fd00:b::100")}
	natVIPNet = [2]netip.Prefix{netip.MustParsePrefix("10.100.0.0/24"), netip.MustParsePrefix("fd00:100::/64")}
	dsrVIPNet = [2]netip.Prefix{netip.MustParsePrefix("10.200.0.0/24"), netip.MustParsePrefix("fd00:200::/64")}
)

func backendAddr(i, fam int) netip.Addr {
	if fam == 0 {
		return netip.AddrFrom4([4]byte{10, 1, 0, byte(11 + i)})
	}
	return netip.MustParseAddr(fmt.Sprintf("fd00:b::%d", 11+i))
}

// extra client addresses (hash and persistence tests): front for NAT VIPs, back for dsr.
func clientAddr(k, fam int, dsr bool) netip.Addr {
	switch {
	case fam == 0 && !dsr:
		return netip.AddrFrom4([4]byte{10, 0, 0, byte(10 + k)})
	case fam == 0:
		return netip.AddrFrom4([4]byte{10, 1, 0, byte(110 + k)})
	case !dsr:
		return netip.MustParseAddr(fmt.Sprintf("fd00:f::%d", 10+k))
	}
	return netip.MustParseAddr(fmt.Sprintf("fd00:b::%d", 110+k))
}

// nClients extra client addresses for the hash and persistence tests, then persistRounds
// more, one per round of TestPersistenceParallelFirstConnections.
const nClients, persistRounds = 10, 30

// backend ports: one per scenario, so that stateless-dnat services do not share a backend
// port (their replies could not be told apart).
var backendPorts = []int{80, 81, 82, 83, 84, 85, 86, 87, 90, 91, 92, 93, 94, 95, 96, 97, 100}

type lbTopo struct {
	dir                    string
	client, lb, sw         *testbed.NS
	backends               [3]*testbed.NS
	mu                     sync.Mutex
	servers                map[string]*http.Server // "b1:90"
	udp                    []net.PacketConn
	agent                  *exec.Cmd
	agentLog               *testbed.SyncBuffer
	socket, cfg, stateFile string
}

func nsSysctls(n *testbed.NS, kv ...string) error {
	for i := 0; i < len(kv); i += 2 {
		if err := n.Sysctl(kv[i], kv[i+1]); err != nil {
			return err
		}
	}
	return nil
}

var baseSysctls = []string{
	"net.ipv6.conf.all.accept_dad", "0", "net.ipv6.conf.default.accept_dad", "0",
	"net.ipv4.conf.all.rp_filter", "0", "net.ipv4.conf.default.rp_filter", "0",
}

func newTopo(dir string) (t *lbTopo, err error) {
	t = &lbTopo{dir: dir, servers: map[string]*http.Server{}, socket: filepath.Join(dir, "lb.sock"),
		cfg: filepath.Join(dir, "hostaccel.yaml"), stateFile: filepath.Join(dir, "lb-services.yaml")}
	mk := func(role string, sysctls ...string) (*testbed.NS, error) {
		n, err := testbed.NewNS(role)
		if err != nil {
			return nil, err
		}
		return n, nsSysctls(n, append(slicesClone(baseSysctls), sysctls...)...)
	}
	if t.client, err = mk("client"); err != nil {
		return t, err
	}
	if t.lb, err = mk("lb", "net.ipv4.ip_forward", "1", "net.ipv6.conf.all.forwarding", "1",
		"net.ipv4.conf.all.send_redirects", "0", "net.ipv4.conf.default.send_redirects", "0"); err != nil {
		return t, err
	}
	if t.sw, err = mk("sw"); err != nil {
		return t, err
	}
	for i := range t.backends {
		if t.backends[i], err = mk(fmt.Sprintf("b%d", i+1), "net.ipv4.conf.all.arp_ignore", "1", "net.ipv4.conf.all.arp_announce", "2"); err != nil {
			return t, err
		}
	}
	steps := []func() error{
		func() error { return testbed.Veth(t.client, "eth0", t.lb, "eth0") },
		func() error { _, err := t.sw.Exec("ip", "link", "add", "br0", "type", "bridge"); return err },
		func() error { return t.sw.LinkUp("br0") },
		func() error { return testbed.Veth(t.sw, "p-lb", t.lb, "eth1") },
		func() error { return testbed.Veth(t.sw, "p-cl", t.client, "eth1") },
	}
	for i, b := range t.backends {
		steps = append(steps, func() error { return testbed.Veth(t.sw, fmt.Sprintf("p-b%d", i+1), b, "eth0") })
	}
	for _, p := range []string{"p-lb", "p-cl", "p-b1", "p-b2", "p-b3"} {
		steps = append(steps, func() error { _, err := t.sw.Exec("ip", "link", "set", p, "master", "br0"); return err })
	}
	for fam := range 2 {
		bits := []int{24, 64}[fam]
		pfx := func(a netip.Addr) netip.Prefix { return netip.PrefixFrom(a, bits) }
		host := func(a netip.Addr) netip.Prefix { return netip.PrefixFrom(a, a.BitLen()) }
		steps = append(steps,
			func() error { return t.lb.AddrAdd("eth0", pfx(lbFront[fam])) },
			func() error { return t.lb.AddrAdd("eth1", pfx(lbBack[fam])) },
			func() error { return t.client.AddrAdd("eth0", pfx(clFront[fam])) },
			func() error { return t.client.AddrAdd("eth1", pfx(clBack[fam])) },
			func() error { return t.client.RouteAdd(natVIPNet[fam], lbFront[fam]) },
			func() error { return t.client.RouteAdd(dsrVIPNet[fam], lbBack[fam]) },
		)
		for k := range nClients + persistRounds {
			steps = append(steps,
				func() error { return t.client.AddrAdd("eth0", pfx(clientAddr(k, fam, false))) },
				func() error { return t.client.AddrAdd("eth1", pfx(clientAddr(k, fam, true))) })
		}
		for i, b := range t.backends {
			steps = append(steps,
				func() error { return b.AddrAdd("eth0", pfx(backendAddr(i, fam))) },
				func() error { return b.RouteAdd(netip.PrefixFrom(lbBack[fam], 0), lbBack[fam]) },
				func() error { return b.AddrAdd("lo", host(dsrVIP(fam))) })
		}
	}
	for _, s := range steps {
		if err := s(); err != nil {
			return t, err
		}
	}
	for i := range t.backends {
		for _, p := range backendPorts {
			if err := t.startBackend(i, p); err != nil {
				return t, err
			}
		}
		if err := t.startUDPBackend(i); err != nil {
			return t, err
		}
	}
	if err := os.WriteFile(t.cfg, []byte(agentConfig(t)), 0o644); err != nil {
		return t, err
	}
	return t, t.startAgent()
}

func slicesClone(s []string) []string { return append([]string(nil), s...) }

func (t *lbTopo) close() {
	t.stopAgent()
	t.mu.Lock()
	for _, s := range t.servers {
		s.Close()
	}
	for _, c := range t.udp {
		c.Close()
	}
	t.mu.Unlock()
	// Deleting the namespaces removes the load balancer's tables with them.
	for _, n := range append([]*testbed.NS{t.client, t.lb, t.sw}, t.backends[:]...) {
		if n != nil {
			n.Close()
		}
	}
}

// startBackend serves HTTP on [::]:port in backend i, answering with its name ("b1").
func (t *lbTopo) startBackend(i, port int) error {
	name := fmt.Sprintf("b%d", i+1)
	var ln net.Listener
	if err := t.backends[i].Do(func() (err error) {
		ln, err = net.Listen("tcp", fmt.Sprintf(":%d", port))
		return err
	}); err != nil {
		return err
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { fmt.Fprint(w, name) })}
	go srv.Serve(ln)
	t.mu.Lock()
	t.servers[fmt.Sprintf("%s:%d", name, port)] = srv
	t.mu.Unlock()
	return nil
}

// startUDPBackend answers every datagram to port 53 with the backend's name, and a DNS
// query with its id and NXDOMAIN (the dns health check). A UDP server answers from the
// address it is bound to, so it listens on each address (the dsr VIPs too) rather than on
// the wildcard, which would answer dsr clients from the backend's own address.
func (t *lbTopo) startUDPBackend(i int) error {
	name := []byte(fmt.Sprintf("b%d", i+1))
	for _, a := range []netip.Addr{backendAddr(i, 0), backendAddr(i, 1), dsrVIP(0), dsrVIP(1)} {
		var c net.PacketConn
		if err := t.backends[i].Do(func() (err error) {
			c, err = net.ListenPacket("udp", netip.AddrPortFrom(a, 53).String())
			return err
		}); err != nil {
			return err
		}
		go func() {
			buf := make([]byte, 512)
			for {
				n, from, err := c.ReadFrom(buf)
				if err != nil {
					return
				}
				if n >= 12 && buf[2]&0x80 == 0 && buf[5] == 1 { // a DNS query
					r := append([]byte{}, buf[:n]...)
					r[2], r[3] = 0x81, 0x83
					c.WriteTo(r, from)
					continue
				}
				c.WriteTo(name, from)
			}
		}()
		t.mu.Lock()
		t.udp = append(t.udp, c)
		t.mu.Unlock()
	}
	return nil
}

// stopBackend kills backend i's server on port (the listener and its connections).
func (t *lbTopo) stopBackend(i, port int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	key := fmt.Sprintf("b%d:%d", i+1, port)
	if s := t.servers[key]; s != nil {
		s.Close()
		delete(t.servers, key)
	}
}

func (t *lbTopo) startAgent() error {
	want := len(allServices())
	if st, err := t.status(); err == nil {
		want = len(st.Services)
	}
	t.agentLog = &testbed.SyncBuffer{}
	cmd := exec.Command("ip", "netns", "exec", t.lb.Name, hostaccel, "agent", "-f", t.cfg, "--state-file", filepath.Join(t.dir, "agent.json"),
		"--lock-file", filepath.Join(t.dir, "hostaccel.lock"))
	cmd.Stdout, cmd.Stderr = t.agentLog, t.agentLog
	if err := cmd.Start(); err != nil {
		return err
	}
	t.agent = cmd
	// Ready: every service installed, dsr backends' MACs resolved.
	deadline := time.Now().Add(20 * time.Second)
	for {
		st, err := t.status()
		if err == nil && len(st.Services) == want && st.LastError == "" && allActive(st) {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("agent not ready (%v, %d services, last error %q):\n%s", err, len(st.Services), st.LastError, t.agentLog)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func allActive(st lb.Status) bool {
	for _, s := range st.Services {
		for _, b := range s.Backends {
			if !b.Active && b.State == lb.StateUp {
				return false
			}
		}
	}
	return true
}

func (t *lbTopo) stopAgent() {
	if t.agent == nil {
		return
	}
	t.agent.Process.Signal(os.Interrupt)
	done := make(chan struct{})
	go func() { t.agent.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.agent.Process.Kill()
		<-done
	}
	t.agent = nil
}

func (t *lbTopo) api() *lb.Client { return lb.NewClient(t.socket, "", "") }

func (t *lbTopo) status() (lb.Status, error) {
	var st lb.Status
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	err := t.api().Do(ctx, http.MethodGet, "/v1/status", nil, &st)
	return st, err
}

// ha runs the hostaccel binary in the load balancer's namespace (apply and cleanup with the
// agent's lock file).
func (t *lbTopo) ha(args ...string) (string, error) {
	if len(args) > 0 && args[0] == "lb" {
		args = append([]string{"lb", "--socket", t.socket}, args[1:]...)
	}
	if len(args) > 0 && (args[0] == "apply" || args[0] == "cleanup") {
		args = append(args, "--lock-file", filepath.Join(t.dir, "hostaccel.lock"))
	}
	out, err := exec.Command("ip", append([]string{"netns", "exec", t.lb.Name, hostaccel}, args...)...).CombinedOutput()
	return string(out), err
}
