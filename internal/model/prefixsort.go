package model

import (
	"cmp"
	"encoding/binary"
	"net/netip"
	"slices"
)

// SortedOrder returns the indexes of n items, whose prefixes key gives, in ComparePrefix
// order (IPv4 before IPv6, then by address, then by length); items of equal prefixes keep
// their order (stable). Each prefix sorts as integers instead of through netip's comparisons:
// an IPv4 one as one uint64 (address, length, index), an IPv6 one as three. The config's
// overlap check uses it to order its entries without moving them.
func SortedOrder(n int, key func(i int) netip.Prefix) []int {
	out := make([]int, 0, n)
	if n >= 1<<26 { // beyond the index bits of the packed IPv4 keys
		for i := range n {
			out = append(out, i)
		}
		slices.SortStableFunc(out, func(a, b int) int { return ComparePrefix(key(a), key(b)) })
		return out
	}
	type key6 struct{ hi, lo, rest uint64 } // rest: length << 32 | index
	v4 := make([]uint64, 0, n)
	var v6 []key6
	for i := range n {
		p := key(i)
		if a := p.Addr(); a.Is4() {
			b := a.As4()
			v4 = append(v4, uint64(binary.BigEndian.Uint32(b[:]))<<32|uint64(p.Bits())<<26|uint64(i))
		} else {
			b := a.As16()
			v6 = append(v6, key6{binary.BigEndian.Uint64(b[:8]), binary.BigEndian.Uint64(b[8:]), uint64(p.Bits())<<32 | uint64(i)})
		}
	}
	slices.Sort(v4)
	slices.SortFunc(v6, func(a, b key6) int {
		return cmp.Or(cmp.Compare(a.hi, b.hi), cmp.Compare(a.lo, b.lo), cmp.Compare(a.rest, b.rest))
	})
	for _, k := range v4 {
		out = append(out, int(k&(1<<26-1)))
	}
	for _, k := range v6 {
		out = append(out, int(uint32(k.rest)))
	}
	return out
}

// SortPrefixes sorts ps as slices.SortFunc(ps, ComparePrefix) does, by SortedOrder's integer
// keys (BenchmarkSortPrefixes: 10,000 IPv4 /24s 0.9 against 1.5 ms; a third of them IPv6,
// 1.1 against 1.25 ms).
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
