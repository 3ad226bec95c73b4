// Package bpfobj finds a hostaccel eBPF program in the kernel again by its ID, with the maps it
// uses, so that a later process (a CLI call, a restarted agent) works on what an earlier one
// loaded without a pinned path. The tc and sockmap datapaths share it.
package bpfobj

import (
	"errors"
	"fmt"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"
)

// Open opens program id if the kernel names it name, and puts each map the program uses into
// the slot of slots named as the map (the caller's map fields, by map name). A map of another
// name, or a second one of a name, is closed. It returns nil and no error when the program is
// gone or is not named name. On an error nothing stays open and every slot it filled is nil
// again. Which slots stay empty (another build's maps) is for the caller to judge.
func Open(id ebpf.ProgramID, name string, slots map[string]**ebpf.Map) (*ebpf.Program, error) {
	prog, err := ebpf.NewProgramFromID(id)
	if errors.Is(err, unix.ENOENT) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("program %d: %w", id, err)
	}
	info, err := prog.Info()
	if err != nil || info.Name != name {
		prog.Close()
		return nil, err
	}
	var filled []**ebpf.Map
	fail := func(err error) (*ebpf.Program, error) {
		for _, slot := range filled {
			(*slot).Close()
			*slot = nil
		}
		prog.Close()
		return nil, err
	}
	ids, _ := info.MapIDs()
	for _, mid := range ids {
		mp, err := ebpf.NewMapFromID(mid)
		if err != nil {
			return fail(fmt.Errorf("map %d of program %d: %w", mid, id, err))
		}
		mi, err := mp.Info()
		if err != nil {
			mp.Close()
			return fail(fmt.Errorf("map %d of program %d: %w", mid, id, err))
		}
		if slot := slots[mi.Name]; slot != nil && *slot == nil {
			*slot = mp
			filled = append(filled, slot)
		} else {
			mp.Close()
		}
	}
	return prog, nil
}
