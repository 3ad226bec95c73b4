package sockmap

import (
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"sync"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/cilium/ebpf/rlimit"

	"github.com/hostaccel/hostaccel/internal/bpfobj"
)

// Program names in the kernel (bpf/sockmap.c): how a later process knows them as ours.
const (
	opsName = "hostaccel_so"
	msgName = "hostaccel_sm"
	rdName  = "hostaccel_rd" // fexit on tcp_bpf_recvmsg
	rtName  = "hostaccel_rt" // raw tracepoint sock_recv_length (Linux >= 6.3)
)

// readerHooks are where hostaccel_rd and hostaccel_rt count reads, by program name.
var readerHooks = map[string]string{rdName: "fexit/tcp_bpf_recvmsg", rtName: "raw_tp/sock_recv_length"}

// DefaultMaxQueued is the bound on what a receiving socket holds unread of the data sent to
// it (Manager.MaxQueued): past it, the sender's direction of the connection takes TCP until
// the receiver has read all. Half tcp_rmem's largest receive buffer on 6.18 (32 MiB): a reader
// that keeps up still lags a fast writer by MiBs when it is not scheduled for a few ms (host
// tests, 2 loaded cores, 256 MiB transfers: 4 MiB tripped 1-2 times in each, 16 MiB in 1 of 3,
// each time for a few MiB).
const DefaultMaxQueued = 16 << 20

// buildID identifies the embedded object: a set of another build is replaced.
var buildID = sync.OnceValue(func() uint64 {
	h := sha256.Sum256(_SockmapBytes)
	return binary.LittleEndian.Uint64(h[:8]) | 1
})

var removeMemlock = sync.OnceFunc(func() { _ = rlimit.RemoveMemlock() })

// progSet is the sock_ops program with its maps, and the sk_msg program when known: loaded by
// this process (loadSet) or found in the kernel by a later one (openSet).
type progSet struct {
	ops   *ebpf.Program
	opsID ebpf.ProgramID
	msg   *ebpf.Program // nil when found again and no sk_msg program is attached to the map
	// msgUnknown: the kernel cannot say which sk_msg program the map has (BPF_PROG_QUERY on a
	// sockmap needs Linux >= 6.0); the pin then vouches for it.
	msgUnknown bool
	maps       sockmapMaps
	build      uint64
	// off: its settings say it is drained (or not yet enabled): a drain that did not get to
	// detach it (a process killed in between) left it attached but doing nothing.
	off bool
}

// setObjects is the set without the read counters hostaccel_rd and hostaccel_rt, which are
// loaded on their own (loadReader): a kernel that can attach neither still gets the datapath,
// unbounded.
type setObjects struct {
	sockmapMaps
	HostaccelSo *ebpf.Program `ebpf:"hostaccel_so"`
	HostaccelSm *ebpf.Program `ebpf:"hostaccel_sm"`
}

func loadSet() (*progSet, error) {
	removeMemlock()
	spec, err := loadSockmap()
	if err != nil {
		return nil, fmt.Errorf("loading the sockmap programs: %w", err)
	}
	delete(spec.Programs, rdName)
	delete(spec.Programs, rtName)
	var objs setObjects
	if err := spec.LoadAndAssign(&objs, nil); err != nil {
		return nil, fmt.Errorf("loading the sockmap programs: %w", err)
	}
	s := &progSet{ops: objs.HostaccelSo, msg: objs.HostaccelSm, maps: objs.sockmapMaps, build: buildID()}
	if info, err := s.ops.Info(); err == nil {
		s.opsID, _ = info.ID()
	}
	if err := s.maps.Config.Put(uint32(0), sockmapSettings{Build: s.build, Enabled: 1}); err != nil {
		s.Close()
		return nil, fmt.Errorf("config: %w", err)
	}
	return s, nil
}

// openSet opens a sock_ops program by ID and, if it is hostaccel's, its maps and the sk_msg
// program attached to its sockhash; nil if it is not ours.
func openSet(id ebpf.ProgramID) (*progSet, error) {
	s := &progSet{opsID: id}
	prog, err := bpfobj.Open(id, opsName, s.fields())
	if prog == nil {
		return nil, err
	}
	s.ops = prog
	if !s.usable() {
		return s, nil // ours by name, another build's maps: to be replaced
	}
	var cfg sockmapSettings
	if s.maps.Config.Lookup(uint32(0), &cfg) == nil {
		s.build, s.off = cfg.Build, cfg.Enabled == 0 || cfg.Draining != 0
	}
	s.msg, s.msgUnknown, err = attachedMsg(s.maps.HostaccelSocks)
	return s, err
}

// fields are the set's maps by name.
func (s *progSet) fields() map[string]**ebpf.Map {
	m := &s.maps
	return map[string]**ebpf.Map{"hostaccel_socks": &m.HostaccelSocks, "pods4": &m.Pods4, "pods6": &m.Pods6, "config": &m.Config, "stats": &m.Stats, "tcp_only": &m.TcpOnly, "ledgers": &m.Ledgers}
}

func (s *progSet) usable() bool {
	for _, m := range s.fields() {
		if *m == nil {
			return false
		}
	}
	return true
}

func (s *progSet) Close() {
	if s == nil {
		return
	}
	s.ops.Close()
	if s.msg != nil {
		s.msg.Close()
	}
	s.maps.Close()
}

// loadReader loads a read counter on the set's maps and attaches it: hostaccel_rd (fexit on
// tcp_bpf_recvmsg, the recvmsg of sockets in a sockmap) where the kernel takes tracing
// programs, else hostaccel_rt (the sock_recv_length tracepoint, every recvmsg of the node).
func (s *progSet) loadReader() (link.Link, error) { return s.loadReaderExcept("") }

// loadReaderExcept is loadReader without replacing the map named skip (ProbeReadCounter).
func (s *progSet) loadReaderExcept(skip string) (link.Link, error) {
	spec, err := loadSockmap()
	if err != nil {
		return nil, err
	}
	repl := map[string]*ebpf.Map{}
	for name, m := range s.fields() {
		if name != skip {
			repl[name] = *m
		}
	}
	var errs []error
	for _, name := range []string{rdName, rtName} {
		ps := spec.Programs[name]
		var objs struct {
			P *ebpf.Program `ebpf:"p"`
		}
		one := &ebpf.CollectionSpec{Maps: spec.Maps, Programs: map[string]*ebpf.ProgramSpec{"p": ps}, Types: spec.Types}
		if err := one.LoadAndAssign(&objs, &ebpf.CollectionOptions{MapReplacements: repl}); err != nil {
			errs = append(errs, fmt.Errorf("%s: loading %s: %w", readerHooks[name], name, err))
			continue
		}
		var l link.Link
		if ps.Type == ebpf.Tracing {
			l, err = link.AttachTracing(link.TracingOptions{Program: objs.P, AttachType: ebpf.AttachTraceFExit})
		} else {
			l, err = link.AttachRawTracepoint(link.RawTracepointOptions{Name: ps.AttachTo, Program: objs.P})
		}
		objs.P.Close()
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: attaching %s: %w", readerHooks[name], name, err))
			continue
		}
		return l, nil
	}
	return nil, errors.Join(errs...)
}

// ProbeReadCounter loads and attaches a read counter on throwaway maps and detaches it again;
// it returns where it attached (see Status.ReadCounter), or why neither could: then the
// datapath works without a bound.
func ProbeReadCounter() (string, error) {
	removeMemlock()
	spec, err := loadSockmap()
	if err != nil {
		return "", err
	}
	s := &progSet{}
	for name, slot := range s.fields() {
		if name == "hostaccel_socks" {
			continue // a sockhash is not needed: the counters do not use it
		}
		m, err := ebpf.NewMap(spec.Maps[name])
		if err != nil {
			s.maps.Close()
			return "", fmt.Errorf("map %s: %w", name, err)
		}
		*slot = m
	}
	defer s.maps.Close()
	l, err := s.loadReaderExcept("hostaccel_socks")
	if err != nil {
		return "", err
	}
	defer l.Close()
	info, err := l.Info()
	if err != nil {
		return "", err
	}
	p, err := ebpf.NewProgramFromID(info.Program)
	if err != nil {
		return "", err
	}
	defer p.Close()
	pi, err := p.Info()
	if err != nil {
		return "", err
	}
	return readerHooks[pi.Name], nil
}

// settings reads the set's config.
func (s *progSet) settings() (sockmapSettings, error) {
	var cfg sockmapSettings
	err := s.maps.Config.Lookup(uint32(0), &cfg)
	return cfg, err
}

// bumpEpoch tells the sk_msg program that the tries changed: each open connection's next
// message checks its ends against them again (settings.epoch; one written after the tries).
func (s *progSet) bumpEpoch() error {
	cfg, err := s.settings()
	if err != nil {
		return fmt.Errorf("config: %w", err)
	}
	cfg.Epoch++
	if err := s.maps.Config.Put(uint32(0), cfg); err != nil {
		return fmt.Errorf("config: %w", err)
	}
	return nil
}

// readPods returns what the tries hold.
func (s *progSet) readPods() (map[netip.Prefix]uint32, error) {
	out := map[netip.Prefix]uint32{}
	var a sockmapAddr
	var k4 sockmapLpm4
	it := s.maps.Pods4.Iterate()
	for it.Next(&k4, &a) {
		out[netip.PrefixFrom(netip.AddrFrom4(k4.Addr), int(k4.Prefixlen))] = a.Flags
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("pods4: %w", err)
	}
	var k6 sockmapLpm6
	it = s.maps.Pods6.Iterate()
	for it.Next(&k6, &a) {
		out[netip.PrefixFrom(netip.AddrFrom16(k6.Addr), int(k6.Prefixlen))] = a.Flags
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("pods6: %w", err)
	}
	return out, nil
}

func (s *progSet) putPod(p netip.Prefix, flags uint32) error {
	var err error
	if p.Addr().Is4() {
		err = s.maps.Pods4.Put(sockmapLpm4{Prefixlen: uint32(p.Bits()), Addr: p.Addr().As4()}, sockmapAddr{Flags: flags})
	} else {
		err = s.maps.Pods6.Put(sockmapLpm6{Prefixlen: uint32(p.Bits()), Addr: p.Addr().As16()}, sockmapAddr{Flags: flags})
	}
	if err != nil {
		return fmt.Errorf("pods: add %s: %w", p, err)
	}
	return nil
}

func (s *progSet) deletePod(p netip.Prefix) error {
	var err error
	if p.Addr().Is4() {
		err = s.maps.Pods4.Delete(sockmapLpm4{Prefixlen: uint32(p.Bits()), Addr: p.Addr().As4()})
	} else {
		err = s.maps.Pods6.Delete(sockmapLpm6{Prefixlen: uint32(p.Bits()), Addr: p.Addr().As16()})
	}
	if err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		return fmt.Errorf("pods: delete %s: %w", p, err)
	}
	return nil
}

// sockets lists the keys of the sockets in the map, each once: when the key the walk stands on
// is deleted (its socket closed), the kernel's next key is the first again, and the walk goes
// over keys it has listed (before, status counted them twice: found by a helper's review). A
// map whose walk keeps restarting is read at most four times its size.
func (s *progSet) sockets() ([]sockmapSockKey, error) {
	var out []sockmapSockKey
	seen := map[sockmapSockKey]bool{}
	var k, next sockmapSockKey
	var kp any // nil: the first key
	for steps, limit := 0, 4*int(s.maps.HostaccelSocks.MaxEntries()); steps < limit; steps++ {
		if err := s.maps.HostaccelSocks.NextKey(kp, &next); err != nil {
			if errors.Is(err, ebpf.ErrKeyNotExist) {
				return out, nil
			}
			return out, fmt.Errorf("hostaccel_socks: %w", err)
		}
		if !seen[next] {
			seen[next] = true
			out = append(out, next)
		}
		k = next
		kp = &k
	}
	return out, nil
}

// counters reads the per-CPU stats, summed over CPUs, by index (enum stat).
func (s *progSet) counters() ([]sockmapCounter, error) {
	n := int(s.maps.Stats.MaxEntries())
	out := make([]sockmapCounter, n)
	for i := range out {
		var per []sockmapCounter
		if err := s.maps.Stats.Lookup(uint32(i), &per); err != nil {
			return nil, fmt.Errorf("stats[%d]: %w", i, err)
		}
		for _, p := range per {
			out[i].Count += p.Count
			out[i].Bytes += p.Bytes
		}
	}
	return out, nil
}
