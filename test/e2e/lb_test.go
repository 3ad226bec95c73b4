package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hostaccel/hostaccel/internal/agent"
	"github.com/hostaccel/hostaccel/internal/conntrack"
	"github.com/hostaccel/hostaccel/internal/lb"
	"github.com/hostaccel/hostaccel/internal/model"
	"github.com/hostaccel/hostaccel/internal/testbed"
)

// The load balancer beside the flowtable: a service's VIPs on the Node, two backends per
// family on the Pod (its address and a second one), the client the Remote's external
// address. Connections to a VIP are balanced (conntrack DNAT, and source NAT for snat), then
// offloaded by the external-to-loadbalancer class, whose VIPs the agent adds to @lb-ip.
var lbVIP = map[bool]netip.Addr{false: netip.MustParseAddr("203.0.113.10"), true: netip.MustParseAddr("2001:db8:203::10")}

const lbPort = 8080

// lbBackends are the two backends of a family: the Pod's address and a second one on its eth0.
func lbBackends(tp *testbed.Topo, v6 bool) [2]netip.Addr {
	a := tp.Addrs(v6)
	return [2]netip.Addr{a.Pod, a.Pod.Next()}
}

// lbTopo is the testbed with the second backend addresses and the client's routes to the VIPs.
func lbTopo(t *testing.T) *testbed.Topo {
	t.Helper()
	tp := testbed.NewTopoT(t, testbed.TopoOptions{})
	for _, v6 := range []bool{false, true} {
		a := tp.Addrs(v6)
		b := lbBackends(tp, v6)
		if err := tp.Pod.AddrAdd("eth0", netip.PrefixFrom(b[1], a.PodCIDR.Bits())); err != nil {
			t.Fatal(err)
		}
		if err := tp.Remote.RouteAdd(netip.PrefixFrom(lbVIP[v6], lbVIP[v6].BitLen()), a.Node); err != nil {
			t.Fatal(err)
		}
	}
	return tp
}

// lbConfig is the node config with the external-to-loadbalancer class and one service
// "web" of topology on both VIPs, with the given health check and API (YAML flow maps).
func lbConfig(t *testing.T, tp *testbed.Topo, topology string, flush bool, health, api string) string {
	var bes []string
	for _, v6 := range []bool{false, true} {
		for _, b := range lbBackends(tp, v6) {
			bes = append(bes, fmt.Sprintf(`{address: "%s"}`, b))
		}
	}
	return nodeConfig(tp, fmt.Sprintf(`classes: {external-to-loadbalancer: true}
agent: {resyncPeriod: 2s, minSyncInterval: 100ms}
loadBalancer:
  api: %s
  stateFile: %s/lb-services.yaml
  services:
  - name: web
    vips: ["%s", "%s"]
    port: %d
    topology: %s
    flushConntrack: %v
    healthCheck: %s
    backends: [%s]
`, api, t.TempDir(), lbVIP[false], lbVIP[true], lbPort, topology, flush, health, strings.Join(bes, ", ")))
}

// lbConn is one client connection to the VIP, with the backend conntrack says it has.
type lbConn struct {
	c       net.Conn
	sport   uint16
	backend netip.Addr
}

// lbFlow finds the Node's conntrack entry of a client connection (nil: none).
func lbFlow(t *testing.T, tp *testbed.Topo, v6 bool, sport uint16) *conntrack.Flow {
	t.Helper()
	var flows []conntrack.Flow
	if err := tp.Node.Do(func() (err error) { flows, err = conntrack.List(context.Background()); return }); err != nil {
		t.Fatal(err)
	}
	a := tp.Addrs(v6)
	for _, f := range flows {
		if f.Orig.Proto == 6 && f.Orig.Src == a.External && f.Orig.Dst == lbVIP[v6] && f.Orig.DstPort == lbPort && f.Orig.SrcPort == sport {
			return &f
		}
	}
	return nil
}

// dialVIP opens n connections to the VIP from the Remote's external address and moves
// size bytes each way on each; it returns them with their backends.
func dialVIP(t *testing.T, tp *testbed.Topo, v6 bool, n, size int) []lbConn {
	t.Helper()
	var out []lbConn
	for range n {
		c, err := tryVIP(t, tp, v6, size)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, c)
	}
	return out
}

func tryVIP(t *testing.T, tp *testbed.Topo, v6 bool, size int) (lbConn, error) {
	t.Helper()
	c, err := tp.Remote.DialTCP(tp.Addrs(v6).External.String(), hostport(lbVIP[v6], lbPort))
	if err != nil {
		return lbConn{}, err
	}
	t.Cleanup(func() { c.Close() })
	if err := testbed.Transfer(c, size, 16<<10); err != nil {
		return lbConn{}, err
	}
	sport := uint16(c.LocalAddr().(*net.TCPAddr).Port)
	f := lbFlow(t, tp, v6, sport)
	if f == nil {
		return lbConn{}, fmt.Errorf("no conntrack entry for client port %d", sport)
	}
	return lbConn{c: c, sport: sport, backend: f.Reply.Src}, nil
}

// Connections to snat and dnat VIPs (IPv4 and IPv6) are offloaded after the balancing
// decision, are spread over both backends, keep their backend, and the class's rule
// counters stop while the transfer goes on.
func TestLoadBalancerOffloaded(t *testing.T) {
	needFlowtable(t)
	tp := lbTopo(t)
	for _, topology := range []string{"dnat", "snat"} {
		for _, v6 := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/v6=%v", topology, v6), func(t *testing.T) {
				mustHA(t, tp.Node.Name, "apply", "-f", writeConfig(t, lbConfig(t, tp, topology, false, "{type: none}", "{disabled: true}")))
				bes := lbBackends(tp, v6)
				var srv [2]*testbed.Server
				for i, b := range bes {
					s, err := tp.Pod.ListenTCP(hostport(b, lbPort))
					if err != nil {
						t.Fatal(err)
					}
					t.Cleanup(func() { s.Close() })
					srv[i] = s
				}
				conns := dialVIP(t, tp, v6, 4, 64<<10)
				used := map[netip.Addr]int{}
				for _, c := range conns {
					used[c.backend]++
					if !slices.Contains(bes[:], c.backend) {
						t.Fatalf("client port %d balanced to %s, not a backend", c.sport, c.backend)
					}
					f := lbFlow(t, tp, v6, c.sport)
					if !f.Offloaded() {
						t.Errorf("not offloaded: %s", f)
					}
					if topology == "snat" && f.Reply.Dst == tp.Addrs(v6).External {
						t.Errorf("snat did not translate the source: %s", f)
					}
				}
				if len(used) != 2 {
					t.Errorf("backends used by 4 connections: %v, want both (rr)", used)
				}
				// A long transfer on each connection: the forward chain sees almost none of it,
				// and every connection stays with its backend.
				before := classPackets(status(t, tp.Node), model.ExternalToLoadBalancer)
				rx0 := testbed.LinkT(t, tp.Node, tp.TransportName).Statistics.RxPackets
				bytes0 := [2]int64{srv[0].Bytes(), srv[1].Bytes()}
				for _, c := range conns {
					if err := testbed.Transfer(c.c, 2<<20, 16<<10); err != nil {
						t.Fatal(err)
					}
					f := lbFlow(t, tp, v6, c.sport)
					if f == nil || f.Reply.Src != c.backend || !f.Offloaded() {
						t.Errorf("client port %d: had backend %s, now %v", c.sport, c.backend, f)
					}
				}
				for i, b := range bes {
					if got, want := srv[i].Bytes()-bytes0[i], int64(used[b])*2<<20; got != want {
						t.Errorf("backend %s received %d bytes, want %d (its connections' share)", b, got, want)
					}
				}
				slow := classPackets(status(t, tp.Node), model.ExternalToLoadBalancer) - before
				fwd := testbed.LinkT(t, tp.Node, tp.TransportName).Statistics.RxPackets - rx0
				t.Logf("external-to-loadbalancer rules counted %d packets while %s received %d", slow, tp.TransportName, fwd)
				if fwd < 100 || slow > 40 || fwd < 20*slow {
					t.Errorf("forward chain saw %d packets of %d: the fastpath did not carry the transfer", slow, fwd)
				}
			})
		}
	}
}

// A backend drained, then failing its health check, mid-transfer on offloaded dnat
// connections, with the agent running (it drains through its API, checks health and flushes
// conntrack), as docs/lb.md says: drained, its connections go on (offloaded, same backend)
// and new ones go to the other backend; failed with flushConntrack, its connections are
// reset within seconds (the flowtable's entry goes with the conntrack entry, at the
// flowtable's next garbage collection); failed without it, its established connections go
// on (conntrack keeps their translation; here the backend itself still answers), and only
// new connections avoid it. The other backend's connections are untouched throughout.
func TestLoadBalancerDrainFailOffloaded(t *testing.T) {
	needFlowtable(t)
	tp := lbTopo(t)
	const v6, checkPort = false, 9090
	bes := lbBackends(tp, v6)
	for _, b := range bes {
		s, err := tp.Pod.ListenTCP(hostport(b, lbPort))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
	}
	for _, flush := range []bool{true, false} {
		t.Run(fmt.Sprintf("flushConntrack=%v", flush), func(t *testing.T) {
			var checks []*testbed.Server
			v6bes := lbBackends(tp, true)
			for _, b := range append(bes[:], v6bes[:]...) {
				s, err := tp.Pod.ListenTCP(hostport(b, checkPort))
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { s.Close() })
				checks = append(checks, s)
			}
			sock := t.TempDir() + "/lb.sock"
			health := fmt.Sprintf("{type: tcp, port: %d, interval: 1s, timeout: 1s, rise: 1, fall: 3}", checkPort)
			cfg := writeConfig(t, lbConfig(t, tp, "dnat", flush, health, fmt.Sprintf("{socket: %s}", sock)))
			statePath := t.TempDir() + "/agent.json"
			startAgent(t, tp.Node, "-f", cfg, "--state-file", statePath)
			// The agent's state file says when its first sync (load balancer, then
			// flowtable) succeeded; polling `hostaccel status` would compete with it for nft.
			waitFor(t, "the agent's first sync", 90*time.Second, func() bool {
				var st agent.State
				b, _ := os.ReadFile(statePath)
				return json.Unmarshal(b, &st) == nil && st.Syncs > 0 && st.SyncErrors == 0
			})
			var conns []lbConn
			waitFor(t, "the agent to balance over both backends", 60*time.Second, func() bool {
				c, err := tryVIP(t, tp, v6, 16<<10)
				if err != nil {
					return false
				}
				if len(conns) == 1 && conns[0].backend == c.backend {
					conns = nil
				}
				conns = append(conns, c)
				return len(conns) == 2
			})
			i := slices.IndexFunc(conns, func(c lbConn) bool { return c.backend == bes[1] })
			onB, onA := conns[i], conns[1-i]
			offloadedOn := func(c lbConn) {
				t.Helper()
				if f := lbFlow(t, tp, v6, c.sport); f == nil || !f.Offloaded() || f.Reply.Src != c.backend {
					t.Errorf("client port %d (backend %s): %v", c.sport, c.backend, f)
				}
			}
			offloadedOn(onB)

			mustHA(t, tp.Node.Name, "lb", "backend", "drain", "web", bes[1].String(), "--socket", sock)
			if err := testbed.Transfer(onB.c, 1<<20, 16<<10); err != nil {
				t.Fatalf("drained backend's connection broke: %v", err)
			}
			offloadedOn(onB)
			for _, c := range dialVIP(t, tp, v6, 3, 16<<10) {
				if c.backend != bes[0] {
					t.Errorf("new connection balanced to the drained backend %s", c.backend)
				}
			}

			checks[1].Close() // the drained backend fails its health check
			err := transferUntilError(onB.c, 15*time.Second)
			if flush {
				if err == nil {
					t.Errorf("failed with flushConntrack: the connection to %s still works after 15s", bes[1])
				} else {
					t.Logf("failed with flushConntrack: %v", err)
				}
				if f := lbFlow(t, tp, v6, onB.sport); f != nil && f.Reply.Src == bes[1] {
					t.Errorf("conntrack still has the failed backend's entry: %s", f)
				}
			} else {
				if err != nil {
					t.Errorf("failed without flushConntrack: the established connection broke: %v", err)
				}
				offloadedOn(onB)
			}
			if out := mustHA(t, tp.Node.Name, "lb", "status", "--socket", sock); !strings.Contains(out, "down") {
				t.Errorf("lb status does not show the failed backend:\n%s", out)
			}
			if err := testbed.Transfer(onA.c, 1<<20, 16<<10); err != nil {
				t.Errorf("the other backend's connection broke: %v", err)
			}
			offloadedOn(onA)
		})
	}
}

// transferUntilError moves data on c in small rounds for d; it returns the first error
// (nil: the connection worked all along).
func transferUntilError(c net.Conn, d time.Duration) error {
	old := testbed.IOTimeout
	testbed.IOTimeout = 3 * time.Second
	defer func() { testbed.IOTimeout = old }()
	for end := time.Now().Add(d); time.Now().Before(end); {
		if err := testbed.Transfer(c, 64<<10, 16<<10); err != nil {
			return err
		}
		time.Sleep(100 * time.Millisecond)
	}
	return nil
}

// A service's sourceRanges (Kubernetes' loadBalancerSourceRanges) let only those clients
// reach its VIPs, per family; others' packets are dropped. Real traffic on the host's kernel
// (datapath none: no flowtable needed): IPv4 from the client's address allowed, IPv6 from a
// range without it refused, then the ranges changed the other way round.
func TestLoadBalancerSourceRanges(t *testing.T) {
	tp := lbTopo(t)
	for _, v6 := range []bool{false, true} {
		for _, b := range lbBackends(tp, v6) {
			s, err := tp.Pod.ListenTCP(hostport(b, lbPort))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { s.Close() })
		}
	}
	config := func(ranges ...string) string {
		var bes []string
		for _, v6 := range []bool{false, true} {
			for _, b := range lbBackends(tp, v6) {
				bes = append(bes, fmt.Sprintf(`{address: "%s"}`, b))
			}
		}
		return nodeConfig(tp, fmt.Sprintf(`datapath: none
loadBalancer:
  api: {disabled: true}
  stateFile: %s/lb-services.yaml
  services:
  - name: web
    vips: ["%s", "%s"]
    port: %d
    topology: dnat
    sourceRanges: ["%s"]
    backends: [%s]
`, t.TempDir(), lbVIP[false], lbVIP[true], lbPort, strings.Join(ranges, `", "`), strings.Join(bes, ", ")))
	}
	reach := func(v6 bool) error {
		return tp.Remote.Do(func() error {
			d := net.Dialer{LocalAddr: &net.TCPAddr{IP: tp.Addrs(v6).External.AsSlice()}, Timeout: time.Second}
			c, err := d.Dial("tcp", hostport(lbVIP[v6], lbPort))
			if err == nil {
				c.Close()
			}
			return err
		})
	}
	v4, v6 := tp.Addrs(false).External, tp.Addrs(true).External
	mustHA(t, tp.Node.Name, "apply", "-f", writeConfig(t, config(netip.PrefixFrom(v4, 24).Masked().String(), "2001:db8:ffff::/48")))
	if err := reach(false); err != nil {
		t.Errorf("IPv4 client in the ranges: %v", err)
	}
	if err := reach(true); err == nil {
		t.Errorf("IPv6 client outside the ranges connected")
	}
	mustHA(t, tp.Node.Name, "apply", "-f", writeConfig(t, config("192.0.2.0/24", netip.PrefixFrom(v6, 64).Masked().String())))
	if err := reach(false); err == nil {
		t.Errorf("IPv4 client outside the ranges connected")
	}
	if err := reach(true); err != nil {
		t.Errorf("IPv6 client in the ranges: %v", err)
	}
}

// A backend that connects to its own dnat service and is picked itself (a Pod calling its
// own Service) gets an answer with hairpin on: its source is masqueraded, so that the reply
// goes back through the node and its un-DNAT. Without it the backend answers itself directly,
// from its own address, and the connection fails (kube-proxy masquerades such connections).
func TestLoadBalancerHairpin(t *testing.T) {
	tp := lbTopo(t)
	a := tp.Addrs(false)
	s, err := tp.Pod.ListenTCP(hostport(a.Pod, lbPort))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	for _, hairpin := range []bool{false, true} {
		mustHA(t, tp.Node.Name, "apply", "-f", writeConfig(t, nodeConfig(tp, fmt.Sprintf(`datapath: none
loadBalancer:
  api: {disabled: true}
  stateFile: %s/lb-services.yaml
  services:
  - {name: web, vips: ["%s"], port: %d, topology: dnat, hairpin: %v, backends: [{address: "%s"}]}
`, t.TempDir(), lbVIP[false], lbPort, hairpin, a.Pod))))
		err := tp.Pod.Do(func() error {
			d := net.Dialer{LocalAddr: &net.TCPAddr{IP: a.Pod.AsSlice()}, Timeout: time.Second}
			c, err := d.Dial("tcp", hostport(lbVIP[false], lbPort))
			if err != nil {
				return err
			}
			defer c.Close()
			return testbed.Transfer(c, 64<<10, 16<<10)
		})
		if hairpin && err != nil {
			t.Errorf("hairpin on: the backend's own connection to the VIP: %v", err)
		}
		if !hairpin && err == nil {
			t.Errorf("hairpin off: the backend's own connection to the VIP worked; this test shows nothing")
		}
	}
}

// clusterVIP is a ClusterIP-like VIP of the tests below, per family (IPv6: true).
var clusterVIP = map[bool]netip.Addr{false: netip.MustParseAddr("10.96.0.10"), true: netip.MustParseAddr("fd00:96::10")}

// lbOnly is the node config of the load balancer alone (no datapath) with these services
// (YAML list entries, each "  - {...}\n").
func lbOnly(t *testing.T, tp *testbed.Topo, services string) string {
	return nodeConfig(tp, fmt.Sprintf(`datapath: none
loadBalancer:
  api: {disabled: true}
  stateFile: %s/lb-services.yaml
  services:
%s`, t.TempDir(), services))
}

// remotePodServers listens on the remote Pod's addresses at lbPort, per family.
func remotePodServers(t *testing.T, tp *testbed.Topo) map[bool]*testbed.Server {
	out := map[bool]*testbed.Server{}
	for _, v6 := range []bool{false, true} {
		s, err := tp.Remote.ListenTCP(hostport(tp.Addrs(v6).RemotePod, lbPort))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		out[v6] = s
	}
	return out
}

// connectFrom connects from ns (from src, when valid) to vip:lbPort and moves data both
// ways, with transfer; else it only connects. It returns the first error.
func connectFrom(ns *testbed.NS, src, vip netip.Addr, transfer bool) error {
	return ns.Do(func() error {
		d := net.Dialer{Timeout: 2 * time.Second}
		if src.IsValid() {
			d.LocalAddr = &net.TCPAddr{IP: src.AsSlice()}
		}
		c, err := d.Dial("tcp", hostport(vip, lbPort))
		if err != nil {
			return err
		}
		defer c.Close()
		if !transfer {
			return nil
		}
		return testbed.Transfer(c, 64<<10, 16<<10)
	})
}

// routeVIPsOut gives the node a route to the load balancer IPs toward the remote host (they
// are not the node's own).
func routeVIPsOut(t *testing.T, tp *testbed.Topo) {
	for _, v6 := range []bool{false, true} {
		if err := tp.Node.RouteAdd(netip.PrefixFrom(lbVIP[v6], lbVIP[v6].BitLen()), tp.Addrs(v6).Remote); err != nil {
			t.Fatal(err)
		}
	}
}

// A service's internal clients (Kubernetes' short-circuit of externalTrafficPolicy Local) are
// served by another service: here a load balancer IP without local backends sends this node's
// Pods and the node itself to the cluster service's backend on the remote node, while an
// outside client's packets are dropped (noBackend drop, as kube-proxy drops a Local Service's
// external traffic on a node without local endpoints) or refused (reject, the default). Real
// traffic on the host's kernel, IPv4 and IPv6; the host's connections are masqueraded.
// Before, the field did not exist, and such a front was left out: every client of this node
// was refused; before noBackend, outside clients were refused where kube-proxy drops.
func TestLoadBalancerInternalClients(t *testing.T) {
	tp := lbTopo(t)
	remotePodServers(t, tp)
	routeVIPsOut(t, tp)
	config := func(internal, noBackend string) string {
		return lbOnly(t, tp, fmt.Sprintf(`  - {name: cluster, vips: ["%s", "%s"], port: %d, topology: dnat, backends: [{address: "%s"}, {address: "%s"}]}
  - {name: local, vips: ["%s", "%s"], port: %d, topology: dnat, internal: %s, noBackend: "%s", backends: []}
`, clusterVIP[false], clusterVIP[true], lbPort, tp.V4.RemotePod, tp.V6.RemotePod, lbVIP[false], lbVIP[true], lbPort, internal, noBackend))
	}
	// noBackend drop (Kubernetes: the Service has endpoints on other nodes): an outside
	// client's packets are dropped, as kube-proxy drops them, and its connect times out
	mustHA(t, tp.Node.Name, "apply", "-f", writeConfig(t, config(fmt.Sprintf(`{service: cluster, sources: ["%s", "%s"], localHost: true}`, tp.V4.PodCIDR, tp.V6.PodCIDR), "drop")))
	for _, v6 := range []bool{false, true} {
		a := tp.Addrs(v6)
		internalClientsReach(t, tp, v6)
		if err := connectFrom(tp.Remote, a.External, lbVIP[v6], true); !timedOut(err) {
			t.Errorf("%s: an outside client to a service without backends and noBackend drop: %v, want a timeout (its packets dropped)", famName(v6), err)
		}
	}
	// Pods no longer internal: refused as outside clients are now, with a reset (noBackend
	// reject, the default; what the test sees is the internal rule and the drop, not a route
	// around them).
	mustHA(t, tp.Node.Name, "apply", "-f", writeConfig(t, config(`{service: cluster, localHost: true}`, "reject")))
	for _, v6 := range []bool{false, true} {
		if err := connectFrom(tp.Pod, tp.Addrs(v6).Pod, lbVIP[v6], true); !errors.Is(err, syscall.ECONNREFUSED) {
			t.Errorf("%s: a Pod that is not internal to a service without backends: %v, want connection refused", famName(v6), err)
		}
		if err := connectFrom(tp.Remote, tp.Addrs(v6).External, lbVIP[v6], true); !errors.Is(err, syscall.ECONNREFUSED) {
			t.Errorf("%s: an outside client to a service without backends: %v, want connection refused", famName(v6), err)
		}
	}
}

// An internalOnly service (Kubernetes: a Service whose traffic policies are both Local, on a
// node without local endpoints) serves the load balancer IP's internal clients with every
// backend, while it shares its VIPs and port with the cluster service, which keeps them: this
// node's Pods reach the remote backend through the load balancer IP, not through the
// ClusterIP (the cluster service has no backend here and drops), and an outside client's
// packets to the load balancer IP are dropped. Real traffic on the host's kernel, IPv4 and
// IPv6. Before, the field did not exist: the two services could not share the VIPs and port,
// and such a node's Pods could not reach the Service's load balancer IP (kube-proxy
// short-circuits them to every endpoint).
func TestLoadBalancerInternalOnlyService(t *testing.T) {
	tp := lbTopo(t)
	servers := remotePodServers(t, tp)
	routeVIPsOut(t, tp)
	mustHA(t, tp.Node.Name, "apply", "-f", writeConfig(t, lbOnly(t, tp, fmt.Sprintf(`  - {name: cluster, vips: ["%[1]s", "%[2]s"], port: %[3]d, topology: dnat, noBackend: drop, backends: []}
  - {name: every, vips: ["%[1]s", "%[2]s"], port: %[3]d, topology: dnat, internalOnly: true, backends: [{address: "%[4]s"}, {address: "%[5]s"}]}
  - {name: local, vips: ["%[6]s", "%[7]s"], port: %[3]d, topology: dnat, noBackend: drop, internal: {service: every, sources: ["%[8]s", "%[9]s"], localHost: true}, backends: []}
`, clusterVIP[false], clusterVIP[true], lbPort, tp.V4.RemotePod, tp.V6.RemotePod, lbVIP[false], lbVIP[true], tp.V4.PodCIDR, tp.V6.PodCIDR))))
	for _, v6 := range []bool{false, true} {
		a := tp.Addrs(v6)
		internalClientsReach(t, tp, v6)
		if got := servers[v6].Peers(); !slices.Contains(got, a.Pod) {
			t.Errorf("%s: the backend saw %v; want this node's Pod's own address", famName(v6), got)
		}
		if err := connectFrom(tp.Pod, a.Pod, clusterVIP[v6], true); !timedOut(err) {
			t.Errorf("%s: this node's Pod to the ClusterIP (the cluster service: no backend, drop): %v, want a timeout", famName(v6), err)
		}
		if err := connectFrom(tp.Remote, a.External, lbVIP[v6], true); !timedOut(err) {
			t.Errorf("%s: an outside client to the load balancer IP: %v, want a timeout (its packets dropped)", famName(v6), err)
		}
	}
}

// internalClientsReach checks that this node's Pod and the node itself (internal clients)
// reach a backend through the load balancer IP of the family.
func internalClientsReach(t *testing.T, tp *testbed.Topo, v6 bool) {
	t.Helper()
	if err := connectFrom(tp.Pod, tp.Addrs(v6).Pod, lbVIP[v6], true); err != nil {
		t.Errorf("%s: this node's Pod to the load balancer IP: %v", famName(v6), err)
	}
	if err := connectFrom(tp.Node, netip.Addr{}, lbVIP[v6], true); err != nil {
		t.Errorf("%s: the node to the load balancer IP: %v", famName(v6), err)
	}
}

// timedOut reports whether err is a dial's timeout.
func timedOut(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// masqueradeExcept (Kubernetes: a ClusterIP, with this node's Pod CIDRs): a client from off the
// cluster whose route to the Service CIDR leads to this node (as with BGP-advertised Service
// IPs) is masqueraded, so that the backend's reply comes back through the node and its
// un-DNAT; this node's Pods keep their source address. Here the backend is on the client's
// own host: without the masquerade it answers the client directly, from its own address, and
// the connection fails. Real traffic, IPv4 and IPv6. Before, the field did not exist and
// Kubernetes' cluster fronts did not masquerade off-cluster clients.
func TestLoadBalancerMasqueradeOffCluster(t *testing.T) {
	tp := lbTopo(t)
	servers := remotePodServers(t, tp)
	for _, v6 := range []bool{false, true} {
		if err := tp.Remote.RouteAdd(netip.PrefixFrom(clusterVIP[v6], clusterVIP[v6].BitLen()), tp.Addrs(v6).Node); err != nil {
			t.Fatal(err)
		}
	}
	config := func(except string) string {
		return lbOnly(t, tp, fmt.Sprintf(`  - {name: cluster, vips: ["%s", "%s"], port: %d, topology: dnat, masqueradeExcept: [%s], backends: [{address: "%s"}, {address: "%s"}]}
`, clusterVIP[false], clusterVIP[true], lbPort, except, tp.V4.RemotePod, tp.V6.RemotePod))
	}
	mustHA(t, tp.Node.Name, "apply", "-f", writeConfig(t, config(fmt.Sprintf(`"%s", "%s"`, tp.V4.PodCIDR, tp.V6.PodCIDR))))
	for _, v6 := range []bool{false, true} {
		a := tp.Addrs(v6)
		if err := connectFrom(tp.Remote, a.External, clusterVIP[v6], true); err != nil {
			t.Errorf("%s: an off-cluster client to the ClusterIP: %v", famName(v6), err)
		}
		if err := connectFrom(tp.Pod, a.Pod, clusterVIP[v6], true); err != nil {
			t.Errorf("%s: this node's Pod to the ClusterIP: %v", famName(v6), err)
		}
		if got := servers[v6].Peers(); !slices.Contains(got, a.Node) || !slices.Contains(got, a.Pod) || slices.Contains(got, a.External) {
			t.Errorf("%s: the backend saw %v; want the node's address (the masqueraded client) and the Pod's own", famName(v6), got)
		}
	}
	// Without it, the same client fails (what the test sees is the masquerade).
	mustHA(t, tp.Node.Name, "apply", "-f", writeConfig(t, config("")))
	for _, v6 := range []bool{false, true} {
		if err := connectFrom(tp.Remote, tp.Addrs(v6).External, clusterVIP[v6], true); err == nil {
			t.Errorf("%s: an off-cluster client reached a backend on its own host without masquerade: this test shows nothing", famName(v6))
		}
	}
}

// One apply that removes the service serving internal clients and points the other at a new
// one, then one that removes the referring service too: the kernel takes each transaction
// (the chain that referred to the old one is rewritten before that one is deleted).
func TestLoadBalancerInternalServiceSwapped(t *testing.T) {
	tp := lbTopo(t)
	serving := func(name, vip string) string {
		return fmt.Sprintf("  - {name: %s, vips: [\"%s\"], port: %d, topology: dnat, backends: [{address: \"%s\"}]}\n", name, vip, lbPort, tp.V4.RemotePod)
	}
	local := func(to string) string {
		return fmt.Sprintf("  - {name: local, vips: [\"%s\"], port: %d, topology: dnat, internal: {service: %s, localHost: true}, backends: []}\n", lbVIP[false], lbPort, to)
	}
	mustHA(t, tp.Node.Name, "apply", "-f", writeConfig(t, lbOnly(t, tp, serving("one", "10.96.0.10")+local("one"))))
	mustHA(t, tp.Node.Name, "apply", "-f", writeConfig(t, lbOnly(t, tp, serving("two", "10.96.0.11")+local("two"))))
	mustHA(t, tp.Node.Name, "apply", "-f", writeConfig(t, lbOnly(t, tp, serving("three", "10.96.0.12"))))
}

// A dnat service without backends (Kubernetes: a Service without endpoints) refuses its
// clients at once, as kube-proxy rejects them: TCP gets a reset, IPv4 and IPv6, from another
// host and from the node itself. Before, such a Kubernetes front was not installed, and a
// connection to its ClusterIP followed the default route and hung.
func TestLoadBalancerServiceWithoutBackendsRefuses(t *testing.T) {
	tp := lbTopo(t)
	routeVIPsOut(t, tp)
	mustHA(t, tp.Node.Name, "apply", "-f", writeConfig(t, lbOnly(t, tp, fmt.Sprintf(`  - {name: empty, vips: ["%s", "%s"], port: %d, topology: dnat, backends: []}
`, lbVIP[false], lbVIP[true], lbPort))))
	for _, v6 := range []bool{false, true} {
		if err := connectFrom(tp.Remote, tp.Addrs(v6).External, lbVIP[v6], false); !errors.Is(err, syscall.ECONNREFUSED) {
			t.Errorf("%s: another host to a service without backends: %v, want connection refused", famName(v6), err)
		}
		if err := connectFrom(tp.Node, netip.Addr{}, lbVIP[v6], false); !errors.Is(err, syscall.ECONNREFUSED) {
			t.Errorf("%s: the node to a service without backends: %v, want connection refused", famName(v6), err)
		}
	}
}

func famName(v6 bool) string {
	if v6 {
		return "IPv6"
	}
	return "IPv4"
}

// A one-shot apply of a dsr service whose backend has no neighbour entry makes the kernel
// resolve it before it decides: a backend that answers is in the maps at once (before, only at
// the next apply); one whose entry the neighbour GC deleted while it lives keeps being in them;
// one that no longer answers (its address gone) leaves them, once the kernel has FAILED it
// (~3 s). Before, an apply kept the MAC the last one installed for a backend without an
// entry, and above gc_thresh1, where the kernel collects FAILED entries between applies, a dead
// backend stayed in the maps for good. Real kernel, IPv4.
func TestOneShotDSRNeighbours(t *testing.T) {
	tp := testbed.NewTopoT(t, testbed.TopoOptions{})
	b4 := tp.V4.PodCIDR.Addr().As4()
	b4[3] = 77 // (a second address of the Pod, in its CIDR)
	backend := netip.AddrFrom4(b4)
	addr := netip.PrefixFrom(backend, tp.V4.PodCIDR.Bits())
	if err := tp.Pod.AddrAdd("eth0", addr); err != nil {
		t.Fatal(err)
	}
	cfg := writeConfig(t, lbOnly(t, tp, fmt.Sprintf("  - {name: d, vips: [\"198.51.100.7\"], port: 80, topology: dsr, interface: %s, backends: [{address: \"%s\"}]}\n", tp.GatewayName, backend)))
	mac := testbed.LinkT(t, tp.Pod, "eth0").HardwareAddr.String()
	inMaps := func() bool {
		t.Helper()
		out, err := tp.Node.Exec("nft", "list", "map", "netdev", lb.IngressTablePrefix+tp.GatewayName, "d-macs")
		if err != nil {
			t.Fatal(err, out)
		}
		return strings.Contains(out, mac)
	}
	forget := func() {
		t.Helper()
		if out, err := tp.Node.Exec("ip", "neigh", "del", backend.String(), "dev", tp.GatewayName); err != nil {
			t.Fatal(err, out)
		}
	}
	first := mustHA(t, tp.Node.Name, "apply", "-f", cfg)
	if !inMaps() {
		nb, _ := tp.Node.Exec("ip", "neigh", "show", "dev", tp.GatewayName)
		t.Fatalf("a backend that answers is not in the maps after the first apply (neighbours: %q):\n%s", nb, first)
	}
	forget() // (as the GC does: dsr never refreshes it)
	mustHA(t, tp.Node.Name, "apply", "-f", cfg)
	if !inMaps() {
		t.Errorf("a live backend whose entry was collected left the maps")
	}
	if out, err := tp.Pod.Exec("ip", "addr", "del", addr.String(), "dev", "eth0"); err != nil {
		t.Fatal(err, out)
	}
	forget()
	start := time.Now()
	out := mustHA(t, tp.Node.Name, "apply", "-f", cfg)
	if inMaps() {
		t.Errorf("a backend that no longer answers is still in the maps (%s later):\n%s", time.Since(start).Round(time.Millisecond), out)
	}
}
