package lb

import (
	"context"
	"fmt"
	"net"
	"regexp"
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/knftables"

	"github.com/hostaccel/hostaccel/internal/testbed"
)

// The forget rule deletes a flow's entry only when the entry's backend is gone. A key that
// was absent for the known-flow rule may have been recorded by another CPU's first packet of
// it before the forget rule runs: d7c14db's forget rule (read back, delete) deleted that
// entry, and the packet was scheduled anew, so one flow's (with persistence: one client's)
// packets on two CPUs reached two backends (test/lb's TestPersistenceParallelFirstConnections
// saw a reset and a split, now and then). Here the other CPU is a rule inserted between the
// two that records the flow to a backend rr does not pick first: the packet must reach that
// backend, and the entry must still hold it. Real kernel, dsr, IPv4 (eth0 -> eth1's ingress,
// forwarded out of eth1 back to eth0, as in TestFlowTableFullKeepsEachFlowOnOneBackend).
func TestForgetSparesAFlowAnotherCPURecorded(t *testing.T) {
	ns, eth1 := dsrBed(t, "forget")
	svc := Service{Name: "web", VIPs: []string{"192.0.2.10"}, Port: 80, Protocol: "udp", Topology: DSR, Interface: "eth1", Scheduler: RoundRobin}
	for i := range 3 {
		svc.Backends = append(svc.Backends, Backend{Address: fmt.Sprintf("10.0.0.%d", 11+i), MAC: fmt.Sprintf("02:00:00:00:01:1%d", i+1)})
	}
	svcs := []Service{svc}
	if errs := ValidateServices(svcs, fieldByName(svcs)); len(errs) > 0 {
		t.Fatal(errs)
	}
	d := Resolve(svcs, nil, Env{Links: map[string]net.HardwareAddr{"eth1": eth1}})
	ss := d.Services[0]
	first := ss.slots(false)[0] // rr's first pick (numgen inc starts at 0)
	var other *BackendState
	for _, be := range ss.Backends {
		if be.ID != first.ID {
			other = be
		}
	}
	ctx := context.Background()
	if err := ns.Do(func() error {
		m, err := NewManager()
		if err != nil {
			return err
		}
		defer m.Close()
		_, err = m.Apply(ctx, Render(d))
		return err
	}); err != nil {
		t.Fatal(err)
	}
	table := IngressTable("eth1")
	listing, err := ns.Exec("nft", "-a", "list", "chain", "netdev", table, "dsr-web-v4")
	if err != nil {
		t.Fatal(err, listing)
	}
	m := regexp.MustCompile(`forget a flow whose backend is gone.*# handle (\d+)`).FindStringSubmatch(listing)
	if m == nil {
		t.Fatalf("no forget rule:\n%s", listing)
	}
	const port = 40000
	key := fmt.Sprintf("ip saddr . udp sport : %s", idMAC(other))
	script := fmt.Sprintf(`insert rule netdev %s dsr-web-v4 position %s update @web-flows-v4 { %s }
table netdev count {
	counter other {}
	counter sent {}
	chain in {
		type filter hook ingress device "eth0" priority 0; policy accept;
		udp sport %d udp dport 80 counter name "sent"
		ether daddr %s udp sport %d udp dport 80 counter name "other"
	}
}
`, table, m[1], key, port, other.MAC, port)
	if err := ns.NFT(script); err != nil {
		t.Fatal(err, "\n", script)
	}
	if err := ns.Do(func() error {
		c, err := net.DialUDP("udp4", &net.UDPAddr{IP: net.IPv4(10, 0, 0, 2), Port: port}, &net.UDPAddr{IP: net.IPv4(192, 0, 2, 10), Port: 80})
		if err != nil {
			return err
		}
		defer c.Close()
		_, err = c.Write([]byte("hello"))
		return err
	}); err != nil {
		t.Fatal(err)
	}
	var got map[string]Counter
	testbed.WaitFor(t, "the packet forwarded back to eth0", 5*time.Second, 20*time.Millisecond, func() bool {
		if err := ns.Do(func() (err error) {
			got, err = NetlinkCounters(ctx, TableRef{knftables.NetDevFamily, "count"})
			return err
		}); err != nil {
			t.Fatal(err)
		}
		return got["sent"].Packets > 0
	})
	if got["other"].Packets != 1 {
		t.Errorf("the packet did not reach %s, the backend another CPU recorded its flow to (rr's first pick: %s): %v", other.MAC, first.MAC, got)
	}
	flows, err := ns.Exec("nft", "list", "map", "netdev", table, "web-flows-v4")
	if err != nil {
		t.Fatal(err, flows)
	}
	if want := fmt.Sprintf("10.0.0.2 . %d", port); !strings.Contains(flows, want) || !strings.Contains(flows, idMAC(other)) {
		t.Errorf("the flow's entry does not hold %s (%s):\n%s", idMAC(other), other.MAC, flows)
	}
}
