package sockmap

import (
	"context"
	"errors"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"

	"github.com/hostaccel/hostaccel/internal/bpfobj"
	"github.com/hostaccel/hostaccel/internal/testbed"
)

// Remove detaches the programs even where no BPF filesystem is visible (a cleanup run from a
// mount namespace without the agent's pins): draining needs no pin. The test runs itself again
// in a private mount namespace (unshare -m), on an empty cgroup of its own.
func TestRemoveWithoutBPFFS(t *testing.T) {
	if !inPrivateMounts(t) {
		return
	}
	cg := testCgroup(t, "hostaccel-test-remove")
	if _, err := (&Manager{Cgroup: cg}).Apply(context.Background(), &Desired{LocalPod: []netip.Prefix{netip.MustParsePrefix("192.0.2.0/24")}}); err != nil {
		t.Fatal(err)
	}
	if n := opsOn(t, cg); n != 1 {
		t.Fatalf("after apply: %d sock_ops programs of ours", n)
	}
	unmountBPFFS(t)
	err := (&Manager{Cgroup: cg}).Remove(context.Background())
	if n := opsOn(t, cg); n != 0 {
		t.Errorf("Remove without a BPF filesystem (%v) left %d sock_ops programs attached", err, n)
	}
}

// opsOn counts our sock_ops programs attached to cgroup dir (observe's sets).
func opsOn(t *testing.T, dir string) int {
	t.Helper()
	o, err := observe(dir)
	defer o.Close()
	if err != nil {
		t.Fatal(err)
	}
	return len(o.sets)
}

// A set whose drain stopped between writing its settings (off) and taking it off the cgroup
// (the process killed in between) is not taken for the current one: the next Apply loads a
// set that works, and the half-drained one goes.
func TestApplyReplacesAHalfDrainedSet(t *testing.T) {
	testbed.RequireRoot(t)
	cg := testCgroup(t, "hostaccel-test-drained")
	defer (&Manager{Cgroup: cg}).Remove(context.Background())
	d := &Desired{LocalPod: []netip.Prefix{netip.MustParsePrefix("192.0.2.0/24")}}
	if _, err := (&Manager{Cgroup: cg}).Apply(context.Background(), d); err != nil {
		t.Fatal(err)
	}
	o, err := observe(cg)
	if err != nil || len(o.sets) != 1 {
		t.Fatalf("after apply: %v, %d sets", err, len(o.sets))
	}
	cfg, err := o.sets[0].settings()
	if err != nil {
		t.Fatal(err)
	}
	cfg.Enabled, cfg.Draining = 0, 1 // drain's first step, and no more
	if err := o.sets[0].maps.Config.Put(uint32(0), cfg); err != nil {
		t.Fatal(err)
	}
	o.Close()
	res, err := (&Manager{Cgroup: cg}).Apply(context.Background(), d) // the restarted agent
	if err != nil || !res.Changed() {
		t.Fatalf("apply over a half-drained set: %+v %v", res, err)
	}
	o, err = observe(cg)
	if err != nil {
		t.Fatal(err)
	}
	defer o.Close()
	if len(o.sets) != 1 || o.sets[0].off {
		t.Errorf("after: %d sets attached, the first off: %v", len(o.sets), len(o.sets) > 0 && o.sets[0].off)
	}
}

// inPrivateMounts runs the test again in a private mount namespace (unshare -m) and reports
// whether this is that run.
func inPrivateMounts(t *testing.T) bool {
	t.Helper()
	testbed.RequireRoot(t)
	if os.Getenv("HOSTACCEL_TEST_INNER") == "1" {
		return true
	}
	out, err := exec.Command("unshare", "-m", "env", "HOSTACCEL_TEST_INNER=1", os.Args[0], "-test.run", "^"+t.Name()+"$", "-test.v").CombinedOutput()
	if err != nil || !strings.Contains(string(out), "--- PASS") {
		t.Fatalf("%v\n%s", err, out)
	}
	return false
}

// unmountBPFFS unmounts every BPF filesystem of the (private) mount namespace.
func unmountBPFFS(t *testing.T) {
	t.Helper()
	b, _ := os.ReadFile(MountInfo)
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(l); len(f) > 4 && strings.Contains(l, " - bpf ") {
			if err := unix.Unmount(f[4], unix.MNT_DETACH); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// Apply without a BPF filesystem mounts one at /sys/fs/bpf for its pins and says so in its
// result (the agent warns: in a container the pins would go with it); the next apply finds it
// and says nothing. Run in a private mount namespace, on an empty cgroup of its own.
func TestApplyMountsBPFFS(t *testing.T) {
	if !inPrivateMounts(t) {
		return
	}
	cg := testCgroup(t, "hostaccel-test-mount")
	unmountBPFFS(t)
	m := &Manager{Cgroup: cg}
	defer m.Remove(context.Background())
	d := &Desired{LocalPod: []netip.Prefix{netip.MustParsePrefix("192.0.2.0/24")}}
	res, err := m.Apply(context.Background(), d)
	if err != nil || res.MountedBPFFS != DefaultBPFFS {
		t.Fatalf("apply without a BPF filesystem: %+v, %v; want it mounted at %s", res, err, DefaultBPFFS)
	}
	if fs, err := BPFFS(); err != nil || fs != DefaultBPFFS {
		t.Errorf("after apply: BPFFS() = %q, %v", fs, err)
	}
	if pins, _ := filepath.Glob(filepath.Join(DefaultBPFFS, "hostaccel", "sockmap-*")); len(pins) != 1 {
		t.Errorf("pins %v, want the sockhash's", pins)
	}
	if res, err := m.Apply(context.Background(), d); err != nil || res.MountedBPFFS != "" {
		t.Errorf("second apply: %+v, %v; want nothing mounted", res, err)
	}
}

// testCgroup makes an empty cgroup of the test's below the cgroup v2 root (the test skips
// where there is none), removed when the test ends: what is still attached to it goes with it.
func testCgroup(t *testing.T, name string) string {
	t.Helper()
	root, err := CgroupRoot()
	if err != nil {
		t.Skip(err)
	}
	cg := filepath.Join(root, name)
	if err := os.Mkdir(cg, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.Remove(cg) })
	return cg
}

// A set whose sock_ops program someone else took off the cgroup (no drain of ours ran) is
// drained by the next Apply, as a set we detach is: the messages of the connections it holds
// take TCP from then on. Before, its sk_msg program went on moving them after the repair and
// after cleanup, with status saying "draining".
func TestOrphanSetIsDrained(t *testing.T) {
	b := newBed(t, false)
	first := b.apply()
	c, s := b.pair(false)
	if n := b.settle(2); n != 2 {
		t.Fatalf("%d sockets in the map", n)
	}
	// the orphan's counters, reached as drainOrphan reaches its settings
	mp, err := ebpf.LoadPinnedMap(filepath.Join(mustBPFFS(t), "hostaccel", PinName(first.ProgramID)), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer mp.Close()
	msg, _, err := attachedMsg(mp)
	if err != nil || msg == nil {
		t.Fatalf("the sockhash's sk_msg program: %v %v", msg, err)
	}
	info, _ := msg.Info()
	id, _ := info.ID()
	msg.Close()
	old := &progSet{}
	p, err := bpfobj.Open(id, msgName, map[string]**ebpf.Map{"stats": &old.maps.Stats, "config": &old.maps.Config})
	if p == nil || old.maps.Stats == nil {
		t.Fatalf("the set's maps: %v", err)
	}
	defer p.Close()
	defer old.maps.Close()
	redirected := func() uint64 {
		n, err := old.counters()
		if err != nil {
			t.Fatal(err)
		}
		return n[statRedirected].Bytes
	}
	// (a round each way, the connection kept open)
	round := func() {
		t.Helper()
		buf := make([]byte, 64<<10)
		for _, p := range [][2]*net.TCPConn{{c, s}, {s, c}} {
			if _, err := p[0].Write(buf); err != nil {
				t.Fatal(err)
			}
			p[1].SetReadDeadline(time.Now().Add(10 * time.Second))
			if _, err := io.ReadFull(p[1], buf); err != nil {
				t.Fatal(err)
			}
		}
	}
	round()
	if redirected() == 0 {
		t.Fatal("nothing moved before the detach: the test shows nothing")
	}

	o, err := observe(first.Cgroup)
	if err != nil {
		t.Fatal(err)
	}
	if err := link.RawDetachProgram(link.RawDetachProgramOptions{Target: int(o.fd.Fd()), Program: o.sets[0].ops, Attach: ebpf.AttachCGroupSockOps}); err != nil {
		t.Fatal(err)
	}
	o.Close()
	if res := b.apply(); !res.Loaded {
		t.Fatalf("the repair: %+v", res)
	}
	before := redirected()
	round()
	if after := redirected(); after != before {
		t.Errorf("after the repair, the detached set moved %d more bytes of its open connection", after-before)
	}
	if st := b.status(); st.Draining != 2 {
		t.Errorf("status: %d sockets draining, want 2", st.Draining)
	}
}

// Remove where the cgroup cannot be reached (no cgroup2 root mounted where this process sees:
// a deployment without the host's /sys/fs/cgroup) says so, and drains the sets whose pins it
// sees: nothing is entered any more, every message takes TCP. Before, it returned nil at once,
// and a switch away from sockmap left the set working, silently. The test runs itself again
// in a private mount namespace, applies on an empty cgroup of its own, unmounts cgroup2 and
// removes from the root.
func TestRemoveWithoutCgroupRoot(t *testing.T) {
	if !inPrivateMounts(t) {
		return
	}
	cg := testCgroup(t, "hostaccel-test-nocgroup")
	root, err := CgroupRoot()
	if err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(cg, os.O_RDONLY|unix.O_DIRECTORY, 0) // the cgroup, once unmounted
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	m := &Manager{Cgroup: cg}
	if _, err := m.Apply(context.Background(), &Desired{LocalPod: []netip.Prefix{netip.MustParsePrefix("192.0.2.0/24")}}); err != nil {
		t.Fatal(err)
	}
	pins := filepath.Join(mustBPFFS(t), "hostaccel")
	if left, _ := filepath.Glob(filepath.Join(pins, "*")); len(left) == 0 {
		t.Fatal("apply pinned nothing: the test shows nothing")
	}
	for range 10 {
		b, _ := os.ReadFile(MountInfo)
		var point string
		for _, l := range strings.Split(string(b), "\n") {
			if f := strings.Fields(l); len(f) > 4 && strings.Contains(l, " - cgroup2 ") {
				point = f[4]
				break
			}
		}
		if point == "" {
			break
		}
		if err := unix.Unmount(point, unix.MNT_DETACH); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		// back, for testCgroup's cleanup: the set goes with a Remove that reaches it
		if err := unix.Mount("cgroup2", root, "cgroup2", 0, ""); err != nil {
			t.Error(err)
			return
		}
		if err := (&Manager{Cgroup: cg}).Remove(context.Background()); err != nil {
			t.Error(err)
		}
	})
	if _, err := CgroupRoot(); err == nil {
		t.Fatal("a cgroup2 root is still mounted")
	}
	m.Cgroup = "" // the node's root: not reachable here
	err = m.Remove(context.Background())
	t.Logf("remove: %v", err)
	if err == nil {
		t.Error("Remove without a cgroup2 root: nil error, with the set attached where it could not look")
	}
	if left, _ := filepath.Glob(filepath.Join(pins, "*")); len(left) > 0 {
		t.Errorf("pins left: %v", left)
	}
	// A Manager that applied nothing, no pin of ours in sight: no error (every apply without
	// sockmap removes it, in a Pod of a deployment that never ran it too).
	if err := NewManager().Remove(context.Background()); err != nil {
		t.Errorf("Remove with nothing of ours in sight: %v", err)
	}
	q, err := link.QueryPrograms(link.QueryOptions{Target: int(f.Fd()), Attach: ebpf.AttachCGroupSockOps})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range q.Programs {
		s, err := openSet(p.ID)
		if err != nil {
			t.Fatal(err)
		}
		if s != nil && !s.off {
			t.Errorf("sock_ops program %d, attached, still enters sockets", p.ID)
		}
		s.Close()
	}
}

// Where the cgroup cannot be reached, Remove says so once, when it drains a set (or its
// Manager applied one): the drained set's map keeps its pin while sockets entered before live,
// and a later Remove from a Manager that applied nothing finds only that. It failed every sync
// (each removes the datapath it does not run) for as long as one old socket lived.
func TestRemoveUnreachedSaysItOnce(t *testing.T) {
	testbed.RequireRoot(t)
	cg := testCgroup(t, "hostaccel-test-unreached")
	pins := filepath.Join(mustBPFFS(t), "hostaccel-test-unreached")
	t.Cleanup(func() { os.RemoveAll(pins) })
	m := &Manager{Cgroup: cg, PinDir: pins}
	if _, err := m.Apply(context.Background(), &Desired{LocalPod: []netip.Prefix{netip.MustParsePrefix("192.0.2.0/24")}}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := (&Manager{Cgroup: cg, PinDir: pins}).Remove(context.Background()); err != nil {
			t.Error(err)
		}
	})
	socks, _ := filepath.Glob(filepath.Join(pins, "sockmap-*"))
	if len(socks) != 1 {
		t.Fatalf("pinned sockhashes %v, want 1", socks)
	}
	mp, err := ebpf.LoadPinnedMap(socks[0], nil)
	if err != nil {
		t.Fatal(err)
	}
	defer mp.Close()
	// an old connection's socket, in the map as the set's sock_ops program would have put it
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	raw, err := c.(*net.TCPConn).SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var perr error
	raw.Control(func(fd uintptr) { perr = mp.Put(make([]byte, mp.KeySize()), uint64(fd)) })
	if perr != nil {
		t.Fatal(perr)
	}
	unreached := errors.New("no cgroup2 mount")
	if err := m.removeUnreached(context.Background(), unreached, true); err == nil {
		t.Error("the Remove that drained the set: no error")
	}
	if left, _ := filepath.Glob(filepath.Join(pins, "sockmap-*")); len(left) != 1 {
		t.Fatalf("the drained set's map, which holds a socket, is not pinned: %v", left)
	}
	if err := (&Manager{PinDir: pins}).removeUnreached(context.Background(), unreached, false); err != nil {
		t.Errorf("a later Remove, which found the set drained already: %v", err)
	}
}
