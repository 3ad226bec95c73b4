package sockmap

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"time"
	"unsafe"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"

	"github.com/hostaccel/hostaccel/internal/bpfobj"
)

// bpfFAllowMulti is BPF_F_ALLOW_MULTI: our sock_ops program runs beside other users' on the
// same cgroup.
const bpfFAllowMulti = 1 << 1

// Manager owns the sockmap datapath of the node: one program set attached to the cgroup v2
// root. Every method finds the set again by asking the kernel (the cgroup's sock_ops
// programs, the program's maps, the sockhash's sk_msg program), so a later process (status,
// cleanup, the next agent) sees what an earlier apply installed. The pins (bpffs) keep the
// sockhash (and with it its sk_msg program) and the read counter's link alive, and find a set
// whose sock_ops program someone else detached (drainOrphan); doc.go says more.
type Manager struct {
	// Cgroup is the cgroup v2 directory to attach to; empty: the hierarchy's root
	// (CgroupRoot), which covers every socket of the node. Tests use a child cgroup.
	Cgroup string
	// Drain is how long Remove waits for the sockets in the map to close (see Remove).
	Drain time.Duration
	// PinDir is where the sockhash is pinned (PinName(program ID)); empty: BPFFS()/hostaccel.
	PinDir string
	// MaxQueued bounds the bytes sent to a receiving socket that it has not read yet: past
	// it, the sender's direction of the connection takes TCP (whose flow control then holds
	// the writer back) until the receiver has read all. 0: DefaultMaxQueued. Without a read
	// counter (the kernel could attach neither) there is no bound.
	MaxQueued uint64

	last *applied
	// readerErr: attaching hostaccel_rd failed for this Manager's current set; not retried
	// until a new set is loaded.
	readerErr error
}

func (m *Manager) maxQueued() uint64 {
	if m.MaxQueued == 0 {
		return DefaultMaxQueued
	}
	return m.MaxQueued
}

// PinName is the file name of a set's pinned sockhash in PinDir, by its sock_ops program's ID.
func PinName(id ebpf.ProgramID) string { return fmt.Sprintf("sockmap-%d", id) }

// ReaderPinName is the file name of a set's pinned hostaccel_rd link (fexit on
// tcp_bpf_recvmsg, or the sock_recv_length tracepoint) in PinDir, by its sock_ops program's ID: the pin keeps it attached.
func ReaderPinName(id ebpf.ProgramID) string { return fmt.Sprintf("reader-%d", id) }

// pinDir returns the pin directory, mounting the BPF filesystem if none is (Apply), and
// where it mounted it (empty: it was mounted).
func (m *Manager) pinDir() (dir, mounted string, err error) {
	if dir, err = m.pins(); err == nil {
		return dir, "", nil
	}
	// As other eBPF agents do: mount it where it belongs (a DaemonSet mounts the host's).
	if merr := unix.Mount("bpf", DefaultBPFFS, "bpf", 0, "mode=0700"); merr != nil {
		return "", "", fmt.Errorf("%w; mounting it at %s: %v", err, DefaultBPFFS, merr)
	}
	return filepath.Join(DefaultBPFFS, "hostaccel"), DefaultBPFFS, nil
}

// pins returns the pin directory of a mounted BPF filesystem.
func (m *Manager) pins() (string, error) {
	if m.PinDir != "" {
		return m.PinDir, nil
	}
	fs, err := BPFFS()
	if err != nil {
		return "", err
	}
	return filepath.Join(fs, "hostaccel"), nil
}

// DefaultBPFFS is where Apply mounts the BPF filesystem when none is mounted.
const DefaultBPFFS = "/sys/fs/bpf"

type applied struct {
	ops  ebpf.ProgramID
	pods map[netip.Prefix]uint32
}

// NewManager returns a Manager for the cgroup v2 root.
func NewManager() *Manager { return &Manager{} }

// Result says what one Apply did.
type Result struct {
	Cgroup          string         `json:"cgroup"`
	ProgramID       ebpf.ProgramID `json:"programID,omitempty"` // the sock_ops program
	Loaded          bool           `json:"loaded"`              // a new program set was loaded and attached
	Replaced        int            `json:"replaced,omitempty"`  // our program sets of other builds detached
	ElementsAdded   int            `json:"elementsAdded"`
	ElementsUpdated int            `json:"elementsUpdated"`
	ElementsRemoved int            `json:"elementsRemoved"`
	// Drift says what someone else changed since this Manager's last apply, now repaired.
	Drift []string `json:"drift,omitempty"`
	// Unbounded says why a receiver's unread data is not bounded (hostaccel_rd could not be
	// attached); empty when it is.
	Unbounded string `json:"unbounded,omitempty"`
	// MountedBPFFS is where this apply mounted the BPF filesystem, none being mounted. The
	// pins (and so the moved connections, past this process) last as long as that mount: in
	// a container without the host's /sys/fs/bpf, as long as the container.
	MountedBPFFS string `json:"mountedBPFFS,omitempty"`
}

// Changed reports whether the apply changed the kernel.
func (r Result) Changed() bool {
	return r.Loaded || r.Replaced+r.ElementsAdded+r.ElementsUpdated+r.ElementsRemoved > 0 || len(r.Drift) > 0
}

func (m *Manager) cgroup() (string, error) {
	if m.Cgroup != "" {
		return m.Cgroup, nil
	}
	return CgroupRoot()
}

// observed is what the kernel has on the cgroup: our program sets, by sock_ops program.
type observed struct {
	fd   *os.File
	sets []*progSet
}

func (o *observed) Close() {
	if o == nil {
		return
	}
	for _, s := range o.sets {
		s.Close()
	}
	if o.fd != nil {
		o.fd.Close()
	}
}

func observe(cgroup string) (*observed, error) {
	f, err := os.OpenFile(cgroup, os.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		return nil, fmt.Errorf("cgroup: %w", err)
	}
	o := &observed{fd: f}
	q, err := link.QueryPrograms(link.QueryOptions{Target: int(f.Fd()), Attach: ebpf.AttachCGroupSockOps})
	if err != nil {
		return o, fmt.Errorf("%s: sock_ops programs: %w", cgroup, err)
	}
	for _, p := range q.Programs {
		s, err := openSet(p.ID)
		if err != nil {
			return o, err
		}
		if s != nil {
			o.sets = append(o.sets, s)
		}
	}
	return o, nil
}

// current is an attached set of this build, enabled, whose sockhash has its sk_msg program,
// or nil. Where the kernel cannot say (before 6.0), the set's pin vouches for it.
func (o *observed) current(pins string) *progSet {
	for _, s := range o.sets {
		if !s.usable() || s.build != buildID() || s.off {
			continue
		}
		if s.msg != nil {
			return s
		}
		if _, err := os.Stat(filepath.Join(pins, PinName(s.opsID))); err == nil && s.msgUnknown {
			return s
		}
	}
	return nil
}

// attachedMsg opens the sk_msg program attached to the sockhash (BPF_PROG_QUERY on a
// sockmap: Linux >= 6.0); nil if none is or the kernel cannot say.
func attachedMsg(socks *ebpf.Map) (_ *ebpf.Program, unknown bool, _ error) {
	q, err := link.QueryPrograms(link.QueryOptions{Target: socks.FD(), Attach: ebpf.AttachSkMsgVerdict})
	if err != nil {
		return nil, true, nil
	}
	if len(q.Programs) == 0 {
		return nil, false, nil
	}
	p, err := ebpf.NewProgramFromID(q.Programs[0].ID)
	if err != nil {
		return nil, false, fmt.Errorf("sk_msg program %d: %w", q.Programs[0].ID, err)
	}
	return p, false, nil
}

// Apply makes the kernel match d: a program set of this build attached to the cgroup (loaded,
// its maps filled and its sk_msg program attached to the sockhash before the sock_ops program
// is attached, so no socket is entered without a verdict program), the Pod CIDR tries updated
// element by element (exclusions added first and removed last), our sets of other builds
// detached. A nil d removes the datapath.
func (m *Manager) Apply(ctx context.Context, d *Desired) (Result, error) {
	if err := ctx.Err(); err != nil {
		return Result{}, err
	}
	if d == nil {
		return Result{}, m.Remove(ctx)
	}
	cg, err := m.cgroup()
	res := Result{Cgroup: cg}
	if err != nil {
		return res, err
	}
	o, err := observe(cg)
	defer o.Close()
	if err != nil {
		return res, err
	}
	pins, mounted, err := m.pinDir()
	res.MountedBPFFS = mounted
	if err != nil {
		return res, err
	}
	want := d.entries()
	set := o.current(pins)
	if m.last != nil && (set == nil || set.opsID != m.last.ops) {
		if slices.ContainsFunc(o.sets, func(s *progSet) bool { return s.opsID == m.last.ops }) {
			res.Drift = append(res.Drift, "sk_msg program detached from the sockhash (its pin removed?): program set replaced")
		} else {
			res.Drift = append(res.Drift, "sock_ops program detached from "+cg)
		}
	}
	if set == nil {
		if set, err = loadSet(); err != nil {
			return res, err
		}
		defer set.Close() // the cgroup holds it from now on
		res.Loaded = true
	}
	res.ProgramID = set.opsID
	cur, err := set.readPods()
	if err != nil {
		return res, err
	}
	if m.last != nil && !res.Loaded && !maps.Equal(m.last.pods, cur) {
		res.Drift = append(res.Drift, "map pods4/pods6 changed")
	}
	if err := fits(set, cur, want); err != nil {
		return res, err
	}
	uerr := m.update(set, cur, want, &res)
	if res.ElementsAdded+res.ElementsUpdated+res.ElementsRemoved > 0 {
		// Open connections check their ends against the tries again (settings.epoch), also
		// after an update that failed part way: the retry finds what it wrote (exclusions
		// first) in place, counts no change and bumps nothing.
		berr := set.bumpEpoch()
		if !res.Loaded && m.last != nil && m.last.ops == set.opsID {
			// what this apply wrote is no drift to the next one, whatever fails after
			if m.last.pods, err = set.readPods(); err != nil {
				m.last = nil
			}
		}
		if err := errors.Join(uerr, berr); err != nil {
			return res, err
		}
	} else if uerr != nil {
		return res, uerr
	}
	// The pin keeps the sk_msg program on the map: without a pin or an open descriptor of
	// the map, the kernel releases it.
	pin := filepath.Join(pins, PinName(set.opsID))
	attached := !res.Loaded
	if res.Loaded {
		// A set loaded here and never attached (its sock_ops attach refused: another tool
		// holding the cgroup's hook exclusively, EPERM) goes whole: its pins would keep its
		// maps (~16 MiB) and its read counter attached, one set more each failed retry.
		// (Best effort: a later Apply that attaches sweeps what is left.)
		defer func() {
			if !attached {
				os.Remove(filepath.Join(pins, ReaderPinName(set.opsID)))
				os.Remove(pin)
			}
		}()
		if err := link.RawAttachProgram(link.RawAttachProgramOptions{Target: set.maps.HostaccelSocks.FD(), Program: set.msg, Attach: ebpf.AttachSkMsgVerdict}); err != nil {
			return res, fmt.Errorf("attach sk_msg to the sockhash: %w", err)
		}
		if err := os.MkdirAll(pins, 0o700); err != nil {
			return res, fmt.Errorf("sockmap pin directory: %w", err)
		}
		if err := set.maps.HostaccelSocks.Pin(pin); err != nil {
			return res, fmt.Errorf("pin the sockhash: %w", err)
		}
	} else if _, err := os.Stat(pin); err != nil {
		res.Drift = append(res.Drift, "sockhash pin "+pin+" removed")
		if err := set.maps.HostaccelSocks.Pin(pin); err != nil {
			return res, fmt.Errorf("pin the sockhash: %w", err)
		}
	}
	if err := m.reader(set, pins, &res); err != nil {
		return res, err
	}
	if res.Loaded {
		if err := link.RawAttachProgram(link.RawAttachProgramOptions{Target: int(o.fd.Fd()), Program: set.ops, Attach: ebpf.AttachCGroupSockOps, Flags: bpfFAllowMulti}); err != nil {
			return res, fmt.Errorf("attach sock_ops to %s: %w", cg, err)
		}
		attached = true
	}
	var errs []error
	for _, s := range o.sets {
		if s != set {
			errs = append(errs, drain(o, s))
			res.Replaced++
		}
	}
	_, err = sweep(pins, []*progSet{set})
	errs = append(errs, err, removeReaders(pins, set))
	if err := errors.Join(errs...); err != nil {
		return res, err
	}
	after, err := set.readPods()
	if err != nil {
		return res, err
	}
	m.last = &applied{ops: set.opsID, pods: after}
	return res, nil
}

// reader keeps hostaccel_rd attached for set (its link pinned at ReaderPinName) and the
// set's bound (settings.max_queued) at m.MaxQueued, or 0 when the program cannot be
// attached: then nothing counts reads, and a bound would turn every connection to TCP.
func (m *Manager) reader(set *progSet, pins string, res *Result) error {
	cfg, err := set.settings()
	if err != nil {
		return fmt.Errorf("config: %w", err)
	}
	pin := filepath.Join(pins, ReaderPinName(set.opsID))
	attached := false
	if l, err := link.LoadPinnedLink(pin, nil); err == nil {
		l.Close()
		attached = true
	}
	if res.Loaded {
		m.readerErr = nil
	}
	if !attached && m.readerErr == nil {
		if !res.Loaded && cfg.MaxQueued != 0 {
			res.Drift = append(res.Drift, "read counter link pin "+pin+" removed")
		}
		l, err := set.loadReader()
		if err == nil {
			if err = os.MkdirAll(pins, 0o700); err == nil {
				err = l.Pin(pin)
			}
			l.Close()
		}
		m.readerErr = err
		attached = err == nil
	}
	want := uint64(0)
	if attached {
		want = m.maxQueued()
	} else if m.readerErr != nil {
		res.Unbounded = m.readerErr.Error()
	} else {
		res.Unbounded = "hostaccel_rd is not attached"
	}
	if cfg.MaxQueued != want {
		cfg.MaxQueued = want
		if err := set.maps.Config.Put(uint32(0), cfg); err != nil {
			return fmt.Errorf("config: %w", err)
		}
	}
	return nil
}

// removeReaders removes the hostaccel_rd link pins of every set but keep (nil: all), which
// detaches those programs.
func removeReaders(pins string, keep *progSet) error {
	files, err := filepath.Glob(filepath.Join(pins, "reader-*"))
	if err != nil {
		return err
	}
	var errs []error
	for _, f := range files {
		if keep != nil && filepath.Base(f) == ReaderPinName(keep.opsID) {
			continue
		}
		if err := os.Remove(f); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// fits checks, before anything is written, that the tries hold want, and cur and want together
// (update adds before it deletes): a trie that filled up half way left exclusions unwritten
// while the set was enabled (new connections to those Pods moved past netfilter).
func fits(set *progSet, cur, want map[netip.Prefix]uint32) error {
	var wanted, both [2]int // IPv4, IPv6
	for p := range want {
		wanted[famOf(p)]++
		both[famOf(p)]++
	}
	for p := range cur {
		if _, ok := want[p]; !ok {
			both[famOf(p)]++
		}
	}
	for i, m := range []*ebpf.Map{set.maps.Pods4, set.maps.Pods6} {
		max := int(m.MaxEntries())
		if wanted[i] > max {
			return fmt.Errorf("sockmap: node.localPodCIDRs and exclude give %d IPv%d prefixes, more than the datapath's %d (nothing was changed)", wanted[i], 4+2*i, max)
		}
		if both[i] > max {
			return fmt.Errorf("sockmap: the %d IPv%d prefixes of node.localPodCIDRs and exclude and the %d the datapath holds now that go would be more than its %d at once (nothing was changed; apply a smaller change first)", wanted[i], 4+2*i, both[i]-wanted[i], max)
		}
	}
	return nil
}

// update brings the tries from cur to want: exclusions first, then the rest, then deletions
// of entries that are not exclusions, then of exclusions.
func (m *Manager) update(set *progSet, cur, want map[netip.Prefix]uint32, res *Result) error {
	for _, excl := range []bool{true, false} {
		for _, p := range sortedKeys(want) {
			f := want[p]
			if (f&addrExclude != 0) != excl {
				continue
			}
			was, ok := cur[p]
			if ok && was == f {
				continue
			}
			if err := set.putPod(p, f); err != nil {
				return err
			}
			if ok {
				res.ElementsUpdated++
			} else {
				res.ElementsAdded++
			}
		}
	}
	for _, excl := range []bool{false, true} {
		for _, p := range sortedKeys(cur) {
			if _, ok := want[p]; ok || (cur[p]&addrExclude != 0) != excl {
				continue
			}
			if err := set.deletePod(p); err != nil {
				return err
			}
			res.ElementsRemoved++
		}
	}
	return nil
}

func sortedKeys(m map[netip.Prefix]uint32) []netip.Prefix {
	return slices.SortedFunc(maps.Keys(m), func(a, b netip.Prefix) int {
		if c := a.Addr().Compare(b.Addr()); c != 0 {
			return c
		}
		return a.Bits() - b.Bits()
	})
}

// enabledAt and drainingAt are the offsets of settings.enabled and settings.draining (u32s),
// the same in every build (fields are only appended); drainingEnd is where draining ends.
const (
	enabledAt   = int(unsafe.Offsetof(sockmapSettings{}.Enabled))
	drainingAt  = int(unsafe.Offsetof(sockmapSettings{}.Draining))
	drainingEnd = drainingAt + 4
)

// drain stops s: nothing is entered any more, no message redirected (each takes TCP), and
// the sock_ops program is taken off the cgroup. The sockets in the map stay there: the data
// already moved to a socket's queue is read before its TCP receive queue, so nothing is lost
// or reordered. Its pin keeps the map until the last socket has left it (closed): sweep then
// removes the pin, and the kernel frees the map and the programs.
func drain(o *observed, s *progSet) error {
	var errs []error
	if s.maps.Config != nil {
		// As bytes: a set of an older build has a shorter settings struct (fields are only
		// appended, so build and draining keep their offsets).
		v := make([]byte, s.maps.Config.ValueSize())
		if len(v) >= drainingEnd {
			binary.LittleEndian.PutUint64(v[0:], s.build)
			binary.LittleEndian.PutUint32(v[drainingAt:], 1)
			errs = append(errs, s.maps.Config.Put(uint32(0), v))
		}
	}
	if err := link.RawDetachProgram(link.RawDetachProgramOptions{Target: int(o.fd.Fd()), Program: s.ops, Attach: ebpf.AttachCGroupSockOps}); err != nil && !errors.Is(err, unix.ENOENT) {
		errs = append(errs, fmt.Errorf("detach sock_ops: %w", err))
	}
	return errors.Join(errs...)
}

// sweep removes the pins of sets no longer attached (drained, or detached by someone else)
// whose maps are empty, and returns how many sockets the others still hold.
func sweep(pins string, live []*progSet) (int, error) { return drained(pins, live, true) }

// drained counts the sockets in the maps of sets no longer attached; with remove, it removes
// the pins of those that are empty.
func drained(pins string, live []*progSet, remove bool) (int, error) {
	files, err := filepath.Glob(filepath.Join(pins, "sockmap-*"))
	if err != nil {
		return 0, err
	}
	held := 0
	var errs []error
	for _, f := range files {
		if slices.ContainsFunc(live, func(s *progSet) bool { return filepath.Base(f) == PinName(s.opsID) }) {
			continue
		}
		mp, err := ebpf.LoadPinnedMap(f, nil)
		if err != nil {
			errs = append(errs, fmt.Errorf("pinned sockhash %s: %w", f, err))
			continue
		}
		keys, err := (&progSet{maps: sockmapMaps{HostaccelSocks: mp}}).sockets()
		if err == nil && remove && len(keys) > 0 {
			err = drainOrphan(mp)
		}
		mp.Close()
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if held += len(keys); len(keys) > 0 || !remove {
			continue
		}
		if err := os.Remove(f); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	return held, errors.Join(errs...)
}

// drainOrphan drains the set whose sockhash is socks, found by its pin only: its sock_ops
// program was taken off the cgroup by someone else, so no drain of ours set its settings, and
// its sk_msg program went on moving its sockets' messages after a repair or a cleanup. Its
// settings are reached through that sk_msg program (BPF_PROG_QUERY on the map: Linux >= 6.0;
// an older kernel cannot say, and the set is left as it is).
func drainOrphan(socks *ebpf.Map) error {
	_, err := drainOrphanNow(socks)
	return err
}

// drainOrphanNow is drainOrphan, and says whether it drained the set now (false: it was
// drained already, or its program cannot be found).
func drainOrphanNow(socks *ebpf.Map) (bool, error) {
	msg, _, err := attachedMsg(socks)
	if err != nil || msg == nil {
		return false, err
	}
	defer msg.Close()
	info, err := msg.Info()
	if err != nil {
		return false, err
	}
	id, _ := info.ID()
	var cfg *ebpf.Map
	p, err := bpfobj.Open(id, msgName, map[string]**ebpf.Map{"config": &cfg})
	if p == nil || cfg == nil {
		return false, err
	}
	defer p.Close()
	defer cfg.Close()
	// (as bytes, as drain writes it: a set of an older build has a shorter settings struct)
	v := make([]byte, cfg.ValueSize())
	if err := cfg.Lookup(uint32(0), &v); err != nil || len(v) < drainingEnd || binary.LittleEndian.Uint32(v[drainingAt:]) != 0 {
		return false, err
	}
	binary.LittleEndian.PutUint32(v[drainingAt:], 1)
	// and nothing entered any more, as drain writes it: Remove cannot always detach it
	// (removeUnreached)
	binary.LittleEndian.PutUint32(v[enabledAt:], 0)
	if err := cfg.Put(uint32(0), v); err != nil {
		return false, fmt.Errorf("drain the sockmap set of sk_msg program %d: %w", id, err)
	}
	return true, nil
}

// Remove drains every hostaccel sockmap program set of the cgroup (see drain): new
// connections and every message from now on take TCP at once. It waits up to Drain for the
// sockets already in the maps to close, then removes the pins of the empty maps; maps that
// still hold sockets stay pinned (Status: Draining) until a later Remove or Apply finds them
// empty.
func (m *Manager) Remove(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	applied := m.last != nil
	m.last = nil
	cg, err := m.cgroup()
	if err != nil {
		return m.removeUnreached(ctx, err, applied)
	}
	o, err := observe(cg)
	defer o.Close()
	if err != nil {
		return err
	}
	// Draining needs no pin: it goes first, so that a missing BPF filesystem (cleanup run
	// where the agent's pins are not visible) still detaches the programs.
	var errs []error
	for _, s := range o.sets {
		errs = append(errs, drain(o, s))
	}
	pins, err := m.pins()
	if err != nil {
		if len(o.sets) == 0 {
			return nil // no BPF filesystem: nothing of ours was pinned
		}
		return errors.Join(append(errs, err)...)
	}
	errs = append(errs, removeReaders(pins, nil))
	return errors.Join(append(errs, m.sweepAll(ctx, pins))...)
}

// sweepAll waits up to Drain for the sockets in the pinned maps to close, removing the pins of
// the empty ones.
func (m *Manager) sweepAll(ctx context.Context, pins string) error {
	deadline := time.Now().Add(m.Drain)
	for {
		held, err := sweep(pins, nil)
		if err != nil || held == 0 || time.Now().After(deadline) || ctx.Err() != nil {
			return err
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// removeUnreached is Remove where the cgroup cannot be reached (no cgroup2 root mounted where
// this process sees, or only a container's own): our sock_ops programs on it can be neither
// listed nor detached. With no pin of ours in sight and no set applied by this Manager that is
// no error (every apply without sockmap removes it, in a Pod of a deployment that never ran
// sockmap too). Otherwise the pinned sets are drained through their sockhash's sk_msg program
// (drainOrphan: nothing is entered any more, every message takes TCP; Linux >= 6.0 says which
// program that is), their read counters detached and the pins of empty maps removed, and the
// error says that their sock_ops programs may still be attached. Before, Remove returned nil
// at once, and a switch away from sockmap left the set working.
func (m *Manager) removeUnreached(ctx context.Context, cgErr error, applied bool) error {
	pins, err := m.pins()
	if err != nil {
		if !applied {
			return nil
		}
		return fmt.Errorf("sockmap: the program set this process attached may still be attached: could not reach the cgroup (%w), nor its pins (%v)", cgErr, err)
	}
	socks, err := filepath.Glob(filepath.Join(pins, "sockmap-*"))
	if err != nil {
		return err
	}
	readers, _ := filepath.Glob(filepath.Join(pins, "reader-*"))
	if !applied && len(socks)+len(readers) == 0 {
		return nil
	}
	var errs []error
	drained := 0
	for _, f := range socks {
		mp, err := ebpf.LoadPinnedMap(f, nil)
		if err != nil {
			errs = append(errs, fmt.Errorf("pinned sockhash %s: %w", f, err))
			continue
		}
		now, err := drainOrphanNow(mp)
		if now {
			drained++
		}
		errs = append(errs, err)
		mp.Close()
	}
	errs = append(errs, removeReaders(pins, nil), m.sweepAll(ctx, pins))
	if !applied && drained == 0 {
		// Sets drained by an earlier Remove, whose maps still hold sockets: they move nothing
		// new (Status: Draining). Said once, when they were drained: every sync removes the
		// datapath it does not run, and each failed on them while old sockets lived.
		return errors.Join(errs...)
	}
	return errors.Join(append([]error{fmt.Errorf("sockmap: could not reach the cgroup to detach our sock_ops programs (%w): the %d program set(s) pinned in %s were drained through their pins (where the kernel names their sk_msg program: Linux >= 6.0), but their sock_ops programs may still be attached (run remove where the host's cgroup2 root is mounted)", cgErr, len(socks), pins)}, errs...)...)
}
