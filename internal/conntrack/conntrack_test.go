package conntrack

import (
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"testing"

	"github.com/hostaccel/hostaccel/internal/testbed"

	"github.com/vishvananda/netlink/nl"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

func be(n int, v uint64) []byte {
	b := make([]byte, 8)
	binary.BigEndian.PutUint64(b, v)
	return b[8-n:]
}

func nest(typ int, children ...*nl.RtAttr) *nl.RtAttr {
	a := nl.NewRtAttr(unix.NLA_F_NESTED|typ, nil)
	for _, c := range children {
		a.AddChild(c)
	}
	return a
}

func attr(typ int, v []byte) *nl.RtAttr { return nl.NewRtAttr(typ, v) }

func tupleAttr(typ int, src, dst string, sport, dport uint16) *nl.RtAttr {
	s, d := netip.MustParseAddr(src), netip.MustParseAddr(dst)
	srcType, dstType := nl.CTA_IP_V4_SRC, nl.CTA_IP_V4_DST
	if s.Is6() {
		srcType, dstType = nl.CTA_IP_V6_SRC, nl.CTA_IP_V6_DST
	}
	return nest(typ,
		nest(nl.CTA_TUPLE_IP, attr(srcType, s.AsSlice()), attr(dstType, d.AsSlice())),
		nest(nl.CTA_TUPLE_PROTO,
			attr(nl.CTA_PROTO_NUM, []byte{unix.IPPROTO_TCP}),
			attr(nl.CTA_PROTO_SRC_PORT, be(2, uint64(sport))),
			attr(nl.CTA_PROTO_DST_PORT, be(2, uint64(dport)))))
}

func serialize(attrs ...*nl.RtAttr) []byte {
	var b []byte
	for _, a := range attrs {
		b = append(b, a.Serialize()...)
	}
	return b
}

// A DNATed, offloaded, assured TCP flow as ctnetlink would send it.
var offloadedMsg = serialize(
	tupleAttr(nl.CTA_TUPLE_ORIG, "10.0.0.1", "10.96.0.10", 40000, 80),
	tupleAttr(nl.CTA_TUPLE_REPLY, "10.244.1.5", "10.0.0.1", 8080, 40000),
	attr(nl.CTA_STATUS, be(4, uint64(StatusSeenReply|StatusAssured|StatusDstNAT|StatusOffload|1<<3|1<<7))),
	attr(nl.CTA_TIMEOUT, be(4, 86400)),
	attr(nl.CTA_MARK, be(4, 7)),
	nest(nl.CTA_PROTOINFO, nest(nl.CTA_PROTOINFO_TCP, attr(nl.CTA_PROTOINFO_TCP_STATE, []byte{nl.TCP_CONNTRACK_ESTABLISHED}))),
	nest(nl.CTA_COUNTERS_ORIG, attr(nl.CTA_COUNTERS_PACKETS, be(8, 10)), attr(nl.CTA_COUNTERS_BYTES, be(8, 1000))),
	nest(nl.CTA_COUNTERS_REPLY, attr(nl.CTA_COUNTERS_PACKETS, be(8, 8)), attr(nl.CTA_COUNTERS_BYTES, be(8, 1<<40))),
	attr(nl.CTA_ID, be(4, 12345)), // ignored
)

func TestParseFlow(t *testing.T) {
	f, err := parseFlow(offloadedMsg)
	if err != nil {
		t.Fatal(err)
	}
	want := Flow{
		Orig:  Tuple{netip.MustParseAddr("10.0.0.1"), netip.MustParseAddr("10.96.0.10"), 40000, 80, unix.IPPROTO_TCP},
		Reply: Tuple{netip.MustParseAddr("10.244.1.5"), netip.MustParseAddr("10.0.0.1"), 8080, 40000, unix.IPPROTO_TCP},
		// SEEN_REPLY|ASSURED|CONFIRMED|DST_NAT|DST_NAT_DONE|OFFLOAD
		Status:      0x40ae,
		OrigPackets: 10, OrigBytes: 1000, ReplyPackets: 8, ReplyBytes: 1 << 40,
		Timeout: 86400, Mark: 7, TCPState: "ESTABLISHED",
	}
	if f != want {
		t.Errorf("parseFlow:\n got %+v\nwant %+v", f, want)
	}
	if !f.Offloaded() || f.HWOffloaded() || !f.NATed() {
		t.Errorf("Offloaded=%v HWOffloaded=%v NATed=%v, want true false true", f.Offloaded(), f.HWOffloaded(), f.NATed())
	}
	wantStr := "tcp      6 86400 ESTABLISHED src=10.0.0.1 dst=10.96.0.10 sport=40000 dport=80 packets=10 bytes=1000 " +
		"src=10.244.1.5 dst=10.0.0.1 sport=8080 dport=40000 packets=8 bytes=1099511627776 [OFFLOAD] [ASSURED] mark=7"
	if f.String() != wantStr {
		t.Errorf("String:\n got %s\nwant %s", f, wantStr)
	}
}

func TestParseFlowIPv6(t *testing.T) {
	f, err := parseFlow(serialize(
		tupleAttr(nl.CTA_TUPLE_ORIG, "fd00::1", "fd00::2", 1, 2),
		tupleAttr(nl.CTA_TUPLE_REPLY, "fd00::2", "fd00::1", 2, 1)))
	if err != nil {
		t.Fatal(err)
	}
	if f.Orig.Src != netip.MustParseAddr("fd00::1") || f.Reply.Dst != netip.MustParseAddr("fd00::1") || f.Reply.SrcPort != 2 {
		t.Errorf("parseFlow: %+v", f)
	}
}

func TestParseFlowBad(t *testing.T) {
	b := attr(nl.CTA_STATUS, be(4, 1)).Serialize()
	binary.NativeEndian.PutUint16(b, 100) // length beyond the buffer
	if _, err := parseFlow(b); err == nil {
		t.Error("parseFlow accepted an attribute longer than the message")
	}
	if _, err := parseFlow(serialize(nest(nl.CTA_TUPLE_ORIG, nest(nl.CTA_TUPLE_IP, attr(nl.CTA_IP_V4_SRC, []byte{1, 2, 3}))))); err == nil {
		t.Error("parseFlow accepted a 3-byte address")
	}
}

func TestStatus(t *testing.T) {
	for _, tc := range []struct {
		status        uint32
		off, hw, nat  bool
		flags, absent string
	}{
		{status: 0, flags: "[UNREPLIED]", absent: "[ASSURED]"},
		{status: StatusSeenReply | StatusAssured, flags: "[ASSURED]", absent: "[UNREPLIED]"},
		{status: StatusSeenReply | StatusSrcNAT, nat: true, absent: "[OFFLOAD]"},
		{status: StatusSeenReply | StatusOffload | StatusHWOffload | StatusAssured, off: true, hw: true, flags: "[HW_OFFLOAD] [ASSURED]", absent: "[OFFLOAD]"},
	} {
		f := Flow{Status: tc.status}
		if f.Offloaded() != tc.off || f.HWOffloaded() != tc.hw || f.NATed() != tc.nat {
			t.Errorf("status %#x: Offloaded=%v HWOffloaded=%v NATed=%v", tc.status, f.Offloaded(), f.HWOffloaded(), f.NATed())
		}
		if s := f.String(); !strings.Contains(s, tc.flags) || strings.Contains(s, tc.absent) {
			t.Errorf("status %#x: String() = %q, want %q and no %q", tc.status, s, tc.flags, tc.absent)
		}
	}
}

func run(t testing.TB, stdin string, args ...string) {
	t.Helper()
	cmd := exec.Command(args[0], args[1:]...)
	cmd.Stdin = strings.NewReader(stdin)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%s: %v: %s", strings.Join(args, " "), err, out)
	}
}

// inNetns runs fn on a thread inside a new named network namespace, with loopback up,
// conntrack enabled by an nft rule and accounting on. Sockets that fn opens live there.
func inNetns(t testing.TB, fn func()) {
	name := fmt.Sprintf("hostaccel-ct-test-%d", os.Getpid())
	run(t, "", "ip", "netns", "add", name)
	defer run(t, "", "ip", "netns", "del", name)
	run(t, "", "ip", "-n", name, "link", "set", "lo", "up")
	run(t, `table inet hostaccel-ct-test {
	chain output {
		type filter hook output priority filter; policy accept;
		ct state new,established counter accept
	}
}`, "ip", "netns", "exec", name, "nft", "-f", "-")
	// after the nft rule: on a modular kernel (the VM) nf_conntrack loads with it
	run(t, "", "ip", "netns", "exec", name, "sysctl", "-qw", "net.netfilter.nf_conntrack_acct=1")

	runtime.LockOSThread() // left locked, so the thread dies, if it cannot be moved back
	orig, err := netns.Get()
	if err != nil {
		t.Fatal(err)
	}
	defer orig.Close()
	ns, err := netns.GetFromName(name)
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Close()
	if err := netns.Set(ns); err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := netns.Set(orig); err != nil {
			t.Errorf("restoring the network namespace: %v", err)
			return
		}
		runtime.UnlockOSThread()
	}()
	fn()
}

// tcpPair connects to a listener on addr and exchanges a message each way. It returns the
// client's and server's address; the connection stays open until the test ends.
func tcpPair(t *testing.T, network, addr string) (client, server netip.AddrPort) {
	ln, err := net.Listen(network, addr)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	c, err := net.Dial(network, ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	s, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	exchange(t, c, s)
	exchange(t, s, c)
	return c.LocalAddr().(*net.TCPAddr).AddrPort(), s.LocalAddr().(*net.TCPAddr).AddrPort()
}

func exchange(t *testing.T, from io.Writer, to io.Reader) {
	t.Helper()
	if _, err := from.Write([]byte("ping")); err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadFull(to, make([]byte, 4)); err != nil {
		t.Fatal(err)
	}
}

func udpPair(t *testing.T, addr string) (client, server netip.AddrPort) {
	s, err := net.ListenUDP("udp4", net.UDPAddrFromAddrPort(netip.MustParseAddrPort(addr)))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	c, err := net.DialUDP("udp4", nil, s.LocalAddr().(*net.UDPAddr))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	buf := make([]byte, 16)
	if _, err := c.Write([]byte("ping")); err != nil {
		t.Fatal(err)
	}
	_, from, err := s.ReadFromUDPAddrPort(buf)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.WriteToUDPAddrPort([]byte("pong"), from); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Read(buf); err != nil {
		t.Fatal(err)
	}
	return from, s.LocalAddr().(*net.UDPAddr).AddrPort()
}

func TestListNetns(t *testing.T) {
	testbed.RequireRoot(t)
	inNetns(t, func() {
		type conn struct {
			name           string
			proto          uint8
			client, server netip.AddrPort
		}
		var conns []conn
		c, s := tcpPair(t, "tcp4", "127.0.0.1:0")
		conns = append(conns, conn{"tcp4", unix.IPPROTO_TCP, c, s})
		c, s = udpPair(t, "127.0.0.1:0")
		conns = append(conns, conn{"udp4", unix.IPPROTO_UDP, c, s})
		c, s = tcpPair(t, "tcp6", "[::1]:0")
		conns = append(conns, conn{"tcp6", unix.IPPROTO_TCP, c, s})

		flows, err := List(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range flows {
			t.Log(f)
		}
		for _, cn := range conns {
			orig := Tuple{cn.client.Addr(), cn.server.Addr(), cn.client.Port(), cn.server.Port(), cn.proto}
			reply := Tuple{cn.server.Addr(), cn.client.Addr(), cn.server.Port(), cn.client.Port(), cn.proto}
			var f *Flow
			for i := range flows {
				if flows[i].Orig == orig {
					f = &flows[i]
				}
			}
			if f == nil {
				t.Errorf("%s: no flow %+v", cn.name, orig)
				continue
			}
			if f.Reply != reply {
				t.Errorf("%s: reply tuple %+v, want %+v", cn.name, f.Reply, reply)
			}
			if f.Status&StatusSeenReply == 0 {
				t.Errorf("%s: not SEEN_REPLY: %s", cn.name, f)
			}
			if cn.proto == unix.IPPROTO_TCP {
				if f.Status&StatusAssured == 0 || f.TCPState != "ESTABLISHED" {
					t.Errorf("%s: want ASSURED and ESTABLISHED: %s", cn.name, f)
				}
			}
			if f.OrigPackets == 0 || f.OrigBytes == 0 || f.ReplyPackets == 0 || f.ReplyBytes == 0 {
				t.Errorf("%s: zero counters with nf_conntrack_acct=1: %s", cn.name, f)
			}
			if f.Offloaded() || f.HWOffloaded() || f.NATed() {
				t.Errorf("%s: offloaded or NATed: %s", cn.name, f)
			}
			if f.Timeout == 0 {
				t.Errorf("%s: no timeout: %s", cn.name, f)
			}
		}
	})
}

func TestListCanceled(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := List(ctx); err != context.Canceled {
		t.Errorf("List(canceled) = %v, want context.Canceled", err)
	}
}
