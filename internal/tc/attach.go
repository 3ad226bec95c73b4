package tc

import (
	"errors"
	"fmt"
	"slices"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/hostaccel/hostaccel/internal/probe"
)

// Attaching to and detaching from a device's tc ingress: tcx, or clsact + cls_bpf.

// Mode is how the program is attached to a device's tc ingress.
type Mode string

const (
	// ModeTCX attaches with BPF_PROG_ATTACH to the device's tcx ingress (Linux >= 6.6). The
	// attachment belongs to the device, not to a file descriptor or link: it outlives the
	// process without bpffs pins.
	ModeTCX Mode = "tcx"
	// ModeClsBPF adds a clsact qdisc (unless one exists) and a cls_bpf direct-action filter.
	ModeClsBPF Mode = "cls_bpf"
)

const (
	progName     = "hostaccel_fp"       // the program's name in the kernel (bpf/fastpath.c)
	filterName   = "hostaccel_fastpath" // cls_bpf filter name
	filterPrio   = 0xc000               // late: other filters (policy) see packets first
	filterHandle = 1
)

func (m *Manager) mode() (Mode, error) {
	switch m.Mode {
	case ModeTCX, ModeClsBPF:
		return m.Mode, nil
	case "":
		if haveTCX() {
			return ModeTCX, nil
		}
		return ModeClsBPF, nil
	}
	return "", fmt.Errorf("tc attach mode %q: want %q or %q", m.Mode, ModeTCX, ModeClsBPF)
}

// haveTCX reports whether the kernel has tcx (probe.HaveTCX: the query ForTC trusts too).
func haveTCX() bool { return probe.HaveTCX() == nil }

// detach takes the attachments off their devices and deletes the clsact qdiscs we created
// that are left empty (clearing the flag in keep's ifaces map). It returns the devices it
// detached from, and those whose flag it cleared in keep.
func (o *observed) detach(atts []attachment, keep *progSet) (names []string, cleared []uint32, err error) {
	flags := o.flags()
	var errs []error
	for _, a := range atts {
		idx := a.link.Attrs().Index
		var err error
		switch a.mode {
		case ModeTCX:
			err = link.RawDetachProgram(link.RawDetachProgramOptions{Target: idx, Program: o.sets[a.prog].prog, Attach: ebpf.AttachTCXIngress})
		case ModeClsBPF:
			err = netlink.FilterDel(a.filter)
		}
		if err != nil && !gone(err) {
			errs = append(errs, fmt.Errorf("%s: detach %s: %w", a.link.Attrs().Name, a.mode, err))
			continue
		}
		if !slices.Contains(names, a.link.Attrs().Name) {
			names = append(names, a.link.Attrs().Name)
		}
		if flags[uint32(idx)]&flagOwnClsact == 0 {
			continue
		}
		deleted, err := deleteEmptyClsact(a.link)
		if err != nil {
			errs = append(errs, err)
		}
		if deleted && keep != nil {
			var e fastpathIface
			if keep.maps.Ifaces.Lookup(uint32(idx), &e) == nil {
				e.Flags &^= flagOwnClsact
				if err := keep.putIface(uint32(idx), e); err != nil {
					errs = append(errs, err)
				} else {
					cleared = append(cleared, uint32(idx))
				}
			}
		}
	}
	return names, cleared, errors.Join(errs...)
}

// attachProgram is attach (a variable: tests make an attach fail).
var attachProgram = attach

// attach attaches set's program to l in mode, replacing in place (atomically) one of our
// attachments there if it can; it returns the attachment replaced.
func attach(mode Mode, l netlink.Link, set *progSet, mine []attachment, sets map[ebpf.ProgramID]*progSet) (attachment, error) {
	idx := l.Attrs().Index
	for _, a := range mine {
		if a.mode != mode {
			continue
		}
		var err error
		switch mode {
		case ModeTCX:
			err = link.RawAttachProgram(link.RawAttachProgramOptions{Target: idx, Program: set.prog, Attach: ebpf.AttachTCXIngress, Anchor: link.ReplaceProgram(sets[a.prog].prog)})
		case ModeClsBPF:
			if a.filter.Priority != filterPrio || a.filter.Handle != filterHandle {
				continue
			}
			err = netlink.FilterReplace(clsFilter(idx, set.prog))
		}
		if err != nil {
			return attachment{}, fmt.Errorf("%s: replace the %s program: %w", l.Attrs().Name, mode, err)
		}
		return a, nil
	}
	var err error
	switch mode {
	case ModeTCX:
		err = link.RawAttachProgram(link.RawAttachProgramOptions{Target: idx, Program: set.prog, Attach: ebpf.AttachTCXIngress, Anchor: link.Tail()})
	case ModeClsBPF:
		err = netlink.FilterReplace(clsFilter(idx, set.prog))
	}
	if err != nil {
		return attachment{}, fmt.Errorf("%s: attach %s: %w", l.Attrs().Name, mode, err)
	}
	return attachment{}, nil
}

func clsFilter(ifindex int, prog *ebpf.Program) *netlink.BpfFilter {
	return &netlink.BpfFilter{
		FilterAttrs: netlink.FilterAttrs{
			LinkIndex: ifindex,
			Parent:    netlink.HANDLE_MIN_INGRESS,
			Handle:    filterHandle,
			Priority:  filterPrio,
			Protocol:  unix.ETH_P_ALL,
		},
		Fd:           prog.FD(),
		Name:         filterName,
		DirectAction: true,
	}
}

// hasClsact reports whether l has a clsact (or ingress) qdisc.
func hasClsact(l netlink.Link) (bool, error) {
	qs, err := netlink.QdiscList(l)
	if err != nil {
		if gone(err) {
			return false, nil
		}
		return false, fmt.Errorf("%s: qdiscs: %w", l.Attrs().Name, err)
	}
	return slices.ContainsFunc(qs, func(q netlink.Qdisc) bool { return q.Attrs().Parent == netlink.HANDLE_INGRESS }), nil
}

// ourFilters returns hostaccel's cls_bpf filters at l's ingress.
func ourFilters(l netlink.Link) ([]*netlink.BpfFilter, error) {
	if ok, err := hasClsact(l); !ok || err != nil {
		return nil, err
	}
	fs, err := netlink.FilterList(l, netlink.HANDLE_MIN_INGRESS)
	if err != nil && !gone(err) {
		return nil, fmt.Errorf("%s: ingress filters: %w", l.Attrs().Name, err)
	}
	var out []*netlink.BpfFilter
	for _, f := range fs {
		if b, ok := f.(*netlink.BpfFilter); ok && b.Name == filterName {
			out = append(out, b)
		}
	}
	return out, nil
}

// ensureClsact adds a clsact qdisc to device ifindex unless it has one; it reports whether
// it added it.
func ensureClsact(ifindex int) (bool, error) {
	err := netlink.QdiscAdd(&netlink.GenericQdisc{
		QdiscAttrs: netlink.QdiscAttrs{LinkIndex: ifindex, Handle: netlink.MakeHandle(0xffff, 0), Parent: netlink.HANDLE_CLSACT},
		QdiscType:  "clsact",
	})
	if errors.Is(err, unix.EEXIST) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("ifindex %d: add clsact qdisc: %w", ifindex, err)
	}
	return true, nil
}

// dropClsacts deletes the clsact qdiscs ownClsacts added, where nothing was attached to
// them yet: an Apply that fails before the map records them as ours leaves nothing behind.
func dropClsacts(added []uint32) {
	for _, idx := range added {
		if l, err := netlink.LinkByIndex(int(idx)); err == nil {
			_, _ = deleteEmptyClsact(l)
		}
	}
}

// deleteEmptyClsact deletes l's clsact qdisc if no filter is left on it.
func deleteEmptyClsact(l netlink.Link) (bool, error) {
	if ok, err := hasClsact(l); !ok || err != nil {
		return false, err
	}
	for _, parent := range []uint32{netlink.HANDLE_MIN_INGRESS, netlink.HANDLE_MIN_EGRESS} {
		fs, err := netlink.FilterList(l, parent)
		if err != nil || len(fs) > 0 {
			return false, err
		}
	}
	err := netlink.QdiscDel(&netlink.GenericQdisc{
		QdiscAttrs: netlink.QdiscAttrs{LinkIndex: l.Attrs().Index, Handle: netlink.MakeHandle(0xffff, 0), Parent: netlink.HANDLE_CLSACT},
		QdiscType:  "clsact",
	})
	if err != nil && !gone(err) {
		return false, fmt.Errorf("%s: delete clsact qdisc: %w", l.Attrs().Name, err)
	}
	return true, nil
}

// gone reports errors of a device or object that disappeared meanwhile.
func gone(err error) bool {
	return errors.Is(err, unix.ENODEV) || errors.Is(err, unix.ENOENT)
}
