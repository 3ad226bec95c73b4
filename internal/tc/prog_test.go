package tc

import (
	"encoding/binary"
	"errors"
	"maps"
	"math"
	"net/netip"
	"runtime"
	"slices"
	"testing"
	"time"
	"unsafe"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"golang.org/x/sys/unix"

	"github.com/hostaccel/hostaccel/internal/model"
	"github.com/hostaccel/hostaccel/internal/testbed"
)

// The program's decisions, run with BPF_PROG_RUN on crafted frames: no namespace, no device,
// no traffic. The test run does not perform redirects; the return code says which one the
// program chose, and the frame it returns shows what it wrote. Routing is taken from the
// next-hop cache, filled here as the program would from the FIB.

const (
	actUnspec   = math.MaxUint32 // TC_ACT_UNSPEC (-1): handed on
	actRedirect = 7              // TC_ACT_REDIRECT
	lo          = 1              // the ingress device the test run reports (loopback)
)

var (
	localPod  = netip.MustParsePrefix("10.244.1.0/24")
	peerPod   = netip.MustParsePrefix("10.244.2.0/24")
	localPod6 = netip.MustParsePrefix("fd00:10:244:1::/64")
	peerPod6  = netip.MustParsePrefix("fd00:10:244:2::/64")
	nhSrcMAC  = [6]byte{0x02, 0, 0, 0, 0, 0x01}
	nhDstMAC  = [6]byte{0x02, 0, 0, 0, 0, 0x02}
)

// skbCtx is struct __sk_buff as BPF_PROG_RUN takes it: the fields the test sets, the rest
// zero (192 bytes in all).
type skbCtx struct {
	Len, PktType, Mark, QueueMapping, Protocol, VlanPresent, VlanTCI, VlanProto, Priority uint32
	IngressIfindex, Ifindex                                                               uint32
	_                                                                                     [37]uint32
}

// frame builds an Ethernet frame (to the all-zero MAC: loopback's, so the test run sees it as
// PACKET_HOST) with a UDP datagram from src:1000 to dst:2000.
func frame(src, dst netip.Addr, ttl uint8) []byte {
	payload := make([]byte, 8+18) // UDP header + data
	binary.BigEndian.PutUint16(payload[0:], 1000)
	binary.BigEndian.PutUint16(payload[2:], 2000)
	binary.BigEndian.PutUint16(payload[4:], uint16(len(payload)))
	f := make([]byte, 14, 14+40+len(payload))
	if src.Is4() {
		binary.BigEndian.PutUint16(f[12:], 0x0800)
		ip := make([]byte, 20)
		ip[0], ip[8], ip[9] = 0x45, ttl, 17
		binary.BigEndian.PutUint16(ip[2:], uint16(20+len(payload)))
		copy(ip[12:], src.AsSlice())
		copy(ip[16:], dst.AsSlice())
		binary.BigEndian.PutUint16(ip[10:], ipChecksum(ip))
		f = append(f, ip...)
	} else {
		binary.BigEndian.PutUint16(f[12:], 0x86dd)
		ip := make([]byte, 40)
		ip[0], ip[6], ip[7] = 0x60, 17, ttl
		binary.BigEndian.PutUint16(ip[4:], uint16(len(payload)))
		copy(ip[8:], src.AsSlice())
		copy(ip[24:], dst.AsSlice())
		f = append(f, ip...)
	}
	return append(f, payload...)
}

func ipChecksum(h []byte) uint16 {
	var sum uint32
	for i := 0; i < len(h); i += 2 {
		sum += uint32(binary.BigEndian.Uint16(h[i:]))
	}
	for sum > 0xffff {
		sum = sum>>16 + sum&0xffff
	}
	return ^uint16(sum)
}

// progEnv is a program set loaded for test runs, its maps filled as for a node whose gateway
// is loopback.
type progEnv struct {
	t   testing.TB
	set *progSet
	// what the agent last wrote: the settings (their generation bumped by every change, as
	// the agent does) and the kept next hops of that generation
	cfg    fastpathSettings
	routes map[netip.Addr]uint32
	// runFlags: BPF_F_TEST_SKB_CHECKSUM_COMPLETE where the kernel has it (Linux >= 6.11)
	runFlags uint32
}

// testSKBChecksumComplete (BPF_F_TEST_SKB_CHECKSUM_COMPLETE) has a test run give the packet
// CHECKSUM_COMPLETE, its skb->csum the sum of the packet, as many NICs do, and fail with
// EBADMSG if the program leaves skb->csum other than the sum of the packet it returns.
const testSKBChecksumComplete = 1 << 2

func newProgEnv(t testing.TB) *progEnv {
	testbed.RequireRoot(t)
	set, err := loadSet(haveConntrackKfuncs())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(set.Close)
	p := &progEnv{t: t, set: set, routes: map[netip.Addr]uint32{},
		cfg: fastpathSettings{NatCheck: natCheckTowardPods | natCheckFromPods, Flags: settingsNexthopCache, Generation: 7, TickNs: tickNS(), HandedEpoch: handedFirstEpoch, HandedSince: handedFirstEpoch}}
	p.must(set.putIface(lo, fastpathIface{Role: uint32(RoleGateway), Mtu: 1500, Mtu6: 1500}))
	for _, pr := range []netip.Prefix{localPod, localPod6} {
		p.must(set.putAddr(pr, fastpathAddr{Flags: addrLocalPod}))
	}
	for _, pr := range []netip.Prefix{peerPod, peerPod6} {
		p.must(set.putAddr(pr, fastpathAddr{Flags: addrPeerPod}))
	}
	p.settings(0b11)
	// Every run checks skb->csum where the kernel can (the program's direct writes of the
	// IPv6 header must update it: sum6); a kernel without the flag refuses it (EINVAL).
	probe := frame(netip.MustParseAddr("192.0.2.1"), netip.MustParseAddr("192.0.2.2"), 64)
	if _, err := set.prog.Run(&ebpf.RunOptions{Data: probe, Context: skbCtx{IngressIfindex: lo, Ifindex: lo}, Flags: testSKBChecksumComplete}); err == nil {
		p.runFlags = testSKBChecksumComplete
	} else if !errors.Is(err, unix.EINVAL) {
		t.Fatal(err)
	}
	return p
}

func (p *progEnv) must(err error) {
	p.t.Helper()
	if err != nil {
		p.t.Fatal(err)
	}
}

func (p *progEnv) settings(classes uint32) {
	p.cfg.Classes = classes
	p.bump()
}

// natCheck sets the NAT check (and bumps the generation).
func (p *progEnv) natCheck(check uint32) {
	p.cfg.NatCheck = check
	p.bump()
}

// bump does what the agent does after it changed the maps: the settings get a new generation
// (the decisions and next hops the program kept are void), and here the next hops are kept
// again for it, as the FIB would answer.
func (p *progEnv) bump() {
	p.cfg.Generation++
	p.must(p.set.setSettings(p.cfg))
	for dst, flags := range p.routes {
		p.route(dst, flags)
	}
}

// markHanded marks e as a client end handed to the stack in the current epoch, as the
// program's remember() does.
func (p *progEnv) markHanded(e fastpathEndpoint) {
	p.must(p.set.maps.HandedMarks.Put(handedSlot(e), uint64(p.cfg.HandedEpoch)))
}

// route fills the next-hop cache for dst as the program does on a FIB answer.
func (p *progEnv) route(dst netip.Addr, flags uint32) {
	p.routes[dst] = flags
	k := fastpathNexthopKey{Ingress: lo}
	copy(k.Addr[:], dst.AsSlice())
	p.must(p.set.maps.Nexthops.Put(k, fastpathNexthop{Expires: math.MaxUint64, Generation: p.cfg.Generation, Ifindex: lo, Flags: flags, Mtu: 1500, Smac: nhSrcMAC, Dmac: nhDstMAC}))
}

func (p *progEnv) run(f []byte) (uint32, []byte) {
	p.t.Helper()
	out := make([]byte, len(f)+64)
	ctx := skbCtx{IngressIfindex: lo, Ifindex: lo}
	ret, err := p.set.prog.Run(&ebpf.RunOptions{Data: f, DataOut: out, Context: ctx, Flags: p.runFlags})
	if errors.Is(err, unix.EBADMSG) {
		p.t.Fatalf("the program left a CHECKSUM_COMPLETE packet's skb->csum stale (EBADMSG): frame %x", f)
	}
	if err != nil {
		p.t.Fatal(err)
	}
	return ret, out[:len(f)]
}

// oneCPU keeps the calling goroutine on one CPU until the test ends: the express lane's slots
// are per CPU, and BPF_PROG_RUN runs the program where its caller runs.
func oneCPU(t testing.TB) {
	runtime.LockOSThread()
	var old, one unix.CPUSet
	if err := unix.SchedGetaffinity(0, &old); err != nil {
		t.Fatal(err)
	}
	for i := range 1024 {
		if old.IsSet(i) {
			one.Set(i)
			break
		}
	}
	if err := unix.SchedSetaffinity(0, &one); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = unix.SchedSetaffinity(0, &old)
		runtime.UnlockOSThread()
	})
}

// cpus is the number of values of a per-CPU map's element.
func (p *progEnv) cpus() int {
	n, err := ebpf.PossibleCPU()
	p.must(err)
	return n
}

func (p *progEnv) counters() []Counter {
	p.t.Helper()
	n, err := p.set.counters()
	p.must(err)
	return n
}

func TestProgramDecisions(t *testing.T) {
	p := newProgEnv(t)
	pod, remote := netip.MustParseAddr("10.244.1.2"), netip.MustParseAddr("10.244.2.2")
	pod6, remote6 := netip.MustParseAddr("fd00:10:244:1::2"), netip.MustParseAddr("fd00:10:244:2::2")
	p.route(remote, 0)
	p.route(remote6, flagPeer)

	t.Run("RedirectIPv4", func(t *testing.T) {
		before := p.counters()
		ret, out := p.run(frame(pod, remote, 64))
		if ret != actRedirect {
			t.Fatalf("return %d, want TC_ACT_REDIRECT", int32(ret))
		}
		if [6]byte(out[0:6]) != nhDstMAC || [6]byte(out[6:12]) != nhSrcMAC {
			t.Errorf("MACs %x -> %x, want the next hop's %x -> %x", out[6:12], out[0:6], nhSrcMAC, nhDstMAC)
		}
		if out[14+8] != 63 || ipChecksum(out[14:34]) != 0 {
			t.Errorf("TTL %d, header checksum %s; want 63 and valid", out[14+8], map[bool]string{true: "valid", false: "invalid"}[ipChecksum(out[14:34]) == 0])
		}
		after := p.counters()
		if after[0].Packets != before[0].Packets+1 || after[stat(ViaPeer)] != before[stat(ViaPeer)] {
			t.Errorf("pod-to-pod ipv4 %d -> %d, peer %d -> %d; want +1 and unchanged", before[0].Packets, after[0].Packets, before[stat(ViaPeer)].Packets, after[stat(ViaPeer)].Packets)
		}
	})
	t.Run("RedirectPeerIPv6", func(t *testing.T) {
		before := p.counters()
		ret, out := p.run(frame(pod6, remote6, 64))
		if ret != actRedirect || out[14+7] != 63 {
			t.Fatalf("return %d, hop limit %d; want TC_ACT_REDIRECT and 63", int32(ret), out[14+7])
		}
		if after := p.counters(); after[1].Packets != before[1].Packets+1 || after[stat(ViaPeer)].Packets != before[stat(ViaPeer)].Packets+1 {
			t.Errorf("pod-to-pod ipv6 +%d, peer +%d; want +1 and +1", after[1].Packets-before[1].Packets, after[stat(ViaPeer)].Packets-before[stat(ViaPeer)].Packets)
		}
	})

	pass := func(name string, f []byte, counter string) {
		t.Run(name, func(t *testing.T) {
			before := p.counters()
			ret, out := p.run(f)
			if ret != actUnspec {
				t.Errorf("return %d, want TC_ACT_UNSPEC", int32(ret))
			}
			if string(out) != string(f) {
				t.Errorf("a packet handed on was changed")
			}
			after := p.counters()
			for i := range after {
				want := before[i].Packets
				if counter != "" && i == stat(counter) {
					want++
				}
				if after[i].Packets != want {
					t.Errorf("counter %d: %d -> %d, want %d", i, before[i].Packets, after[i].Packets, want)
				}
			}
		})
	}
	arp := frame(pod, remote, 64)
	binary.BigEndian.PutUint16(arp[12:], 0x0806)
	pass("NotIP", arp, "")
	pass("TTL1", frame(pod, remote, 1), PassTTL)
	pass("NotAPeer", frame(pod, netip.MustParseAddr("192.0.2.1"), 64), "")
	pass("FromAPeerOnTheGateway", frame(remote, pod, 64), "")
	icmp := frame(pod, remote, 64)
	icmp[14+9] = 1
	pass("ICMP", icmp, "")

	p.must(p.set.putAddr(netip.MustParsePrefix("10.244.2.2/32"), fastpathAddr{Flags: addrPeerPod | addrExclude}))
	p.bump()
	pass("Excluded", frame(pod, remote, 64), PassExcluded)
	p.must(p.set.deleteAddr(netip.MustParsePrefix("10.244.2.2/32")))
	p.bump()

	p.settings(0b10) // pod-to-pod off
	pass("ClassOff", frame(pod, remote, 64), "")
	p.settings(0b11)

	p.must(p.set.deleteIface(lo))
	p.bump()
	pass("NotOurDevice", frame(pod, remote, 64), "")
	p.must(p.set.putIface(lo, fastpathIface{Role: uint32(RoleGateway), Mtu: 1500, Mtu6: 1500}))
	p.bump()

	// A Pod's packet to an address of no class (a ClusterIP) goes to the stack, and its client
	// end is remembered: the NAT check will ask conntrack about the replies.
	t.Run("Handed", func(t *testing.T) {
		vip := netip.MustParseAddr("10.96.0.10")
		if ret, _ := p.run(frame(pod, vip, 64)); ret != actUnspec {
			t.Fatalf("to a ClusterIP: return %d, want TC_ACT_UNSPEC", int32(ret))
		}
		e := fastpathEndpoint{Port: htons(1000), Proto: 17}
		copy(e.Addr[:], pod.AsSlice())
		var v fastpathHandedEnd
		if err := p.set.maps.Handed.Lookup(e, &v); err != nil {
			t.Errorf("client end %s:1000 not remembered: %v", pod, err)
		}
		// The program marked it where the agent computes (handedSlot is handed_mark()), with
		// the current epoch.
		var m uint64
		p.must(p.set.maps.HandedMarks.Lookup(handedSlot(e), &m))
		if m != uint64(p.cfg.HandedEpoch) {
			t.Errorf("handed_marks[%d] = %d, want the epoch, %d", handedSlot(e), m, p.cfg.HandedEpoch)
		}
	})

	// conntrack's answer about a reply to a remembered client end is kept for a moment, for
	// that server end only; a TCP SYN from the client end voids it.
	t.Run("KeptNATAnswer", func(t *testing.T) {
		client := fastpathEndpoint{Port: htons(2000), Proto: 17} // frame(pod, remote): the reply goes to remote:2000
		copy(client.Addr[:], remote.AsSlice())
		kept := func(asked uint64, server netip.Addr) {
			h := fastpathHandedEnd{Asked: asked, Port: htons(1000), Nat: 1}
			copy(h.Server[:], server.AsSlice())
			p.markHanded(client)
			p.must(p.set.maps.Handed.Put(client, h))
		}
		now := coarseNow(t)
		kept(now, pod)
		pass("Fresh", frame(pod, remote, 64), PassNAT)

		kept(now, netip.MustParseAddr("10.244.1.3"))
		if ret, _ := p.run(frame(pod, remote, 64)); ret != actRedirect {
			t.Errorf("kept answer about another server end: return %d, want TC_ACT_REDIRECT (conntrack has no entry)", int32(ret))
		}
		kept(now-uint64(time.Second), pod)
		if ret, _ := p.run(frame(pod, remote, 64)); ret != actRedirect {
			t.Errorf("old kept answer: return %d, want TC_ACT_REDIRECT (conntrack has no entry)", int32(ret))
		}
		var h fastpathHandedEnd
		p.must(p.set.maps.Handed.Lookup(client, &h))
		if h.Nat != 0 || h.Asked < now || netip.AddrFrom4([4]byte(h.Server[:4])) != pod {
			t.Errorf("after asking again: kept %+v, want conntrack's answer (no NAT) about %s, asked now", h, pod)
		}

		// A SYN from pod:1000 to a ClusterIP starts a new connection: what was kept is voided.
		syn := frame(pod, netip.MustParseAddr("10.96.0.10"), 64)
		syn[14+9], syn[14+20+13] = 6, 0x02 // TCP, flags SYN
		client = fastpathEndpoint{Port: htons(1000), Proto: 6}
		copy(client.Addr[:], pod.AsSlice())
		kept(now, remote)
		if ret, _ := p.run(syn); ret != actUnspec {
			t.Fatalf("SYN to a ClusterIP: return %d, want TC_ACT_UNSPEC", int32(ret))
		}
		p.must(p.set.maps.Handed.Lookup(client, &h))
		if h.Asked != 0 {
			t.Errorf("after a SYN: kept %+v, want nothing asked", h)
		}
	})
}

// local-pod-to-pod: on a gateway, a local Pod's packet to another local Pod is redirected
// where the class is on (into the other Pod, bpf_redirect_peer) and counted as that class;
// off, it passes, but a local Pod inside a peer Pod CIDR (a node given the cluster CIDR as
// its peers) stays pod-to-pod as before. A reply to a client end handed to the stack whose
// flow conntrack knows as NAT-ed (a backend Pod answering a ClusterIP connection from a Pod
// of this node) is handed to the stack under either NAT check setting.
func TestProgramLocalPodToPod(t *testing.T) {
	p := newProgEnv(t)
	const localBit = 1 << 2
	a, b := netip.MustParseAddr("10.244.1.2"), netip.MustParseAddr("10.244.1.3")
	a6, b6 := netip.MustParseAddr("fd00:10:244:1::2"), netip.MustParseAddr("fd00:10:244:1::3")
	p.route(b, flagPeer)
	p.route(b6, flagPeer)
	idx := slices.Index(Supported, model.LocalPodToPod)
	if idx != 2 {
		t.Fatalf("local-pod-to-pod is class %d, want 2 (CLASS_LOCAL_POD_TO_POD)", idx)
	}
	p.settings(0b11 | localBit)
	for _, c := range []struct{ src, dst netip.Addr }{{a, b}, {a6, b6}} {
		fam := map[bool]int{false: 0, true: 1}[c.src.Is6()]
		before := p.counters()
		if ret, _ := p.run(frame(c.src, c.dst, 64)); ret != actRedirect {
			t.Fatalf("%s -> %s: return %d, want TC_ACT_REDIRECT", c.src, c.dst, int32(ret))
		}
		after := p.counters()
		if after[idx*2+fam].Packets != before[idx*2+fam].Packets+1 || after[stat(ViaPeer)].Packets != before[stat(ViaPeer)].Packets+1 {
			t.Errorf("%s -> %s: local-pod-to-pod +%d, peer +%d; want +1, +1", c.src, c.dst,
				after[idx*2+fam].Packets-before[idx*2+fam].Packets, after[stat(ViaPeer)].Packets-before[stat(ViaPeer)].Packets)
		}
	}

	p.settings(0b11)
	if ret, _ := p.run(frame(a, b, 64)); ret != actUnspec {
		t.Errorf("class off: return %d, want TC_ACT_UNSPEC", int32(ret))
	}
	super := netip.MustParsePrefix("10.244.0.0/16")
	p.must(p.set.putAddr(super, fastpathAddr{Flags: addrPeerPod}))
	p.must(p.set.putAddr(localPod, fastpathAddr{Flags: addrLocalPod | addrPeerPod})) // flatten's answer
	p.bump()
	before := p.counters()
	if ret, _ := p.run(frame(a, b, 64)); ret != actRedirect || p.counters()[0].Packets != before[0].Packets+1 {
		t.Errorf("class off, local Pods inside a peer CIDR: return %d, want TC_ACT_REDIRECT as pod-to-pod", int32(ret))
	}
	before = p.counters()
	p.settings(0b11 | localBit)
	if ret, _ := p.run(frame(a, b, 64)); ret != actRedirect || p.counters()[idx*2].Packets != before[idx*2].Packets+1 {
		t.Errorf("class on, local Pods inside a peer CIDR: return %d, want TC_ACT_REDIRECT as local-pod-to-pod", int32(ret))
	}
	p.must(p.set.deleteAddr(super))
	p.must(p.set.putAddr(localPod, fastpathAddr{Flags: addrLocalPod}))
	p.bump()

	// b answers a's connection to a ClusterIP: frame(b, a) goes to a:2000.
	client := fastpathEndpoint{Port: htons(2000), Proto: 17}
	copy(client.Addr[:], a.AsSlice())
	h := fastpathHandedEnd{Asked: coarseNow(t), Port: htons(1000), Nat: 1}
	copy(h.Server[:], b.AsSlice())
	p.markHanded(client)
	p.route(a, flagPeer)
	for _, check := range []uint32{natCheckTowardPods | natCheckFromPods, natCheckTowardPods} {
		p.natCheck(check)
		p.must(p.set.maps.Handed.Put(client, h))
		before := p.counters()
		if ret, _ := p.run(frame(b, a, 64)); ret != actUnspec || p.counters()[stat(PassNAT)].Packets != before[stat(PassNAT)].Packets+1 {
			t.Errorf("nat_check %#b: a NAT-ed reply between local Pods: return %d, want TC_ACT_UNSPEC counted as nat", check, int32(ret))
		}
	}
	p.natCheck(0)
	if ret, _ := p.run(frame(b, a, 64)); ret != actRedirect {
		t.Errorf("NAT check off: return %d, want TC_ACT_REDIRECT (the check is what hands it on)", int32(ret))
	}
}

// A redirected packet's decision is kept for its pair of addresses on its device: the next
// packets of the pair are redirected without the roles' lookups (here: with the roles gone,
// which only an agent's update does, and an update bumps the generation), until the
// generation changes; the TTL, the class being on and the NAT check still hold for each packet.
func TestProgramPairs(t *testing.T) {
	p := newProgEnv(t)
	pod, remote := netip.MustParseAddr("10.244.1.2"), netip.MustParseAddr("10.244.2.2")
	pod6, remote6 := netip.MustParseAddr("fd00:10:244:1::2"), netip.MustParseAddr("fd00:10:244:2::2")
	p.route(remote, 0)
	p.route(remote6, flagPeer)
	p.settings(0b11)
	pairs := func() int {
		n := 0
		var k4 fastpathPairKey4
		var k6 fastpathPairKey6
		var v fastpathPair
		for it := p.set.maps.Pairs4.Iterate(); it.Next(&k4, &v); {
			n++
		}
		for it := p.set.maps.Pairs6.Iterate(); it.Next(&k6, &v); {
			n++
		}
		return n
	}
	for _, c := range []struct{ src, dst netip.Addr }{{pod, remote}, {pod6, remote6}} {
		fam := map[bool]int{false: 0, true: 1}[c.src.Is6()]
		peer := c.dst.Is6()
		if ret, _ := p.run(frame(c.src, c.dst, 64)); ret != actRedirect {
			t.Fatalf("%s -> %s: return %d, want TC_ACT_REDIRECT", c.src, c.dst, int32(ret))
		}
		// The roles go (the agent would bump the generation; not yet): the pair still answers.
		peerCIDR := map[bool]netip.Prefix{false: peerPod, true: peerPod6}[c.dst.Is6()]
		p.must(p.set.deleteAddr(peerCIDR))
		before := p.counters()
		ret, out := p.run(frame(c.src, c.dst, 64))
		if ret != actRedirect || [6]byte(out[0:6]) != nhDstMAC || [6]byte(out[6:12]) != nhSrcMAC {
			t.Errorf("%s -> %s, by its pair: return %d, MACs %x -> %x; want TC_ACT_REDIRECT and the next hop's", c.src, c.dst, int32(ret), out[6:12], out[0:6])
		}
		after := p.counters()
		wantPeer := before[stat(ViaPeer)].Packets
		if peer {
			wantPeer++
		}
		if after[fam].Packets != before[fam].Packets+1 || after[stat(ViaPeer)].Packets != wantPeer {
			t.Errorf("%s -> %s, by its pair: pod-to-pod +%d, peer +%d; want +1, %d", c.src, c.dst, after[fam].Packets-before[fam].Packets, after[stat(ViaPeer)].Packets-before[stat(ViaPeer)].Packets, wantPeer-before[stat(ViaPeer)].Packets)
		}
		if ret, _ := p.run(frame(c.src, c.dst, 1)); ret != actUnspec {
			t.Errorf("%s -> %s, TTL 1, by its pair: return %d, want TC_ACT_UNSPEC", c.src, c.dst, int32(ret))
		}
		p.settings(0b10) // the class off: the generation changes too, but the class is checked first
		if ret, _ := p.run(frame(c.src, c.dst, 64)); ret != actUnspec {
			t.Errorf("%s -> %s, class off: return %d, want TC_ACT_UNSPEC", c.src, c.dst, int32(ret))
		}
		p.settings(0b11) // a new generation, and the roles are gone: the pair is void
		if ret, _ := p.run(frame(c.src, c.dst, 64)); ret != actUnspec {
			t.Errorf("%s -> %s, after the update: return %d, want TC_ACT_UNSPEC (no roles)", c.src, c.dst, int32(ret))
		}
		p.must(p.set.putAddr(peerCIDR, fastpathAddr{Flags: addrPeerPod}))
		p.bump()
	}
	if n := pairs(); n != 2 {
		t.Errorf("%d pairs kept, want 2", n)
	}

	// A reply to a client end handed to the stack takes the full way, and conntrack's kept
	// answer (NAT-ed) hands it to the stack, although its pair is kept.
	if ret, _ := p.run(frame(pod, remote, 64)); ret != actRedirect {
		t.Fatalf("return %d, want TC_ACT_REDIRECT", int32(ret))
	}
	client := fastpathEndpoint{Port: htons(2000), Proto: 17}
	copy(client.Addr[:], remote.AsSlice())
	h := fastpathHandedEnd{Asked: coarseNow(t), Port: htons(1000), Nat: 1}
	copy(h.Server[:], pod.AsSlice())
	p.markHanded(client)
	p.must(p.set.maps.Handed.Put(client, h))
	before := p.counters()
	if ret, _ := p.run(frame(pod, remote, 64)); ret != actUnspec || p.counters()[stat(PassNAT)].Packets != before[stat(PassNAT)].Packets+1 {
		t.Errorf("a NAT-ed reply with its pair kept: return %d, want TC_ACT_UNSPEC counted as nat", int32(ret))
	}
}

// TestProgramExpress checks the express lane: a pair's next packet on this CPU (the first takes
// the full way, which keeps the pair and fills the CPU's slot) is sent by the slot alone, with the pair and the roles gone; counted once, in its class,
// express and (toward a Pod's namespace) peer; voided by a new generation; not taken for a packet out of
// hops; and not kept at all where the agent gave no jiffy.
func TestProgramExpress(t *testing.T) {
	p := newProgEnv(t)
	oneCPU(t)
	pod, remote := netip.MustParseAddr("10.244.1.2"), netip.MustParseAddr("10.244.2.2")
	pod6, remote6 := netip.MustParseAddr("fd00:10:244:1::2"), netip.MustParseAddr("fd00:10:244:2::2")
	p.route(remote, 0)
	p.route(remote6, flagPeer)
	forget := func() { // the pairs and the peers' roles go; the generation stays
		for _, m := range []*ebpf.Map{p.set.maps.Pairs4, p.set.maps.Pairs6} {
			var k []byte
			for it := m.Iterate(); it.Next(&k, new([]byte)); {
				p.must(m.Delete(k))
			}
		}
		p.must(p.set.deleteAddr(peerPod))
		p.must(p.set.deleteAddr(peerPod6))
	}
	restore := func() {
		p.must(p.set.putAddr(peerPod, fastpathAddr{Flags: addrPeerPod}))
		p.must(p.set.putAddr(peerPod6, fastpathAddr{Flags: addrPeerPod}))
		p.bump()
	}
	for _, tick := range []uint32{tickNS(), 0} {
		p.cfg.TickNs = tick
		p.bump()
		for _, c := range []struct{ src, dst netip.Addr }{{pod, remote}, {pod6, remote6}} {
			first := p.counters()[stat(ViaExpress)]
			if ret, _ := p.run(frame(c.src, c.dst, 64)); ret != actRedirect {
				t.Fatalf("%s -> %s, first packet: return %d, want TC_ACT_REDIRECT", c.src, c.dst, int32(ret))
			}
			if n := p.counters()[stat(ViaExpress)].Packets - first.Packets; n != 0 {
				t.Errorf("%s -> %s: the first packet by the express lane, want the full way", c.src, c.dst)
			}
			// The slots emptied (as if other pairs had taken them): the next packet goes by
			// its pair, which fills the slot again for the one after.
			for i := range p.set.maps.Slots4.MaxEntries() {
				p.must(p.set.maps.Slots4.Put(i, make([]fastpathSlot4, p.cpus())))
				p.must(p.set.maps.Slots6.Put(i, make([]fastpathSlot6, p.cpus())))
			}
			if ret, _ := p.run(frame(c.src, c.dst, 64)); ret != actRedirect || p.counters()[stat(ViaExpress)] != first {
				t.Errorf("%s -> %s, its slot emptied: return %d, express +%d; want TC_ACT_REDIRECT by its pair", c.src, c.dst, int32(ret), p.counters()[stat(ViaExpress)].Packets-first.Packets)
			}
			forget()
			before := p.counters()
			ret, out := p.run(frame(c.src, c.dst, 64))
			after := p.counters()
			if tick == 0 {
				if ret != actUnspec {
					t.Errorf("%s -> %s, no jiffy known, pair and roles gone: return %d, want TC_ACT_UNSPEC (no slot kept)", c.src, c.dst, int32(ret))
				}
				restore()
				continue
			}
			if ret != actRedirect || [6]byte(out[0:6]) != nhDstMAC || [6]byte(out[6:12]) != nhSrcMAC || out[14+8-btoi(c.dst.Is6())] != 63 {
				t.Errorf("%s -> %s, by its slot: return %d, MACs %x -> %x; want TC_ACT_REDIRECT, the next hop's MACs and one hop less", c.src, c.dst, int32(ret), out[6:12], out[0:6])
			}
			fam, peer := btoi(c.dst.Is6()), uint64(btoi(c.dst.Is6()))
			d, dp, de := after[fam].Packets-before[fam].Packets, after[stat(ViaPeer)].Packets-before[stat(ViaPeer)].Packets, after[stat(ViaExpress)].Packets-before[stat(ViaExpress)].Packets
			if d != 1 || dp != peer || de != 1 {
				t.Errorf("%s -> %s, by its slot: pod-to-pod +%d, peer +%d, express +%d; want +1, +%d, +1", c.src, c.dst, d, dp, de, peer)
			}
			if after[fam].Bytes-before[fam].Bytes != uint64(len(frame(c.src, c.dst, 64))) {
				t.Errorf("%s -> %s, by its slot: pod-to-pod +%d bytes, want the frame's %d", c.src, c.dst, after[fam].Bytes-before[fam].Bytes, len(frame(c.src, c.dst, 64)))
			}
			if ret, _ := p.run(frame(c.src, c.dst, 1)); ret != actUnspec {
				t.Errorf("%s -> %s, TTL 1, by its slot: return %d, want TC_ACT_UNSPEC", c.src, c.dst, int32(ret))
			}
			p.bump() // a new generation: the slot is void, and the roles are gone
			if ret, _ := p.run(frame(c.src, c.dst, 64)); ret != actUnspec {
				t.Errorf("%s -> %s, after the update: return %d, want TC_ACT_UNSPEC (no roles)", c.src, c.dst, int32(ret))
			}
			restore()
		}
	}
}

// TestExpressLaneSize checks the slots' size: within the budget, a power of two, and a set
// loaded with fewer slots (a large machine's) still sends a pair by its slot: the program's
// mask follows the maps' size.
func TestExpressLaneSize(t *testing.T) {
	for _, c := range []struct {
		cpus int
		want uint32
	}{{1, 4096}, {2, 4096}, {22, 4096}, {23, 2048}, {64, 1024}, {128, 512}, {256, 256}, {4096, 256}} {
		if got := slotsPerCPU(c.cpus); got != c.want {
			t.Errorf("slotsPerCPU(%d) = %d, want %d", c.cpus, got, c.want)
		}
	}
	defer func(f func(int) uint32) { slotsFor = f }(slotsFor)
	slotsFor = func(int) uint32 { return 256 }
	p := newProgEnv(t)
	oneCPU(t)
	if n := p.set.maps.Slots4.MaxEntries(); n != 256 {
		t.Fatalf("slots4 holds %d slots, want 256", n)
	}
	// Pairs whose hash falls beyond the first 256 slots: the mask must bring them in.
	for i := range 4 {
		src, dst := netip.AddrFrom4([4]byte{10, 244, 1, byte(2 + i)}), netip.AddrFrom4([4]byte{10, 244, 2, byte(2 + i)})
		p.route(dst, 0)
		if ret, _ := p.run(frame(src, dst, 64)); ret != actRedirect {
			t.Fatalf("%s -> %s: return %d, want TC_ACT_REDIRECT", src, dst, int32(ret))
		}
		before := p.counters()[stat(ViaExpress)]
		if ret, _ := p.run(frame(src, dst, 64)); ret != actRedirect || p.counters()[stat(ViaExpress)].Packets != before.Packets+1 {
			t.Errorf("%s -> %s, 256 slots: return %d, want TC_ACT_REDIRECT by the express lane", src, dst, int32(ret))
		}
	}
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

// coarseNow is bpf_ktime_get_coarse_ns() as a program would read it now.
func coarseNow(t *testing.T) uint64 {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC_COARSE, &ts); err != nil {
		t.Fatal(err)
	}
	return uint64(ts.Nano())
}

// BenchmarkProgram is the program's own cost per packet (BPF_PROG_RUN repeated in the
// kernel, ns/packet; no redirect is carried out): a Pod's packet to a peer Pod redirected by
// the kept next hop (the common case), the same toward a Pod (the NAT check's lookup on top),
// and one handed to the stack (to a ClusterIP). Compare builds side by side, interleaved
// (`go test -c` of each, then alternate runs): the host's clock is noisy; the VM's pktgen
// rows (hostaccel bench) are the measure that counts.
// BenchmarkProgram reports the program's cost per packet as the kernel times BPF_PROG_RUN's
// loop (the test run's own cost is empty-program's, the least a redirect costs floor's). In the
// VM under icount (vmtest/run-in-vm.sh -i) a nanosecond is one guest instruction, so builds
// compare exactly; on the host it is time, and noisy.
func BenchmarkProgram(b *testing.B) {
	p := newProgEnv(b)
	pod, remote := netip.MustParseAddr("10.244.1.2"), netip.MustParseAddr("10.244.2.2")
	p.route(remote, flagPeer)
	p.route(pod, flagPeer)
	p.must(p.set.putIface(lo, fastpathIface{Role: uint32(RoleGateway), Mtu: 1500, Mtu6: 1500}))
	run := func(b *testing.B, prog *ebpf.Program, f []byte, want uint32) {
		const per = 200 // the runs share the frame: each one decrements its TTL
		var ns uint64
		for b.Loop() {
			ret, d, err := timedRun(prog, f, skbCtx{IngressIfindex: lo, Ifindex: lo}, per)
			if err != nil || ret != want {
				b.Fatalf("return %d (%v), want %d", int32(ret), err, int32(want))
			}
			ns += uint64(d)
		}
		b.ReportMetric(float64(ns)/float64(b.N), "ns/packet")
	}
	for _, c := range []struct {
		name string
		f    []byte
		role Role
		want uint32
	}{
		{"to-peer-pod", frame(pod, remote, 255), RoleGateway, actRedirect},
		{"to-local-pod", frame(remote, pod, 255), RoleTransport, actRedirect},
		{"to-service", frame(pod, netip.MustParseAddr("10.96.0.10"), 255), RoleGateway, actUnspec},
	} {
		b.Run(c.name, func(b *testing.B) {
			p.must(p.set.putIface(lo, fastpathIface{Role: uint32(c.role), Mtu: 1500, Mtu6: 1500}))
			run(b, p.set.prog, c.f, c.want)
		})
	}
	// The same toward a Pod with every handed mark set: what every such packet cost on a
	// long-running node before the marks were aged (every end handed to the stack marked one,
	// and none was ever cleared).
	b.Run("to-local-pod-marks-full", func(b *testing.B) {
		p.must(p.set.putIface(lo, fastpathIface{Role: uint32(RoleTransport), Mtu: 1500, Mtu6: 1500}))
		keys, marks := make([]uint32, handedMarks), make([]uint64, handedMarks)
		for i := range keys {
			keys[i], marks[i] = uint32(i), uint64(p.cfg.HandedEpoch)
		}
		_, err := p.set.maps.HandedMarks.BatchUpdate(keys, marks, nil)
		p.must(err)
		defer func() {
			_, err := p.set.maps.HandedMarks.BatchUpdate(keys, make([]uint64, len(keys)), nil)
			p.must(err)
		}()
		run(b, p.set.prog, frame(remote, pod, 255), actRedirect)
	})
	// A carried flow's packet by the NAT express lane (a ClusterIP's DNAT: the destination's
	// address and port rewritten, both checksums updated): the flow's slot, and the reverse
	// translation's for the frame the run before rewrote (the runs share the frame).
	b.Run("nat-express", func(b *testing.B) {
		p.cfg.Flags |= settingsNATCarry
		p.bump()
		defer func() { p.cfg.Flags &^= settingsNATCarry; p.bump() }()
		client, vip := netip.AddrPortFrom(pod, 40000), netip.MustParseAddrPort("10.96.0.10:80")
		backend := netip.AddrPortFrom(remote, 8080)
		for _, s := range [][2]netip.AddrPort{{vip, backend}, {backend, vip}} {
			p.putNATSlot(natSlot{from: client, to: s[0], nfrom: client, nto: s[1], gen: p.cfg.Generation, mtu: 1500, ingress: lo, until: math.MaxUint64})
		}
		run(b, p.set.prog, tcpFrame(client, vip, 255, tcpACK), actRedirect)
	})
	// The least a redirect costs: the MACs written, bpf_redirect_peer (as the bench's tc-floor).
	b.Run("floor", func(b *testing.B) {
		floor, err := ebpf.NewProgram(&ebpf.ProgramSpec{Type: ebpf.SchedCLS, License: "GPL",
			Instructions: asm.Instructions{
				asm.LoadMem(asm.R2, asm.R1, 76, asm.Word), // skb->data
				asm.LoadMem(asm.R3, asm.R1, 80, asm.Word), // skb->data_end
				asm.Mov.Reg(asm.R4, asm.R2),
				asm.Add.Imm(asm.R4, 14),
				asm.JGT.Reg(asm.R4, asm.R3, "pass"),
				asm.StoreImm(asm.R2, 0, 0x02, asm.Word),
				asm.StoreImm(asm.R2, 4, 0, asm.Half),
				asm.StoreImm(asm.R2, 6, 0x02, asm.Word),
				asm.StoreImm(asm.R2, 10, 1, asm.Half),
				asm.Mov.Imm(asm.R1, lo),
				asm.Mov.Imm(asm.R2, 0),
				asm.FnRedirectPeer.Call(),
				asm.Return(),
				asm.Mov.Imm(asm.R0, -1).WithSymbol("pass"),
				asm.Return(),
			}})
		p.must(err)
		defer floor.Close()
		run(b, floor, frame(pod, remote, 255), actRedirect)
	})
	// The test run's own cost: a program that returns at once.
	b.Run("empty-program", func(b *testing.B) {
		empty, err := ebpf.NewProgram(&ebpf.ProgramSpec{Type: ebpf.SchedCLS, License: "GPL",
			Instructions: asm.Instructions{asm.Mov.Imm(asm.R0, -1), asm.Return()}})
		p.must(err)
		defer empty.Close()
		run(b, empty, frame(pod, remote, 255), actUnspec)
	})
}

// timedRun runs prog repeat times on one frame with BPF_PROG_RUN and returns its last return
// code and the kernel's mean time per run (the ebpf library's Run does not return it with a
// context).
func timedRun(prog *ebpf.Program, data []byte, ctx skbCtx, repeat uint32) (uint32, uint32, error) {
	c := make([]byte, binary.Size(ctx))
	if _, err := binary.Encode(c, binary.NativeEndian, ctx); err != nil {
		return 0, 0, err
	}
	attr := struct {
		progFD, retval, dataSizeIn, dataSizeOut uint32
		dataIn, dataOut                         uint64
		repeat, duration, ctxSizeIn, ctxSizeOut uint32
		ctxIn, ctxOut                           uint64
		flags, cpu, batchSize, _                uint32
	}{progFD: uint32(prog.FD()), dataSizeIn: uint32(len(data)), dataIn: uint64(uintptr(unsafe.Pointer(&data[0]))),
		repeat: repeat, ctxSizeIn: uint32(len(c)), ctxIn: uint64(uintptr(unsafe.Pointer(&c[0])))}
	_, _, errno := unix.Syscall(unix.SYS_BPF, unix.BPF_PROG_TEST_RUN, uintptr(unsafe.Pointer(&attr)), unsafe.Sizeof(attr))
	runtime.KeepAlive(data)
	runtime.KeepAlive(c)
	if errno != 0 {
		return 0, 0, errno
	}
	return attr.retval, attr.duration, nil
}

// A packet that decides while narrow writes the maps (after its first settings write, before
// its removals and new exclusions reach the trie) keeps its pair and slot with that
// generation: once narrow has returned they are void, so the pair's next packets see the new
// exclusion at once, not only when widen ends after the attachments (~13 ms per new device
// with tcx).
func TestNarrowVoidsWhatWasDecidedDuringIt(t *testing.T) {
	p := newProgEnv(t)
	oneCPU(t)
	pod, remote := netip.MustParseAddr("10.244.1.2"), netip.MustParseAddr("10.244.2.2")
	cur := contents{
		ifaces: map[uint32]fastpathIface{lo: {Role: uint32(RoleGateway), Mtu: 1500, Mtu6: 1500}},
		addrs: map[netip.Prefix]fastpathAddr{
			localPod: {Flags: addrLocalPod}, localPod6: {Flags: addrLocalPod},
			peerPod: {Flags: addrPeerPod}, peerPod6: {Flags: addrPeerPod},
		},
		settings: policy(p.cfg),
	}
	w := contents{ifaces: maps.Clone(cur.ifaces), addrs: maps.Clone(cur.addrs), settings: p.cfg}
	w.addrs[netip.PrefixFrom(remote, 32)] = fastpathAddr{Flags: addrPeerPod | addrExclude} // the new exclusion
	w.settings.Generation = generationAfter(p.cfg.Generation)

	// narrow's first write: the settings of the generation after the live one
	p.cfg.Generation++
	during := w.settings
	during.Generation = p.cfg.Generation
	p.must(p.set.setSettings(during))
	p.route(remote, 0) // the FIB's answer, as a packet of that generation keeps it
	if ret, _ := p.run(frame(pod, remote, 64)); ret != actRedirect {
		t.Fatalf("a packet before the exclusion is in: return %d, want TC_ACT_REDIRECT", int32(ret))
	}
	var res Result
	p.must((&Manager{}).narrow(p.set, cur, w, false, &res))
	if ret, _ := p.run(frame(pod, remote, 64)); ret != actUnspec {
		t.Errorf("once narrow returned (the exclusion in the trie): return %d, want TC_ACT_UNSPEC (the slot kept during narrow void)", int32(ret))
	}
	for i := range p.set.maps.Slots4.MaxEntries() { // the slot emptied: by the pair
		p.must(p.set.maps.Slots4.Put(i, make([]fastpathSlot4, p.cpus())))
	}
	if ret, _ := p.run(frame(pod, remote, 64)); ret != actUnspec {
		t.Errorf("once narrow returned, the slot emptied: return %d, want TC_ACT_UNSPEC (the pair kept during narrow void)", int32(ret))
	}
}
