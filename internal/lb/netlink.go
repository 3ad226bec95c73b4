package lb

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"regexp"
	"strconv"
	"strings"
	"sync"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/google/nftables/userdata"
	"golang.org/x/sys/unix"
	"sigs.k8s.io/knftables"

	"github.com/hostaccel/hostaccel/internal/nftlist"
)

// The netlink lane: a transaction made only of what a change to a service's backends needs
// (map and set elements added and deleted, a service chain flushed and its counter and
// schedule rules added) goes to the kernel as one netlink batch, without nft. nft 1.0.6 reads
// every table, chain and set of the namespace before it runs any transaction: 70-90 ms at
// 5,000 services, for a change of a few elements. The batch is atomic as nft's is; anything
// else (a table, map, chain or counter added or deleted, another rule, a dynamic map) makes
// the whole transaction nft's, as does a batch the kernel refuses (nothing of it was applied).
// What the lane writes is what nft writes for the same text: TestNetlinkLaneMatchesNFT
// compares the kernel's expressions of both, rule by rule and element by element.

// txn is a knftables transaction that also keeps its operations, for the netlink lane.
type txn struct {
	*knftables.Transaction
	ops []txOp
	// whole: something was added to the transaction past Add, Delete and Flush (a table
	// added whole): the lane does not carry it.
	whole bool
}

type txVerb int

const (
	txAdd txVerb = iota
	txDelete
	txFlush
)

type txOp struct {
	verb txVerb
	obj  knftables.Object
}

// newTxn starts a transaction. Its knftables context is a family-less interface's on a kernel
// with object comments, which is what knftables.New("", "") gives wherever the load balancer
// works (its tables' comments carry their layout), so it needs no nft run to build: the lane
// may carry it, and nft runs it as its own.
func newTxn() *txn { return &txn{Transaction: txContext.NewTransaction()} }

var txContext = knftables.NewFake("", "")

func (t *txn) Add(o knftables.Object) {
	t.Transaction.Add(o)
	t.ops = append(t.ops, txOp{txAdd, o})
}

func (t *txn) Delete(o knftables.Object) {
	t.Transaction.Delete(o)
	t.ops = append(t.ops, txOp{txDelete, o})
}

func (t *txn) Flush(o knftables.Object) {
	t.Transaction.Flush(o)
	t.ops = append(t.ops, txOp{txFlush, o})
}

// errLane: the lane does not carry this transaction (nft runs it).
var errLane = errors.New("not for the netlink lane")

// Netlink sends a transaction the lane carries as one batch; it returns errLane, before
// sending anything, for one it does not. typeOf names a map's or set's typeof ("" when
// unknown).
type Netlink func(ctx context.Context, tx *txn, typeOf func(TableRef, string) string) error

// lane is the real lane (google/nftables) on a netlink socket it keeps between batches:
// closing a netfilter socket after a commit waits for the kernel to release the commit's old
// objects (an RCU grace period, 5-19 ms here), which a socket per batch added to every change
// a caller waits for (an API call returns when its change is applied). A batch from a thread
// in another network namespace than the socket's opens one there.
type lane struct {
	mu    sync.Mutex
	c     *nftables.Conn
	netns uint64 // inode of c's namespace
}

func (l *lane) run(_ context.Context, tx *txn, typeOf func(TableRef, string) string) error {
	b, err := laneBatch(tx, typeOf)
	if err != nil {
		return err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if ns := nftlist.ThreadNetNSInode(); l.c == nil || ns != l.netns {
		l.close()
		c, err := nftables.New(nftables.AsLasting())
		if err != nil {
			return fmt.Errorf("netlink: %w", err)
		}
		l.c, l.netns = c, ns
	}
	if err := b(l.c); err != nil {
		l.close() // its queued messages must not go with the next batch
		return err
	}
	if err := l.c.Flush(); err != nil {
		l.close() // a refused batch may leave answers unread
		return err
	}
	return nil
}

// Close closes the socket, if any (a later batch opens another).
func (l *lane) Close() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.close()
}

// close closes the socket, if any (l.mu held, or l not shared).
func (l *lane) close() {
	if l.c != nil {
		_ = l.c.CloseLasting()
		l.c = nil
	}
}

// laneMaxOps is the most operations the lane carries in one batch: a change of backends is a
// handful; a larger transaction (thousands of elements) pays nft's cache fetch once for all.
const laneMaxOps = 1024

// laneBatch compiles tx's operations into calls on a netlink connection, or returns errLane.
func laneBatch(tx *txn, typeOf func(TableRef, string) string) (func(*nftables.Conn) error, error) {
	if tx.whole || len(tx.ops) == 0 || len(tx.ops) > laneMaxOps {
		return nil, errLane
	}
	var steps []func(*nftables.Conn) error
	tables := map[TableRef]*nftables.Table{}
	table := func(f knftables.Family, name string) (*nftables.Table, error) {
		ref := TableRef{f, name}
		if t := tables[ref]; t != nil {
			return t, nil
		}
		fam, ok := nftlist.NetlinkFamily(f)
		if !ok {
			return nil, errLane
		}
		t := &nftables.Table{Family: fam, Name: name}
		tables[ref] = t
		return t, nil
	}
	for _, op := range tx.ops {
		switch o := op.obj.(type) {
		case *knftables.Chain:
			if op.verb != txFlush {
				return nil, errLane
			}
			t, err := table(o.Family, o.Table)
			if err != nil {
				return nil, err
			}
			ch := &nftables.Chain{Table: t, Name: o.Name}
			steps = append(steps, func(c *nftables.Conn) error { c.FlushChain(ch); return nil })
		case *knftables.Rule:
			if op.verb != txAdd || o.Handle != nil || o.Index != nil {
				return nil, errLane
			}
			t, err := table(o.Family, o.Table)
			if err != nil {
				return nil, err
			}
			exprs, err := ruleExprs(o.Rule, t.Family)
			if err != nil {
				return nil, err
			}
			r := &nftables.Rule{Table: t, Chain: &nftables.Chain{Table: t, Name: o.Chain}, Exprs: exprs}
			if o.Comment != nil {
				r.UserData = userdata.AppendString(nil, userdata.TypeComment, *o.Comment)
			}
			steps = append(steps, func(c *nftables.Conn) error { c.AddRule(r); return nil })
		case *knftables.Element:
			if op.verb == txFlush || o.Comment != nil {
				return nil, errLane
			}
			t, err := table(o.Family, o.Table)
			if err != nil {
				return nil, err
			}
			name := o.Set + o.Map
			el, err := laneElement(typeOf(TableRef{o.Family, o.Table}, name), o, op.verb == txDelete)
			if err != nil {
				return nil, err
			}
			s := &nftables.Set{Table: t, Name: name, IsMap: o.Map != ""}
			if op.verb == txDelete {
				steps = append(steps, func(c *nftables.Conn) error { return c.SetDeleteElements(s, []nftables.SetElement{el}) })
			} else {
				steps = append(steps, func(c *nftables.Conn) error { return c.SetAddElements(s, []nftables.SetElement{el}) })
			}
		default:
			return nil, errLane
		}
	}
	return func(c *nftables.Conn) error {
		for _, s := range steps {
			if err := s(c); err != nil {
				return err
			}
		}
		return nil
	}, nil
}

// laneElement encodes e as nft does for a map or set of typeOf (its key, and its data unless
// del): each part of a concatenation padded to 4 bytes, integers in the byte order of their
// expression.
func laneElement(typeOf string, e *knftables.Element, del bool) (nftables.SetElement, error) {
	var el nftables.SetElement
	keyType, dataType, isMap := strings.Cut(typeOf, " : ")
	if typeOf == "" || isMap != (e.Map != "") {
		return el, errLane
	}
	key, err := laneData(keyType, e.Key)
	if err != nil {
		return el, err
	}
	el.Key = key
	if !isMap || del {
		return el, nil
	}
	if dataType == "verdict" {
		if len(e.Value) != 1 {
			return el, errLane
		}
		v, err := laneVerdict(e.Value[0])
		if err != nil {
			return el, err
		}
		el.VerdictData = v
		return el, nil
	}
	if el.Val, err = laneData(dataType, e.Value); err != nil {
		return el, err
	}
	return el, nil
}

// laneData encodes the values of a (concatenated) typeof.
func laneData(typeOf string, vals []string) ([]byte, error) {
	parts := strings.Split(typeOf, " . ")
	if len(parts) != len(vals) {
		return nil, errLane
	}
	var out []byte
	for i, p := range parts {
		b, err := laneValue(p, vals[i])
		if err != nil {
			return nil, err
		}
		out = append(out, b...)
		if len(parts) > 1 {
			for len(out)%4 != 0 {
				out = append(out, 0)
			}
		}
	}
	return out, nil
}

// laneProtos are the protocols' numbers (also the conntrack flushes' filter).
var laneProtos = map[string]byte{"tcp": unix.IPPROTO_TCP, "udp": unix.IPPROTO_UDP, "sctp": unix.IPPROTO_SCTP}

// laneValue encodes one value of one typeof expression (those the load balancer's maps use).
func laneValue(typeOf, v string) ([]byte, error) {
	switch typeOf {
	case "numgen inc mod 1": // the slot maps' keys: numgen's result, in host byte order
		n, err := strconv.ParseUint(v, 10, 32)
		if err != nil {
			return nil, errLane
		}
		return binary.NativeEndian.AppendUint32(nil, uint32(n)), nil
	case "ip daddr", "ip saddr", "ip6 daddr", "ip6 saddr":
		a, err := netip.ParseAddr(v)
		if err != nil || a.Zone() != "" || a.Is4() != strings.HasPrefix(typeOf, "ip ") {
			return nil, errLane
		}
		return a.AsSlice(), nil
	case "meta l4proto":
		if p, ok := laneProtos[v]; ok {
			return []byte{p}, nil
		}
		return nil, errLane
	case "th dport", "th sport", "tcp dport", "udp dport", "sctp dport":
		n, err := strconv.ParseUint(v, 10, 16)
		if err != nil {
			return nil, errLane
		}
		return binary.BigEndian.AppendUint16(nil, uint16(n)), nil
	}
	return nil, errLane
}

func laneVerdict(v string) (*expr.Verdict, error) {
	kind, chain, _ := strings.Cut(v, " ")
	switch {
	case kind == "goto" && chain != "":
		return &expr.Verdict{Kind: expr.VerdictGoto, Chain: chain}, nil
	case kind == "jump" && chain != "":
		return &expr.Verdict{Kind: expr.VerdictJump, Chain: chain}, nil
	}
	return nil, errLane
}

var (
	laneCounter  = regexp.MustCompile(`^counter name "([A-Za-z0-9_.-]+)"$`)
	laneSchedule = regexp.MustCompile(`^(?:meta l4proto (tcp|udp|sctp) )?dnat (ip|ip6) to numgen (inc|random) mod ([0-9]+) map @([A-Za-z0-9_.-]+)$`)
)

// ruleExprs compiles the rules of a service chain the lane carries, as nft 1.0.6 does:
// its counter (`counter name "C"`) and its schedule
// (`[meta l4proto P ]dnat ip|ip6 to numgen inc|random mod N map @M`).
func ruleExprs(rule string, fam nftables.TableFamily) ([]expr.Any, error) {
	if m := laneCounter.FindStringSubmatch(rule); m != nil {
		return []expr.Any{&expr.Objref{Type: unix.NFT_OBJECT_COUNTER, Name: m[1]}}, nil
	}
	m := laneSchedule.FindStringSubmatch(rule)
	if m == nil || fam != nftables.TableFamilyINet {
		return nil, errLane
	}
	n, err := strconv.ParseUint(m[4], 10, 32)
	if err != nil || n == 0 {
		return nil, errLane
	}
	var out []expr.Any
	if m[1] != "" {
		out = append(out,
			&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{laneProtos[m[1]]}})
	}
	ng := uint32(unix.NFT_NG_INCREMENTAL)
	if m[3] == "random" {
		ng = unix.NFT_NG_RANDOM
	}
	nat := &expr.NAT{Type: expr.NATTypeDestNAT, Family: unix.NFPROTO_IPV4, RegAddrMin: 1}
	if m[2] == "ip6" {
		nat.Family = unix.NFPROTO_IPV6
	}
	if m[1] != "" { // the map's data is address . port: the port follows the address's registers
		nat.RegProtoMin = 9 // NFT_REG32_01, after an IPv4 address
		if m[2] == "ip6" {
			nat.RegProtoMin = 2 // NFT_REG_2, after an IPv6 address
		}
	}
	return append(out,
		&expr.Numgen{Register: 1, Modulus: uint32(n), Type: ng},
		&expr.Lookup{SourceRegister: 1, DestRegister: 1, IsDestRegSet: true, SetName: m[5]},
		nat), nil
}
