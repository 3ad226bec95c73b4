package tc

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"time"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/hostaccel/hostaccel/internal/conntrack"
)

// The handed marks (handed_marks in bpf/fastpath.c) say which client ends the program handed
// to the stack, so that only packets to those ends are looked up in handed and, where
// conntrack has them NAT-ed, go to the stack for the un-NAT. A mark is the epoch in which its
// end was last remembered; marks below settings.handed_since are void. Every DNS query to a
// ClusterIP remembers a new end, so without aging the marks fill up within hours on a busy
// node, and then every packet toward the Pods takes the handed lookup and the pairs' way
// instead of the express lane. Apply ages them (ageHanded) once a sample shows more than
// handedAgeAt of them set.

const (
	// handedFirstEpoch is a fresh set's epoch and since: a mark of 0 was never written.
	handedFirstEpoch = 1
	// handedAgeAt is the share of counting marks above which Apply ages them: up to it, one
	// packet in 16 toward the Pods whose end was never handed takes the handed lookup.
	handedAgeAt = 1.0 / 16
	// handedAgeEvery is the least time between two agings by one Manager: where the NAT-ed
	// connections alive fill that share on their own, aging cannot help, and each costs a
	// listing of conntrack.
	handedAgeEvery = time.Minute
	// handedSettle is how long ageHanded waits after it starts an epoch before it lists
	// conntrack: a packet whose program run read the old epoch is through the stack by then,
	// its connection confirmed (in the same softirq), so the listing holds it.
	handedSettle = 5 * time.Millisecond
)

// ageHanded voids the marks of the ends whose NAT-ed connections are gone: it starts a new
// epoch (the program marks new ends with it), marks the client ends of the NAT-ed connections
// that list finds with it (entering them in handed again, should the LRU have dropped one),
// then voids the older epochs (handed_since). Marks are whole values that the program and
// the agent only ever set to the current epoch, so neither undoes the other's. cfg is the
// set's settings, as written.
func (s *progSet) ageHanded(ctx context.Context, cfg *fastpathSettings, list func(context.Context) ([]conntrack.Flow, error)) error {
	next := *cfg
	next.HandedEpoch++
	if err := s.setSettings(next); err != nil {
		return err
	}
	*cfg = next // a failure below leaves the older marks counting: safe
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(handedSettle):
	}
	flows, err := list(ctx)
	if err != nil {
		return fmt.Errorf("tc: aging the handed marks: the NAT-ed connections: %w", err)
	}
	if err := s.rememberNATed(flows, next.HandedEpoch); err != nil {
		return fmt.Errorf("tc: aging the handed marks: %w", err)
	}
	next.HandedSince = next.HandedEpoch
	if err := s.setSettings(next); err != nil {
		return err
	}
	*cfg = next
	return nil
}

// rememberOpen enters the client ends of the NAT-ed connections conntrack holds now into a
// fresh set (first epoch): before it is attached, and again once it is (rememberNATed).
func (s *progSet) rememberOpen(ctx context.Context) error {
	flows, err := conntrack.ListNATed(ctx)
	if err != nil {
		return err
	}
	return s.rememberNATed(flows, handedFirstEpoch)
}

// rememberNATed enters the client end of every connection conntrack knows as NAT-ed into the
// handed map, with a mark of epoch: of a set about to be attached (the program records such
// ends only as their packets pass it, and a reply to a connection that is older than the
// program would otherwise be redirected past the un-NAT), and when ageHanded starts an epoch.
// Two batch writes.
func (s *progSet) rememberNATed(flows []conntrack.Flow, epoch uint32) error {
	var ends []fastpathEndpoint
	slots := map[uint32]bool{}
	for _, f := range flows {
		if !f.NATed() || (f.Orig.Proto != unix.IPPROTO_TCP && f.Orig.Proto != unix.IPPROTO_UDP) {
			continue
		}
		e := fastpathEndpoint{Port: htons(f.Orig.SrcPort), Proto: f.Orig.Proto}
		a := f.Orig.Src.Unmap()
		if a.Is4() {
			b := a.As4()
			copy(e.Addr[:], b[:])
		} else {
			e.Addr = a.As16()
		}
		ends = append(ends, e)
		slots[handedSlot(e)] = true
	}
	if len(ends) == 0 {
		return nil
	}
	// the marks first: an end whose mark is void is never looked up in handed
	keys, marks := make([]uint32, 0, len(slots)), make([]uint64, len(slots))
	for k := range slots {
		keys = append(keys, k)
	}
	for i := range marks {
		marks[i] = uint64(epoch)
	}
	if _, err := s.maps.HandedMarks.BatchUpdate(keys, marks, nil); err != nil {
		return fmt.Errorf("handed marks: %w", err)
	}
	// A kept answer of an end already in handed is voided too: conntrack is asked again.
	if _, err := s.maps.Handed.BatchUpdate(ends, make([]fastpathHandedEnd, len(ends)), nil); err != nil {
		return fmt.Errorf("handed: %w", err)
	}
	return nil
}

// handedMarks is HANDED_MARKS in bpf/fastpath.c.
const handedMarks = 1 << 18

// handedSlot is handed_mark() of bpf/fastpath.c (mark_hash): the index of e's mark in
// handed_marks.
func handedSlot(e fastpathEndpoint) uint32 {
	return progHash(foldAddr(e.Addr), uint32(e.Port)|uint32(e.Proto)<<16) & (handedMarks - 1)
}

// progHash is the program's hash of words (bpf/fastpath.c: from HASH_SEED, hash_step per
// word, then hash_end), each word as the program loads it on a little-endian machine.
func progHash(words ...uint32) uint32 {
	h := uint32(0x9e3779b9)
	for _, w := range words {
		h = (h ^ w) * 0x01000193
	}
	return h ^ h>>15
}

// foldAddr is an address as the program folds it to one word: its four words XOR-ed (an IPv4
// address, in the first four bytes, is its first word).
func foldAddr(a [16]byte) uint32 {
	var w uint32
	for i := 0; i < 16; i += 4 {
		w ^= binary.LittleEndian.Uint32(a[i:])
	}
	return w
}

// handedSample is how many marks handedFill reads: the first 1/64 of them (the hash spreads
// the ends evenly over the map).
const handedSample = handedMarks / 64

// handedFill estimates the share of handed_marks that counts (>= since) from the first
// handedSample marks: one batch read of 32 KiB.
func (s *progSet) handedFill(since uint32) (float64, error) {
	n, err := s.marksFrom(handedSample, since)
	return float64(n) / handedSample, err
}

// handedMarked counts the marks that count (>= since): status.
func (s *progSet) handedMarked(since uint32) (int, error) {
	return s.marksFrom(handedMarks, since)
}

// marksFrom counts the marks >= since among the first n.
func (s *progSet) marksFrom(n int, since uint32) (int, error) {
	keys, marks := make([]uint32, n), make([]uint64, n)
	got, err := s.maps.HandedMarks.BatchLookup(new(ebpf.MapBatchCursor), keys, marks, nil)
	if err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		return 0, fmt.Errorf("handed marks: %w", err)
	}
	c := 0
	for _, m := range marks[:got] {
		if m >= uint64(since) {
			c++
		}
	}
	return c, nil
}
