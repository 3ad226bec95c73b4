package conntrack

import (
	"encoding/binary"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"

	"github.com/hostaccel/hostaccel/internal/golden"
)

// FuzzParseFlow: one ctnetlink message's attributes, as the kernel sends them for every
// conntrack entry. parseFlow never panics, says "ctnetlink: ..." when it fails, and a flow it
// reads formats (String) and serializes back to attributes that parse to the same flow.
func FuzzParseFlow(f *testing.F) {
	f.Fuzz(func(t *testing.T, b []byte) {
		fl, err := parseFlow(b)
		if err != nil {
			if !strings.HasPrefix(err.Error(), "ctnetlink: ") {
				t.Fatalf("error %q does not say ctnetlink\ninput: %x", err, b)
			}
			return
		}
		_ = fl.String()
		back, err := parseFlow(serializeFlow(fl))
		if err != nil || back != fl {
			t.Fatalf("round trip: %v\n got %+v\nwant %+v\ninput: %x", err, back, fl, b)
		}
	})
}

// serializeFlow writes f as ctnetlink attributes (what parseFlow reads).
func serializeFlow(f Flow) []byte {
	tuple := func(typ int, tp Tuple) *nl.RtAttr {
		ip := nest(nl.CTA_TUPLE_IP)
		for _, a := range []struct {
			addr   netip.Addr
			v4, v6 int
		}{{tp.Src, nl.CTA_IP_V4_SRC, nl.CTA_IP_V6_SRC}, {tp.Dst, nl.CTA_IP_V4_DST, nl.CTA_IP_V6_DST}} {
			if !a.addr.IsValid() {
				continue
			}
			typ := a.v6
			if a.addr.Is4() {
				typ = a.v4
			}
			ip.AddChild(attr(typ, a.addr.AsSlice()))
		}
		return nest(typ, ip, nest(nl.CTA_TUPLE_PROTO,
			attr(nl.CTA_PROTO_NUM, []byte{tp.Proto}),
			attr(nl.CTA_PROTO_SRC_PORT, be(2, uint64(tp.SrcPort))),
			attr(nl.CTA_PROTO_DST_PORT, be(2, uint64(tp.DstPort)))))
	}
	attrs := []*nl.RtAttr{
		tuple(nl.CTA_TUPLE_ORIG, f.Orig), tuple(nl.CTA_TUPLE_REPLY, f.Reply),
		attr(nl.CTA_STATUS, be(4, uint64(f.Status))),
		attr(nl.CTA_TIMEOUT, be(4, uint64(f.Timeout))),
		attr(nl.CTA_MARK, be(4, uint64(f.Mark))),
		nest(nl.CTA_COUNTERS_ORIG, attr(nl.CTA_COUNTERS_PACKETS, be(8, f.OrigPackets)), attr(nl.CTA_COUNTERS_BYTES, be(8, f.OrigBytes))),
		nest(nl.CTA_COUNTERS_REPLY, attr(nl.CTA_COUNTERS_PACKETS, be(8, f.ReplyPackets)), attr(nl.CTA_COUNTERS_BYTES, be(8, f.ReplyBytes))),
	}
	if i := slices.Index(tcpStates, f.TCPState); i >= 0 {
		attrs = append(attrs, nest(nl.CTA_PROTOINFO, nest(nl.CTA_PROTOINFO_TCP, attr(nl.CTA_PROTOINFO_TCP_STATE, []byte{byte(i)}))))
	}
	return serialize(attrs...)
}

// The round trip itself reproduces a full flow (so that the fuzz target's check can fail).
func TestSerializeFlow(t *testing.T) {
	f, err := parseFlow(offloadedMsg)
	if err != nil {
		t.Fatal(err)
	}
	if back, err := parseFlow(serializeFlow(f)); err != nil || back != f || back.TCPState != "ESTABLISHED" || back.ReplyBytes != 1<<40 {
		t.Errorf("%v %+v", err, back)
	}
}

// TestFuzzSeeds keeps FuzzParseFlow's seed corpus current (go test -update rewrites it):
// flows of each family and protocol, with and without counters and TCP state, and damaged
// messages (truncated, bad lengths, bad addresses).
func TestFuzzSeeds(t *testing.T) {
	seeds := map[string][]any{}
	add := func(name string, b []byte) { seeds[name] = []any{b} }
	add("offloaded-tcp", offloadedMsg)
	flow := func(proto byte, src, dst string, sport, dport uint16, extra ...*nl.RtAttr) []byte {
		s, d := netip.MustParseAddr(src), netip.MustParseAddr(dst)
		srcType, dstType := nl.CTA_IP_V4_SRC, nl.CTA_IP_V4_DST
		if s.Is6() {
			srcType, dstType = nl.CTA_IP_V6_SRC, nl.CTA_IP_V6_DST
		}
		tuple := func(typ int, a, b netip.Addr, ap, bp uint16) *nl.RtAttr {
			return nest(typ, nest(nl.CTA_TUPLE_IP, attr(srcType, a.AsSlice()), attr(dstType, b.AsSlice())),
				nest(nl.CTA_TUPLE_PROTO, attr(nl.CTA_PROTO_NUM, []byte{proto}),
					attr(nl.CTA_PROTO_SRC_PORT, be(2, uint64(ap))), attr(nl.CTA_PROTO_DST_PORT, be(2, uint64(bp)))))
		}
		return serialize(append([]*nl.RtAttr{tuple(nl.CTA_TUPLE_ORIG, s, d, sport, dport), tuple(nl.CTA_TUPLE_REPLY, d, s, dport, sport)}, extra...)...)
	}
	status := func(s uint32) *nl.RtAttr { return attr(nl.CTA_STATUS, be(4, uint64(s))) }
	add("udp-v6", flow(unix.IPPROTO_UDP, "fd00::1", "fd00::2", 5353, 53, status(StatusSeenReply), attr(nl.CTA_TIMEOUT, be(4, 30))))
	add("udp-unreplied", flow(unix.IPPROTO_UDP, "10.0.0.1", "10.0.0.2", 1, 65535))
	add("sctp-nat", flow(unix.IPPROTO_SCTP, "10.0.0.1", "192.0.2.10", 40000, 80, status(StatusSrcNAT|StatusDstNAT|StatusAssured)))
	add("icmp", serialize(nest(nl.CTA_TUPLE_ORIG, nest(nl.CTA_TUPLE_IP, attr(nl.CTA_IP_V4_SRC, []byte{10, 0, 0, 1}), attr(nl.CTA_IP_V4_DST, []byte{10, 0, 0, 2})),
		nest(nl.CTA_TUPLE_PROTO, attr(nl.CTA_PROTO_NUM, []byte{unix.IPPROTO_ICMP}), attr(4, be(2, 7)), attr(5, []byte{8}))))) // CTA_PROTO_ICMP_ID, CTA_PROTO_ICMP_TYPE
	add("hw-offload", flow(unix.IPPROTO_TCP, "10.0.0.1", "10.0.0.2", 1, 2, status(StatusHWOffload|StatusOffload|StatusSeenReply), attr(nl.CTA_MARK, be(4, 0xffffffff))))
	for i, st := range tcpStates {
		if i%3 == 0 {
			add("tcp-"+strings.ToLower(st), flow(unix.IPPROTO_TCP, "fd00::1", "10.0.0.2", 1, 2,
				nest(nl.CTA_PROTOINFO, nest(nl.CTA_PROTOINFO_TCP, attr(nl.CTA_PROTOINFO_TCP_STATE, []byte{byte(i)}), attr(nl.CTA_PROTOINFO_TCP_WSCALE_ORIGINAL, []byte{7})))))
		}
	}
	add("tcp-state-out-of-range", flow(unix.IPPROTO_TCP, "10.0.0.1", "10.0.0.2", 1, 2, nest(nl.CTA_PROTOINFO, nest(nl.CTA_PROTOINFO_TCP, attr(nl.CTA_PROTOINFO_TCP_STATE, []byte{200})))))
	add("counters-short", serialize(nest(nl.CTA_COUNTERS_ORIG, attr(nl.CTA_COUNTERS_PACKETS, []byte{1, 2, 3}), attr(nl.CTA_COUNTERS_BYTES, nil))))
	add("status-short", serialize(attr(nl.CTA_STATUS, []byte{1}), attr(nl.CTA_TIMEOUT, nil), attr(nl.CTA_MARK, be(2, 1))))
	add("mapped-address", flow(unix.IPPROTO_TCP, "::ffff:10.0.0.1", "::ffff:10.0.0.2", 1, 2))
	add("unknown-attrs", serialize(attr(nl.CTA_ID, be(4, 1)), attr(nl.CTA_ZONE, be(2, 1)), attr(nl.CTA_LABELS, make([]byte, 16)), attr(99, []byte("x"))))
	add("empty", nil)
	for _, n := range []int{1, 3, 4, 7, 20, 45} {
		add("truncated-"+strconv.Itoa(n), offloadedMsg[:n])
	}
	badLen := slices.Clone(offloadedMsg)
	binary.NativeEndian.PutUint16(badLen, 2)
	add("bad-attr-length", badLen)
	tooLong := attr(nl.CTA_STATUS, be(4, 1)).Serialize()
	binary.NativeEndian.PutUint16(tooLong, 100)
	add("attr-beyond-message", tooLong)
	add("bad-address", serialize(nest(nl.CTA_TUPLE_REPLY, nest(nl.CTA_TUPLE_IP, attr(nl.CTA_IP_V6_SRC, make([]byte, 15))))))
	add("nested-in-flat", serialize(nest(nl.CTA_STATUS, attr(1, be(4, 1)))))
	golden.FuzzSeeds(t, "testdata/fuzz/FuzzParseFlow", seeds)
}
