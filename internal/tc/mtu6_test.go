package tc

import (
	"context"
	"net/netip"
	"testing"
	"time"
)

// The FIB checks an IPv6 packet against the output device's IPv6 MTU (net.ipv6.conf.DEV.mtu,
// set by router advertisements or by hand), and so do the kept answers (nexthops, pairs,
// express slots): a 1400-byte datagram after small ones that kept the pair is refused as the
// kernel refuses it (Packet Too Big). They checked the device's MTU, and it went out; and a
// TCP stream's GSO segments were checked against the device's MTU, not 1280.
func TestKeptAnswersCheckTheIPv6MTU(t *testing.T) {
	e := newEnv(t, "")
	a := e.topo.Addrs(true)
	if err := e.topo.Node.Sysctl("net.ipv6.conf."+e.topo.TransportName+".mtu", "1280"); err != nil {
		t.Fatal(err)
	}
	send := func(smallFirst bool) (small, big int64) {
		srv, err := e.topo.Remote.ListenUDP(netip.AddrPortFrom(a.RemotePod, 0).String())
		if err != nil {
			t.Fatal(err)
		}
		defer srv.Close()
		c, err := e.topo.Pod.DialUDP(a.Pod.String(), srv.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		for range 5 {
			if !smallFirst {
				break
			}
			c.Write(make([]byte, 100))
			time.Sleep(10 * time.Millisecond)
		}
		time.Sleep(50 * time.Millisecond)
		small = srv.Packets()
		c.Write(make([]byte, 1400))
		time.Sleep(200 * time.Millisecond)
		return small, srv.Packets() - small
	}
	e.apply()
	_, bf := send(false)
	if bf != 0 {
		t.Errorf("with the tc datapath, the 1400-byte datagram first (no answer kept): %d arrived, want 0 (the FIB refuses it)", bf)
	}
	e.topo.Pod.Exec("ip", "-6", "route", "flush", "cache")
	e.apply()
	// A TCP stream's GSO packets, whose segments only the device's MTU could be checked
	// against here, go to the stack, which sends them in 1280 (or tells the Pod the size).
	before := e.status()
	if err := tcp(e.topo.Pod, e.topo.Remote, a.Pod, a.RemotePod); err != nil {
		t.Fatalf("TCP over a device of IPv6 MTU 1280: %v", err)
	}
	if n := e.status().Passed[PassFragNeeded].Packets - before.Passed[PassFragNeeded].Packets; n == 0 {
		t.Errorf("TCP over a device of IPv6 MTU 1280: no GSO packet went to the stack")
	}
	e.topo.Pod.Exec("ip", "-6", "route", "flush", "cache")
	e.apply()
	s, b := send(true)
	t.Logf("with the tc datapath: %d small datagrams, %d of 1400 bytes arrived across a hop of IPv6 MTU 1280", s, b)
	e.do(func() error { return NewManager().Remove(context.Background()) })
	e.topo.Pod.Exec("ip", "-6", "route", "flush", "cache")
	s0, b0 := send(true)
	t.Logf("without it (the kernel forwards): %d small, %d of 1400 bytes", s0, b0)
	if s != 5 || b != b0 || b0 != 0 {
		t.Errorf("a 1400-byte IPv6 datagram over a device of IPv6 MTU 1280: %d arrived with the tc datapath, %d without (the kernel sends Packet Too Big)", b, b0)
	}
}
