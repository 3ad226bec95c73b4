package conntrack

import (
	"context"
	"fmt"
	"net/netip"
	"testing"

	"github.com/hostaccel/hostaccel/internal/testbed"

	"golang.org/x/sys/unix"
)

// Which NAT an entry made by addEntry has.
const (
	natNone = iota
	natSrc
	natDst
	natBoth
)

// addEntry makes the i-th TCP entry of family v4 (else v6): 10.1.x.y:40000 -> 10.2.x.y:80
// (fd01::/fd02:: for v6), translated as nat says (to 10.9.x.y / fd09::).
func addEntry(i int, v4 bool, nat int) error {
	addr := func(net byte) netip.Addr {
		if v4 {
			return netip.AddrFrom4([4]byte{10, net, byte(i >> 8), byte(i)})
		}
		return netip.AddrFrom16([16]byte{0xfd, net, 14: byte(i >> 8), 15: byte(i)})
	}
	e := testbed.ConntrackEntry{Proto: unix.IPPROTO_TCP, Src: netip.AddrPortFrom(addr(1), 40000), Dst: netip.AddrPortFrom(addr(2), 80)}
	if nat == natSrc || nat == natBoth {
		e.SNAT = netip.AddrPortFrom(addr(9), 0)
	}
	if nat == natDst || nat == natBoth {
		e.DNAT = netip.AddrPortFrom(addr(9), 0)
	}
	return testbed.AddConntrack(e)
}

// fill makes n entries of each family, every k-th of them NAT-ed, in turn source, destination
// and both; it returns the NAT-ed entries' original sources.
func fill(tb testing.TB, n, k int) map[netip.Addr]uint32 {
	tb.Helper()
	nated := map[netip.Addr]uint32{}
	for _, v4 := range []bool{true, false} {
		for i := range n {
			nat := natNone
			if i%k == 0 {
				nat = natSrc + i/k%3
			}
			if err := addEntry(i, v4, nat); err != nil {
				tb.Fatalf("entry %d (v4 %v, nat %d): %v", i, v4, nat, err)
			}
			if nat != natNone {
				a := netip.AddrFrom4([4]byte{10, 1, byte(i >> 8), byte(i)})
				if !v4 {
					a = netip.AddrFrom16([16]byte{0xfd, 1, 14: byte(i >> 8), 15: byte(i)})
				}
				nated[a] = map[int]uint32{natSrc: StatusSrcNAT, natDst: StatusDstNAT, natBoth: StatusSrcNAT | StatusDstNAT}[nat]
			}
		}
	}
	return nated
}

// ListNATed returns exactly the NAT-ed entries, each once (source, destination and both),
// and the kernel sends no other: it filters by the status bits. So does ListOffloaded.
func TestListNATed(t *testing.T) {
	testbed.RequireRoot(t)
	inNetns(t, func() {
		nated := fill(t, 300, 10)
		flows, err := ListNATed(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		got := map[netip.Addr]uint32{}
		for _, f := range flows {
			if _, dup := got[f.Orig.Src]; dup {
				t.Errorf("listed twice: %s", f)
			}
			got[f.Orig.Src] = f.Status & (StatusSrcNAT | StatusDstNAT)
		}
		if len(nated) != 60 || fmt.Sprint(got) != fmt.Sprint(nated) {
			t.Errorf("ListNATed gave %d entries, want the %d NAT-ed:\n got %v\nwant %v", len(got), len(nated), got, nated)
		}
		received := 0
		for _, sf := range []statusFilter{{StatusSrcNAT, StatusSrcNAT}, {StatusDstNAT, StatusSrcNAT | StatusDstNAT}} {
			_, n, err := dump(unix.AF_UNSPEC, sf)
			if err != nil {
				t.Fatal(err)
			}
			received += n
		}
		if received != len(nated) {
			t.Errorf("the kernel sent %d entries for the NAT-ed %d: it did not filter them", received, len(nated))
		}
		// none is in a flowtable (the VM's e2e tests list offloaded ones): the kernel sends none
		if off, err := ListOffloaded(context.Background()); err != nil || len(off) != 0 {
			t.Errorf("ListOffloaded = %d entries, %v; want none", len(off), err)
		}
		if _, n, err := dump(unix.AF_UNSPEC, statusFilter{StatusOffload, StatusOffload}); err != nil || n != 0 {
			t.Errorf("the kernel sent %d entries (%v) for the offloaded ones: none is", n, err)
		}
		all, err := List(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if len(all) != 600 {
			t.Errorf("List gave %d entries, want 600", len(all))
		}
	})
}

// BenchmarkListNATed: a table of 50,000 entries (25,000 per family), 1 in 100 or 1 in 2 of
// them NAT-ed: what the tc datapath lists (the NAT-ed ones), picked by the kernel;
// BenchmarkListAll: the same read whole and picked here, as the tc datapath did before.
func BenchmarkListNATed(b *testing.B) { benchmarkList(b, ListNATed) }

func BenchmarkListAll(b *testing.B) {
	benchmarkList(b, func(ctx context.Context) ([]Flow, error) {
		flows, err := List(ctx)
		var nated []Flow
		for _, f := range flows {
			if f.NATed() {
				nated = append(nated, f)
			}
		}
		return nated, err
	})
}

func benchmarkList(b *testing.B, list func(context.Context) ([]Flow, error)) {
	testbed.RequireRoot(b)
	for _, k := range []int{100, 2} {
		b.Run(fmt.Sprintf("1-in-%d-NATed", k), func(b *testing.B) {
			inNetns(b, func() { // on this goroutine: b.Loop runs here
				fill(b, 25000, k)
				for b.Loop() {
					flows, err := list(context.Background())
					if err != nil {
						b.Fatal(err)
					}
					if len(flows) != 50000/k {
						b.Fatalf("%d NAT-ed, want %d", len(flows), 50000/k)
					}
				}
			})
		})
	}
}

// DeleteDstNATed deletes the destination-NAT-ed entries that match picks, of either family,
// and no other.
func TestDeleteDstNATed(t *testing.T) {
	testbed.RequireRoot(t)
	inNetns(t, func() {
		nated := fill(t, 300, 10) // per family: 10 source-NAT-ed, 10 destination-, 10 both
		ctx := context.Background()
		var offered int
		n, err := DeleteDstNATed(ctx, func(f *Flow) bool {
			offered++
			return f.Orig.Src.Is6()
		})
		if err != nil || n != 20 {
			t.Errorf("deleting the IPv6 ones: %d deleted, %v; want 20", n, err)
		}
		if offered != 40 {
			t.Errorf("match was offered %d entries, want the 40 destination-NAT-ed", offered)
		}
		if n, err := DeleteDstNATed(ctx, func(*Flow) bool { return true }); err != nil || n != 20 {
			t.Errorf("deleting the rest: %d deleted, %v; want 20", n, err)
		}
		flows, err := List(ctx)
		if err != nil {
			t.Fatal(err)
		}
		left := 0
		for _, f := range flows {
			if f.Status&StatusDstNAT != 0 {
				t.Errorf("left: %s", f)
			}
			if nated[f.Orig.Src] != 0 {
				left++
			}
		}
		if len(flows) != 600-40 || left != 20 {
			t.Errorf("%d entries left, %d of them source-NAT-ed; want 560 and 20", len(flows), left)
		}
	})
}
