package bpfobj

import (
	"os"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/rlimit"
)

// load loads a socket filter named name that uses an array map named "counts".
func load(t *testing.T, name string) (*ebpf.Program, *ebpf.Map) {
	t.Helper()
	if os.Geteuid() != 0 {
		if os.Getenv("HOSTACCEL_REQUIRE_ROOT") != "" {
			t.Fatal("needs root (HOSTACCEL_REQUIRE_ROOT is set)")
		}
		t.Skip("needs root")
	}
	_ = rlimit.RemoveMemlock()
	m, err := ebpf.NewMap(&ebpf.MapSpec{Name: "counts", Type: ebpf.Array, KeySize: 4, ValueSize: 8, MaxEntries: 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	p, err := ebpf.NewProgram(&ebpf.ProgramSpec{Name: name, Type: ebpf.SocketFilter, License: "GPL", Instructions: asm.Instructions{
		asm.LoadMapPtr(asm.R1, m.FD()),
		asm.Mov.Imm(asm.R0, 0),
		asm.Return(),
	}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return p, m
}

func TestOpen(t *testing.T) {
	p, _ := load(t, "hostaccel_test")
	info, err := p.Info()
	if err != nil {
		t.Fatal(err)
	}
	id, _ := info.ID()

	var counts, other *ebpf.Map
	slots := map[string]**ebpf.Map{"counts": &counts, "other": &other}
	got, err := Open(id, "hostaccel_test", slots)
	if err != nil || got == nil {
		t.Fatalf("Open(ours) = %v, %v", got, err)
	}
	defer got.Close()
	defer counts.Close()
	if counts == nil || other != nil {
		t.Fatalf("slots after Open: counts %v, other %v (want counts filled, other empty)", counts, other)
	}
	if err := counts.Put(uint32(0), uint64(7)); err != nil {
		t.Fatalf("the map found again is not usable: %v", err)
	}

	var counts2 *ebpf.Map
	if got, err := Open(id, "someone_else", map[string]**ebpf.Map{"counts": &counts2}); got != nil || err != nil || counts2 != nil {
		t.Errorf("Open(another name) = %v, %v, slot %v; want nothing", got, err, counts2)
	}
	if got, err := Open(ebpf.ProgramID(^uint32(0)), "hostaccel_test", slots); got != nil || err != nil {
		t.Errorf("Open(a gone ID) = %v, %v; want nil, nil", got, err)
	}
}
