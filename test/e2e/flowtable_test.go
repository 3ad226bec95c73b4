package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/hostaccel/hostaccel/internal/agent"
	"github.com/hostaccel/hostaccel/internal/conntrack"
	"github.com/hostaccel/hostaccel/internal/model"
	"github.com/hostaccel/hostaccel/internal/testbed"
)

// nodeConfig renders a node config for the testbed topology.
func nodeConfig(tp *testbed.Topo, extra string) string {
	return fmt.Sprintf(`node:
  gateways: [%s]
  transports: [%s]
  localPodCIDRs: [%s, "%s"]
  peerPodCIDRs: [%s, "%s"]
  nodeIPs: [%s, "%s"]
  peerNodeIPs: [%s, "%s"]
%s`, tp.GatewayName, tp.TransportName, tp.V4.PodCIDR, tp.V6.PodCIDR, tp.V4.RemotePodCIDR, tp.V6.RemotePodCIDR,
		tp.V4.Node, tp.V6.Node, tp.V4.Remote, tp.V6.Remote, extra)
}

const podToPod = "classes: {pod-to-pod: true}\n"

func status(t *testing.T, ns *testbed.NS) agent.Status {
	t.Helper()
	var st agent.Status
	out := mustHA(t, ns.Name, "status", "-o", "json", "--state-file", "")
	if err := json.Unmarshal([]byte(out), &st); err != nil {
		t.Fatalf("status json: %v\n%s", err, out)
	}
	return st
}

func classPackets(st agent.Status, c model.Class) uint64 {
	for _, cs := range st.Classes {
		if cs.Class == c {
			return cs.Packets
		}
	}
	return 0
}

// flow finds the conntrack entry of a connection in ns.
func flow(t *testing.T, ns *testbed.NS, proto uint8, src, dst netip.Addr, dport uint16) conntrack.Flow {
	t.Helper()
	var flows []conntrack.Flow
	if err := ns.Do(func() (err error) { flows, err = conntrack.List(context.Background()); return }); err != nil {
		t.Fatal(err)
	}
	for _, f := range flows {
		if f.Orig.Proto == proto && f.Orig.Src == src && f.Orig.Dst == dst && f.Orig.DstPort == dport {
			return f
		}
	}
	t.Fatalf("no conntrack entry %d %s -> %s:%d among %d", proto, src, dst, dport, len(flows))
	return conntrack.Flow{}
}

// listed reports whether `hostaccel status` shows f among the offloaded connections.
func listed(st agent.Status, f conntrack.Flow) bool {
	want := fmt.Sprintf("src=%s dst=%s sport=%d dport=%d", f.Orig.Src, f.Orig.Dst, f.Orig.SrcPort, f.Orig.DstPort)
	for _, l := range st.Offloaded {
		if strings.Contains(l, want) && strings.Contains(l, "[OFFLOAD]") {
			return true
		}
	}
	return false
}

func hostport(a netip.Addr, port int) string { return netip.AddrPortFrom(a, uint16(port)).String() }

// tcpConn opens a TCP connection client -> server:port and moves n bytes each way.
func tcpConn(t *testing.T, client *testbed.NS, src netip.Addr, server *testbed.NS, dst netip.Addr, port, n int) net.Conn {
	t.Helper()
	srv, err := server.ListenTCP(hostport(dst, port))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close() })
	local := ""
	if src.IsValid() {
		local = src.String()
	}
	c, err := client.DialTCP(local, srv.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	if n > 0 {
		if err := testbed.Transfer(c, n, 16<<10); err != nil {
			t.Fatal(err)
		}
	}
	return c
}

// udpExchange sends n datagrams client -> server:port, each echoed back.
func udpExchange(t *testing.T, client *testbed.NS, server *testbed.NS, dst netip.Addr, port, n int) {
	t.Helper()
	srv, err := server.ListenUDP(hostport(dst, port))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close() })
	c, err := client.DialUDP("", srv.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	buf := make([]byte, 1500)
	for i := 0; i < n; i++ {
		if _, err := c.Write([]byte(fmt.Sprintf("datagram %04d %s", i, strings.Repeat("x", 900)))); err != nil {
			t.Fatal(err)
		}
		_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
		if _, err := c.Read(buf); err != nil {
			t.Fatalf("udp echo %d: %v", i, err)
		}
	}
}

// Pod-to-pod TCP and UDP, IPv4 and IPv6, are offloaded: conntrack says [OFFLOAD], and the
// class's rule counters stop after the first packets while the transfer goes on.
func TestPodToPodOffloaded(t *testing.T) {
	needFlowtable(t)
	tp := testbed.NewTopoT(t, testbed.TopoOptions{})
	mustHA(t, tp.Node.Name, "apply", "-f", writeConfig(t, nodeConfig(tp, podToPod)))
	for _, v6 := range []bool{false, true} {
		a := tp.Addrs(v6)
		t.Run(fmt.Sprintf("tcp/v6=%v", v6), func(t *testing.T) {
			before := classPackets(status(t, tp.Node), model.PodToPod)
			rx0 := testbed.LinkT(t, tp.Node, tp.GatewayName).Statistics.RxPackets
			tcpConn(t, tp.Pod, netip.Addr{}, tp.Remote, a.RemotePod, 5001, 8<<20)
			f := flow(t, tp.Node, 6, a.Pod, a.RemotePod, 5001)
			if !f.Offloaded() {
				t.Fatalf("not offloaded: %s", f)
			}
			if !listed(status(t, tp.Node), f) {
				t.Errorf("hostaccel status does not list %s", f)
			}
			slow := classPackets(status(t, tp.Node), model.PodToPod) - before
			fwd := testbed.LinkT(t, tp.Node, tp.GatewayName).Statistics.RxPackets - rx0
			t.Logf("%s; pod-to-pod rule counted %d packets while gw received %d", f, slow, fwd)
			if slow == 0 || slow > 40 || fwd < 20*slow {
				t.Errorf("forward chain saw %d packets of %d: the fastpath did not carry the transfer", slow, fwd)
			}
		})
		t.Run(fmt.Sprintf("udp/v6=%v", v6), func(t *testing.T) {
			udpExchange(t, tp.Pod, tp.Remote, a.RemotePod, 5002, 100)
			f := flow(t, tp.Node, 17, a.Pod, a.RemotePod, 5002)
			if !f.Offloaded() {
				t.Fatalf("not offloaded: %s", f)
			}
			if !listed(status(t, tp.Node), f) {
				t.Errorf("hostaccel status does not list %s", f)
			}
			t.Logf("%s", f)
		})
	}
	st := status(t, tp.Node)
	if ft := st.Table.Flowtables["fastpath"]; ft == nil || strings.Join(ft.Devices, ",") != "eth0,gw" {
		t.Errorf("flowtable: %+v", ft)
	}
}

// Traffic outside the enabled classes, and traffic to an excluded CIDR, takes the normal path.
func TestOutsideClassesAndExcludesNotOffloaded(t *testing.T) {
	needFlowtable(t)
	tp := testbed.NewTopoT(t, testbed.TopoOptions{})
	for _, v6 := range []bool{false, true} {
		a := tp.Addrs(v6)
		t.Run(fmt.Sprintf("external-not-enabled/v6=%v", v6), func(t *testing.T) {
			mustHA(t, tp.Node.Name, "apply", "-f", writeConfig(t, nodeConfig(tp, podToPod)))
			tcpConn(t, tp.Remote, a.External, tp.Pod, a.Pod, 5003, 1<<20)
			if f := flow(t, tp.Node, 6, a.External, a.Pod, 5003); f.Offloaded() {
				t.Fatalf("external -> pod offloaded with only pod-to-pod enabled: %s", f)
			}
		})
		t.Run(fmt.Sprintf("excluded/v6=%v", v6), func(t *testing.T) {
			cfg := nodeConfig(tp, podToPod+fmt.Sprintf("exclude: [%s, %s]\n", tp.V4.RemotePod, tp.V6.RemotePod))
			mustHA(t, tp.Node.Name, "apply", "-f", writeConfig(t, cfg))
			tcpConn(t, tp.Pod, netip.Addr{}, tp.Remote, a.RemotePod, 5004, 1<<20)
			udpExchange(t, tp.Pod, tp.Remote, a.RemotePod, 5005, 20)
			for _, p := range []struct {
				proto uint8
				port  uint16
			}{{6, 5004}, {17, 5005}} {
				if f := flow(t, tp.Node, p.proto, a.Pod, a.RemotePod, p.port); f.Offloaded() {
					t.Errorf("excluded destination offloaded: %s", f)
				}
			}
			var excluded uint64
			for _, r := range status(t, tp.Node).Rules {
				if strings.HasPrefix(r.Comment, "exclude") {
					excluded += r.Packets
				}
			}
			if excluded < 100 {
				t.Errorf("exclude rules counted %d packets; the excluded traffic did not hit them", excluded)
			}
		})
	}
}

// With packetThreshold N a connection is offloaded only once it carried more than N packets.
func TestPacketThreshold(t *testing.T) {
	needFlowtable(t)
	tp := testbed.NewTopoT(t, testbed.TopoOptions{})
	const n = 60
	mustHA(t, tp.Node.Name, "apply", "-f", writeConfig(t, nodeConfig(tp, podToPod+fmt.Sprintf("packetThreshold: %d\n", n))))
	a := tp.V4
	c := tcpConn(t, tp.Pod, netip.Addr{}, tp.Remote, a.RemotePod, 5006, 0)
	buf := make([]byte, 64)
	for i := 0; i < 8; i++ { // a few small round trips: well under n packets
		if _, err := c.Write(buf); err != nil {
			t.Fatal(err)
		}
		if _, err := c.Read(buf); err != nil {
			t.Fatal(err)
		}
	}
	f := flow(t, tp.Node, 6, a.Pod, a.RemotePod, 5006)
	if pk := f.OrigPackets + f.ReplyPackets; pk > n {
		t.Fatalf("setup carried %d packets already; the test needs fewer than %d", pk, n)
	}
	if f.Offloaded() {
		t.Fatalf("offloaded below the threshold: %s", f)
	}
	if got := classPackets(status(t, tp.Node), model.PodToPod); got != 0 {
		t.Errorf("pod-to-pod rule matched %d packets below the threshold", got)
	}
	if err := testbed.Transfer(c, 2<<20, 16<<10); err != nil {
		t.Fatal(err)
	}
	f = flow(t, tp.Node, 6, a.Pod, a.RemotePod, 5006)
	if !f.Offloaded() {
		t.Fatalf("not offloaded above the threshold: %s", f)
	}
}
