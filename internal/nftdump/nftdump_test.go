package nftdump

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"

	"sigs.k8s.io/knftables"
)

func structure(tx *knftables.Transaction) {
	tx.Add(&knftables.Table{})
	tx.Add(&knftables.Chain{Name: "c1"})
	tx.Add(&knftables.Chain{Name: "c0"})
	tx.Add(&knftables.Set{Name: "zz", Type: "ipv4_addr"})
	tx.Add(&knftables.Set{Name: "aa", Type: "ipv4_addr", Flags: []knftables.SetFlag{knftables.IntervalFlag}})
	tx.Add(&knftables.Map{Name: "vm", Type: "ipv4_addr : verdict"})
	tx.Add(&knftables.Map{Name: "mm", Type: "ipv4_addr : ipv4_addr"})
	tx.Add(&knftables.Rule{Chain: "c0", Rule: "ip daddr @aa accept"})
}

// randomElements draws elements with repeated keys (a repeat replaces the earlier element
// in its place), over every set and map, in random order.
func randomElements(r *rand.Rand, n int) []*knftables.Element {
	var out []*knftables.Element
	for range n {
		k := fmt.Sprintf("10.0.0.%d", r.IntN(n/2+1))
		switch r.IntN(4) {
		case 0:
			out = append(out, &knftables.Element{Set: "zz", Key: []string{k}})
		case 1:
			out = append(out, &knftables.Element{Set: "aa", Key: []string{k}, Comment: knftables.PtrTo(fmt.Sprint(r.IntN(3)))})
		case 2:
			out = append(out, &knftables.Element{Map: "vm", Key: []string{k}, Value: []string{fmt.Sprintf("goto c%d", r.IntN(2))}})
		default:
			out = append(out, &knftables.Element{Map: "mm", Key: []string{k}, Value: []string{fmt.Sprintf("192.0.2.%d", r.IntN(9))}})
		}
	}
	return out
}

func TestTableIsTheFakesDump(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for _, n := range []int{0, 1, 7, 60, 300} {
		elems := randomElements(r, n)
		fake := knftables.NewFake(knftables.InetFamily, "t")
		tx := fake.NewTransaction()
		structure(tx)
		for _, e := range elems {
			tx.Add(e)
		}
		if err := fake.Run(context.Background(), tx); err != nil {
			t.Fatal(err)
		}
		want := fake.Dump()
		got, err := Table(knftables.NewFake(knftables.InetFamily, "t"), structure, elems)
		if err != nil {
			t.Fatal(err)
		}
		if got != want {
			t.Errorf("%d elements: got\n%s\nwant (the Fake's dump)\n%s", n, got, want)
		}
	}
}

func TestTableRefusesWhatTheFakeRefuses(t *testing.T) {
	for _, c := range []struct {
		e    *knftables.Element
		want string
	}{
		{&knftables.Element{Set: "nope", Key: []string{"1.2.3.4"}}, `no such set "nope"`},
		{&knftables.Element{Map: "nope", Key: []string{"1.2.3.4"}, Value: []string{"1.1.1.1"}}, `no such map "nope"`},
		{&knftables.Element{Map: "vm", Key: []string{"1.2.3.4"}, Value: []string{"goto c9"}}, `no such chain "c9"`},
		{&knftables.Element{Map: "mm", Key: []string{"1.2.3.4"}}, "no map value"},
		{&knftables.Element{Set: "zz"}, "no key"},
	} {
		_, err := Table(knftables.NewFake(knftables.InetFamily, "t"), structure, []*knftables.Element{{Set: "zz", Key: []string{"10.1.1.1"}}, c.e})
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: error %v, want one saying %q", c.e, err, c.want)
		}
	}
}

// An invalid element (a map element without a value, a set element with one) that a later
// element of the same key replaces: the Fake refuses the transaction, and so does Table (it
// dumped it as if it were fine).
func TestTableRefusesAnInvalidElementReplacedLater(t *testing.T) {
	for _, elems := range [][]*knftables.Element{{
		{Map: "mm", Key: []string{"10.0.0.1"}},
		{Map: "mm", Key: []string{"10.0.0.1"}, Value: []string{"192.0.2.1"}},
	}, {
		{Set: "zz", Key: []string{"10.0.0.1"}, Value: []string{"192.0.2.1"}},
		{Set: "zz", Key: []string{"10.0.0.1"}},
	}} {
		fake := knftables.NewFake(knftables.InetFamily, "t")
		tx := fake.NewTransaction()
		structure(tx)
		for _, e := range elems {
			tx.Add(e)
		}
		ferr := fake.Run(context.Background(), tx)
		_, err := Table(knftables.NewFake(knftables.InetFamily, "t"), structure, elems)
		if ferr == nil || err == nil {
			t.Errorf("%v: Fake: %v; Table: %v (want both to refuse)", elems[0], ferr, err)
		}
	}
}
