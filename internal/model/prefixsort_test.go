package model

import (
	"math/rand/v2"
	"net/netip"
	"slices"
	"testing"
)

// randomPrefixes are n prefixes of both families, nested, disjoint and repeated.
func randomPrefixes(r *rand.Rand, n int) []netip.Prefix {
	ps := make([]netip.Prefix, n)
	for i := range ps {
		var a netip.Addr
		bits := 0
		if r.IntN(3) == 0 {
			var b [16]byte
			b[0], b[1], b[7], b[15] = 0xfd, byte(r.IntN(3)), byte(r.IntN(4)), byte(r.IntN(256))
			a, bits = netip.AddrFrom16(b), r.IntN(129)
		} else {
			a, bits = netip.AddrFrom4([4]byte{10, byte(r.IntN(4)), byte(r.IntN(256)), byte(r.IntN(256))}), r.IntN(33)
		}
		ps[i] = netip.PrefixFrom(a, bits).Masked()
		if i > 0 && r.IntN(10) == 0 {
			ps[i] = ps[r.IntN(i)]
		}
	}
	return ps
}

func TestSortPrefixesAsComparePrefix(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for _, n := range []int{0, 1, 2, 10, 1000, 20000} {
		ps := randomPrefixes(r, n)
		want := slices.Clone(ps)
		slices.SortStableFunc(want, ComparePrefix)
		got := slices.Clone(ps)
		SortPrefixes(got)
		if !slices.Equal(got, want) {
			t.Fatalf("n=%d: SortPrefixes differs from ComparePrefix's order", n)
		}
		order := SortedOrder(len(ps), func(i int) netip.Prefix { return ps[i] })
		for j := 1; j < len(order); j++ {
			a, b := order[j-1], order[j]
			if c := ComparePrefix(ps[a], ps[b]); c > 0 || c == 0 && a > b {
				t.Fatalf("n=%d: SortedOrder puts %d (%s) before %d (%s)", n, a, ps[a], b, ps[b])
			}
		}
	}
}

func BenchmarkSortPrefixes(b *testing.B) {
	benchSorts(b, randomPrefixes(rand.New(rand.NewPCG(1, 2)), 10000))
}

// BenchmarkSortPrefixes4: 10,000 IPv4 /24s, as peer Pod CIDRs are.
func BenchmarkSortPrefixes4(b *testing.B) {
	r := rand.New(rand.NewPCG(1, 2))
	ps := make([]netip.Prefix, 10000)
	for i := range ps {
		ps[i] = netip.PrefixFrom(netip.AddrFrom4([4]byte{10, byte(r.IntN(256)), byte(r.IntN(256)), 0}), 24)
	}
	benchSorts(b, ps)
}

func benchSorts(b *testing.B, ps []netip.Prefix) {
	b.Run("ComparePrefix", func(b *testing.B) {
		for b.Loop() {
			slices.SortFunc(slices.Clone(ps), ComparePrefix)
		}
	})
	b.Run("SortPrefixes", func(b *testing.B) {
		for b.Loop() {
			SortPrefixes(slices.Clone(ps))
		}
	})
}
