package tc

import (
	"context"
	"encoding/binary"
	"net/netip"
	"testing"

	"github.com/hostaccel/hostaccel/internal/conntrack"
)

// withPorts sets an IPv4 frame's UDP ports.
func withPorts(f []byte, sport, dport uint16) []byte {
	binary.BigEndian.PutUint16(f[14+20:], sport)
	binary.BigEndian.PutUint16(f[14+22:], dport)
	return f
}

// The handed marks fill with every end the program hands to the stack (here 30,000 UDP
// datagrams from a Pod to a ClusterIP, each from another port, as DNS queries are); aging them
// voids the marks of ends conntrack no longer holds as NAT-ed (a kept NAT answer of such an
// end is not even looked up: its reply is redirected) and keeps those it holds (their replies
// still go to the stack), and the program marks new ends in the new epoch.
func TestHandedAging(t *testing.T) {
	p := newProgEnv(t)
	pod, remote, vip := netip.MustParseAddr("10.244.1.2"), netip.MustParseAddr("10.244.2.2"), netip.MustParseAddr("10.96.0.10")
	p.route(remote, 0)

	const ends = 30000
	for i := range ends {
		if ret, _ := p.run(withPorts(frame(pod, vip, 64), uint16(10000+i), 53)); ret != actUnspec {
			t.Fatalf("to a ClusterIP: return %d, want TC_ACT_UNSPEC", int32(ret))
		}
	}
	marked, err := p.set.handedMarked(p.cfg.HandedSince)
	p.must(err)
	// 30,000 ends in 2^18 slots: ~28,350 distinct
	if marked < 27000 || marked > ends {
		t.Errorf("after %d ends handed: %d marks count, want ~28,350", ends, marked)
	}
	fill, err := p.set.handedFill(p.cfg.HandedSince)
	p.must(err)
	if fill <= handedAgeAt {
		t.Fatalf("fill %.3f estimated from the sample, want above %.4f (~0.108)", fill, handedAgeAt)
	}

	// Two ends the replies of frame(pod, remote) go to, each with a kept answer "NAT-ed":
	// gone is no longer in conntrack, alive is.
	end := func(port uint16) fastpathEndpoint {
		e := fastpathEndpoint{Port: htons(port), Proto: 17}
		copy(e.Addr[:], remote.AsSlice())
		return e
	}
	gone, alive := end(2000), end(2001)
	keptNAT := func(e fastpathEndpoint) {
		h := fastpathHandedEnd{Asked: coarseNow(t), Port: htons(1000), Nat: 1}
		copy(h.Server[:], pod.AsSlice())
		p.must(p.set.maps.Handed.Put(e, h))
	}
	for port, e := range map[uint16]fastpathEndpoint{2000: gone, 2001: alive} {
		p.markHanded(e)
		keptNAT(e)
		if ret, _ := p.run(withPorts(frame(pod, remote, 64), 1000, port)); ret != actUnspec {
			t.Fatalf("before aging, a reply to port %d with a kept NAT answer: return %d, want TC_ACT_UNSPEC", port, int32(ret))
		}
	}

	list := func(context.Context) ([]conntrack.Flow, error) {
		tuple := conntrack.Tuple{Src: remote, Dst: vip, SrcPort: 2001, DstPort: 1000, Proto: 17}
		return []conntrack.Flow{
			{Orig: tuple, Status: conntrack.StatusDstNAT},
			{Orig: conntrack.Tuple{Src: remote, Dst: vip, SrcPort: 2002, DstPort: 1000, Proto: 17}}, // not NAT-ed
		}, nil
	}
	was := p.cfg
	p.must(p.set.ageHanded(context.Background(), &p.cfg, list))
	var live fastpathSettings
	p.must(p.set.settings.Lookup(uint32(0), &live))
	if p.cfg.HandedEpoch != live.HandedEpoch || p.cfg.HandedSince != live.HandedSince || live.HandedEpoch != was.HandedEpoch+1 || live.HandedSince != live.HandedEpoch || policy(live) != policy(was) || live.Generation != was.Generation {
		t.Errorf("settings after aging %+v, want %+v with the next epoch as epoch and since, all else as it was", live, was)
	}
	if marked, err = p.set.handedMarked(p.cfg.HandedSince); err != nil || marked != 1 {
		t.Errorf("after aging: %d marks count (%v), want 1 (the end conntrack holds as NAT-ed)", marked, err)
	}
	if fill, _ := p.set.handedFill(p.cfg.HandedSince); fill > 1.0/handedSample {
		t.Errorf("after aging: fill %.4f, want at most one mark in the sample", fill)
	}
	var h fastpathHandedEnd
	if err := p.set.maps.Handed.Lookup(alive, &h); err != nil || h.Asked != 0 {
		t.Errorf("the end conntrack holds: handed entry %+v (%v), want entered again with nothing asked", h, err)
	}

	keptNAT(gone)
	keptNAT(alive)
	if ret, _ := p.run(withPorts(frame(pod, remote, 64), 1000, 2000)); ret != actRedirect {
		t.Errorf("after aging, a reply to an end conntrack no longer holds: return %d, want TC_ACT_REDIRECT (its mark is void: handed is not looked up)", int32(ret))
	}
	before := p.counters()
	if ret, _ := p.run(withPorts(frame(pod, remote, 64), 1000, 2001)); ret != actUnspec || p.counters()[stat(PassNAT)].Packets != before[stat(PassNAT)].Packets+1 {
		t.Errorf("after aging, a reply to an end conntrack holds as NAT-ed: return %d, want TC_ACT_UNSPEC counted as nat", int32(ret))
	}

	// The program marks a new end with the new epoch.
	if ret, _ := p.run(withPorts(frame(pod, vip, 64), 40000, 53)); ret != actUnspec {
		t.Fatalf("to a ClusterIP: return %d, want TC_ACT_UNSPEC", int32(ret))
	}
	e := fastpathEndpoint{Port: htons(40000), Proto: 17}
	copy(e.Addr[:], pod.AsSlice())
	var m uint64
	p.must(p.set.maps.HandedMarks.Lookup(handedSlot(e), &m))
	if m != uint64(p.cfg.HandedEpoch) {
		t.Errorf("a new end's mark %d, want the new epoch %d", m, p.cfg.HandedEpoch)
	}
}

// A pod-to-pod server end whose mark counts only because a handed end shares its slot is not
// entered into handed: conntrack, asked once, says its flow is not NAT-ed, its pair is kept,
// and its packets from several clients ask no more (an entry would keep one client's answer,
// and the others would ask conntrack at every packet).
func TestMarkCollisionLeavesPodToPodEndOut(t *testing.T) {
	p := newProgEnv(t)
	pod, remote := netip.MustParseAddr("10.244.1.2"), netip.MustParseAddr("10.244.2.2")
	p.route(remote, 0)
	server := fastpathEndpoint{Port: htons(2000), Proto: 17} // frame(pod, remote) goes to remote:2000
	copy(server.Addr[:], remote.AsSlice())
	p.markHanded(server) // as another end's remember() does when it shares the slot
	for i := range 10 {
		if ret, _ := p.run(withPorts(frame(pod, remote, 64), uint16(1000+i%2), 2000)); ret != actRedirect {
			t.Fatalf("packet %d: return %d, want TC_ACT_REDIRECT", i, int32(ret))
		}
	}
	var h fastpathHandedEnd
	if err := p.set.maps.Handed.Lookup(server, &h); err == nil {
		t.Errorf("a pod-to-pod server end that only shares a mark was entered into handed: %+v", h)
	}
	// conntrack's answer is kept per flow (direct_flows, per CPU): one per client, which
	// kept_pair reads instead of asking again.
	type directFlow struct {
		Key   [40]byte
		Asked uint64
	}
	var i uint32
	var perCPU []directFlow
	kept := map[[40]byte]bool{} // (a test run may move to another CPU between packets)
	for it := p.set.maps.DirectFlows.Iterate(); it.Next(&i, &perCPU); {
		for _, d := range perCPU {
			if d.Asked != 0 {
				kept[d.Key] = true
			}
		}
	}
	if flows := len(kept); flows != 2 {
		t.Errorf("direct_flows holds %d flows after packets of 2, want conntrack's answer kept for each", flows)
	}
}
