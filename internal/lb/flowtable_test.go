package lb

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"sigs.k8s.io/knftables"

	"github.com/hostaccel/hostaccel/internal/testbed"
)

// A dsr service whose flow table is full keeps every flow on one backend, on the real
// kernel: with flowTableSize 4, twelve UDP flows of six packets each, interleaved, under rr.
// The first four flows are recorded; the table is then full, `update @flows` fails for the
// eight others, and without the rule after it each of their packets was scheduled anew and
// reached another backend (a reviewer's finding: a flow's packets split across 3 MACs). Now
// they follow a hash of the flow, counted by the chain's "flow table full" counter.
//
//	eth0 (10.0.0.2, the clients) ── veth ── eth1 (the service's ingress; dsr forwards out
//	                                         of it again, so the frames come back to eth0)
//
// eth0's ingress counts each flow's frames per backend MAC. Then a flowTableSize that fits
// replaces the table (the Manager's partial diff, one transaction) and the next flows are
// all recorded.
func TestFlowTableFullKeepsEachFlowOnOneBackend(t *testing.T) {
	ns, eth1 := dsrBed(t, "flowfull")

	const flows, packets, size, port0 = 12, 6, 4, 40000
	macs := []string{"02:00:00:00:01:11", "02:00:00:00:01:12", "02:00:00:00:01:13"}
	svc := Service{Name: "web", VIPs: []string{"192.0.2.10"}, Port: 80, Protocol: "udp", Topology: DSR, Interface: "eth1",
		Scheduler: RoundRobin, FlowTableSize: size}
	for i, m := range macs {
		svc.Backends = append(svc.Backends, Backend{Address: fmt.Sprintf("10.0.0.%d", 11+i), MAC: m})
	}
	svcs := []Service{svc}
	if errs := ValidateServices(svcs, fieldByName(svcs)); len(errs) > 0 {
		t.Fatal(errs)
	}
	env := Env{Links: map[string]net.HardwareAddr{"eth1": eth1}}
	ctx := context.Background()
	var m *Manager
	if err := ns.Do(func() (err error) { m, err = NewManager(); return err }); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(m.Close)
	var rv Resolver
	var rr Renderer
	apply := func() Result { // the agent's path: the partial diff
		t.Helper()
		var res Result
		if err := ns.Do(func() (err error) { res, err = m.ApplyChanges(ctx, rr.Render(rv.Resolve(svcs, nil, env))); return err }); err != nil {
			t.Fatal(err)
		}
		return res
	}
	apply()

	// A named counter per flow and backend MAC at eth0's ingress, for two rounds of flows.
	var script strings.Builder
	script.WriteString("table netdev count {\n")
	for f := range 2 * flows {
		for b := range macs {
			fmt.Fprintf(&script, "\tcounter f%d-b%d {}\n", f, b)
		}
	}
	script.WriteString("\tchain in {\n\t\ttype filter hook ingress device \"eth0\" priority 0; policy accept;\n")
	for f := range 2 * flows {
		for b, mac := range macs {
			fmt.Fprintf(&script, "\t\tether daddr %s udp sport %d udp dport 80 counter name \"f%d-b%d\"\n", mac, port0+f, f, b)
		}
	}
	script.WriteString("\t}\n}\n")
	if err := ns.NFT(script.String()); err != nil {
		t.Fatal(err, "\n", script.String())
	}

	read := func(table string) map[string]Counter {
		t.Helper()
		var got map[string]Counter
		if err := ns.Do(func() (err error) {
			got, err = NetlinkCounters(ctx, TableRef{knftables.NetDevFamily, table})
			return err
		}); err != nil {
			t.Fatal(err)
		}
		return got
	}
	// send sends flows from..from+flows-1, their packets interleaved (each round one packet of
	// every flow), and checks that each flow's packets all reached one backend.
	send := func(from int) {
		t.Helper()
		if err := ns.Do(func() error {
			var conns []*net.UDPConn
			defer func() {
				for _, c := range conns {
					c.Close()
				}
			}()
			for f := from; f < from+flows; f++ {
				c, err := net.DialUDP("udp4", &net.UDPAddr{IP: net.IPv4(10, 0, 0, 2), Port: port0 + f}, &net.UDPAddr{IP: net.IPv4(192, 0, 2, 10), Port: 80})
				if err != nil {
					return err
				}
				conns = append(conns, c)
			}
			for range packets {
				for _, c := range conns {
					if _, err := c.Write([]byte("hello")); err != nil {
						return err
					}
				}
			}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		var got map[string]Counter
		total := func() (n uint64) {
			for f := from; f < from+flows; f++ {
				for b := range macs {
					n += got[fmt.Sprintf("f%d-b%d", f, b)].Packets
				}
			}
			return n
		}
		testbed.WaitFor(t, "every packet forwarded back to eth0", 5*time.Second, 20*time.Millisecond, func() bool {
			got = read("count")
			return total() >= flows*packets
		})
		if n := total(); n != flows*packets {
			t.Fatalf("%d packets counted at eth0, want %d", n, flows*packets)
		}
		used := map[int]bool{}
		for f := from; f < from+flows; f++ {
			var per []string
			on := 0
			for b := range macs {
				if n := got[fmt.Sprintf("f%d-b%d", f, b)].Packets; n > 0 {
					per = append(per, fmt.Sprintf("%s: %d", macs[b], n))
					on++
					used[b] = true
				}
			}
			if on != 1 {
				t.Errorf("flow %d (source port %d): its packets reached %d backends: %s", f, port0+f, on, strings.Join(per, ", "))
			}
		}
		if len(used) < 2 {
			t.Errorf("every flow reached one backend of the three: %v", used)
		}
	}

	send(0)
	lb := read(IngressTable("eth1"))
	if full, want := lb["full-dsr-web-v4"].Packets, uint64((flows-size)*packets); full != want {
		t.Errorf("flow table full counter: %d packets, want %d (%d flows past the table's %d, %d packets each); counters: %v",
			full, want, flows-size, size, packets, lb)
	}
	if n := lb["dsr-web-v4"].Packets; n != flows*packets {
		t.Errorf("the service counted %d packets, want %d", n, flows*packets)
	}
	// The status and the metrics show them.
	r := &Runtime{desired: Resolve(svcs, nil, env), mgr: m}
	var st Status
	if err := ns.Do(func() error { st = r.Status(ctx, true); return nil }); err != nil {
		t.Fatal(err)
	}
	if s, _ := st.Service("web"); s.TableFull != uint64((flows-size)*packets) || s.Packets != flows*packets {
		t.Errorf("status: %d packets, %d of them sent by hash (the flow table full), want %d, %d", s.Packets, s.TableFull, flows*packets, (flows-size)*packets)
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(NewCollector(func(context.Context) Status { return st }))
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var full []float64
	for _, mf := range mfs {
		if mf.GetName() == "hostaccel_lb_service_flow_table_full_packets_total" {
			for _, m := range mf.GetMetric() {
				full = append(full, m.GetCounter().GetValue())
			}
		}
	}
	if want := float64((flows - size) * packets); !slices.Equal(full, []float64{want}) {
		t.Errorf("hostaccel_lb_service_flow_table_full_packets_total: %v, want [%v]", full, want)
	}

	// A larger table replaces the map (in the transaction that rewrites the chain using it):
	// the next flows are all recorded, none is hashed.
	svcs[0].FlowTableSize = 4 * flows
	if res := apply(); !slices.Contains(res.MapsReplaced, IngressTable("eth1")+" web-flows-v4") {
		t.Errorf("resized: the flow table was not replaced: %+v", res)
	}
	if out, err := ns.Exec("nft", "list", "map", "netdev", IngressTable("eth1"), "web-flows-v4"); err != nil || !strings.Contains(out, fmt.Sprintf("size %d", 4*flows)) {
		t.Errorf("resized flow table (%v):\n%s", err, out)
	}
	send(flows)
	if full, was := read(IngressTable("eth1"))["full-dsr-web-v4"].Packets, lb["full-dsr-web-v4"].Packets; full != was {
		t.Errorf("flow table full counter: %d packets after the resize, %d before: flows were hashed", full, was)
	}
}

// dsrBed makes the namespace of a dsr service on eth1 whose clients are on eth0 (10.0.0.2),
// eth0 and eth1 a veth pair: a client's frames to the VIPs (192.0.2.0/24) go by a gateway
// whose MAC is eth1's, so they reach eth1's ingress (the service) with no ARP, and the service
// forwards them out of eth1 again, back to eth0, where a test counts them.
func dsrBed(t *testing.T, name string) (*testbed.NS, net.HardwareAddr) {
	t.Helper()
	ns := testEnvNS(t, name)
	for _, dev := range []string{"eth0", "eth1"} {
		if err := ns.LinkUp(dev); err != nil {
			t.Fatal(err)
		}
	}
	eth1 := testbed.LinkT(t, ns, "eth1").HardwareAddr
	if err := ns.AddrAdd("eth0", netip.MustParsePrefix("10.0.0.2/24")); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{
		{"ip", "neigh", "replace", "10.0.0.1", "lladdr", eth1.String(), "dev", "eth0", "nud", "permanent"},
		{"ip", "route", "add", "192.0.2.0/24", "via", "10.0.0.1", "dev", "eth0"},
	} {
		if out, err := ns.Exec(args...); err != nil {
			t.Fatal(err, out)
		}
	}
	return ns, eth1
}
