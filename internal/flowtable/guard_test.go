package flowtable

import (
	"fmt"
	"net/netip"
	"testing"
	"time"

	"github.com/hostaccel/hostaccel/internal/nftjson"
	"github.com/hostaccel/hostaccel/internal/testbed"
)

// The rendered TCP flags guard, on the host kernel (it needs no flowtable): in the forward
// hook of a router namespace, a reference chain at a lower priority counts TCP packets by
// their flags with the `tcp flags` expression; after the guard, a second chain counts what
// it let through. Every SYN, SYN-ACK, FIN and RST must be returned and nothing else: every
// other TCP packet, every UDP datagram (some with the FIN|SYN|RST bits set at the guard's
// offset, some too short to reach it) and ICMP (a port unreachable) pass. IPv4 and IPv6.
func TestFlagsGuard(t *testing.T) {
	topo := testbed.NewTopoT(t, testbed.TopoOptions{})
	r := Render(base(), Options{})
	if r.Rules[0].Rule != flagsGuard {
		t.Fatalf("the forward chain's first rule is %q, not the flags guard", r.Rules[0].Rule)
	}
	script := fmt.Sprintf(`table inet guardtest {
	chain reference {
		type filter hook forward priority filter - 10 ;
		tcp flags & (fin | syn | rst) != 0 counter
		tcp flags & (fin | syn | rst) == 0 counter
		meta l4proto udp counter
		meta l4proto { icmp, ipv6-icmp } counter
	}
	chain guarded {
		type filter hook forward priority filter + 10 ;
		%s
		meta l4proto tcp counter
		meta l4proto udp counter
		meta l4proto { icmp, ipv6-icmp } counter
	}
}`, r.Rules[0].Rule)
	if err := topo.Node.NFT(script); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { topo.Node.Exec("nft", "delete", "table", "inet", "guardtest") })

	for _, v6 := range []bool{false, true} {
		a := topo.Addrs(v6)
		// TCP: a connection that moves data both ways and closes (SYN, SYN-ACK, ACKs, FINs).
		if err := testbed.Exchange(topo.Pod, topo.Remote, a.Pod, netip.AddrPortFrom(a.RemotePod, 7100), netip.AddrPortFrom(a.RemotePod, 7100), false); err != nil {
			t.Fatal(err)
		}
		// UDP, echoed: payloads whose bytes 4-7 (the transport header's bytes 12-15) carry
		// FIN|SYN|RST in the flags position, all ones, zeros, and datagrams shorter than that.
		srv, err := topo.Remote.ListenUDP(netip.AddrPortFrom(a.RemotePod, 7101).String())
		if err != nil {
			t.Fatal(err)
		}
		c, err := topo.Pod.DialUDP(a.Pod.String(), srv.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		payloads := [][]byte{
			{0, 0, 0, 0, 0x50, 0x07, 0xff, 0xff, 1},
			{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff},
			make([]byte, 64),
			{1, 2, 3},
			{},
		}
		for _, p := range payloads {
			if _, err := c.Write(p); err != nil {
				t.Fatal(err)
			}
		}
		c.Close()
		testbed.WaitFor(t, "the UDP echoes", 5*time.Second, 20*time.Millisecond, func() bool { return srv.Packets() == int64(len(payloads)) })
		srv.Close()
		// ICMP: a datagram to a closed port comes back as port unreachable.
		c, err = topo.Pod.DialUDP(a.Pod.String(), netip.AddrPortFrom(a.RemotePod, 7102).String())
		if err != nil {
			t.Fatal(err)
		}
		c.Write([]byte("closed"))
		c.SetReadDeadline(time.Now().Add(2 * time.Second))
		_, err = c.Read(make([]byte, 16))
		c.Close()
		if err == nil {
			t.Fatal("a reply from a closed port")
		}
	}

	out, err := topo.Node.Exec("nft", "--json", "list", "table", "inet", "guardtest")
	if err != nil {
		t.Fatal(err, out)
	}
	tbl, err := nftjson.Parse([]byte(out))
	if err != nil {
		t.Fatal(err)
	}
	ref, got := tbl.Chains["reference"].Rules, tbl.Chains["guarded"].Rules
	if len(ref) != 4 || len(got) != 4 {
		t.Fatalf("rules: %d reference, %d guarded", len(ref), len(got))
	}
	flagged, other, udp, icmp := ref[0].Packets, ref[1].Packets, ref[2].Packets, ref[3].Packets
	t.Logf("reference: TCP with FIN|SYN|RST %d, other TCP %d, UDP %d, ICMP %d", flagged, other, udp, icmp)
	// Two connections (v4, v6): at least SYN, SYN-ACK and two FINs each.
	if flagged < 8 || other == 0 || udp != 2*(2*5+1) || icmp < 2 {
		t.Fatalf("the traffic was not what the test sends")
	}
	if got[1].Packets != other {
		t.Errorf("TCP after the guard: %d packets, want the %d without FIN, SYN or RST", got[1].Packets, other)
	}
	if got[2].Packets != udp {
		t.Errorf("UDP after the guard: %d datagrams, want all %d", got[2].Packets, udp)
	}
	if got[3].Packets != icmp {
		t.Errorf("ICMP after the guard: %d packets, want all %d", got[3].Packets, icmp)
	}
}
