// Package conntrack reads the conntrack table of the current network namespace over
// ctnetlink, including the status bits (ASSURED, NAT, OFFLOAD, HW_OFFLOAD) that
// vishvananda/netlink's ConntrackFlow leaves out.
package conntrack

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"strings"

	"github.com/vishvananda/netlink/nl"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// Status bits, from linux/netfilter/nf_conntrack_common.h.
const (
	StatusSeenReply uint32 = 1 << 1
	StatusAssured   uint32 = 1 << 2
	StatusSrcNAT    uint32 = 1 << 4
	StatusDstNAT    uint32 = 1 << 5
	StatusOffload   uint32 = 1 << 14
	StatusHWOffload uint32 = 1 << 15
)

// Tuple is one direction of a connection.
type Tuple struct {
	Src, Dst         netip.Addr
	SrcPort, DstPort uint16
	Proto            uint8
}

// Flow is one conntrack entry.
type Flow struct {
	Orig, Reply                                      Tuple
	Status                                           uint32
	OrigPackets, OrigBytes, ReplyPackets, ReplyBytes uint64 // zero unless nf_conntrack_acct=1
	Timeout                                          uint32 // seconds left
	Mark                                             uint32
	TCPState                                         string // e.g. "ESTABLISHED"; empty for other protocols
}

// Offloaded reports whether the flow is in a flowtable (IPS_OFFLOAD).
func (f Flow) Offloaded() bool { return f.Status&StatusOffload != 0 }

// HWOffloaded reports whether the flow is offloaded to hardware (IPS_HW_OFFLOAD).
func (f Flow) HWOffloaded() bool { return f.Status&StatusHWOffload != 0 }

// NATed reports whether the flow is source- or destination-NATed.
func (f Flow) NATed() bool { return f.Status&(StatusSrcNAT|StatusDstNAT) != 0 }

// String formats f like one line of `conntrack -L`.
func (f Flow) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%-8s %d %d ", protoName(f.Orig.Proto), f.Orig.Proto, f.Timeout)
	if f.TCPState != "" {
		b.WriteString(f.TCPState + " ")
	}
	acct := f.OrigPackets+f.ReplyPackets+f.OrigBytes+f.ReplyBytes != 0
	writeTuple(&b, f.Orig)
	if acct {
		fmt.Fprintf(&b, "packets=%d bytes=%d ", f.OrigPackets, f.OrigBytes)
	}
	if f.Status&StatusSeenReply == 0 {
		b.WriteString("[UNREPLIED] ")
	}
	writeTuple(&b, f.Reply)
	if acct {
		fmt.Fprintf(&b, "packets=%d bytes=%d ", f.ReplyPackets, f.ReplyBytes)
	}
	switch {
	case f.HWOffloaded():
		b.WriteString("[HW_OFFLOAD] ")
	case f.Offloaded():
		b.WriteString("[OFFLOAD] ")
	}
	if f.Status&StatusAssured != 0 {
		b.WriteString("[ASSURED] ")
	}
	fmt.Fprintf(&b, "mark=%d", f.Mark)
	return b.String()
}

func writeTuple(b *strings.Builder, t Tuple) {
	fmt.Fprintf(b, "src=%s dst=%s ", t.Src, t.Dst)
	if t.SrcPort != 0 || t.DstPort != 0 {
		fmt.Fprintf(b, "sport=%d dport=%d ", t.SrcPort, t.DstPort)
	}
}

func protoName(p uint8) string {
	switch p {
	case unix.IPPROTO_TCP:
		return "tcp"
	case unix.IPPROTO_UDP:
		return "udp"
	case unix.IPPROTO_ICMP:
		return "icmp"
	case unix.IPPROTO_ICMPV6:
		return "icmpv6"
	case unix.IPPROTO_SCTP:
		return "sctp"
	case unix.IPPROTO_UDPLITE:
		return "udplite"
	case unix.IPPROTO_DCCP:
		return "dccp"
	case unix.IPPROTO_GRE:
		return "gre"
	}
	return "unknown"
}

// tcpStates are the names of enum tcp_conntrack, as conntrack(8) prints them.
var tcpStates = []string{"NONE", "SYN_SENT", "SYN_RECV", "ESTABLISHED", "FIN_WAIT",
	"CLOSE_WAIT", "LAST_ACK", "TIME_WAIT", "CLOSE", "SYN_SENT2"}

// List dumps the IPv4 and IPv6 conntrack tables of the calling thread's network namespace.
func List(ctx context.Context) ([]Flow, error) {
	var flows []Flow
	for _, family := range []uint8{unix.AF_INET, unix.AF_INET6} {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		fs, _, err := dump(family, statusFilter{})
		if err != nil {
			return nil, err
		}
		flows = append(flows, fs...)
	}
	return flows, nil
}

// ListNATed dumps the entries of both families that are source- or destination-NAT-ed
// (NATed). The kernel picks them by their status bits (Linux >= 5.15), so the cost is that
// of the NAT-ed entries, not of the whole table: two walks of the table that copy out only
// what matches (a table of 50,000 entries of which 500 are NAT-ed: BenchmarkListNATed).
// Where the kernel ignores the filter, the entries are picked here.
func ListNATed(ctx context.Context) ([]Flow, error) {
	return listPicked(ctx,
		statusFilter{StatusSrcNAT, StatusSrcNAT},                // source-NAT-ed, perhaps destination-NAT-ed too
		statusFilter{StatusDstNAT, StatusSrcNAT | StatusDstNAT}) // destination-NAT-ed only
}

// ListOffloaded dumps the entries of both families that are in a flowtable (Offloaded),
// picked by the kernel as ListNATed's are: one walk of the table.
func ListOffloaded(ctx context.Context) ([]Flow, error) {
	return listPicked(ctx, statusFilter{StatusOffload, StatusOffload})
}

// listPicked dumps the entries of both families that each filter picks, one dump per filter.
func listPicked(ctx context.Context, filters ...statusFilter) ([]Flow, error) {
	var flows []Flow
	for _, sf := range filters {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		fs, _, err := dump(unix.AF_UNSPEC, sf)
		if err != nil {
			return nil, err
		}
		flows = append(flows, fs...)
	}
	return flows, nil
}

// statusFilter picks the entries whose status, masked by mask, is val; the zero value picks
// all.
type statusFilter struct{ val, mask uint32 }

// picks reports whether sf picks f (the kernel's test, made again here for kernels that ignore
// the filter).
func (sf statusFilter) picks(f *Flow) bool { return f.Status&sf.mask == sf.val }

// ctaStatusMask is CTA_STATUS_MASK (linux/netfilter/nfnetlink_conntrack.h, Linux >= 5.15),
// which vishvananda/netlink's nl does not name.
const ctaStatusMask = 26

// dump lists the entries of family (AF_UNSPEC: all) that sf picks; received is how many the
// kernel sent (more than it picked where the kernel ignores the filter).
func dump(family uint8, sf statusFilter) (flows []Flow, received int, err error) {
	err = dumpEach(family, sf, func(f Flow, _ uint8, _ []byte) error {
		received++
		if sf.picks(&f) {
			flows = append(flows, f)
		}
		return nil
	})
	return flows, received, err
}

// dumpEach calls fn with every entry of family (AF_UNSPEC: all) that the kernel sends for sf,
// the entry's family and the message's attributes (after the nfgenmsg).
func dumpEach(family uint8, sf statusFilter, fn func(f Flow, family uint8, attrs []byte) error) error {
	var (
		msgs [][]byte
		err  error
	)
	// A dump that raced with a table change is inconsistent; try again a few times.
	for range 3 {
		req := nl.NewNetlinkRequest(unix.NFNL_SUBSYS_CTNETLINK<<8|nl.IPCTNL_MSG_CT_GET, unix.NLM_F_DUMP)
		req.AddData(&nl.Nfgenmsg{NfgenFamily: family, Version: nl.NFNETLINK_V0})
		if sf.mask != 0 {
			req.AddData(nl.NewRtAttr(nl.CTA_STATUS, binary.BigEndian.AppendUint32(nil, sf.val)))
			req.AddData(nl.NewRtAttr(ctaStatusMask, binary.BigEndian.AppendUint32(nil, sf.mask)))
		}
		if msgs, err = req.Execute(unix.NETLINK_NETFILTER, 0); !errors.Is(err, nl.ErrDumpInterrupted) {
			break
		}
	}
	if err != nil {
		return fmt.Errorf("ctnetlink dump (family %d): %w", family, err)
	}
	for _, m := range msgs {
		if len(m) < nl.SizeofNfgenmsg {
			return errors.New("ctnetlink: short message")
		}
		f, err := parseFlow(m[nl.SizeofNfgenmsg:])
		if err != nil {
			return err
		}
		if err := fn(f, m[0], m[nl.SizeofNfgenmsg:]); err != nil {
			return err
		}
	}
	return nil
}

// DeleteDstNATed deletes the destination-NAT-ed entries of both families that match picks
// (a load balancer's connections to a backend that left). One dump, which the kernel filters
// by the status bit (Linux >= 5.15: it copies out only those entries; older kernels send all,
// picked here), then a delete per entry picked, by its tuple, zone and id, as the dump gave
// them: an entry made again meanwhile under the same tuple stays. It returns how many it
// deleted; an entry gone meanwhile is no error.
func DeleteDstNATed(ctx context.Context, match func(*Flow) bool) (int, error) {
	sock, err := nl.GetNetlinkSocketAt(netns.None(), netns.None(), unix.NETLINK_NETFILTER)
	if err != nil {
		return 0, fmt.Errorf("ctnetlink: %w", err)
	}
	defer sock.Close()
	sockets := map[int]*nl.SocketHandle{unix.NETLINK_NETFILTER: {Socket: sock}}
	sf := statusFilter{StatusDstNAT, StatusDstNAT}
	deleted := 0
	var errs []error
	err = dumpEach(unix.AF_UNSPEC, sf, func(f Flow, family uint8, attrs []byte) error {
		if !sf.picks(&f) || !match(&f) {
			return nil
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		req := nl.NewNetlinkRequest(unix.NFNL_SUBSYS_CTNETLINK<<8|nl.IPCTNL_MSG_CT_DELETE, unix.NLM_F_ACK)
		req.Sockets = sockets
		req.AddData(&nl.Nfgenmsg{NfgenFamily: family, Version: nl.NFNETLINK_V0})
		req.AddRawData(attrs)
		switch _, err := req.Execute(unix.NETLINK_NETFILTER, 0); {
		case err == nil:
			deleted++
		case !errors.Is(err, unix.ENOENT):
			errs = append(errs, fmt.Errorf("ctnetlink: delete %s: %w", f, err))
		}
		return nil
	})
	return deleted, errors.Join(append(errs, err)...)
}

// parseFlow decodes the attributes of one IPCTNL_MSG_CT_NEW message (after the nfgenmsg).
func parseFlow(b []byte) (Flow, error) {
	var f Flow
	err := forAttrs(b, func(typ uint16, v []byte) error {
		switch typ {
		case nl.CTA_TUPLE_ORIG:
			return parseTuple(v, &f.Orig)
		case nl.CTA_TUPLE_REPLY:
			return parseTuple(v, &f.Reply)
		case nl.CTA_STATUS:
			f.Status = be32(v)
		case nl.CTA_TIMEOUT:
			f.Timeout = be32(v)
		case nl.CTA_MARK:
			f.Mark = be32(v)
		case nl.CTA_COUNTERS_ORIG:
			return parseCounters(v, &f.OrigPackets, &f.OrigBytes)
		case nl.CTA_COUNTERS_REPLY:
			return parseCounters(v, &f.ReplyPackets, &f.ReplyBytes)
		case nl.CTA_PROTOINFO:
			return forAttrs(v, func(typ uint16, v []byte) error {
				if typ != nl.CTA_PROTOINFO_TCP {
					return nil
				}
				return forAttrs(v, func(typ uint16, v []byte) error {
					if typ == nl.CTA_PROTOINFO_TCP_STATE && len(v) == 1 && int(v[0]) < len(tcpStates) {
						f.TCPState = tcpStates[v[0]]
					}
					return nil
				})
			})
		}
		return nil
	})
	return f, err
}

func parseTuple(b []byte, t *Tuple) error {
	return forAttrs(b, func(typ uint16, v []byte) error {
		switch typ {
		case nl.CTA_TUPLE_IP:
			return forAttrs(v, func(typ uint16, v []byte) error {
				a, ok := netip.AddrFromSlice(v)
				if !ok {
					return fmt.Errorf("ctnetlink: bad address of %d bytes", len(v))
				}
				switch typ {
				case nl.CTA_IP_V4_SRC, nl.CTA_IP_V6_SRC:
					t.Src = a
				case nl.CTA_IP_V4_DST, nl.CTA_IP_V6_DST:
					t.Dst = a
				}
				return nil
			})
		case nl.CTA_TUPLE_PROTO:
			return forAttrs(v, func(typ uint16, v []byte) error {
				switch typ {
				case nl.CTA_PROTO_NUM:
					if len(v) > 0 {
						t.Proto = v[0]
					}
				case nl.CTA_PROTO_SRC_PORT:
					t.SrcPort = be16(v)
				case nl.CTA_PROTO_DST_PORT:
					t.DstPort = be16(v)
				}
				return nil
			})
		}
		return nil
	})
}

func parseCounters(b []byte, packets, bytes *uint64) error {
	return forAttrs(b, func(typ uint16, v []byte) error {
		switch typ {
		case nl.CTA_COUNTERS_PACKETS:
			*packets = be64(v)
		case nl.CTA_COUNTERS_BYTES:
			*bytes = be64(v)
		}
		return nil
	})
}

// forAttrs calls fn for each netlink attribute in b, with the nested and byte-order flags
// cleared from its type.
func forAttrs(b []byte, fn func(typ uint16, value []byte) error) error {
	for len(b) >= unix.SizeofNlAttr {
		n := int(binary.NativeEndian.Uint16(b))
		typ := binary.NativeEndian.Uint16(b[2:]) & nl.NLA_TYPE_MASK
		if n < unix.SizeofNlAttr || n > len(b) {
			return fmt.Errorf("ctnetlink: bad attribute length %d", n)
		}
		if err := fn(typ, b[unix.SizeofNlAttr:n]); err != nil {
			return err
		}
		b = b[min(nlaAlign(n), len(b)):]
	}
	return nil
}

func nlaAlign(n int) int { return (n + unix.NLA_ALIGNTO - 1) &^ (unix.NLA_ALIGNTO - 1) }

// The values of ctnetlink attributes are big endian; short ones read as zero.
func be16(b []byte) uint16 {
	if len(b) < 2 {
		return 0
	}
	return binary.BigEndian.Uint16(b)
}

func be32(b []byte) uint32 {
	if len(b) < 4 {
		return 0
	}
	return binary.BigEndian.Uint32(b)
}

func be64(b []byte) uint64 {
	if len(b) < 8 {
		return 0
	}
	return binary.BigEndian.Uint64(b)
}
