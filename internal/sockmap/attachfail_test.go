package sockmap

import (
	"context"
	"errors"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"

	"github.com/hostaccel/hostaccel/internal/testbed"
)

// An Apply whose sock_ops attach is refused (another tool holds the cgroup's hook
// exclusively: EPERM) leaves nothing of the set it loaded: no pins, no read counter. Before,
// the sockhash and the read counter's link stayed pinned, a whole set (~16 MiB of maps and
// an attached read counter) more with each failed retry.
func TestRefusedAttachLeavesNoSet(t *testing.T) {
	testbed.RequireRoot(t)
	cg := testCgroup(t, "hostaccel-test-exclusive")
	dummy, err := ebpf.NewProgram(&ebpf.ProgramSpec{Name: "other_sockops", Type: ebpf.SockOps, License: "GPL",
		Instructions: asm.Instructions{asm.Mov.Imm(asm.R0, 1), asm.Return()}})
	if err != nil {
		t.Fatal(err)
	}
	defer dummy.Close()
	f, err := os.OpenFile(cg, os.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	// no BPF_F_ALLOW_MULTI: the hook is the other tool's alone
	if err := link.RawAttachProgram(link.RawAttachProgramOptions{Target: int(f.Fd()), Program: dummy, Attach: ebpf.AttachCGroupSockOps}); err != nil {
		t.Fatal(err)
	}
	defer link.RawDetachProgram(link.RawDetachProgramOptions{Target: int(f.Fd()), Program: dummy, Attach: ebpf.AttachCGroupSockOps})
	pins := filepath.Join(mustBPFFS(t), "hostaccel-test-exclusive")
	t.Cleanup(func() { os.RemoveAll(pins) })
	before := orphanReaders(t)
	m := &Manager{Cgroup: cg, PinDir: pins}
	for i := range 3 {
		_, err := m.Apply(context.Background(), &Desired{LocalPod: []netip.Prefix{netip.MustParsePrefix("192.0.2.0/24")}})
		if !errors.Is(err, unix.EPERM) {
			t.Fatalf("apply %d over an exclusive sock_ops program: %v, want EPERM", i+1, err)
		}
	}
	if left, _ := filepath.Glob(filepath.Join(pins, "*")); len(left) > 0 {
		t.Errorf("3 refused applies left pins %v", left)
	}
	// a read counter whose sock_ops program is gone counts reads for no set (the kernel frees
	// a program a little after its last reference goes)
	var leaked []ebpf.ProgramID
	for deadline := time.Now().Add(3 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		leaked = slices.DeleteFunc(orphanReaders(t), func(id ebpf.ProgramID) bool { return slices.Contains(before, id) })
		if len(leaked) == 0 || time.Now().After(deadline) {
			break
		}
	}
	if len(leaked) > 0 {
		t.Errorf("3 refused applies left read counters %v loaded", leaked)
	}
}

// orphanReaders lists the loaded read counters (hostaccel_rd, hostaccel_rt) that share no map
// with a loaded sock_ops program of ours: those of no set.
func orphanReaders(t *testing.T) []ebpf.ProgramID {
	t.Helper()
	opsMaps := map[ebpf.MapID]bool{}
	readers := map[ebpf.ProgramID][]ebpf.MapID{}
	for id := ebpf.ProgramID(0); ; {
		next, err := ebpf.ProgramGetNextID(id)
		if errors.Is(err, os.ErrNotExist) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		id = next
		p, err := ebpf.NewProgramFromID(id)
		if err != nil {
			continue // gone meanwhile
		}
		info, err := p.Info()
		p.Close()
		if err != nil {
			continue
		}
		ids, _ := info.MapIDs()
		switch info.Name {
		case opsName:
			for _, m := range ids {
				opsMaps[m] = true
			}
		case rdName, rtName:
			readers[id] = ids
		}
	}
	var out []ebpf.ProgramID
	for id, ms := range readers {
		if !slices.ContainsFunc(ms, func(m ebpf.MapID) bool { return opsMaps[m] }) {
			out = append(out, id)
		}
	}
	return out
}
