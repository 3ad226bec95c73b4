package config

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"slices"
	"strings"
	"testing"
)

func fields(name string, ps ...string) []field {
	var out []field
	for i, p := range ps {
		out = append(out, field{name, i, netip.MustParsePrefix(p)})
	}
	return out
}

// overlapErrors checks a within itself when b is nil, else a against b.
func overlapErrors(a, b []field) []string {
	var errs Errors
	if b == nil {
		noOverlap(&errs, a)
	} else {
		noOverlapWith(&errs, a, b)
	}
	var out []string
	for _, e := range errs {
		out = append(out, e.Error())
	}
	return out
}

// bruteOverlap is the old check: every pair, in index order.
func bruteOverlap(a, b []field) []string {
	var out []string
	for i, x := range a {
		others, start := b, 0
		if b == nil {
			others, start = a, i+1
		}
		for _, y := range others[start:] {
			if x.p.Overlaps(y.p) {
				out = append(out, fmt.Sprintf("%s: %s overlaps %s %s", x.name(), x.p, y.name(), y.p))
			}
		}
	}
	return out
}

func TestNoOverlapCases(t *testing.T) {
	for _, tc := range []struct {
		name string
		a, b []field
		want []string
	}{
		{"nested", fields("x", "10.1.1.0/24", "10.0.0.0/8", "10.1.0.0/16"), nil, []string{
			"x[0]: 10.1.1.0/24 overlaps x[1] 10.0.0.0/8",
			"x[0]: 10.1.1.0/24 overlaps x[2] 10.1.0.0/16",
			"x[1]: 10.0.0.0/8 overlaps x[2] 10.1.0.0/16"}},
		{"adjacent", fields("x", "10.0.0.0/25", "10.0.0.128/25", "10.0.1.0/24", "10.0.0.255/32"), nil, []string{
			"x[1]: 10.0.0.128/25 overlaps x[3] 10.0.0.255/32"}},
		{"identical", fields("x", "10.0.0.0/24", "10.0.0.0/24", "10.0.0.0/24"), nil, []string{
			"x[0]: 10.0.0.0/24 overlaps x[1] 10.0.0.0/24",
			"x[0]: 10.0.0.0/24 overlaps x[2] 10.0.0.0/24"}},
		{"v4 and v6 never overlap", fields("x", "0.0.0.0/0", "::ffff:10.0.0.0/104", "::/0", "10.0.0.0/8"), nil, []string{
			"x[0]: 0.0.0.0/0 overlaps x[3] 10.0.0.0/8",
			"x[1]: ::ffff:10.0.0.0/104 overlaps x[2] ::/0"}},
		{"between lists", fields("a", "10.244.0.0/16", "fd00::/64", "10.96.0.0/12"), fields("b", "10.244.1.0/24", "fd00::/64", "10.0.0.0/8", "10.245.0.0/16"), []string{
			"a[0]: 10.244.0.0/16 overlaps b[0] 10.244.1.0/24",
			"a[0]: 10.244.0.0/16 overlaps b[2] 10.0.0.0/8",
			"a[1]: fd00::/64 overlaps b[1] fd00::/64",
			"a[2]: 10.96.0.0/12 overlaps b[2] 10.0.0.0/8"}},
		{"disjoint", fields("x", "10.0.0.0/24", "10.0.1.0/24", "fd00::/64", "fd00:0:0:1::/64"), nil, nil},
	} {
		if got := overlapErrors(tc.a, tc.b); !slices.Equal(got, tc.want) {
			t.Errorf("%s:\n got %q\nwant %q", tc.name, got, tc.want)
		}
	}
}

// The sweep finds exactly the pairs that comparing every pair finds, in the same order, on
// random sets dense with nesting, adjacency and both families.
func TestNoOverlapMatchesEveryPair(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	random := func(name string, n int) []field {
		seen := map[netip.Prefix]bool{}
		var out []field
		for len(out) < n {
			var p netip.Prefix
			switch r.IntN(3) {
			case 0:
				a := netip.AddrFrom4([4]byte{10, byte(r.IntN(4)), byte(r.IntN(256)), byte(r.IntN(256))})
				p = netip.PrefixFrom(a, 8+r.IntN(25)).Masked()
			case 1:
				var b [16]byte
				b[0], b[1], b[15] = 0xfd, byte(r.IntN(4)), byte(r.IntN(256))
				p = netip.PrefixFrom(netip.AddrFrom16(b), 8+r.IntN(121)).Masked()
			default: // IPv4-mapped IPv6: never overlaps IPv4
				a := netip.AddrFrom16(netip.AddrFrom4([4]byte{10, byte(r.IntN(4)), byte(r.IntN(256)), 0}).As16())
				p = netip.PrefixFrom(a, 96+8+r.IntN(25)).Masked()
			}
			if !seen[p] {
				seen[p] = true
				out = append(out, field{name, len(out), p})
			}
		}
		return out
	}
	for round := range 200 {
		a, b := random("a", 1+r.IntN(60)), random("b", 1+r.IntN(60))
		if got, want := overlapErrors(a, nil), bruteOverlap(a, nil); !slices.Equal(got, want) {
			t.Fatalf("round %d, within:\n got %s\nwant %s", round, strings.Join(got, "\n"), strings.Join(want, "\n"))
		}
		if got, want := overlapErrors(a, b), bruteOverlap(a, b); !slices.Equal(got, want) {
			t.Fatalf("round %d, between:\n got %s\nwant %s", round, strings.Join(got, "\n"), strings.Join(want, "\n"))
		}
	}
}

func manyExcludes(n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = netip.AddrFrom4([4]byte{10, byte(i >> 14), byte(i >> 6), byte(i << 2)}).String() + "/30"
	}
	return out
}

// BenchmarkParse40kExcludes: comparing every pair took 20 s here.
func BenchmarkParse40kExcludes(b *testing.B) {
	y := good + "exclude: [" + strings.Join(manyExcludes(40000), ", ") + "]\n"
	for b.Loop() {
		if _, err := Parse([]byte(y)); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkNoOverlap40k(b *testing.B) {
	f := fields("exclude", manyExcludes(40000)...)
	for b.Loop() {
		var errs Errors
		noOverlap(&errs, f)
		if len(errs) > 0 {
			b.Fatal(errs)
		}
	}
}

// TestOverlapWithinEachList: entries within one list may not overlap, whatever the other
// lists hold. Overlapping service CIDRs passed with local Pod CIDRs present (and nft then
// refused them in the flowtable's interval set: "conflicting intervals specified"); without
// local Pod CIDRs the checks between two lists read the empty one as "within the first",
// which reported the peer CIDRs' overlaps twice.
func TestOverlapWithinEachList(t *testing.T) {
	for _, c := range []struct{ name, yaml, want string }{
		{"with local Pod CIDRs", strings.Replace(good, "  gateways:", "  serviceCIDRs: [10.96.0.0/12, 10.96.0.0/16]\n  gateways:", 1),
			"node.serviceCIDRs[0]: 10.96.0.0/12 overlaps node.serviceCIDRs[1] 10.96.0.0/16"},
		{"without local Pod CIDRs", `
datapath: none
node:
  peerPodCIDRs: [10.244.0.0/16, 10.244.2.0/24]
  serviceCIDRs: [10.96.0.0/12, 10.96.0.0/16]
`, "node.peerPodCIDRs[0]: 10.244.0.0/16 overlaps node.peerPodCIDRs[1] 10.244.2.0/24\n" +
			"node.serviceCIDRs[0]: 10.96.0.0/12 overlaps node.serviceCIDRs[1] 10.96.0.0/16"},
	} {
		if _, err := Parse([]byte(c.yaml)); err == nil || err.Error() != c.want {
			t.Errorf("%s: got %v\nwant %s", c.name, err, c.want)
		}
	}
}
