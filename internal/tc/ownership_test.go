package tc

import (
	"context"
	"encoding/binary"
	"errors"
	"net/netip"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/vishvananda/netlink"
)

// applyFailingAttachOn applies e with every attach to device name failing, and wants the
// apply to fail.
func applyFailingAttachOn(t *testing.T, e *env, name string) {
	t.Helper()
	attachProgram = func(mode Mode, l netlink.Link, set *progSet, mine []attachment, sets map[ebpf.ProgramID]*progSet) (attachment, error) {
		if l.Attrs().Name == name {
			return attachment{}, errors.New("injected attach failure")
		}
		return attach(mode, l, set, mine, sets)
	}
	defer func() { attachProgram = attach }()
	var err error
	e.do(func() error { _, err = e.m.Apply(context.Background(), e.d); return nil })
	if err == nil {
		t.Fatalf("an apply whose attach to %s fails: no error", name)
	}
}

// hasClsactNamed reports whether e's node has a clsact qdisc on device name.
func hasClsactNamed(e *env, name string) bool {
	var ok bool
	e.do(func() (err error) {
		l, err := netlink.LinkByName(name)
		if err != nil {
			return err
		}
		ok, err = hasClsact(l)
		return err
	})
	return ok
}

// An Apply whose attach fails on a device where it has just added the clsact qdisc deletes the
// device's ifaces entry, the record that hostaccel owns the qdisc: the Manager keeps the
// ownership for the Apply that attaches there, so that a later Remove (cleanup) deletes the
// qdisc. It was lost, and the qdisc stayed; and a failing attach keeps the qdisc where it is
// (one deleted at once was added again at every retry).
func TestAttachFailureKeepsClsactOwnership(t *testing.T) {
	e := newEnv(t, ModeClsBPF)
	gw := e.topo.GatewayName
	if hasClsactNamed(e, gw) {
		t.Fatal("gw has a clsact before any apply")
	}
	applyFailingAttachOn(t, e, gw)
	applyFailingAttachOn(t, e, gw)
	if !hasClsactNamed(e, gw) {
		t.Errorf("after two failed attaches: %s lost the clsact qdisc (deleted and added again at each)", gw)
	}
	e.apply()
	e.do(func() error { return NewManager().Remove(context.Background()) })
	if hasClsactNamed(e, gw) {
		t.Errorf("after Remove: %s keeps the clsact qdisc hostaccel added (its ownership was lost with the failed attach)", gw)
	}
}

// A one-shot apply whose attach failed on a device where it added the clsact qdisc exits
// without an Apply to adopt the qdisc or a Remove to delete it: Close deletes it (it stayed,
// and no later cleanup knew it was hostaccel's). The qdiscs of devices the program is
// attached to stay: Close leaves the datapath in place.
func TestCloseDropsUnadoptedClsacts(t *testing.T) {
	e := newEnv(t, ModeClsBPF)
	gw := e.topo.GatewayName
	applyFailingAttachOn(t, e, gw)
	e.do(func() error { e.m.Close(); return nil })
	if hasClsactNamed(e, gw) {
		t.Errorf("after a failed attach and Close: %s keeps the clsact qdisc hostaccel added", gw)
	}
	e.m = NewManager()
	e.apply()
	e.m.Close()
	if !hasClsactNamed(e, gw) {
		t.Errorf("after an apply and Close: %s lost the clsact qdisc its program is attached to", gw)
	}
	if st := e.status(); len(st.Devices) == 0 {
		t.Errorf("after an apply and Close: status has no device: %+v", st)
	}
}

// After an Apply that failed, the next starts afresh: it compared the maps with the apply
// before the failed one, and reported the failed one's own writes as drift.
func TestFailedApplyIsNoDrift(t *testing.T) {
	e := newEnv(t, "")
	e.apply()
	e.do(func() error {
		return netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "hax0"}, PeerName: "hax1"})
	})
	e.d.Devices["hax0"] = RoleGateway
	e.d.PeerPod = append(e.d.PeerPod, netip.MustParsePrefix("10.244.9.0/24"))
	applyFailingAttachOn(t, e, "hax0")
	res := e.apply()
	if len(res.Drift) > 0 {
		t.Errorf("apply after a failed apply of our own reports drift %q: nobody else changed anything", res.Drift)
	}
}

// A switch from cls_bpf to tcx deletes the clsact qdisc hostaccel owned and clears the flag in
// the map, and the Manager's memory of the maps with it: it kept the flag, and the next whole
// reading reported drift.
func TestModeSwitchIsNoDrift(t *testing.T) {
	needMode(t, ModeTCX)
	e := newEnv(t, ModeClsBPF)
	e.apply()
	e.mode = ModeTCX
	if res := e.apply(); len(res.Drift) > 0 {
		t.Errorf("switch: drift %q", res.Drift)
	}
	if res := e.apply(); len(res.Drift) > 0 {
		t.Errorf("apply after the mode switch, nothing changed by anyone: drift %q", res.Drift)
	}
}

// An older build of the program (here: one that lacks the maps this build has and has a
// shorter iface, as every build before the last map or field was added) recorded in its
// ifaces map that hostaccel created gw's clsact qdisc. The new build's Apply replaces that
// program, and takes the ownership over: cleanup deletes the qdisc. Flags were read from sets
// of this build's maps only, and the qdisc stayed.
func TestUpgradeKeepsClsactOwnership(t *testing.T) {
	e := newEnv(t, ModeClsBPF)
	gw := e.topo.GatewayName
	e.do(func() error {
		l, err := netlink.LinkByName(gw)
		if err != nil {
			return err
		}
		idx := l.Attrs().Index
		if _, err := ensureClsact(idx); err != nil {
			return err
		}
		removeMemlock()
		m, err := ebpf.NewMap(&ebpf.MapSpec{Name: "ifaces", Type: ebpf.Hash, KeySize: 4, ValueSize: 12, MaxEntries: 16})
		if err != nil {
			return err
		}
		defer m.Close()
		old := make([]byte, 12) // role, flags, mtu
		binary.LittleEndian.PutUint32(old[0:], uint32(RoleGateway))
		binary.LittleEndian.PutUint32(old[4:], flagOwnClsact)
		binary.LittleEndian.PutUint32(old[8:], 1500)
		if err := m.Put(uint32(idx), old); err != nil {
			return err
		}
		p, err := ebpf.NewProgram(&ebpf.ProgramSpec{Name: progName, Type: ebpf.SchedCLS, License: "GPL", Instructions: asm.Instructions{
			asm.LoadMapPtr(asm.R1, m.FD()),
			asm.Mov.Imm(asm.R0, -1),
			asm.Return(),
		}})
		if err != nil {
			return err
		}
		defer p.Close()
		return netlink.FilterReplace(clsFilter(idx, p))
	})
	if res := e.apply(); !res.Loaded {
		t.Fatalf("apply over the older build: %+v", res)
	}
	e.do(func() error { return NewManager().Remove(context.Background()) })
	if hasClsactNamed(e, gw) {
		t.Errorf("after the upgrade and Remove: %s keeps the clsact qdisc the older build recorded as hostaccel's", gw)
	}
}

// A Remove after one that left nothing of ours, with no Apply between, reads nothing: an agent
// whose plan has no tc removes it at every sync, and the reading of every link's programs and
// filters was ~10 ms of each at 200 links. An Apply makes the next Remove read (and detach)
// again.
func TestRemoveAfterRemoveReadsNothing(t *testing.T) {
	e := newEnv(t, "")
	readings := 0
	was := removeObserve
	removeObserve = func() (*observed, error) { readings++; return was() }
	t.Cleanup(func() { removeObserve = was })
	remove := func() {
		t.Helper()
		e.do(func() error { return e.m.Remove(context.Background()) })
	}
	e.apply()
	remove()
	remove()
	remove()
	if readings != 1 {
		t.Errorf("three Removes after an Apply read the kernel %d times, want once", readings)
	}
	e.apply()
	remove()
	if st := e.status(); readings != 2 || len(st.Devices) != 0 {
		t.Errorf("a Remove after an Apply: %d readings in all (want 2), attached to %v (want none)", readings, st.Devices)
	}
}
