package tc

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"sync"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/cilium/ebpf/rlimit"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/hostaccel/hostaccel/internal/model"
)

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

// Manager owns the tc datapath in the calling thread's network namespace: one program set
// (program and maps) shared by every device. It keeps no state between calls: every method
// rediscovers the program set from the kernel (the attachments, then the program's maps), so
// a later process (hostaccel status, cleanup) sees what an earlier apply installed.
type Manager struct {
	// Mode forces the attach mode; empty picks tcx where the kernel has it, else cls_bpf.
	Mode Mode
}

// NewManager returns a Manager that picks the attach mode itself.
func NewManager() *Manager { return &Manager{} }

// Result says what one Apply did.
type Result struct {
	Mode            Mode           `json:"mode"`
	ProgramID       ebpf.ProgramID `json:"programID,omitempty"`
	Loaded          bool           `json:"loaded"`             // a new program set was loaded
	Attached        []string       `json:"attached,omitempty"` // devices (re)attached
	Detached        []string       `json:"detached,omitempty"` // devices no longer desired
	Missing         []string       `json:"missing,omitempty"`  // desired devices not present
	ElementsAdded   int            `json:"elementsAdded"`
	ElementsUpdated int            `json:"elementsUpdated"`
	ElementsRemoved int            `json:"elementsRemoved"`
}

// Device is a device the program is attached to.
type Device struct {
	Name  string `json:"name"`
	Index int    `json:"index"`
	Role  Role   `json:"role"` // 0: attached but not in the program's devices
	Mode  Mode   `json:"mode"`
}

// Counter counts packets and bytes (layer 2 lengths, as the device saw them).
type Counter struct {
	Packets uint64 `json:"packets"`
	Bytes   uint64 `json:"bytes"`
}

// ClassCounter counts the packets of one class and family that were redirected.
type ClassCounter struct {
	Class  model.Class `json:"class"`
	Family string      `json:"family"` // "ipv4", "ipv6"
	Counter
}

// Passed counters: why packets of an enabled class took the normal path, and how many
// were redirected along the agent's route because the FIB refused (forwarding disabled).
const (
	PassExcluded     = "excluded"
	PassTTL          = "ttl-expired"
	PassNoNeigh      = "no-neigh"
	PassFragNeeded   = "frag-needed"
	PassNoRoute      = "no-route"
	RoutedForwardOff = "forwarding-off"
)

// passNames follow the class counters in the stats map (enum stat in bpf/fastpath.c).
var passNames = []string{PassExcluded, PassTTL, PassNoNeigh, PassFragNeeded, PassNoRoute, RoutedForwardOff}

// Status is the datapath as the kernel has it.
type Status struct {
	Mode      Mode               `json:"mode,omitempty"` // empty: not attached anywhere
	ProgramID ebpf.ProgramID     `json:"programID,omitempty"`
	Devices   []Device           `json:"devices"`
	Classes   []ClassCounter     `json:"classes"`
	Passed    map[string]Counter `json:"passed"`
}

// Class sums the counters of class c over both families.
func (s Status) Class(c model.Class) Counter {
	var sum Counter
	for _, cc := range s.Classes {
		if cc.Class == c {
			sum.Packets += cc.Packets
			sum.Bytes += cc.Bytes
		}
	}
	return sum
}

// Apply makes the kernel match d: it loads the program set unless one of this build is
// attached, fills its maps before attaching it anywhere, attaches it to every desired device
// present where it is missing or the device was replaced, detaches it from devices no longer
// desired and updates map elements one by one. Updates narrow before they widen: classes
// that go away are disabled first and enabled last, exclusions are added first and removed
// last, so no packet sees a policy wider than both the old and the new one. Desired devices
// that do not exist are skipped and reported.
func (m *Manager) Apply(ctx context.Context, d *Desired) (Result, error) {
	if err := ctx.Err(); err != nil {
		return Result{}, err
	}
	if d == nil {
		return Result{}, errors.New("tc: no desired state")
	}
	mode, err := m.mode()
	res := Result{Mode: mode}
	if err != nil {
		return res, err
	}
	o, err := observe()
	defer o.Close()
	if err != nil {
		return res, err
	}
	routes, err := mainRoutes()
	if err != nil {
		return res, err
	}
	links := map[string]uint32{}
	for name, l := range o.links {
		links[name] = uint32(l.Attrs().Index)
	}
	flags := o.flags()
	w, missing := want(d, links, routes, flags)
	res.Missing = missing
	if len(w.ifaces) == 0 {
		res.Detached, err = o.detach(o.atts, nil)
		return res, err
	}

	set := o.current()
	fresh := set == nil
	if fresh {
		if set, err = loadSet(); err != nil {
			return res, err
		}
		defer set.Close() // the attachments hold it from now on
		res.Loaded = true
	}
	res.ProgramID = set.id
	cur, err := set.read()
	if err != nil {
		return res, err
	}
	if mode == ModeClsBPF {
		for idx, e := range w.ifaces {
			created, err := ensureClsact(int(idx))
			if err != nil {
				return res, err
			}
			if created {
				e.Flags |= flagOwnClsact
				w.ifaces[idx] = e
			}
		}
	}

	// Narrow, then widen. A fresh set is not attached yet: it gets everything at once.
	first := cur.classes & w.classes
	if fresh {
		first = w.classes
	}
	if err := set.setClasses(first); err != nil {
		return res, err
	}
	var excludeDel = map[string][]netip.Prefix{}
	for name := range w.prefixes {
		put, del := diff(cur.prefixes[name], w.prefixes[name])
		if name == "exclude4" || name == "exclude6" {
			excludeDel[name] = del
		} else if err := set.delete(name, del, &res); err != nil {
			return res, err
		}
		if err := set.put(name, cur.prefixes[name], put, &res); err != nil {
			return res, err
		}
	}
	ifPut, ifDel := diff(cur.ifaces, w.ifaces)
	for idx, e := range ifPut {
		if err := set.maps["ifaces"].Put(idx, e); err != nil {
			return res, fmt.Errorf("ifaces: %w", err)
		}
		countPut(&res, cur.ifaces, idx)
	}

	// Attach where missing (a device that failed does not stop the others), then take our
	// other attachments off: older programs, the other mode, devices no longer desired.
	var stale []attachment
	var errs []error
	for _, name := range sortedNames(o.links) {
		l := o.links[name]
		_, wanted := w.ifaces[uint32(l.Attrs().Index)]
		mine := o.on(l.Attrs().Index)
		if !wanted {
			stale = append(stale, mine...)
			continue
		}
		var keep attachment
		if i := slices.IndexFunc(mine, func(a attachment) bool { return a.mode == mode && a.prog == set.id }); i >= 0 {
			keep = mine[i]
		} else if keep, err = attach(mode, l, set, mine, o.sets); gone(err) {
			res.Missing = append(res.Missing, name)
			continue
		} else if err != nil {
			errs = append(errs, err)
			continue
		} else {
			res.Attached = append(res.Attached, name)
		}
		for _, a := range mine {
			if a != keep {
				stale = append(stale, a)
			}
		}
	}
	detached, err := o.detach(stale, set)
	for _, n := range detached {
		if _, wanted := d.Devices[n]; !wanted && !slices.Contains(res.Detached, n) {
			res.Detached = append(res.Detached, n)
		}
	}
	errs = append(errs, err)

	errs = append(errs, set.delete("ifaces", ifDel, &res))
	for name, del := range excludeDel {
		errs = append(errs, set.delete(name, del, &res))
	}
	errs = append(errs, set.setClasses(w.classes))
	slices.Sort(res.Missing)
	return res, errors.Join(errs...)
}

// Remove detaches the program from every device of this network namespace, deletes the
// clsact qdiscs hostaccel created (when nothing else is on them) and so releases the program
// and its maps: nothing else holds them.
func (m *Manager) Remove(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	o, err := observe()
	defer o.Close()
	if err != nil {
		return err
	}
	_, err = o.detach(o.atts, nil)
	return err
}

// Status reads the attachments and the counters of the program set.
func (m *Manager) Status(ctx context.Context) (Status, error) {
	st := Status{Devices: []Device{}, Classes: []ClassCounter{}, Passed: map[string]Counter{}}
	if err := ctx.Err(); err != nil {
		return st, err
	}
	o, err := observe()
	defer o.Close()
	if err != nil {
		return st, err
	}
	set := o.current()
	for _, a := range o.atts {
		if set == nil {
			set = o.sets[a.prog]
		}
		var role Role
		if s := o.sets[a.prog]; s != nil {
			var e fastpathIface
			if s.maps["ifaces"].Lookup(uint32(a.link.Attrs().Index), &e) == nil {
				role = Role(e.Role)
			}
		}
		st.Devices = append(st.Devices, Device{Name: a.link.Attrs().Name, Index: a.link.Attrs().Index, Role: role, Mode: a.mode})
		if a.prog == set.id && st.Mode == "" {
			st.Mode = a.mode
		}
	}
	slices.SortFunc(st.Devices, func(a, b Device) int { return cmp.Or(cmp.Compare(a.Name, b.Name), cmp.Compare(a.Mode, b.Mode)) })
	if set == nil {
		return st, nil
	}
	st.ProgramID = set.id
	stats := set.maps["stats"]
	read := func(i int) (Counter, error) {
		var per []fastpathCounter
		var c Counter
		if err := stats.Lookup(uint32(i), &per); err != nil {
			return c, fmt.Errorf("stats[%d]: %w", i, err)
		}
		for _, p := range per {
			c.Packets += p.Packets
			c.Bytes += p.Bytes
		}
		return c, nil
	}
	for i, c := range Supported {
		for f, fam := range []string{"ipv4", "ipv6"} {
			n, err := read(i*2 + f) // class*2 + family, as in bpf/fastpath.c
			if err != nil {
				return st, err
			}
			st.Classes = append(st.Classes, ClassCounter{Class: c, Family: fam, Counter: n})
		}
	}
	for i, name := range passNames {
		n, err := read(len(Supported)*2 + i)
		if err != nil {
			return st, err
		}
		st.Passed[name] = n
	}
	return st, nil
}

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

// haveTCX asks the kernel for the tcx programs of the loopback device (ifindex 1 in every
// network namespace): kernels without tcx reject the attach type.
func haveTCX() bool {
	_, err := link.QueryPrograms(link.QueryOptions{Target: 1, Attach: ebpf.AttachTCXIngress})
	return err == nil
}

// progSet is a loaded program with its maps, by name.
type progSet struct {
	prog  *ebpf.Program
	id    ebpf.ProgramID
	maps  map[string]*ebpf.Map
	build uint64
}

// removeMemlock lifts RLIMIT_MEMLOCK for kernels before 5.11 (best effort).
var removeMemlock = sync.OnceFunc(func() { _ = rlimit.RemoveMemlock() })

func loadSet() (*progSet, error) {
	removeMemlock()
	spec, err := loadFastpath()
	if err != nil {
		return nil, err
	}
	coll, err := ebpf.NewCollection(spec)
	if err != nil {
		return nil, fmt.Errorf("loading the tc program: %w", err)
	}
	s := &progSet{prog: coll.Programs[progName], maps: coll.Maps, build: build}
	if info, err := s.prog.Info(); err == nil {
		s.id, _ = info.ID()
	}
	return s, nil
}

// openSet opens a program by ID and, if it is hostaccel's, its maps; nil if it is not ours.
func openSet(id ebpf.ProgramID) (*progSet, error) {
	prog, err := ebpf.NewProgramFromID(id)
	if errors.Is(err, unix.ENOENT) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("program %d: %w", id, err)
	}
	info, err := prog.Info()
	if err != nil || info.Name != progName {
		prog.Close()
		return nil, err
	}
	s := &progSet{prog: prog, id: id, maps: map[string]*ebpf.Map{}}
	ids, _ := info.MapIDs()
	for _, mid := range ids {
		mp, err := ebpf.NewMapFromID(mid)
		if err != nil {
			s.Close()
			return nil, fmt.Errorf("map %d of program %d: %w", mid, id, err)
		}
		mi, err := mp.Info()
		if err != nil {
			mp.Close()
			s.Close()
			return nil, err
		}
		s.maps[mi.Name] = mp
	}
	var cfg fastpathSettings
	if c := s.maps["config"]; c != nil && c.Lookup(uint32(0), &cfg) == nil {
		s.build = cfg.Build
	}
	return s, nil
}

func (s *progSet) Close() {
	if s == nil {
		return
	}
	s.prog.Close()
	for _, m := range s.maps {
		m.Close()
	}
}

// read returns what the maps hold.
func (s *progSet) read() (contents, error) {
	c := contents{ifaces: map[uint32]fastpathIface{}, prefixes: map[string]map[netip.Prefix]uint32{}}
	var idx uint32
	var e fastpathIface
	it := s.maps["ifaces"].Iterate()
	for it.Next(&idx, &e) {
		c.ifaces[idx] = e
	}
	if err := it.Err(); err != nil {
		return c, fmt.Errorf("ifaces: %w", err)
	}
	for _, ps := range prefixSets {
		for _, fam := range []string{"4", "6"} {
			name := ps.name + fam
			got := map[netip.Prefix]uint32{}
			var v uint32
			var err error
			if fam == "4" {
				var k fastpathLpm4
				it := s.maps[name].Iterate()
				for it.Next(&k, &v) {
					got[netip.PrefixFrom(netip.AddrFrom4(k.Addr), int(k.Prefixlen))] = v
				}
				err = it.Err()
			} else {
				var k fastpathLpm6
				it := s.maps[name].Iterate()
				for it.Next(&k, &v) {
					got[netip.PrefixFrom(netip.AddrFrom16(k.Addr), int(k.Prefixlen))] = v
				}
				err = it.Err()
			}
			if err != nil {
				return c, fmt.Errorf("%s: %w", name, err)
			}
			c.prefixes[name] = got
		}
	}
	var cfg fastpathSettings
	if err := s.maps["config"].Lookup(uint32(0), &cfg); err != nil {
		return c, fmt.Errorf("config: %w", err)
	}
	c.classes = cfg.Classes
	return c, nil
}

func (s *progSet) setClasses(bits uint32) error {
	if err := s.maps["config"].Put(uint32(0), fastpathSettings{Classes: bits, Build: build}); err != nil {
		return fmt.Errorf("config: %w", err)
	}
	return nil
}

func (s *progSet) put(name string, cur, put map[netip.Prefix]uint32, res *Result) error {
	for p, v := range put {
		if err := s.maps[name].Put(lpmKey(p), v); err != nil {
			return fmt.Errorf("%s: add %s: %w", name, p, err)
		}
		countPut(res, cur, p)
	}
	return nil
}

// delete removes keys (prefixes, or ifindexes for ifaces) from map name.
func (s *progSet) delete(name string, keys any, res *Result) error {
	var err error
	switch ks := keys.(type) {
	case []netip.Prefix:
		for _, p := range ks {
			err = errors.Join(err, s.maps[name].Delete(lpmKey(p)))
			res.ElementsRemoved++
		}
	case []uint32:
		for _, k := range ks {
			err = errors.Join(err, s.maps[name].Delete(k))
			res.ElementsRemoved++
		}
	}
	if err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		return fmt.Errorf("%s: %w", name, err)
	}
	return nil
}

func countPut[K comparable, V any](res *Result, cur map[K]V, k K) {
	if _, ok := cur[k]; ok {
		res.ElementsUpdated++
	} else {
		res.ElementsAdded++
	}
}

// attachment is the program of one of our program sets attached to a device.
type attachment struct {
	mode   Mode
	link   netlink.Link
	prog   ebpf.ProgramID
	filter *netlink.BpfFilter // ModeClsBPF
}

// observed is what the kernel has: the links of the namespace, our attachments on them and
// the program sets they run.
type observed struct {
	links map[string]netlink.Link
	atts  []attachment
	sets  map[ebpf.ProgramID]*progSet // nil values: programs that are not ours
}

func observe() (*observed, error) {
	o := &observed{links: map[string]netlink.Link{}, sets: map[ebpf.ProgramID]*progSet{}}
	links, err := netlink.LinkList()
	if err != nil {
		return o, fmt.Errorf("listing links: %w", err)
	}
	tcx := haveTCX()
	for _, l := range links {
		o.links[l.Attrs().Name] = l
		if tcx {
			q, err := link.QueryPrograms(link.QueryOptions{Target: l.Attrs().Index, Attach: ebpf.AttachTCXIngress})
			if err != nil && !gone(err) {
				return o, fmt.Errorf("%s: tcx programs: %w", l.Attrs().Name, err)
			}
			for _, p := range programs(q) {
				if _, isLink := p.LinkID(); isLink {
					continue // we never attach with links
				}
				if ours, err := o.open(p.ID); err != nil {
					return o, err
				} else if ours {
					o.atts = append(o.atts, attachment{mode: ModeTCX, link: l, prog: p.ID})
				}
			}
		}
		fs, err := ourFilters(l)
		if err != nil {
			return o, err
		}
		for _, f := range fs {
			if ours, err := o.open(ebpf.ProgramID(f.Id)); err != nil {
				return o, err
			} else if ours {
				o.atts = append(o.atts, attachment{mode: ModeClsBPF, link: l, prog: ebpf.ProgramID(f.Id), filter: f})
			}
		}
	}
	return o, nil
}

func programs(q *link.QueryResult) []link.AttachedProgram {
	if q == nil {
		return nil
	}
	return q.Programs
}

func (o *observed) open(id ebpf.ProgramID) (bool, error) {
	s, ok := o.sets[id]
	if !ok {
		var err error
		if s, err = openSet(id); err != nil {
			return false, err
		}
		o.sets[id] = s
	}
	return s != nil, nil
}

func (o *observed) Close() {
	for _, s := range o.sets {
		s.Close()
	}
}

// current returns an attached program set of this build, or nil.
func (o *observed) current() *progSet {
	for _, a := range o.atts {
		if s := o.sets[a.prog]; s != nil && s.build == build {
			return s
		}
	}
	return nil
}

// on returns our attachments on device ifindex.
func (o *observed) on(ifindex int) []attachment {
	var out []attachment
	for _, a := range o.atts {
		if a.link.Attrs().Index == ifindex {
			out = append(out, a)
		}
	}
	return out
}

// flags returns the ifaces flags every attached set holds, by ifindex.
func (o *observed) flags() map[uint32]uint32 {
	f := map[uint32]uint32{}
	for _, s := range o.sets {
		if s == nil {
			continue
		}
		var idx uint32
		var e fastpathIface
		for it := s.maps["ifaces"].Iterate(); it.Next(&idx, &e); {
			f[idx] |= e.Flags
		}
	}
	return f
}

// detach takes the attachments off their devices and deletes the clsact qdiscs we created
// that are left empty (clearing the flag in keep's ifaces map). It returns the devices it
// detached from.
func (o *observed) detach(atts []attachment, keep *progSet) ([]string, error) {
	flags := o.flags()
	var names []string
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
			m := keep.maps["ifaces"]
			if m.Lookup(uint32(idx), &e) == nil {
				e.Flags &^= flagOwnClsact
				errs = append(errs, m.Put(uint32(idx), e))
			}
		}
	}
	return names, errors.Join(errs...)
}

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

// mainRoutes lists the main table's routes of both families.
func mainRoutes() ([]route, error) {
	var out []route
	for _, fam := range []int{netlink.FAMILY_V4, netlink.FAMILY_V6} {
		rs, err := netlink.RouteListFiltered(fam, &netlink.Route{Table: unix.RT_TABLE_MAIN}, netlink.RT_FILTER_TABLE)
		if err != nil {
			return nil, fmt.Errorf("listing routes: %w", err)
		}
		for _, r := range rs {
			out = append(out, route{dst: prefixOf(r.Dst, fam), ifindex: routeDevice(r)})
		}
	}
	return out, nil
}

// routeDevice is the single device a unicast route leaves through, or 0.
func routeDevice(r netlink.Route) uint32 {
	if r.Type != unix.RTN_UNICAST {
		return 0
	}
	if len(r.MultiPath) == 0 {
		return uint32(r.LinkIndex)
	}
	idx := r.MultiPath[0].LinkIndex
	for _, nh := range r.MultiPath {
		if nh.LinkIndex != idx {
			return 0
		}
	}
	return uint32(idx)
}

func prefixOf(n *net.IPNet, fam int) netip.Prefix {
	if n == nil {
		if fam == netlink.FAMILY_V4 {
			return netip.PrefixFrom(netip.IPv4Unspecified(), 0)
		}
		return netip.PrefixFrom(netip.IPv6Unspecified(), 0)
	}
	a, _ := netip.AddrFromSlice(n.IP)
	if fam == netlink.FAMILY_V4 {
		a = a.Unmap()
	}
	bits, _ := n.Mask.Size()
	return netip.PrefixFrom(a, bits)
}

func sortedNames(links map[string]netlink.Link) []string {
	names := make([]string, 0, len(links))
	for n := range links {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}
