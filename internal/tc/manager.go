package tc

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"runtime"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/cilium/ebpf"
	"github.com/vishvananda/netns"

	"github.com/hostaccel/hostaccel/internal/conntrack"
	"github.com/hostaccel/hostaccel/internal/probe"
)

// Manager owns the tc datapath in the calling thread's network namespace: one program set
// (program and maps) shared by every device. Every method rediscovers the program set from
// the kernel (the attachments, then the program's maps), so a later process (hostaccel
// status, cleanup) sees what an earlier apply installed. The only things a Manager remembers
// are what its last apply left, to tell drift (someone else's change) from its own, and when
// it last aged the handed marks.
type Manager struct {
	// Mode forces the attach mode; empty picks tcx where the kernel has it, else cls_bpf.
	Mode Mode
	// FullEvery is how often Apply reads the program's maps back whole (drift repair: an
	// entry changed behind the agent's back is found and rewritten); in between, an Apply
	// diffs against what the last one wrote. 0: every Apply reads them (a one-shot apply,
	// which knows nothing before). The agent sets it below its resync period, as the load
	// balancer's: at 10,000 peer CIDRs the reading is ~10 ms of a sync's ~55 ms of CPU.
	FullEvery time.Duration

	last     *applied         // after the last successful Apply; nil: none since New or Remove
	routes   *routeWatch      // WatchRoutes: the routes kept between Applies; nil: listed every time
	pre      chan *kernelView // Prefetch: the next Apply's reading of the kernel, under way
	fullRead time.Time        // the last whole reading of the maps
	mtu6     map[string]mtu6  // the devices' IPv6 MTUs, read again with the maps whole
	aged     time.Time        // the last aging of the handed marks (ageHanded)

	prepMu   sync.Mutex
	prepared map[uint32]time.Time // Prepare: the clsact qdiscs it added, not yet adopted by an Apply
	removed  bool                 // Remove ran, and no Apply since: Prepare adds nothing
	// clean: the last Remove left nothing of ours attached, and no Apply ran since: the next
	// Remove has nothing to do. An agent whose plan has no tc removes it at every sync, and
	// the reading of every link's programs and filters was ~10 ms of each at 200 links.
	clean bool
}

// removeObserve reads the kernel for Remove (tests count its readings).
var removeObserve = observe

// applied is the kernel as an Apply left it: the devices the program was attached to (name ->
// ifindex) and what its maps held.
type applied struct {
	attached map[string]int
	maps     contents
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
	// NATCheck is false where the kernel lacks the conntrack kfuncs: NAT-ed flows are then
	// not recognised (probe: bpf_skb_ct_lookup).
	NATCheck bool `json:"natCheck"`
	// Drift says what someone else changed since this Manager's last apply and this one
	// repaired: the program detached from a device (the same device, not one re-created), map
	// contents changed. Set only when the apply succeeded.
	Drift []string `json:"drift,omitempty"`
	// HandedAged: the marks of client ends handed to the stack were aged (their share had
	// grown past 1/16): those of NAT-ed connections gone since are void.
	HandedAged bool `json:"handedAged,omitempty"`
	// FullRead: the maps were read back whole (every Apply unless FullEvery says otherwise);
	// only such an Apply finds map entries changed behind its back.
	FullRead bool `json:"fullRead,omitempty"`
}

// readResult is what progSet.read returned.
type readResult struct {
	c   contents
	err error
}

// haveConntrackKfuncs reports whether the kernel has the conntrack kfuncs (probe keeps a yes).
func haveConntrackKfuncs() bool { return probe.HaveConntrackKfuncs() == nil }

// kernelView is what an Apply reads of the kernel before it works anything out: our
// attachments and program sets, the namespace's devices, addresses and routes, and the
// attached set's maps when they are read whole (on another goroutine, while the routes are
// listed and the desired contents worked out: at 10,000 peer CIDRs each ~10 ms, one after
// the other before, issue 13; the reading waits for nothing an Apply writes).
type kernelView struct {
	o       *observed
	ct      bool     // the set to run is the build that calls conntrack's kfuncs
	set     *progSet // the attached set of that build; nil: Apply loads a fresh one
	full    bool     // the maps are to be read whole
	reading chan readResult
	n       netState
	err     error
}

// look reads the kernel for an Apply.
func (m *Manager) look() *kernelView {
	v := &kernelView{}
	if v.o, v.err = observe(); v.err != nil {
		return v
	}
	// An attached set of the build that calls conntrack's kfuncs answers the probe (whose yes
	// is otherwise read from its cache file, or the kernel's BTF): its program holds
	// nf_conntrack's module, so the kfuncs are still there.
	v.ct = v.o.current(buildID(true)) != nil || haveConntrackKfuncs()
	v.set = v.o.current(buildID(v.ct))
	v.full = m.last == nil || v.set == nil || m.FullEvery <= 0 || time.Since(m.fullRead) >= m.FullEvery
	if v.full && v.set != nil {
		v.reading = make(chan readResult, 1)
		go func(set *progSet) {
			c, err := set.read()
			v.reading <- readResult{c, err}
		}(v.set)
	}
	v.n, v.err = v.o.netState(func() ([]route, bool, error) {
		if m.routes == nil {
			return mainRoutes()
		}
		return m.routes.list(v.full) // listed again with the maps read whole
	})
	v.n.ipv6MTU = m.ipv6MTUs(v.full)
	return v
}

// mtu6 is a device's IPv6 MTU as readIPv6MTU read it.
type mtu6 struct {
	mtu uint32
	ok  bool
}

// ipv6MTUs reads the devices' IPv6 MTUs for want, each once until the maps are read whole
// (fresh): the kernel announces no change of them, and a file read per device per sync was
// ~16 us each, 8 ms a sync at 500 Pods' veths.
func (m *Manager) ipv6MTUs(fresh bool) func(string) (uint32, bool) {
	if fresh || m.mtu6 == nil {
		m.mtu6 = map[string]mtu6{}
	}
	kept := m.mtu6
	return func(dev string) (uint32, bool) {
		e, ok := kept[dev]
		if !ok {
			e.mtu, e.ok = readIPv6MTU(dev)
			kept[dev] = e
		}
		return e.mtu, e.ok
	}
}

// maps waits for the reading of the maps; zero contents when none was started.
func (v *kernelView) maps() (contents, error) {
	if v.reading == nil {
		return contents{}, nil
	}
	r := <-v.reading
	v.reading = nil
	return r.c, r.err
}

// close waits for the reading of the maps, then closes the program sets it read.
func (v *kernelView) close() {
	_, _ = v.maps()
	v.o.Close()
}

// Prefetch starts the next Apply's reading of the kernel (attachments, devices, routes, the
// maps) on another goroutine. A one-shot `apply` calls it before it parses its config and
// waits for the kernel's probe, so that they overlap: at 10,000 peer CIDRs the reading is
// ~15 ms of system calls, the parse ~6 ms (issue 13). The caller holds the node's lock
// already and calls Apply or Remove next, and nothing else of this Manager in between; what
// the kernel's routes or devices do in between is what any Apply misses until the next one.
// The reading is of the calling thread's network namespace, which the goroutine's thread
// enters (it may be in another: a caller's thread moved into a namespace, as tests do), and
// that thread ends with the goroutine.
func (m *Manager) Prefetch() {
	ns, err := netns.Get()
	if err != nil {
		return // Apply reads for itself
	}
	ch := make(chan *kernelView, 1)
	go func() {
		defer ns.Close()
		runtime.LockOSThread() // never unlocked: the thread ends with the goroutine
		if netns.Set(ns) != nil {
			ch <- nil // Apply reads for itself
			return
		}
		ch <- m.look()
	}()
	m.pre = ch
}

// takePrefetched returns what Prefetch read, nil when nothing was prefetched.
func (m *Manager) takePrefetched() *kernelView {
	if m.pre == nil {
		return nil
	}
	v := <-m.pre
	m.pre = nil
	return v
}

// Apply makes the kernel match d: it loads the program set unless one of this build is
// attached, fills its maps before attaching it anywhere, attaches it to every desired device
// present where it is missing or the device was replaced, detaches it from devices no longer
// desired and updates map elements one by one. Updates narrow before they widen: classes
// that go away are disabled first and enabled last, roles are taken away before they are
// given, exclusions are added first and removed last, so no packet sees a policy wider than
// both the old and the new one. Desired devices that do not exist are skipped and reported.
func (m *Manager) Apply(ctx context.Context, d *Desired) (Result, error) {
	v := m.takePrefetched() // nil unless Prefetch
	defer func() {
		if v != nil {
			v.close()
		}
	}()
	if err := ctx.Err(); err != nil {
		return Result{}, err
	}
	if d == nil {
		return Result{}, errors.New("tc: no desired state")
	}
	m.clean = false
	mode, err := m.mode()
	res := Result{Mode: mode}
	if err != nil {
		return res, err
	}
	if v == nil {
		v = m.look()
	}
	if v.err != nil {
		return res, v.err
	}
	o, ct, set, full, n := v.o, v.ct, v.set, v.full, v.n
	fresh := set == nil
	w, missing := want(d, n)
	res.Missing = missing
	if len(w.ifaces) == 0 {
		res.Detached, _, err = o.detach(o.atts, nil)
		m.last = nil
		return res, err
	}
	drift := m.detachedBehindUs(o, w)
	res.NATCheck = ct && w.settings.NatCheck != 0
	if fresh {
		if set, err = loadSet(ct); err != nil {
			return res, err
		}
		defer set.Close() // the attachments hold it from now on
		res.Loaded = true
	}
	res.ProgramID = set.id
	if fresh && res.NATCheck {
		if err := set.rememberOpen(ctx); err != nil {
			return res, fmt.Errorf("tc: the NAT-ed connections already open: %w", err)
		}
	}
	var cur contents
	if !full {
		cur = m.last.maps // written by the last Apply without error, and only Apply writes them
	} else {
		if fresh {
			cur, err = set.read()
		} else {
			cur, err = v.maps()
		}
		if err != nil {
			return res, err
		}
		m.fullRead, res.FullRead = time.Now(), true
		if m.last != nil && !fresh {
			drift = append(drift, mapsDrift(m.last.maps, cur)...)
		}
	}
	// Every update voids the next hops and the decisions the program kept: routes, devices or
	// neighbours may have changed (the agent updates on link events and every resync period),
	// and so may the roles. The generation is bumped three times: before narrow writes the
	// maps, after it (what a packet decided while narrow's removals and new exclusions were
	// half written is void at once, not only when widen ends, after the attachments: ~13 ms
	// per new device with tcx), and in widen, after the attachments and widen's own writes.
	var live fastpathSettings
	if set.settings.Lookup(uint32(0), &live) == nil {
		w.settings.Generation = generationAfter(live.Generation)
	}
	if live.HandedEpoch == 0 { // a fresh set
		live.HandedEpoch, live.HandedSince = handedFirstEpoch, handedFirstEpoch
	} else if res.NATCheck && time.Since(m.aged) >= handedAgeEvery {
		fill, err := set.handedFill(live.HandedSince)
		if err == nil && fill > handedAgeAt {
			m.aged = time.Now()
			err = set.ageHanded(ctx, &live, conntrack.ListNATed)
			res.HandedAged = err == nil
		}
		if err != nil {
			return res, err
		}
	}
	w.settings.HandedEpoch, w.settings.HandedSince = live.HandedEpoch, live.HandedSince
	var added []uint32
	var adopted map[uint32]time.Time
	if mode == ModeClsBPF {
		// under prepMu: a Prepare of one of these devices comes before or after, never
		// between the qdisc added and its ownership recorded
		m.prepMu.Lock()
		m.removed = false
		if added, err = ownClsacts(w.ifaces); err != nil {
			m.prepMu.Unlock()
			dropClsacts(added)
			return res, err
		}
		adopted = m.adoptPrepared(w.ifaces)
		m.prepMu.Unlock()
	}
	// While the set is attached to devices that lack it (a fresh set, a new device: a new
	// Pod's veth), packets of one connection may pass programs of different sets, or none (a
	// Pod's connections opened before its device joined): every mark counts (handed_since 0)
	// in this set and in the older ones until conntrack has been listed after the attachments,
	// so that every reply toward the Pods asks conntrack meanwhile. The listing (of the NAT-ed
	// entries only, which the kernel picks: conntrack.ListNATed) costs two walks of conntrack
	// per Apply that attaches a device; an Apply that attaches none lists nothing.
	window := res.NATCheck && (fresh || needsAttach(o, set, mode, w))
	since := w.settings.HandedSince
	if window {
		w.settings.HandedSince = 0
		for id, s := range o.sets {
			var c fastpathSettings
			if id != set.id && s.usable() && s.settings.Lookup(uint32(0), &c) == nil {
				c.HandedSince = 0
				_ = s.settings.Put(uint32(0), c)
			}
		}
	}
	if err := m.narrow(set, cur, w, fresh, &res); err != nil {
		m.fullRead, m.last = time.Time{}, nil // half written: the next Apply reads the maps whole, afresh
		dropClsacts(added)                    // their ownership may not be in the map: the next Apply adds them again
		m.unadopt(adopted)                    // nor may theirs: the next Apply adopts them again
		return res, err
	}
	cleared, err := m.attachAll(o, set, mode, w, d, &res)
	errs := []error{err}
	if window {
		time.Sleep(handedSettle)
		flows, err := conntrack.ListNATed(ctx)
		if err == nil {
			err = set.rememberNATed(flows, w.settings.HandedEpoch)
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("tc: the NAT-ed connections opened while the program was attached: %w", err))
		} else {
			w.settings.HandedSince = since // widen writes it
		}
	}
	errs = append(errs, m.widen(set, cur, w, &res))
	if !fresh {
		// the pairs kept before are void now (widen wrote the new generation): their
		// filter bits go, so that packets without a pair skip that lookup again
		errs = append(errs, set.clearPairBits())
	}
	slices.Sort(res.Missing)
	if err := errors.Join(errs...); err != nil {
		// The next apply reads the maps whole and starts afresh: compared with the last
		// apply's, what this one wrote was reported as someone else's change (drift).
		m.fullRead, m.last = time.Time{}, nil
		return res, err
	}
	// The maps now hold w: every difference was written without error (only Apply writes
	// these maps), so they are not read back.
	after := w
	after.settings = policy(after.settings)
	for _, idx := range cleared { // detach deleted the qdiscs: the map no longer says ours
		if e, ok := after.ifaces[idx]; ok {
			e.Flags &^= flagOwnClsact
			after.ifaces[idx] = e
		}
	}
	m.last = &applied{attached: map[string]int{}, maps: after}
	for name, l := range o.links {
		if _, ok := w.ifaces[uint32(l.Attrs().Index)]; ok && !slices.Contains(res.Missing, name) {
			m.last.attached[name] = l.Attrs().Index
		}
	}
	res.Drift = drift
	return res, nil
}

// detachedBehindUs lists the desired devices this Manager's last apply attached the program
// to and that lost it since, although they are the same devices (a device deleted and
// re-created has another ifindex: it lost the program with itself, which is no drift).
func (m *Manager) detachedBehindUs(o *observed, w contents) []string {
	if m.last == nil {
		return nil
	}
	var out []string
	for _, name := range sortedNames(o.links) {
		idx := o.links[name].Attrs().Index
		_, wanted := w.ifaces[uint32(idx)]
		if was, ok := m.last.attached[name]; ok && was == idx && wanted && len(o.on(idx)) == 0 {
			out = append(out, "program detached from "+name)
		}
	}
	return out
}

// mapsDrift says how the maps changed between was (as the last apply left them) and now:
// only Apply writes them (the program writes other maps), so any difference is someone
// else's.
func mapsDrift(was, now contents) []string {
	var out []string
	say := func(name string, changed, added int) {
		if changed+added > 0 {
			out = append(out, fmt.Sprintf("map %s: %d entries removed or changed, %d added", name, changed, added))
		}
	}
	lost, extra := diff(now.ifaces, was.ifaces) // what now lacks of was, what was lacks of now
	say(fastpathMapIfaces, len(lost), len(extra))
	lostA, extraA := diff(now.addrs, was.addrs)
	say("addrs4/addrs6", len(lostA), len(extraA))
	if was.settings != now.settings {
		out = append(out, "settings changed")
	}
	return out
}

// Remove detaches the program from every device of this network namespace, deletes the
// clsact qdiscs hostaccel created (when nothing else is on them) and so releases the program
// and its maps: nothing else holds them. After a Remove that left nothing, with no Apply
// since, it reads nothing.
func (m *Manager) Remove(ctx context.Context) error {
	m.Close() // a link event handled after it (the agent stopping) adds nothing
	if err := ctx.Err(); err != nil {
		return err
	}
	if m.clean {
		return nil
	}
	o, err := removeObserve()
	defer o.Close()
	if err != nil {
		return err
	}
	m.last = nil
	_, _, err = o.detach(o.atts, nil)
	m.clean = err == nil
	return err
}

// Close ends the Manager's use without removing the datapath (a one-shot `apply` exiting,
// the agent stopping without --cleanup-on-exit): what only its memory holds goes with it. The
// clsact qdiscs it added that no Apply adopted (Prepare's, or those of devices whose attach
// failed) are deleted where nothing is on them: no later process would know they are
// hostaccel's, and `cleanup` would leave them. A Prepare after Close adds nothing.
func (m *Manager) Close() {
	if v := m.takePrefetched(); v != nil {
		v.close()
	}
	m.prepMu.Lock()
	defer m.prepMu.Unlock()
	dropClsacts(slices.Collect(maps.Keys(m.prepared)))
	m.prepared, m.removed = nil, true
}

// Prepare readies device ifindex for an attach the next Apply may make: without tcx it adds
// the device's clsact qdisc now. Linux drops what a device transmits while a qdisc is added
// (README, tc datapath); the agent calls Prepare on the link event of a new device a gateway
// pattern names (a new Pod's veth), before that device carries anything, where an Apply would
// add the qdisc at the next sync, up to agent.minSyncInterval later, when the Pod may be
// sending. The Apply that attaches there counts the qdisc as hostaccel's (cleanup deletes it);
// one that has not wanted the device within preparedFor deletes it again.
func (m *Manager) Prepare(ifindex int) error {
	if mode, err := m.mode(); err != nil || mode != ModeClsBPF {
		return err
	}
	m.prepMu.Lock() // (held while the qdisc is added: see Apply and Remove)
	defer m.prepMu.Unlock()
	if m.removed {
		return nil
	}
	created, err := ensureClsact(ifindex)
	if gone(err) { // deleted meanwhile: nothing to prepare (as ownClsacts skips it)
		return nil
	}
	if err != nil || !created {
		return err
	}
	if m.prepared == nil {
		m.prepared = map[uint32]time.Time{}
	}
	m.prepared[uint32(ifindex)] = time.Now()
	return nil
}

// preparedFor is how long a qdisc Prepare added waits for an Apply to want its device (a
// device that appeared after an Apply listed the links is wanted by the next one).
var preparedFor = 30 * time.Second

// adoptPrepared marks the devices of ifaces whose qdisc Prepare added as owning it (returned),
// and deletes the qdiscs of prepared devices that no Apply has wanted within preparedFor (if
// nothing is on them). The caller holds prepMu.
func (m *Manager) adoptPrepared(ifaces map[uint32]fastpathIface) map[uint32]time.Time {
	var adopted map[uint32]time.Time
	for idx, at := range m.prepared {
		if e, ok := ifaces[idx]; ok {
			e.Flags |= flagOwnClsact
			ifaces[idx] = e
			if adopted == nil {
				adopted = map[uint32]time.Time{}
			}
			adopted[idx] = at
			delete(m.prepared, idx)
		} else if time.Since(at) > preparedFor {
			dropClsacts([]uint32{idx})
			delete(m.prepared, idx)
		}
	}
	return adopted
}

// unadopt puts back what adoptPrepared adopted, for an Apply that failed before the ownership
// reached the map.
func (m *Manager) unadopt(adopted map[uint32]time.Time) {
	if len(adopted) == 0 {
		return
	}
	m.prepMu.Lock()
	defer m.prepMu.Unlock()
	if m.prepared == nil {
		m.prepared = map[uint32]time.Time{}
	}
	for idx, at := range adopted {
		m.prepared[idx] = at
	}
}

// ownClsacts adds a clsact qdisc where a desired device has none, and marks those devices so
// that Remove deletes the qdisc again; it returns those it added. A device gone meanwhile (a
// Pod's veth deleted) is skipped: attaching finds it missing.
func ownClsacts(ifaces map[uint32]fastpathIface) (added []uint32, err error) {
	for idx, e := range ifaces {
		created, err := ensureClsact(int(idx))
		if gone(err) {
			continue
		}
		if err != nil {
			return added, err
		}
		if created {
			e.Flags |= flagOwnClsact
			ifaces[idx] = e
			added = append(added, idx)
		}
	}
	return added, nil
}

// generationAfter is the generation an Apply leaves when it starts at live: narrow writes live+1,
// then live+2 when its maps are written; widen writes live+3.
func generationAfter(live uint32) uint32 { return live + 3 }

// narrow is the first half of an update, before any attachment changes: classes going away are
// disabled, roles going away are taken, exclusions coming are added, the new devices entered.
// A fresh set is not attached yet and gets everything at once.
func (m *Manager) narrow(set *progSet, cur, w contents, fresh bool, res *Result) error {
	first := w.settings
	first.Generation -= 2 // then one less than w's when narrow ends; widen writes w's (see Apply)
	if !fresh {
		first.Classes &= cur.settings.Classes
	}
	if err := set.setSettings(first); err != nil {
		return err
	}
	put, del := diff(cur.addrs, w.addrs)
	for _, p := range del {
		if cur.addrs[p].Flags&addrExclude == 0 {
			if err := set.deleteAddr(p); err != nil {
				return err
			}
			res.ElementsRemoved++
		}
	}
	for _, exclusions := range []bool{true, false} {
		for p, a := range put {
			if (a.Flags&addrExclude != 0) != exclusions {
				continue
			}
			if err := set.putAddr(p, a); err != nil {
				return err
			}
			countPut(res, cur.addrs, p)
		}
	}
	ifPut, _ := diff(cur.ifaces, w.ifaces)
	for idx, e := range ifPut {
		if err := set.putIface(idx, e); err != nil {
			return err
		}
		countPut(res, cur.ifaces, idx)
	}
	first.Generation++ // what was decided on the maps half written is void
	return set.setSettings(first)
}

// widen is the second half: devices no longer desired leave the ifaces map, exclusions going
// away are removed, and the classes are enabled.
func (m *Manager) widen(set *progSet, cur, w contents, res *Result) error {
	var errs []error
	_, ifDel := diff(cur.ifaces, w.ifaces)
	for _, idx := range ifDel {
		errs = append(errs, set.deleteIface(idx))
		res.ElementsRemoved++
	}
	_, del := diff(cur.addrs, w.addrs)
	for _, p := range del {
		if cur.addrs[p].Flags&addrExclude != 0 {
			errs = append(errs, set.deleteAddr(p))
			res.ElementsRemoved++
		}
	}
	errs = append(errs, set.setSettings(w.settings))
	return errors.Join(errs...)
}

// attachAll attaches set where it is missing (a device that fails does not stop the others),
// then takes our other attachments off: older programs, the other mode, devices no longer
// desired. It returns the devices whose clsact qdisc went with the last of them, their
// ownership cleared in set's ifaces map.
func (m *Manager) attachAll(o *observed, set *progSet, mode Mode, w contents, d *Desired, res *Result) ([]uint32, error) {
	var stale []attachment
	var failedOwned []uint32
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
		var err error
		if i := slices.IndexFunc(mine, func(a attachment) bool { return a.mode == mode && a.prog == set.id }); i >= 0 {
			keep = mine[i]
		} else if keep, err = attachProgram(mode, l, set, mine, o.sets); gone(err) {
			res.Missing = append(res.Missing, name)
			continue
		} else if err != nil {
			// No program here, so no end of its Pods is remembered: not a redirect target
			// either (the next Apply reads the maps whole and enters it again).
			errs = append(errs, set.deleteIface(uint32(l.Attrs().Index)))
			if w.ifaces[uint32(l.Attrs().Index)].Flags&flagOwnClsact != 0 {
				failedOwned = append(failedOwned, uint32(l.Attrs().Index))
			}
			// The programs of other sets come off the device (its packets take the stack
			// until an attach succeeds): their maps are no longer written, and a peer CIDR
			// removed or an exclusion added since would not reach them.
			var older []string
			for _, a := range mine {
				if a.prog != set.id {
					stale = append(stale, a)
					older = append(older, fmt.Sprintf("%s program %d", a.mode, a.prog))
				}
			}
			if len(older) > 0 {
				err = fmt.Errorf("%w (detached from it: %s; its packets take the stack until an attach succeeds)", err, strings.Join(older, ", "))
			}
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
	detached, cleared, err := o.detach(stale, set)
	for _, n := range detached {
		if _, wanted := d.Devices[n]; !wanted && !slices.Contains(res.Detached, n) {
			res.Detached = append(res.Detached, n)
		}
	}
	// A device whose attach failed left the ifaces map with the record that we added its
	// clsact qdisc: the Manager keeps it, as it keeps one Prepare added, for the next Apply
	// that attaches there (or deletes the qdisc when none wants the device within
	// preparedFor, or at Remove). Lost, no later Remove knew the qdisc was ours; deleted at
	// once, a device whose attach keeps failing had its qdisc added again at every sync.
	if len(failedOwned) > 0 {
		m.prepMu.Lock()
		if m.prepared == nil {
			m.prepared = map[uint32]time.Time{}
		}
		for _, idx := range failedOwned {
			m.prepared[idx] = time.Now()
		}
		m.prepMu.Unlock()
	}
	return cleared, errors.Join(append(errs, err)...)
}

func countPut[K comparable, V any](res *Result, cur map[K]V, k K) {
	if _, ok := cur[k]; ok {
		res.ElementsUpdated++
	} else {
		res.ElementsAdded++
	}
}

// needsAttach reports whether a desired device lacks set (attachAll attaches it there).
func needsAttach(o *observed, set *progSet, mode Mode, w contents) bool {
	for _, l := range o.links {
		if _, ok := w.ifaces[uint32(l.Attrs().Index)]; !ok {
			continue
		}
		if !slices.ContainsFunc(o.on(l.Attrs().Index), func(a attachment) bool { return a.mode == mode && a.prog == set.id }) {
			return true
		}
	}
	return false
}
