package tc

import (
	"encoding/binary"
	"math"
	"net/netip"
	"testing"

	"github.com/cilium/ebpf"
)

const (
	tcpFIN = 0x01
	tcpSYN = 0x02
	tcpACK = 0x10
)

// tcpFrame builds an Ethernet frame (to loopback's all-zero MAC) with a TCP segment of flags
// from src to dst (IPv4 or IPv6), its checksums complete.
func tcpFrame(src, dst netip.AddrPort, ttl, flags uint8) []byte {
	tcp := make([]byte, 20+10)
	binary.BigEndian.PutUint16(tcp[0:], src.Port())
	binary.BigEndian.PutUint16(tcp[2:], dst.Port())
	binary.BigEndian.PutUint32(tcp[4:], 1000)
	tcp[12], tcp[13] = 5<<4, flags
	binary.BigEndian.PutUint16(tcp[14:], 65535)
	copy(tcp[20:], "0123456789")
	var ip []byte
	f := make([]byte, 14, 14+40+len(tcp))
	if src.Addr().Is4() {
		binary.BigEndian.PutUint16(f[12:], 0x0800)
		ip = make([]byte, 20)
		ip[0], ip[8], ip[9] = 0x45, ttl, 6
		binary.BigEndian.PutUint16(ip[2:], uint16(20+len(tcp)))
		copy(ip[12:], src.Addr().AsSlice())
		copy(ip[16:], dst.Addr().AsSlice())
		binary.BigEndian.PutUint16(ip[10:], ipChecksum(ip))
	} else {
		binary.BigEndian.PutUint16(f[12:], 0x86dd)
		ip = make([]byte, 40)
		ip[0], ip[6], ip[7] = 0x60, 6, ttl
		binary.BigEndian.PutUint16(ip[4:], uint16(len(tcp)))
		copy(ip[8:], src.Addr().AsSlice())
		copy(ip[24:], dst.Addr().AsSlice())
	}
	binary.BigEndian.PutUint16(tcp[16:], tcpChecksum(ip, tcp))
	return append(append(f, ip...), tcp...)
}

// tcpChecksum is the checksum a TCP segment (its checksum field zero or not) should carry
// under IP header ip: 0 when it already carries it (the sum over all folds to 0xffff).
func tcpChecksum(ip, tcp []byte) uint16 {
	var pseudo []byte
	if ip[0]>>4 == 4 {
		pseudo = make([]byte, 12, 12+len(tcp))
		copy(pseudo, ip[12:20])
		pseudo[9] = 6
		binary.BigEndian.PutUint16(pseudo[10:], uint16(len(tcp)))
	} else {
		pseudo = make([]byte, 40, 40+len(tcp))
		copy(pseudo, ip[8:40])
		binary.BigEndian.PutUint32(pseudo[32:], uint32(len(tcp)))
		pseudo[39] = 6
	}
	return ipChecksum(append(pseudo, tcp...))
}

// natHash is nat_hash4() / nat_hash6() of bpf/fastpath.c: the hash of a TCP flow as the packet
// holds it (an IPv6 address folded to one word).
func natHash(src, dst netip.AddrPort) uint32 {
	var ports [4]byte
	binary.BigEndian.PutUint16(ports[0:], src.Port())
	binary.BigEndian.PutUint16(ports[2:], dst.Port())
	return progHash(folded(src.Addr()), folded(dst.Addr()), le32(ports[:]))
}

// folded is foldAddr of a as the program holds it (an IPv4 address in the first four bytes).
func folded(a netip.Addr) uint32 {
	var b [16]byte
	copy(b[:], a.AsSlice())
	return foldAddr(b)
}

func le32(b []byte) uint32 { return binary.LittleEndian.Uint32(b) }

func words(b []byte) []uint32 {
	w := make([]uint32, len(b)/4)
	for i := range w {
		w[i] = le32(b[i*4:])
	}
	return w
}

// fold32 and the diffs below are the program's (fold32(), diffs()): one's complement sums of
// the words replaced, ~old + new.
func fold32(s uint64) uint32 {
	s = s&0xffffffff + s>>32
	s = s&0xffffffff + s>>32
	return uint32(s)
}

func wordDiff(old, new []uint32) uint32 {
	var s uint64
	for i := range old {
		if old[i] != new[i] {
			s += uint64(^old[i]) + uint64(new[i])
		}
	}
	return fold32(s)
}

// natSlot is a NAT express slot as the full way fills it: the flow from -> to becomes
// nfrom -> nto, sent by loopback's kept answer.
type natSlot struct {
	from, to, nfrom, nto netip.AddrPort
	gen, mtu, ingress    uint32
	until                uint64
	voided               uint32
	peer                 bool // into a Pod's namespace (bpf_redirect_peer)
}

// put writes s into every CPU's slot of its flow.
func (p *progEnv) putNATSlot(s natSlot) {
	var changes uint8
	addrs := func(a, b netip.Addr) []byte { return append(a.AsSlice(), b.AsSlice()...) }
	addrDiff := wordDiff(words(addrs(s.from.Addr(), s.to.Addr())), words(addrs(s.nfrom.Addr(), s.nto.Addr())))
	if addrDiff != 0 {
		changes |= 1 // NAT_ADDRS
	}
	var portDiff uint32
	old, new := uint32(htons(s.from.Port()))|uint32(htons(s.to.Port()))<<16, uint32(htons(s.nfrom.Port()))|uint32(htons(s.nto.Port()))<<16
	if old != new {
		changes |= 2 // NAT_PORTS
		portDiff = fold32(uint64(^old) + uint64(new))
	}
	w := fastpathNatSlot4{}.W // the way, of the same type in both slots
	w.Until, w.Generation, w.Ifindex, w.Mtu, w.Dmac, w.Smac = s.until, s.gen, lo, s.mtu, nhDstMAC, nhSrcMAC
	w.Stat = uint16(numStats + len(Supported)*4) // STAT_NAT_EXPRESS
	if s.peer {
		w.Stat++
		w.Flags = 1 // SLOT_PEER
	}
	idx := natHash(s.from, s.to) & (p.set.maps.NatSlots4.MaxEntries() - 1)
	if s.from.Addr().Is4() {
		putPerCPU(p, p.set.maps.NatSlots4, idx, fastpathNatSlot4{
			Saddr: le32(s.from.Addr().AsSlice()), Daddr: le32(s.to.Addr().AsSlice()), Sport: htons(s.from.Port()), Dport: htons(s.to.Port()), Ingress: s.ingress,
			Nsaddr: le32(s.nfrom.Addr().AsSlice()), Ndaddr: le32(s.nto.Addr().AsSlice()), Nsport: htons(s.nfrom.Port()), Ndport: htons(s.nto.Port()),
			AddrDiff: addrDiff, PortDiff: portDiff, Voided: s.voided, Changes: changes, W: w,
		})
		return
	}
	putPerCPU(p, p.set.maps.NatSlots6, idx, fastpathNatSlot6{
		Saddr: s.from.Addr().As16(), Daddr: s.to.Addr().As16(), Sport: htons(s.from.Port()), Dport: htons(s.to.Port()), Ingress: s.ingress,
		Nsaddr: s.nfrom.Addr().As16(), Ndaddr: s.nto.Addr().As16(), Nsport: htons(s.nfrom.Port()), Ndport: htons(s.nto.Port()),
		AddrDiff: addrDiff, PortDiff: portDiff, Voided: s.voided, Changes: changes, W: w,
	})
}

// putPerCPU writes v as every CPU's value of key k in per-CPU map m.
func putPerCPU[T any](p *progEnv, m *ebpf.Map, k uint32, v T) {
	all := make([]T, p.cpus())
	for i := range all {
		all[i] = v
	}
	p.must(m.Put(k, all))
}

// TestProgramNATExpress: a carried flow's packets whose NAT slot holds (filled here as the
// full way fills it after a packet carried by the flow's kept answer, which a test run cannot
// make: it needs conntrack) are translated, their checksums updated, and redirected with the
// slot's MACs, counted as carried and express; a packet with a SYN, FIN or RST takes the full
// way and voids the flow's slots; so do a new generation, the slot's time running out, too
// few hops, a packet larger than the MTU and NAT carry turned off.
func TestProgramNATExpress(t *testing.T) {
	p := newProgEnv(t)
	p.cfg.Flags |= settingsNATCarry
	p.bump()
	for _, c := range []struct{ client, vip, backend netip.AddrPort }{
		{netip.MustParseAddrPort("10.244.1.2:40000"), netip.MustParseAddrPort("10.96.0.10:80"), netip.MustParseAddrPort("10.244.2.9:8080")},
		{netip.MustParseAddrPort("[fd00:10:244:1::2]:40000"), netip.MustParseAddrPort("[fd00:10:96::10]:80"), netip.MustParseAddrPort("[fd00:10:244:2::9]:8080")},
	} {
		t.Run(fam(c.client.Addr().Is6()), func(t *testing.T) { natExpress(t, p, c.client, c.vip, c.backend) })
	}
}

// natExpress is TestProgramNATExpress for a client's flow to a VIP DNAT-ed to a backend.
func natExpress(t *testing.T, p *progEnv, client, vip, backend netip.AddrPort) {
	v6 := client.Addr().Is6()
	void := natHash(client, vip) & (1<<16 - 1)
	voided := func() uint32 {
		var v uint32
		p.must(p.set.maps.NatVoids.Lookup(void, &v))
		return v
	}
	holding := func() natSlot {
		return natSlot{from: client, to: vip, nfrom: client, nto: backend, gen: p.cfg.Generation, mtu: 1500, ingress: lo, until: math.MaxUint64, voided: voided()}
	}
	// the frame's addresses and ports, and the headers' offsets
	hdr, ttlAt, srcAt, dstAt := 20, 8, 12, 16
	if v6 {
		hdr, ttlAt, srcAt, dstAt = 40, 7, 8, 24
	}
	addr := func(b []byte) netip.Addr { a, _ := netip.AddrFromSlice(b); return a }
	// into a Pod's namespace: counted as peer too
	peer := holding()
	peer.peer = true
	p.putNATSlot(peer)
	before := p.counters()
	if ret, _ := p.run(tcpFrame(client, vip, 64, tcpACK)); ret != actRedirect {
		t.Errorf("by its NAT slot, to a Pod's namespace: return %d, want TC_ACT_REDIRECT", int32(ret))
	}
	after := p.counters()
	for _, c := range []string{ViaNATCarried, ViaExpress, ViaPeer} {
		if d := after[stat(c)].Packets - before[stat(c)].Packets; d != 1 {
			t.Errorf("by its NAT slot, to a Pod's namespace: via %s +%d, want +1", c, d)
		}
	}

	p.putNATSlot(holding())
	before = p.counters()
	in := tcpFrame(client, vip, 64, tcpACK)
	ret, out := p.run(in)
	after = p.counters()
	if ret != actRedirect {
		t.Fatalf("by its NAT slot: return %d, want TC_ACT_REDIRECT", int32(ret))
	}
	ip, tcp := out[14:14+hdr], out[14+hdr:]
	alen := len(client.Addr().AsSlice())
	if src, dst := addr(ip[srcAt:srcAt+alen]), addr(ip[dstAt:dstAt+alen]); src != client.Addr() || dst != backend.Addr() {
		t.Errorf("translated to %s -> %s, want %s -> %s", src, dst, client.Addr(), backend.Addr())
	}
	if sp, dp := binary.BigEndian.Uint16(tcp[0:]), binary.BigEndian.Uint16(tcp[2:]); sp != client.Port() || dp != backend.Port() {
		t.Errorf("ports %d -> %d, want %d -> %d", sp, dp, client.Port(), backend.Port())
	}
	if ip[ttlAt] != 63 || (!v6 && ipChecksum(ip) != 0) {
		t.Errorf("hops %d, IP checksum off by %#x: want 63 and a complete checksum", ip[ttlAt], ipChecksum(ip))
	}
	if c := tcpChecksum(ip, tcp); c != 0 {
		t.Errorf("TCP checksum off by %#x after the translation", c)
	}
	if [6]byte(out[0:6]) != nhDstMAC || [6]byte(out[6:12]) != nhSrcMAC {
		t.Errorf("MACs %x -> %x, want the slot's", out[6:12], out[0:6])
	}
	for _, c := range []struct {
		name string
		want uint64
	}{{ViaNATCarried, 1}, {ViaExpress, 1}, {ViaPeer, 0}} {
		if d := after[stat(c.name)].Packets - before[stat(c.name)].Packets; d != c.want {
			t.Errorf("via %s +%d, want +%d", c.name, d, c.want)
		}
	}
	if d := after[stat(ViaNATCarried)].Bytes - before[stat(ViaNATCarried)].Bytes; d != uint64(len(in)) {
		t.Errorf("via nat-carried +%d bytes, want the frame's %d", d, len(in))
	}

	// Each of these takes the full way, which carries nothing here (no conntrack entry, and
	// a ClusterIP is no address of a class): TC_ACT_UNSPEC, the frame untouched.
	for _, c := range []struct {
		name  string
		frame []byte
		slot  func(s *natSlot)
		setup func()
	}{
		{name: "TTL 1", frame: tcpFrame(client, vip, 1, tcpACK)},
		{name: "SYN", frame: tcpFrame(client, vip, 64, tcpSYN)},
		{name: "other ports", frame: tcpFrame(netip.AddrPortFrom(client.Addr(), 40001), vip, 64, tcpACK)},
		{name: "older generation", slot: func(s *natSlot) { s.gen-- }},
		{name: "time out", slot: func(s *natSlot) { s.until = 0 }},
		{name: "larger than the MTU", slot: func(s *natSlot) { s.mtu = 40 }},
		{name: "another device", slot: func(s *natSlot) { s.ingress = lo + 1 }},
		{name: "voided", slot: func(s *natSlot) { s.voided-- }},
		{name: "NAT carry off", setup: func() { p.cfg.Flags &^= settingsNATCarry; p.bump() }},
	} {
		if c.setup != nil {
			c.setup()
		}
		s := holding()
		if c.slot != nil {
			c.slot(&s)
		}
		p.putNATSlot(s)
		f := c.frame
		if f == nil {
			f = tcpFrame(client, vip, 64, tcpACK)
		}
		before := p.counters()
		if ret, out := p.run(f); ret != actUnspec || string(out) != string(f) {
			t.Errorf("%s: return %d, frame changed %v; want TC_ACT_UNSPEC, untouched", c.name, int32(ret), string(out) != string(f))
		}
		if d := p.counters()[stat(ViaExpress)].Packets - before[stat(ViaExpress)].Packets; d != 0 {
			t.Errorf("%s: express +%d, want 0", c.name, d)
		}
		p.cfg.Flags |= settingsNATCarry
		p.bump()
	}

	// A FIN voids the flow's slots on every CPU: the next packet takes the full way.
	p.putNATSlot(holding())
	v := voided()
	if ret, _ := p.run(tcpFrame(client, vip, 64, tcpFIN|tcpACK)); ret != actUnspec {
		t.Errorf("FIN: return %d, want TC_ACT_UNSPEC", int32(ret))
	}
	if got := voided(); got != v+1 {
		t.Errorf("FIN: the flow's void word %d, want %d", got, v+1)
	}
	if ret, _ := p.run(tcpFrame(client, vip, 64, tcpACK)); ret != actUnspec {
		t.Errorf("after the FIN: return %d, want TC_ACT_UNSPEC (its slot voided)", int32(ret))
	}
}
