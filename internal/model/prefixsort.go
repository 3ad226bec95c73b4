package model

import (
	"cmp"
	"encoding/binary"
	"net/netip"
	"slices"
)

// PrefixKey is a prefix as integers, ordered by ComparePrefixKey as ComparePrefix orders
// prefixes: IPv4 before IPv6, then by address, then by length. Sorting keys costs a fraction
// of sorting prefixes with ComparePrefix, whose netip calls dominate it (10,000 peer CIDRs:
// ~4.5 ms per sort, in every sync of the tc datapath).
type PrefixKey struct {
	Hi, Lo uint64 // the address; an IPv4 one in Lo
	Bits   int
	V6     bool
}

// KeyOf is p's key.
func KeyOf(p netip.Prefix) PrefixKey {
	a := p.Addr()
	if a.Is4() {
		b := a.As4()
		return PrefixKey{Lo: uint64(binary.BigEndian.Uint32(b[:])), Bits: p.Bits()}
	}
	b := a.As16()
	return PrefixKey{Hi: binary.BigEndian.Uint64(b[:8]), Lo: binary.BigEndian.Uint64(b[8:]), Bits: p.Bits(), V6: true}
}

// ComparePrefixKey orders keys as ComparePrefix orders their prefixes.
func ComparePrefixKey(a, b PrefixKey) int {
	if a.V6 != b.V6 {
		if a.V6 {
			return 1
		}
		return -1
	}
	if a.Hi != b.Hi {
		return cmp.Compare(a.Hi, b.Hi)
	}
	if a.Lo != b.Lo {
		return cmp.Compare(a.Lo, b.Lo)
	}
	return a.Bits - b.Bits
}

// SortedOrder returns the indexes of n items whose prefixes key gives, in ComparePrefix
// order; items of equal prefixes stay in their order (stable). IPv4 prefixes sort as one
// integer each (address, length, index), IPv6 ones as keys.
func SortedOrder(n int, key func(i int) netip.Prefix) []int {
	type keyed struct {
		k PrefixKey
		i int
	}
	v4 := make([]uint64, 0, n)
	var v6 []keyed
	for i := range n {
		k := KeyOf(key(i))
		if !k.V6 && i < 1<<26 {
			v4 = append(v4, k.Lo<<32|uint64(k.Bits)<<26|uint64(i))
		} else {
			v6 = append(v6, keyed{k, i})
		}
	}
	slices.Sort(v4)
	slices.SortFunc(v6, func(a, b keyed) int {
		if c := ComparePrefixKey(a.k, b.k); c != 0 {
			return c
		}
		return a.i - b.i
	})
	out := make([]int, 0, n)
	for _, k := range v4 {
		out = append(out, int(k&(1<<26-1)))
	}
	for _, k := range v6 {
		out = append(out, k.i)
	}
	return out
}

// SortPrefixes sorts ps as slices.SortFunc(ps, ComparePrefix) does, in a fraction of its time.
func SortPrefixes(ps []netip.Prefix) {
	if len(ps) < 2 {
		return
	}
	order := SortedOrder(len(ps), func(i int) netip.Prefix { return ps[i] })
	sorted := make([]netip.Prefix, len(ps))
	for j, i := range order {
		sorted[j] = ps[i]
	}
	copy(ps, sorted)
}
