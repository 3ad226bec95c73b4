package tc

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"sync"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/rlimit"
	"golang.org/x/sys/unix"

	"github.com/hostaccel/hostaccel/internal/bpfobj"
)

// progSet is a loaded program with its maps: loaded by this process (loadSet) or found in
// the kernel by a later one (openSet).
type progSet struct {
	prog     *ebpf.Program
	id       ebpf.ProgramID
	maps     fastpathMaps
	settings *ebpf.Map // settingsMap: the program's struct settings
	build    uint64    // from the settings: buildID at load
}

// settingsMap is the map of the program's writable globals (.bss): its one, agent_settings
// (struct settings), which the program reads without a lookup. One element, written whole.
const settingsMap = ".bss"

// removeMemlock lifts RLIMIT_MEMLOCK for kernels before 5.11 (best effort).
var removeMemlock = sync.OnceFunc(func() { _ = rlimit.RemoveMemlock() })

// loadSet loads the embedded object. withConntrack says whether the kernel has the conntrack
// kfuncs (probe.HasConntrackKfuncs); without them the program skips its NAT check.
func loadSet(withConntrack bool) (*progSet, error) {
	removeMemlock()
	spec, err := loadFastpath()
	if err != nil {
		return nil, err
	}
	var ct uint32
	if withConntrack {
		ct = 1
	}
	if err := spec.Variables[fastpathVarConntrackKfuncs].Set(ct); err != nil {
		return nil, err
	}
	cpus, err := ebpf.PossibleCPU()
	if err != nil {
		return nil, err
	}
	slots := slotsFor(cpus)
	for _, name := range []string{fastpathMapSlots4, fastpathMapSlots6, fastpathMapNatSlots4, fastpathMapNatSlots6} {
		spec.Maps[name].MaxEntries = slots
	}
	if err := spec.Variables[fastpathVarSlotMask].Set(slots - 1); err != nil {
		return nil, err
	}
	var objs struct {
		fastpathObjects
		Settings *ebpf.Map `ebpf:".bss"`
	}
	if err := spec.LoadAndAssign(&objs, nil); err != nil {
		return nil, fmt.Errorf("loading the tc program: %w", err)
	}
	s := &progSet{prog: objs.HostaccelFp, maps: objs.fastpathMaps, settings: objs.Settings, build: buildID(withConntrack)}
	if info, err := s.prog.Info(); err == nil {
		s.id, _ = info.ID()
	}
	return s, nil
}

// slotsFor is slotsPerCPU (tests make it smaller).
var slotsFor = slotsPerCPU

// slotBudget bounds the express lanes' slots over all CPUs (the pairs' and the NAT lane's, both
// families: four maps).
const slotBudget = 32 << 20

// slotsPerCPU is the express lanes' slots per CPU for a machine of cpus (possible) CPUs: 4,096
// where the budget allows (1.4 MiB per CPU), else the largest power of two within it, never
// fewer than 256. A pair (or carried flow) whose slot another holds takes the full way.
func slotsPerCPU(cpus int) uint32 {
	per := binary.Size(fastpathSlot4{}) + binary.Size(fastpathSlot6{}) + binary.Size(fastpathNatSlot4{}) + binary.Size(fastpathNatSlot6{})
	n := uint32(4096)
	for n > 256 && int(n)*per*max(cpus, 1) > slotBudget {
		n /= 2
	}
	return n
}

// openSet opens a program by ID and, if it is hostaccel's, its maps; nil if it is not ours.
func openSet(id ebpf.ProgramID) (*progSet, error) {
	s := &progSet{id: id}
	prog, err := bpfobj.Open(id, progName, s.fields())
	if prog == nil {
		return nil, err
	}
	s.prog = prog
	if !s.usable() {
		// A program of our name from another build with other maps: not ours to use, but
		// ours to replace. Its build stays 0, so it never counts as current.
		return s, nil
	}
	var cfg fastpathSettings
	if s.settings.Lookup(uint32(0), &cfg) == nil {
		s.build = cfg.Build
	}
	return s, nil
}

// fields are the set's maps by name.
func (s *progSet) fields() map[string]**ebpf.Map {
	m := &s.maps
	return map[string]**ebpf.Map{
		fastpathMapIfaces: &m.Ifaces, fastpathMapAddrs4: &m.Addrs4, fastpathMapAddrs6: &m.Addrs6,
		settingsMap: &s.settings, fastpathMapStats: &m.Stats, fastpathMapHanded: &m.Handed,
		fastpathMapHandedMarks: &m.HandedMarks, fastpathMapNexthops: &m.Nexthops, fastpathMapPairs4: &m.Pairs4, fastpathMapPairs6: &m.Pairs6,
		fastpathMapPairBits: &m.PairBits, fastpathMapSlots4: &m.Slots4, fastpathMapSlots6: &m.Slots6,
		fastpathMapNatSlots4: &m.NatSlots4, fastpathMapNatSlots6: &m.NatSlots6, fastpathMapNatVoids: &m.NatVoids,
	}
}

func (s *progSet) Close() {
	if s == nil {
		return
	}
	s.prog.Close()
	s.maps.Close() // nil maps close as no-ops
	s.settings.Close()
}

// usable reports whether the set has every map this build uses.
func (s *progSet) usable() bool {
	for _, m := range s.fields() {
		if *m == nil {
			return false
		}
	}
	return true
}

// clearPairBits clears the program's filter of kept pairs (pair_bits): after a new generation
// every pair is void, and a pair kept again sets its bit again. The map is mapped into this
// process's memory (BPF_F_MMAPABLE), zeroed in one copy and unmapped (a mapping holds the map:
// ebpf.Map.Memory's would keep it until the garbage collector ran); where it cannot be mapped
// (a set loaded without the flag), one batch write (16,384 elements, ~7 ms).
func (s *progSet) clearPairBits() error {
	m := s.maps.PairBits
	if b, err := unix.Mmap(m.FD(), 0, int(m.MaxEntries()*m.ValueSize()), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED); err == nil {
		clear(b)
		return unix.Munmap(b)
	}
	keys := make([]uint32, m.MaxEntries())
	for i := range keys {
		keys[i] = uint32(i)
	}
	_, err := m.BatchUpdate(keys, make([]uint64, len(keys)), nil)
	return err
}

// htons is the network byte order of a port, as the program stores it (a __be16 read on a
// little-endian host).
func htons(p uint16) uint16 { return p<<8 | p>>8 }

// read returns what the maps hold.
func (s *progSet) read() (contents, error) {
	c := contents{ifaces: map[uint32]fastpathIface{}, addrs: map[netip.Prefix]fastpathAddr{}}
	var idx uint32
	var e fastpathIface
	it := s.maps.Ifaces.Iterate()
	for it.Next(&idx, &e) {
		c.ifaces[idx] = e
	}
	if err := it.Err(); err != nil {
		return c, fmt.Errorf("ifaces: %w", err)
	}
	if err := readAll(s.maps.Addrs4, func(k fastpathLpm4, a fastpathAddr) {
		c.addrs[netip.PrefixFrom(netip.AddrFrom4(k.Addr), int(k.Prefixlen))] = a
	}); err != nil {
		return c, fmt.Errorf("addrs4: %w", err)
	}
	if err := readAll(s.maps.Addrs6, func(k fastpathLpm6, a fastpathAddr) {
		c.addrs[netip.PrefixFrom(netip.AddrFrom16(k.Addr), int(k.Prefixlen))] = a
	}); err != nil {
		return c, fmt.Errorf("addrs6: %w", err)
	}
	if err := s.settings.Lookup(uint32(0), &c.settings); err != nil {
		return c, fmt.Errorf("settings: %w", err)
	}
	c.settings = policy(c.settings)
	return c, nil
}

// readAll calls fn for every entry of m: in batches of 1,024 a system call where the kernel
// has batch reads for the map's type (LPM tries since 5.x: 10,000 peer prefixes in ~5 ms, where
// reading them one by one takes 20,000 calls, ~26 ms), else one by one.
func readAll[K, V any](m *ebpf.Map, fn func(K, V)) error {
	keys, vals := make([]K, 1024), make([]V, 1024)
	var cursor ebpf.MapBatchCursor
	for first := true; ; first = false {
		n, err := m.BatchLookup(&cursor, keys, vals, nil)
		for i := range n {
			fn(keys[i], vals[i])
		}
		switch {
		case errors.Is(err, ebpf.ErrKeyNotExist):
			return nil
		case first && errors.Is(err, ebpf.ErrNotSupported):
			var k K
			var v V
			it := m.Iterate()
			for it.Next(&k, &v) {
				fn(k, v)
			}
			return it.Err()
		case err != nil:
			return err
		}
	}
}

// setSettings writes the program's settings, recording the set's build.
func (s *progSet) setSettings(st fastpathSettings) error {
	st.Build = s.build
	if err := s.settings.Put(uint32(0), st); err != nil {
		return fmt.Errorf("settings: %w", err)
	}
	return nil
}

// addrMap is the trie of p's family.
func (s *progSet) addrMap(p netip.Prefix) *ebpf.Map {
	if p.Addr().Is4() {
		return s.maps.Addrs4
	}
	return s.maps.Addrs6
}

func (s *progSet) putAddr(p netip.Prefix, a fastpathAddr) error {
	if err := s.addrMap(p).Put(lpmKey(p), a); err != nil {
		return fmt.Errorf("addrs: add %s: %w", p, err)
	}
	return nil
}

func (s *progSet) deleteAddr(p netip.Prefix) error {
	if err := s.addrMap(p).Delete(lpmKey(p)); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		return fmt.Errorf("addrs: delete %s: %w", p, err)
	}
	return nil
}

func (s *progSet) putIface(idx uint32, e fastpathIface) error {
	if err := s.maps.Ifaces.Put(idx, e); err != nil {
		return fmt.Errorf("ifaces: add %d: %w", idx, err)
	}
	return nil
}

func (s *progSet) deleteIface(idx uint32) error {
	if err := s.maps.Ifaces.Delete(idx); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		return fmt.Errorf("ifaces: delete %d: %w", idx, err)
	}
	return nil
}

// counters reads the per-CPU stats, summed over CPUs, by index (enum stat).
func (s *progSet) counters() ([]Counter, error) {
	classes := len(Supported) * 2
	out := make([]Counter, numStats+classes*2+2)
	for i := range out {
		var per []fastpathCounter
		if err := s.maps.Stats.Lookup(uint32(i), &per); err != nil {
			return nil, fmt.Errorf("stats[%d]: %w", i, err)
		}
		for _, p := range per {
			out[i].Packets += p.Packets
			out[i].Bytes += p.Bytes
		}
	}
	// The express lane counts a packet once, in STAT_EXPRESS_CLASS + class*2 + family (plus
	// classes where it went into a Pod's namespace): it belongs to its class, express, and peer.
	// The NAT express lane's (STAT_NAT_EXPRESS, then into a Pod's namespace) are carried,
	// express, and the second peer.
	add := func(to *Counter, c Counter) { to.Packets += c.Packets; to.Bytes += c.Bytes }
	express, peer, carried := &out[stat(ViaExpress)], &out[stat(ViaPeer)], &out[stat(ViaNATCarried)]
	for i, c := range out[numStats : numStats+classes*2] {
		add(&out[i%classes], c)
		add(express, c)
		if i >= classes {
			add(peer, c)
		}
	}
	for i, c := range out[numStats+classes*2:] {
		add(carried, c)
		add(express, c)
		if i == 1 {
			add(peer, c)
		}
	}
	return out[:numStats], nil
}
