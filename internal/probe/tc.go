package probe

import (
	"context"
	"fmt"
	"sync"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/link"
	"github.com/cilium/ebpf/rlimit"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/hostaccel/hostaccel/internal/scratchns"
)

const (
	hintClsBPF    = "load cls_bpf and sch_ingress (CONFIG_NET_CLS_BPF, CONFIG_NET_SCH_INGRESS)"
	hintClsFlower = "load cls_flower (CONFIG_NET_CLS_FLOWER)"
	hintTCX       = "" // cilium/ebpf's error already names the kernel version needed
)

// removeMemlock lifts RLIMIT_MEMLOCK for kernels before 5.11, which charge BPF memory to
// it. Best effort: newer kernels do not need it, and if it fails for lack of privileges the
// probes report that themselves.
var removeMemlock = sync.OnceFunc(func() { _ = rlimit.RemoveMemlock() })

// probeTC tries a clsact qdisc with a flower and a cls_bpf filter, and a tcx link, on the
// loopback device of a throwaway network namespace, so the host's devices are never touched.
func probeTC(ctx context.Context) []Feature {
	done := make(chan []Feature, 1)
	go func() {
		var fs []Feature
		err := try(func() error {
			return scratchns.Run(func() error { fs = probeTCHere(); return nil })
		})
		if err != nil {
			err = fmt.Errorf("throwaway network namespace: %w", err)
			fs = []Feature{feature(ClsBPF, err, hintClsBPF), feature(ClsFlower, err, hintClsFlower), feature(TCX, err, hintTCX)}
		}
		done <- fs
	}()
	select {
	case fs := <-done:
		return fs
	case <-ctx.Done():
		err := ctx.Err()
		return []Feature{feature(ClsBPF, err, ""), feature(ClsFlower, err, ""), feature(TCX, err, "")}
	}
}

// probeTCHere runs the tc probes in the current thread's network namespace.
func probeTCHere() []Feature {
	lo, err := netlink.LinkByName("lo")
	if err == nil {
		err = netlink.QdiscAdd(&netlink.GenericQdisc{
			QdiscAttrs: netlink.QdiscAttrs{LinkIndex: lo.Attrs().Index, Handle: netlink.MakeHandle(0xffff, 0), Parent: netlink.HANDLE_CLSACT},
			QdiscType:  "clsact",
		})
		if err != nil {
			err = fmt.Errorf("clsact qdisc: %w", err)
		}
	}
	if err != nil {
		return []Feature{feature(ClsBPF, err, hintClsBPF), feature(ClsFlower, err, hintClsFlower), feature(TCX, err, hintTCX)}
	}
	ifindex := lo.Attrs().Index
	attrs := func(prio uint16) netlink.FilterAttrs {
		return netlink.FilterAttrs{LinkIndex: ifindex, Parent: netlink.HANDLE_MIN_INGRESS, Priority: prio, Protocol: unix.ETH_P_ALL}
	}

	prog, progErr := loadTrivialProgram()
	if progErr == nil {
		defer prog.Close()
	}

	err = progErr
	if err == nil {
		err = netlink.FilterAdd(&netlink.BpfFilter{FilterAttrs: attrs(1), Fd: prog.FD(), Name: "hostaccel-probe", DirectAction: true})
	}
	fs := []Feature{feature(ClsBPF, err, hintClsBPF)}

	err = netlink.FilterAdd(&netlink.Flower{FilterAttrs: attrs(2), EthType: unix.ETH_P_IP})
	fs = append(fs, feature(ClsFlower, err, hintClsFlower))

	err = progErr
	if err == nil {
		var l link.Link
		if l, err = link.AttachTCX(link.TCXOptions{Interface: ifindex, Program: prog, Attach: ebpf.AttachTCXIngress}); err == nil {
			l.Close()
		}
	}
	return append(fs, feature(TCX, err, hintTCX))
}

// HaveTCX asks the kernel for the tcx programs of the loopback device (ifindex 1 in every
// network namespace), which changes nothing: kernels without tcx reject the attach type, and
// a process without CAP_NET_ADMIN is refused. The tc datapath attaches with tcx where this
// answers (tc.Manager), and ForTC trusts it.
func HaveTCX() error {
	_, err := link.QueryPrograms(link.QueryOptions{Target: 1, Attach: ebpf.AttachTCXIngress})
	return err
}

// loadTrivialProgram loads a SchedCLS program that returns TC_ACT_OK.
func loadTrivialProgram() (*ebpf.Program, error) {
	removeMemlock()
	prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{
		Name:         "hostaccel_probe",
		Type:         ebpf.SchedCLS,
		License:      "GPL",
		Instructions: asm.Instructions{asm.Mov.Imm(asm.R0, 0), asm.Return()},
	})
	if err != nil {
		return nil, fmt.Errorf("loading a SchedCLS program: %w", err)
	}
	return prog, nil
}
