package bench

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/hostaccel/hostaccel/internal/probe"
	"github.com/hostaccel/hostaccel/internal/tc"
)

// VariantFloor is the least a tc hop can do per packet: the bench's own program at tc
// ingress of both node devices that writes the frame's two MACs and redirects, nothing
// looked up (no maps, no FIB, no conntrack), no TTL decremented. It is no datapath (its MACs
// are read once from the node's neighbours, its output device fixed: it serves the pktgen
// bed's node of two devices only), but the limit of any datapath that forwards at tc
// ingress here, between the direct link's one veth and the node's two: what is left to gain
// by a leaner program, and what only a cheaper hook (XDP) or no hop at all could give.
const VariantFloor = "tc-floor"

var floorVariant = Variant{
	Name: VariantFloor, Title: "Bare tc redirect (limit of a tc hop)", PktgenOnly: true,
	Needs:    []string{probe.ClsBPF},
	Setup:    setupFloor,
	Teardown: teardownFloor,
	Ruleset: func(n *Node) (string, error) {
		return fmt.Sprintf("cls_bpf (direct action) at ingress of %s and %s: IPv4 UDP gets the next hop's MACs (read once from the node's neighbour table) and goes to the other device (bpf_redirect_peer where the tc datapath uses it: a veth whose peer is in another namespace; else bpf_redirect); everything else to the stack\n", n.Gateway, n.Transport), nil
	},
	Note: "the bench's own minimal tc program, per packet only: MACs written, redirected to the other device; no lookup, no TTL; the limit of a tc hop on this node (internal/bench/floor.go)",
}

// setupFloor attaches the floor program to both devices of the node: gateway -> transport
// and transport -> gateway, by bpf_redirect_peer where the tc datapath would use it (the
// output is a veth whose peer lives in another namespace: the Pod's; in the pktgen bed the
// sink's too), else bpf_redirect.
func setupFloor(ctx context.Context, n *Node) error {
	return n.NS.Do(func() error {
		gw, err := netlink.LinkByName(n.Gateway)
		if err != nil {
			return err
		}
		tr, err := netlink.LinkByName(n.Transport)
		if err != nil {
			return err
		}
		for _, hop := range []struct{ in, out netlink.Link }{{gw, tr}, {tr, gw}} {
			dst, err := onlyNeighbour(hop.out)
			if err != nil {
				return err
			}
			// bpf_redirect_peer where the tc datapath uses it
			prog, err := floorProgram(hop.out.Attrs().Index, dst, hop.out.Attrs().HardwareAddr, tc.PeerElsewhere(hop.out))
			if err != nil {
				return err
			}
			err = attachFloor(hop.in, prog)
			prog.Close() // the filter holds it
			if err != nil {
				return err
			}
		}
		return nil
	})
}

func teardownFloor(ctx context.Context, n *Node) error {
	return n.NS.Do(func() error {
		var errs []error
		for _, name := range []string{n.Gateway, n.Transport} {
			l, err := netlink.LinkByName(name)
			if err == nil {
				err = netlink.QdiscDel(clsact(l.Attrs().Index))
			}
			if err != nil && !errors.Is(err, unix.ENOENT) && !errors.Is(err, unix.EINVAL) {
				errs = append(errs, fmt.Errorf("%s: %w", name, err))
			}
		}
		return errors.Join(errs...)
	})
}

// onlyNeighbour is the MAC of the one IPv4 neighbour on l (the pktgen bed's checks resolved
// it before any variant runs).
func onlyNeighbour(l netlink.Link) (net.HardwareAddr, error) {
	ns, err := netlink.NeighList(l.Attrs().Index, unix.AF_INET)
	if err != nil {
		return nil, err
	}
	var mac net.HardwareAddr
	for _, nb := range ns {
		if len(nb.HardwareAddr) != 6 || nb.State&(unix.NUD_INCOMPLETE|unix.NUD_FAILED) != 0 {
			continue
		}
		if mac != nil && mac.String() != nb.HardwareAddr.String() {
			return nil, fmt.Errorf("%s: more than one neighbour (%s, %s): the floor variant serves the pktgen bed's node only", l.Attrs().Name, mac, nb.HardwareAddr)
		}
		mac = nb.HardwareAddr
	}
	if mac == nil {
		return nil, fmt.Errorf("%s: no resolved neighbour", l.Attrs().Name)
	}
	return mac, nil
}

// floorProgram: an IPv4 UDP frame gets MACs dst and src and goes to ifindex out; anything
// else to the stack.
func floorProgram(out int, dst, src net.HardwareAddr, peer bool) (*ebpf.Program, error) {
	const (
		skbData, skbDataEnd = 76, 80 // offsetof(struct __sk_buff, data), data_end
		tcActOK             = 0
	)
	u32 := func(b []byte) int32 { return int32(binary.LittleEndian.Uint32(b)) }
	u16 := func(b []byte) int32 { return int32(binary.LittleEndian.Uint16(b)) }
	redirect := asm.FnRedirect
	if peer {
		redirect = asm.FnRedirectPeer
	}
	insns := asm.Instructions{
		asm.LoadMem(asm.R2, asm.R1, skbData, asm.Word),
		asm.LoadMem(asm.R3, asm.R1, skbDataEnd, asm.Word),
		asm.Mov.Reg(asm.R4, asm.R2),
		asm.Add.Imm(asm.R4, 14+20), // Ethernet and an IPv4 header without options
		asm.JGT.Reg(asm.R4, asm.R3, "pass"),
		asm.LoadMem(asm.R5, asm.R2, 12, asm.Half),
		asm.JNE.Imm(asm.R5, u16([]byte{0x08, 0x00}), "pass"), // EtherType IPv4, as loaded
		asm.LoadMem(asm.R5, asm.R2, 14+9, asm.Byte),
		asm.JNE.Imm(asm.R5, unix.IPPROTO_UDP, "pass"),
		asm.StoreImm(asm.R2, 0, int64(u32(dst[0:4])), asm.Word),
		asm.StoreImm(asm.R2, 4, int64(u16(dst[4:6])), asm.Half),
		asm.StoreImm(asm.R2, 6, int64(u32(src[0:4])), asm.Word),
		asm.StoreImm(asm.R2, 10, int64(u16(src[4:6])), asm.Half),
		asm.Mov.Imm(asm.R1, int32(out)),
		asm.Mov.Imm(asm.R2, 0),
		redirect.Call(),
		asm.Return(),
		asm.Mov.Imm(asm.R0, tcActOK).WithSymbol("pass"),
		asm.Return(),
	}
	return ebpf.NewProgram(&ebpf.ProgramSpec{Name: "bench_floor", Type: ebpf.SchedCLS, License: "GPL", Instructions: insns})
}

func clsact(ifindex int) *netlink.GenericQdisc {
	return &netlink.GenericQdisc{QdiscAttrs: netlink.QdiscAttrs{LinkIndex: ifindex, Handle: netlink.MakeHandle(0xffff, 0), Parent: netlink.HANDLE_CLSACT}, QdiscType: "clsact"}
}

// attachFloor puts prog at l's tc ingress (a clsact qdisc of its own, cls_bpf direct action):
// in both kernels the bench runs on (the VM's has no tcx).
func attachFloor(l netlink.Link, prog *ebpf.Program) error {
	if err := netlink.QdiscAdd(clsact(l.Attrs().Index)); err != nil {
		return fmt.Errorf("%s: clsact: %w", l.Attrs().Name, err)
	}
	f := &netlink.BpfFilter{
		FilterAttrs: netlink.FilterAttrs{LinkIndex: l.Attrs().Index, Parent: netlink.HANDLE_MIN_INGRESS, Handle: 1, Protocol: unix.ETH_P_ALL, Priority: 1},
		Fd:          prog.FD(), Name: "bench_floor", DirectAction: true,
	}
	if err := netlink.FilterAdd(f); err != nil {
		return fmt.Errorf("%s: cls_bpf: %w", l.Attrs().Name, err)
	}
	return nil
}
