package testbed

import (
	be "encoding/binary"
	"net/netip"
	"os"
	"os/exec"
	"strconv"
	"strings"

	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"
)

// ConntrackEntry is a conntrack entry for AddConntrack: Proto's (TCP or UDP) connection from
// Src to Dst, its destination translated to DNAT and its source to SNAT where those are valid.
type ConntrackEntry struct {
	Proto      uint8
	Src, Dst   netip.AddrPort
	SNAT, DNAT netip.AddrPort
}

// ctnetlink attributes that nl does not name (linux/netfilter/nfnetlink_conntrack.h).
const (
	ctaNATSrc, ctaNATDst                                = 6, 13
	ctaNATV4Min, ctaNATV4Max, ctaNATV6Min, ctaNATV6Max  = 1, 2, 4, 5
	ctaNATProto, ctaProtoNATPortMin, ctaProtoNATPortMax = 3, 1, 2
)

// AddConntrack makes e in the calling thread's network namespace over ctnetlink, as
// `conntrack -I` would, without a process per entry: tables of 50,000 entries for benchmarks.
// The kernel sets the NAT status bits and the reply tuple from SNAT and DNAT.
func AddConntrack(e ConntrackEntry) error {
	family := uint8(unix.AF_INET)
	if e.Src.Addr().Is6() {
		family = unix.AF_INET6
	}
	req := nl.NewNetlinkRequest(unix.NFNL_SUBSYS_CTNETLINK<<8|nl.IPCTNL_MSG_CT_NEW, unix.NLM_F_CREATE|unix.NLM_F_EXCL|unix.NLM_F_ACK)
	req.AddData(&nl.Nfgenmsg{NfgenFamily: family, Version: nl.NFNETLINK_V0})
	req.AddData(ctTuple(nl.CTA_TUPLE_ORIG, e.Proto, e.Src, e.Dst))
	req.AddData(ctTuple(nl.CTA_TUPLE_REPLY, e.Proto, e.Dst, e.Src))
	req.AddData(nl.NewRtAttr(nl.CTA_TIMEOUT, be.BigEndian.AppendUint32(nil, 600)))
	if e.SNAT.IsValid() {
		req.AddData(ctNAT(ctaNATSrc, e.SNAT))
	}
	if e.DNAT.IsValid() {
		req.AddData(ctNAT(ctaNATDst, e.DNAT))
	}
	_, err := req.Execute(unix.NETLINK_NETFILTER, 0)
	return err
}

func ctNest(typ int, children ...*nl.RtAttr) *nl.RtAttr {
	a := nl.NewRtAttr(unix.NLA_F_NESTED|typ, nil)
	for _, c := range children {
		a.AddChild(c)
	}
	return a
}

func ctTuple(typ int, proto uint8, src, dst netip.AddrPort) *nl.RtAttr {
	srcType, dstType := nl.CTA_IP_V4_SRC, nl.CTA_IP_V4_DST
	if src.Addr().Is6() {
		srcType, dstType = nl.CTA_IP_V6_SRC, nl.CTA_IP_V6_DST
	}
	return ctNest(typ,
		ctNest(nl.CTA_TUPLE_IP, nl.NewRtAttr(srcType, src.Addr().AsSlice()), nl.NewRtAttr(dstType, dst.Addr().AsSlice())),
		ctNest(nl.CTA_TUPLE_PROTO,
			nl.NewRtAttr(nl.CTA_PROTO_NUM, []byte{proto}),
			nl.NewRtAttr(nl.CTA_PROTO_SRC_PORT, be.BigEndian.AppendUint16(nil, src.Port())),
			nl.NewRtAttr(nl.CTA_PROTO_DST_PORT, be.BigEndian.AppendUint16(nil, dst.Port()))))
}

func ctNAT(typ int, to netip.AddrPort) *nl.RtAttr {
	lo, hi := ctaNATV4Min, ctaNATV4Max
	if to.Addr().Is6() {
		lo, hi = ctaNATV6Min, ctaNATV6Max
	}
	a := to.Addr().AsSlice()
	n := ctNest(typ, nl.NewRtAttr(lo, a), nl.NewRtAttr(hi, a))
	if to.Port() != 0 {
		p := be.BigEndian.AppendUint16(nil, to.Port())
		n.AddChild(ctNest(ctaNATProto, nl.NewRtAttr(ctaProtoNATPortMin, p), nl.NewRtAttr(ctaProtoNATPortMax, p)))
	}
	return n
}

// RaiseConntrackMax makes the kernel's conntrack table hold at least n entries and returns
// what puts the old size back (a no-op where nothing changed). For a kernel the run owns
// only (the VM): nf_conntrack_max is the whole kernel's. The VM's 1 GiB sizes it at 8,192,
// which connection-heavy runs fill within a minute or two (connections stay for TIME_WAIT,
// 120 s), and then "nf_conntrack: table full, dropping packet" drops new connections.
func RaiseConntrackMax(n int) (restore func()) {
	const file = "/proc/sys/net/netfilter/nf_conntrack_max"
	_ = exec.Command("modprobe", "nf_conntrack").Run() // (the file comes with the module)
	was, err := os.ReadFile(file)
	if have, _ := strconv.Atoi(strings.TrimSpace(string(was))); err != nil || have >= n ||
		os.WriteFile(file, []byte(strconv.Itoa(n)), 0o644) != nil {
		return func() {}
	}
	return func() { _ = os.WriteFile(file, was, 0o644) }
}
