package tc

import (
	"context"
	"net/netip"
	"os"
	"slices"
	"testing"
	"time"

	"github.com/hostaccel/hostaccel/internal/model"
	"github.com/hostaccel/hostaccel/internal/testbed"
)

// An IPv6 route of the main table with a source prefix (ip -6 route add DST from SRC ...)
// makes the FIB's answer depend on the source: datagrams of two sources to one destination go
// where the kernel alone sends them. The next hop the program kept for the first source was
// used for the second too, whose route leaves by the other transport (5 of 5 to the wrong node).
// Answers are kept per pair of addresses for such a destination, never per destination.
func TestSourceRoutesFollowed(t *testing.T) {
	e := twoTransports(t)
	topo := e.topo
	a := topo.V6
	second := netip.MustParseAddr("fd00:10:244:1::3")
	for _, c := range [][]string{
		{"pod", "ip", "-6", "addr", "add", second.String() + "/64", "dev", "eth0"},
		{"node", "ip", "-6", "route", "add", a.RemotePodCIDR.String(), "from", second.String() + "/128", "via", a.Remote2.String(), "dev", topo.Transport2Name},
		{"node", "ip", "-6", "route", "add", a.RemotePodCIDR.String(), "from", a.Pod.String() + "/128", "via", a.Remote.String(), "dev", topo.TransportName},
		{"remote2", "ip", "-6", "addr", "add", a.RemotePod.String() + "/128", "dev", "lo"},
	} {
		ns := map[string]*testbed.NS{"pod": topo.Pod, "node": topo.Node, "remote2": topo.Remote2}[c[0]]
		if out, err := ns.Exec(c[1:]...); err != nil {
			t.Fatal(c, out, err)
		}
	}
	run := func() (fromSecondAtRemote, fromSecondAtRemote2 int64) {
		s1, s2 := listenAtBoth(t, topo, a)
		defer s1.Close()
		defer s2.Close()
		for _, src := range []netip.Addr{a.Pod, second} {
			c, err := topo.Pod.DialUDP(src.String(), s1.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			b1, b2 := s1.Packets(), s2.Packets()
			for range 5 {
				c.Write(make([]byte, 100))
				time.Sleep(10 * time.Millisecond)
			}
			time.Sleep(50 * time.Millisecond)
			c.Close()
			t.Logf("from %s: at Remote %d, at Remote2 %d", src, s1.Packets()-b1, s2.Packets()-b2)
			if src == second {
				return s1.Packets() - b1, s2.Packets() - b2
			}
		}
		return
	}
	e.apply()
	r1, r2 := run()
	t.Logf("with the tc datapath: datagrams from %s (routed via Remote2 by its source route) at Remote %d, at Remote2 %d", second, r1, r2)
	// The answers are kept per pair of addresses still: the datagrams after each pair's first
	// take the express lane (the route made the node keep none at all before).
	if st := e.status(); st.Via[ViaExpress].Packets == 0 {
		t.Errorf("no datagram took the express lane: %+v", st.Via)
	}
	e.do(func() error { return NewManager().Remove(context.Background()) })
	k1, k2 := run()
	t.Logf("without it: at Remote %d, at Remote2 %d", k1, k2)
	if r1 != k1 || r2 != k2 {
		t.Errorf("the tc datapath sent %s's packets another way than the kernel's source-specific route", second)
	}
}

// A route with two next hops that the kernel picks per flow (IPv4 with
// fib_multipath_hash_policy 1, a hash of the ports; IPv6, whose hash takes the flow label)
// spreads the flows of one pair of addresses over both, each flow one way: the program keeps
// no answer for what it decides and asks the FIB with the packet's ports and flow label. Kept
// per pair, every flow of the pair went the first one's way (16 of 16 flows to one node). The
// kernel's own choice is not reproducible here: it hashes by the socket's random hash where
// the packet carries one (skb->hash), which the FIB helper does not see; the test wants the
// same spread, not the same choice per flow.
func TestECMPFlowsSpread(t *testing.T) {
	e := twoTransports(t)
	topo := e.topo
	if err := topo.Node.Do(func() error {
		return os.WriteFile("/proc/sys/net/ipv4/fib_multipath_hash_policy", []byte("1"), 0)
	}); err != nil {
		t.Fatal(err)
	}
	for _, a := range []testbed.Addrs{topo.V4, topo.V6} {
		fam := "-4"
		if a.Pod.Is6() {
			fam = "-6"
		}
		for _, c := range [][]string{
			{"node", "ip", fam, "route", "replace", a.RemotePodCIDR.String(), "nexthop", "via", a.Remote.String(), "dev", topo.TransportName,
				"nexthop", "via", a.Remote2.String(), "dev", topo.Transport2Name},
			{"remote2", "ip", fam, "addr", "add", netip.PrefixFrom(a.RemotePod, a.RemotePod.BitLen()).String(), "dev", "lo"},
		} {
			ns := map[string]*testbed.NS{"node": topo.Node, "remote2": topo.Remote2}[c[0]]
			if out, err := ns.Exec(c[1:]...); err != nil {
				t.Fatal(c, out, err)
			}
		}
	}
	// ways sends 3 datagrams from each of 16 source ports and says where each port's went:
	// 1 (Remote), 2 (Remote2), 0 (lost or split).
	ways := func(a testbed.Addrs) []int {
		s1, s2 := listenAtBoth(t, topo, a)
		defer s1.Close()
		defer s2.Close()
		var out []int
		for port := 41000; port < 41016; port++ {
			c, err := topo.Pod.DialUDP(netip.AddrPortFrom(a.Pod, uint16(port)).String(), s1.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			b1, b2 := s1.Packets(), s2.Packets()
			for range 3 {
				c.Write(make([]byte, 100))
				time.Sleep(5 * time.Millisecond)
			}
			c.Close()
			way := 0
			for deadline := time.Now().Add(time.Second); way == 0 && time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
				switch n1, n2 := s1.Packets()-b1, s2.Packets()-b2; {
				case n1 == 3 && n2 == 0:
					way = 1
				case n1 == 0 && n2 == 3:
					way = 2
				}
			}
			out = append(out, way)
		}
		return out
	}
	spread := func(w []int) bool { return slices.Contains(w, 1) && slices.Contains(w, 2) && !slices.Contains(w, 0) }
	for _, a := range []testbed.Addrs{topo.V4, topo.V6} {
		kernel := ways(a)
		if !spread(kernel) {
			t.Fatalf("%s: the kernel alone sends 16 flows %v: want both next hops, every datagram of a flow one way", a.Pod, kernel)
		}
		e.apply()
		got := ways(a)
		st := e.status()
		e.do(func() error { return NewManager().Remove(context.Background()) })
		t.Logf("%s: per source port, the kernel %v, with the tc datapath %v", a.Pod, kernel, got)
		if !spread(got) {
			t.Errorf("%s: with the tc datapath the flows went %v: want both next hops, every datagram of a flow one way", a.Pod, got)
		}
		// (and the echoes back: 96)
		if n := st.Class(model.PodToPod).Packets; n != 96 {
			t.Errorf("%s: %d datagrams redirected, want 96", a.Pod, n)
		}
	}
}

// twoTransports is a node with a second transport to Remote2 and the tc datapath rendered for
// it (not applied): the peer Pod CIDR is routed through Remote, both remotes are peer nodes.
func twoTransports(t *testing.T) *env {
	topo := testbed.NewTopoT(t, testbed.TopoOptions{ExtraTransport: true})
	var local, peer []netip.Prefix
	var nodes []netip.Addr
	for _, a := range []testbed.Addrs{topo.V4, topo.V6} {
		local = append(local, a.PodCIDR)
		peer = append(peer, a.RemotePodCIDR)
		nodes = append(nodes, a.Remote, a.Remote2)
	}
	d, err := Render(model.State{Datapath: model.DatapathTC, Gateways: []string{topo.GatewayName},
		Transports: []string{topo.TransportName, topo.Transport2Name}, LocalPodCIDRs: local,
		PeerPodCIDRs: peer, PeerNodeIPs: nodes, Classes: Supported})
	if err != nil {
		t.Fatal(err)
	}
	e := &env{t: t, topo: topo, d: d, m: &Manager{}}
	t.Cleanup(func() { e.do(func() error { return NewManager().Remove(context.Background()) }) })
	return e
}

// listenAtBoth starts a UDP echo server on a's remote Pod address at Remote, and one on the same
// address and port at Remote2 (which holds that address on lo).
func listenAtBoth(t *testing.T, topo *testbed.Topo, a testbed.Addrs) (s1, s2 *testbed.UDPServer) {
	t.Helper()
	s1, err := topo.Remote.ListenUDP(netip.AddrPortFrom(a.RemotePod, 0).String())
	if err != nil {
		t.Fatal(err)
	}
	s2, err = topo.Remote2.ListenUDP(s1.Addr().String())
	if err != nil {
		s1.Close()
		t.Fatal(err)
	}
	return s1, s2
}
