package lb

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
	"sigs.k8s.io/knftables"

	"github.com/hostaccel/hostaccel/internal/conntrack"
	"github.com/hostaccel/hostaccel/internal/testbed"
)

// laneServices are services of every shape whose backend changes the lane carries (rr and
// weight, one port and all ports, IPv4 and IPv6, dnat and snat), a service with
// persistence (whose changes are nft's), and a hash service (its schedule rule is nft's).
func laneServices(change int) []Service {
	be := func(addr string, port int) Backend { return Backend{Address: addr, Port: port} }
	svcs := []Service{
		{Name: "web", VIPs: []string{"198.18.0.1"}, Port: 80, Backends: []Backend{be("10.0.0.1", 8080), be("10.0.0.2", 8080)}},
		{Name: "dns", VIPs: []string{"198.18.0.2"}, Port: 53, Protocol: "udp", Scheduler: Weighted,
			Backends: []Backend{be("10.0.1.1", 53), be("10.0.1.2", 53)}},
		{Name: "all", VIPs: []string{"198.18.0.3"}, Backends: []Backend{be("10.0.2.1", 0), be("10.0.2.2", 0)}},
		{Name: "six", VIPs: []string{"fd00:18::4"}, Port: 443, Topology: SNAT,
			Backends: []Backend{be("fd00:1::1", 8443), be("fd00:1::2", 8443)}},
		{Name: "sticky", VIPs: []string{"198.18.0.5"}, Port: 80, Persistence: &Duration{Duration: time.Minute},
			Backends: []Backend{be("10.0.3.1", 80), be("10.0.3.2", 80)}},
	}
	switch change {
	case 1: // the lane's: drain (2 -> 1 slots), a backend replaced, one added, weights, a VIP added
		svcs[0].Backends[1].State = StateDrain
		svcs[1].Backends[0].Address = "10.0.1.9"
		svcs[1].Backends[1].Weight = knftables.PtrTo(3)
		svcs[2].Backends = append(svcs[2].Backends, be("10.0.2.3", 0))
		svcs[3].Backends = append(svcs[3].Backends, be("fd00:1::3", 8443))
		svcs[0].VIPs = append(svcs[0].VIPs, "198.18.0.11")
	case 2: // nft's: no backend left (reject), a persistent service's backend gone
		svcs[0].Backends = nil
		svcs[4].Backends = svcs[4].Backends[:1]
	}
	return svcs
}

// TestNetlinkLaneMatchesNFT applies the same changes to two namespaces, one with the netlink
// lane and one with nft alone, and requires the kernel to hold the same expressions, rule by
// rule and element by element (nft --debug=netlink), and the lane to have carried the
// changes it is for.
func TestNetlinkLaneMatchesNFT(t *testing.T) {
	testbed.RequireRoot(t)
	ctx := context.Background()
	type side struct {
		ns *testbed.NS
		m  *Manager
	}
	var sides [2]*side
	for i := range sides {
		ns, err := testbed.NewNS("lane")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { ns.Close() })
		s := &side{ns: ns}
		if err := ns.Do(func() (err error) { s.m, err = NewManager(); return err }); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(s.m.Close)
		sides[i] = s
	}
	if sides[0].m.Netlink == nil {
		t.Fatalf("the netlink lane is off (%s set?)", EnvNFTOnly)
	}
	sides[1].m.Netlink = nil // nft alone
	var rv Resolver
	var rr Renderer
	steps := []struct {
		change int
		lane   bool // the lane carries it
	}{{0, false}, {1, true}, {0, true}, {2, false}, {0, false}, {1, true}}
	for step, st := range steps {
		change := st.change
		r := rr.Render(rv.Resolve(laneServices(change), nil, testEnv))
		var got [2]string
		for i, s := range sides {
			var res Result
			if err := s.ns.Do(func() (err error) { res, err = s.m.ApplyChanges(ctx, r); return err }); err != nil {
				t.Fatalf("step %d (change %d), side %d: %v", step, change, i, err)
			}
			wantLane := i == 0 && st.lane
			if res.Netlink != wantLane {
				t.Errorf("step %d (change %d), side %d: netlink %v, want %v (result %+v)", step, change, i, res.Netlink, wantLane, res)
			}
			out, err := s.ns.Exec("nft", "--debug=netlink", "list", "table", "inet", NATTable)
			if err != nil {
				t.Fatal(err)
			}
			got[i] = normalizeDebug(out)
		}
		if got[0] != got[1] {
			t.Errorf("step %d (change %d): the kernel differs, lane:\n%s\nnft:\n%s", step, change, got[0], got[1])
		}
	}
	// A new Manager (a one-shot apply) whose change the lane carries runs no nft transaction,
	// so it never makes its knftables interface (nft --version and --check).
	err := sides[0].ns.Do(func() error {
		m, err := NewManager()
		if err != nil {
			return err
		}
		defer m.Close()
		res, err := m.ApplyChanges(ctx, rr.Render(rv.Resolve(laneServices(0), nil, testEnv)))
		if err != nil {
			return err
		}
		if !res.Netlink || m.NFT != nil {
			t.Errorf("a change the lane carries: netlink %v, knftables made %v (result %+v)", res.Netlink, m.NFT != nil, res)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

var (
	ruleHeader = regexp.MustCompile(`(?m)^(inet \S+ \S+)( [0-9]+)+$`)
	counts     = regexp.MustCompile(`packets [0-9]+ bytes [0-9]+`)
	handles    = regexp.MustCompile(` # handle [0-9]+`)
)

// normalizeDebug drops what differs between two namespaces given the same ruleset: rule
// handles and positions, counters' values, the order of a set's elements (a hash's).
func normalizeDebug(s string) string {
	s = ruleHeader.ReplaceAllString(s, "$1")
	s = counts.ReplaceAllString(s, "packets N bytes N")
	s = handles.ReplaceAllString(s, "")
	lines := strings.Split(strings.TrimSpace(s), "\n")
	for i := 0; i < len(lines); {
		j := i
		for j < len(lines) && strings.HasPrefix(lines[j], "\telement ") {
			j++
		}
		slices.Sort(lines[i:j])
		i = max(j, i+1)
	}
	return strings.Join(lines, "\n")
}

// TestLaneCarriesOnly: the lane takes element changes and service chains' counter and
// schedule rules; anything else is nft's, before anything is sent.
func TestLaneCarriesOnly(t *testing.T) {
	typeOf := func(_ TableRef, name string) string {
		return map[string]string{
			"slots":    "numgen inc mod 1 : ip daddr . tcp dport",
			"services": "ip daddr . meta l4proto . th dport : verdict",
		}[name]
	}
	fam, tab := knftables.InetFamily, NATTable
	c := "comment"
	lane := []knftables.Object{
		&knftables.Element{Family: fam, Table: tab, Map: "slots", Key: []string{"0"}, Value: []string{"10.0.0.1", "80"}},
		&knftables.Element{Family: fam, Table: tab, Map: "services", Key: []string{"198.18.0.1", "tcp", "80"}, Value: []string{"goto svc-web-v4"}},
		&knftables.Rule{Family: fam, Table: tab, Chain: "svc-web-v4", Rule: `counter name "svc-web-v4"`, Comment: &c},
		&knftables.Rule{Family: fam, Table: tab, Chain: "svc-web-v4", Rule: "meta l4proto tcp dnat ip to numgen inc mod 3 map @slots", Comment: &c},
	}
	nftOnly := []knftables.Object{
		&knftables.Chain{Family: fam, Table: tab, Name: "svc-new-v4"},
		&knftables.Counter{Family: fam, Table: tab, Name: "svc-new-v4"},
		&knftables.Rule{Family: fam, Table: tab, Chain: "svc-web-v4", Rule: "reject", Comment: &c},
		&knftables.Rule{Family: fam, Table: tab, Chain: "svc-web-v4", Rule: "meta l4proto tcp dnat ip to jhash ip saddr mod 3 seed 0x1 map @slots"},
		&knftables.Element{Family: fam, Table: tab, Map: "flows", Key: []string{"10.1.1.1"}, Value: []string{"10.0.0.1"}}, // a dynamic map (no typeof given)
		&knftables.Element{Family: fam, Table: tab, Map: "slots", Key: []string{"zero"}, Value: []string{"10.0.0.1", "80"}},
		&knftables.Element{Family: fam, Table: tab, Map: "slots", Key: []string{"0"}, Value: []string{"fd00::1", "80"}},
		&knftables.Element{Family: fam, Table: tab, Map: "services", Key: []string{"198.18.0.1", "icmp", "80"}, Value: []string{"goto svc-web-v4"}},
	}
	build := func(objs ...knftables.Object) *txn {
		tx := newTxn()
		tx.Flush(&knftables.Chain{Family: fam, Table: tab, Name: "svc-web-v4"})
		for _, o := range objs {
			tx.Add(o)
		}
		return tx
	}
	if _, err := laneBatch(build(lane...), typeOf); err != nil {
		t.Fatalf("the lane refused its own: %v", err)
	}
	for _, o := range nftOnly {
		if _, err := laneBatch(build(append(lane[:2:2], o)...), typeOf); !errors.Is(err, errLane) {
			t.Errorf("the lane took %#v: %v", o, err)
		}
	}
	var many []knftables.Object
	for i := range laneMaxOps {
		many = append(many, &knftables.Element{Family: fam, Table: tab, Map: "slots", Key: []string{strconv.Itoa(i)}, Value: []string{"10.0.0.1", "80"}})
	}
	if _, err := laneBatch(build(many...), typeOf); !errors.Is(err, errLane) {
		t.Errorf("the lane took %d operations", len(many)+1)
	}
	whole := build(lane...)
	whole.whole = true
	if _, err := laneBatch(whole, typeOf); !errors.Is(err, errLane) {
		t.Errorf("the lane took a table added whole")
	}
}

// TestLaneElementBytes: concatenations pad every part to 4 bytes, numgen keys are in host
// byte order, ports in network byte order (what nft writes; TestNetlinkLaneMatchesNFT checks
// it against a kernel).
func TestLaneElementBytes(t *testing.T) {
	e := &knftables.Element{Map: "services", Key: []string{"198.18.0.7", "tcp", "80"}, Value: []string{"goto c"}}
	el, err := laneElement("ip daddr . meta l4proto . th dport : verdict", e, false)
	if err != nil {
		t.Fatal(err)
	}
	if want := []byte{198, 18, 0, 7, 6, 0, 0, 0, 0, 80, 0, 0}; !bytes.Equal(el.Key, want) {
		t.Errorf("key % x, want % x", el.Key, want)
	}
	if el.VerdictData == nil || el.VerdictData.Chain != "c" {
		t.Errorf("verdict %+v", el.VerdictData)
	}
	e = &knftables.Element{Map: "slots", Key: []string{"1"}, Value: []string{"10.0.0.14", "8080"}}
	if el, err = laneElement("numgen inc mod 1 : ip daddr . tcp dport", e, false); err != nil {
		t.Fatal(err)
	}
	if len(el.Key) != 4 || el.Key[0]+el.Key[3] != 1 { // 1 in host byte order, either end
		t.Errorf("key % x", el.Key)
	}
	if want := []byte{10, 0, 0, 14, 0x1f, 0x90, 0, 0}; !bytes.Equal(el.Val, want) {
		t.Errorf("data % x, want % x", el.Val, want)
	}
}

// TestManagerLaneFallsBack: a transaction the lane carries goes to it; when the kernel
// refuses the batch (nothing applied), or the lane does not carry it, nft runs it.
func TestManagerLaneFallsBack(t *testing.T) {
	ctx := context.Background()
	m, f := NewFakeManager()
	m.FullEvery = time.Hour
	var calls int
	var refuse error
	m.Netlink = func(_ context.Context, tx *txn, typeOf func(TableRef, string) string) error {
		calls++
		if _, err := laneBatch(tx, typeOf); err != nil {
			return err
		}
		return refuse
	}
	var rv Resolver
	var rr Renderer
	apply := func(change int) Result {
		t.Helper()
		res, err := m.ApplyChanges(ctx, rr.Render(rv.Resolve(laneServices(change), nil, testEnv)))
		if err != nil {
			t.Fatal(err)
		}
		return res
	}
	if res := apply(0); res.Netlink || calls != 1 { // a table added whole: nft's
		t.Fatalf("first apply: netlink %v after %d calls", res.Netlink, calls)
	}
	refuse = errors.New("netlink receive: invalid argument")
	if res := apply(1); res.Netlink || calls != 2 {
		t.Fatalf("refused batch: netlink %v after %d calls", res.Netlink, calls)
	}
	dump := f.Dump()
	if !strings.Contains(dump, "198.18.0.11") {
		t.Fatalf("nft did not run the refused batch's transaction:\n%s", dump)
	}
	refuse = nil
	if res := apply(0); !res.Netlink || calls != 3 {
		t.Fatalf("a drain undone: netlink %v after %d calls", res.Netlink, calls)
	}
	if f.Dump() != dump { // the lane's batch "ran": the Fake, standing for nft, saw nothing
		t.Fatalf("nft ran a transaction the lane carried")
	}
}

// The lane keeps its socket between batches, but a batch from a thread in another network
// namespace goes to that namespace: each namespace gets its own element, and only its own.
// A batch the kernel refuses leaves the socket usable for the next one.
func TestLaneKeepsItsSocketPerNamespace(t *testing.T) {
	testbed.RequireRoot(t)
	var nss [2]*testbed.NS
	for i := range nss {
		ns, err := testbed.NewNS("lanens")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { ns.Close() })
		if err := ns.NFT("add table inet t\nadd map inet t m { typeof numgen inc mod 1 : ip daddr . tcp dport ; }\n"); err != nil {
			t.Fatal(err)
		}
		nss[i] = ns
	}
	typeOf := func(TableRef, string) string { return "numgen inc mod 1 : ip daddr . tcp dport" }
	add := func(key string) *txn {
		tx := newTxn()
		tx.Add(&knftables.Element{Family: knftables.InetFamily, Table: "t", Map: "m", Key: []string{key}, Value: []string{"10.0.0." + key, "80"}})
		return tx
	}
	var l lane
	defer l.close()
	for round := range 3 {
		for i, ns := range nss {
			key := strconv.Itoa(round*2 + i)
			if err := ns.Do(func() error { return l.run(context.Background(), add(key), typeOf) }); err != nil {
				t.Fatalf("round %d, namespace %d: %v", round, i, err)
			}
		}
		// Refused: the map has no element 99 to delete.
		tx := newTxn()
		tx.Delete(&knftables.Element{Family: knftables.InetFamily, Table: "t", Map: "m", Key: []string{"99"}})
		if err := nss[0].Do(func() error { return l.run(context.Background(), tx, typeOf) }); err == nil {
			t.Fatal("deleting an element that is not there: no error")
		}
	}
	for i, ns := range nss {
		out, err := ns.Exec("nft", "list", "map", "inet", "t", "m")
		if err != nil {
			t.Fatal(err)
		}
		for round := range 3 {
			for j := range nss {
				key := strconv.Itoa(round*2 + j)
				if has := strings.Contains(out, key+" : 10.0.0."+key+" . 80"); has != (i == j) {
					t.Errorf("namespace %d has element %s: %v\n%s", i, key, has, out)
				}
			}
		}
	}
}

// A Manager keeps its lane's and its generation reader's sockets between applies, and Close
// closes them: a socket left open would keep a deleted namespace alive.
func TestManagerCloseClosesItsSockets(t *testing.T) {
	testbed.RequireRoot(t)
	ns, err := testbed.NewNS("mclose")
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Close()
	fds := func() int {
		ents, err := os.ReadDir("/proc/self/fd")
		if err != nil {
			t.Fatal(err)
		}
		return len(ents)
	}
	ctx := context.Background()
	var rv Resolver
	var rr Renderer
	before := fds()
	var m *Manager
	err = ns.Do(func() error {
		var err error
		if m, err = NewManager(); err != nil {
			return err
		}
		for change := range 2 {
			if _, err := m.Apply(ctx, rr.Render(rv.Resolve(laneServices(change), nil, testEnv))); err != nil {
				return err
			}
		}
		if n := fds(); n < before+2 {
			t.Errorf("after a change by the lane: %d fds, %d before: the sockets are not kept", n, before)
		}
		m.Close()
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	// A closed socket's descriptor may be released a moment after Close returns (the
	// runtime's poller closes it when its last use ends): a leak is one still open after a
	// second while m is reachable.
	n := fds()
	for deadline := time.Now().Add(time.Second); n != before && time.Now().Before(deadline); n = fds() {
		time.Sleep(time.Millisecond)
	}
	if n != before {
		t.Errorf("after Close: %d fds, %d before", n, before)
	}
	runtime.KeepAlive(m) // until here no finalizer may close what Close left open
}

// A backend's flush takes the connections it answers on its port to the service's VIPs and
// ports, not its entries on another port (another service's, or another backend on the same
// host), nor another VIP's or family's.
func TestConntrackFilters(t *testing.T) {
	vip, other := netip.MustParseAddr("192.0.2.10"), netip.MustParseAddr("192.0.2.11")
	be := netip.MustParseAddr("10.0.0.1")
	flow := func(dst netip.Addr, dport uint16, src netip.Addr, sport uint16) *conntrack.Flow {
		f := &conntrack.Flow{}
		f.Orig.Proto, f.Orig.Dst, f.Orig.DstPort = unix.IPPROTO_TCP, dst, dport
		f.Reply.Src, f.Reply.SrcPort = src, sport
		return f
	}
	filter := conntrackFilter([]ConntrackFlush{{[]netip.Addr{vip, netip.MustParseAddr("2001:db8::10")}, []int{80}, "tcp", be, 8080}})
	match := filter.match
	for _, c := range []struct {
		what string
		flow *conntrack.Flow
		want bool
	}{
		{"its connection", flow(vip, 80, be, 8080), true},
		{"the same host on another port", flow(vip, 80, be, 8081), false},
		{"another service's port", flow(vip, 443, be, 8080), false},
		{"another VIP", flow(other, 80, be, 8080), false},
	} {
		if got := match(c.flow); got != c.want {
			t.Errorf("%s: matched %v, want %v", c.what, got, c.want)
		}
	}
	if n := len(filter); n != 1 {
		t.Errorf("%d keys, want 1 (the IPv6 VIP is of another family than the backend)", n)
	}
	// Backend port 0 keeps the client's port; no port at all matches every port.
	if f := conntrackFilter([]ConntrackFlush{{[]netip.Addr{vip}, []int{80, 443}, "tcp", be, 0}}); len(f) != 2 || !f.match(flow(vip, 443, be, 443)) || f.match(flow(vip, 443, be, 80)) {
		t.Errorf("ports kept: %+v", f)
	}
	if f := conntrackFilter([]ConntrackFlush{{[]netip.Addr{vip}, nil, "tcp", be, 0}}); len(f) != 1 || !f.match(flow(vip, 1234, be, 4321)) || f.match(flow(other, 1234, be, 4321)) {
		t.Errorf("no ports: %+v", f)
	}
	// Several flushes: one filter takes each one's entries, and only those; of both families.
	be6, vip6 := netip.MustParseAddr("2001:db8:1::2"), netip.MustParseAddr("2001:db8::11")
	f := conntrackFilter([]ConntrackFlush{{[]netip.Addr{vip}, []int{80}, "tcp", be, 8080}, {[]netip.Addr{other, vip6}, []int{53}, "udp", be6, 5353}})
	udp := flow(vip6, 53, be6, 5353)
	udp.Orig.Proto = unix.IPPROTO_UDP
	if !f.match(flow(vip, 80, be, 8080)) || !f.match(udp) || f.match(flow(vip6, 53, be6, 5353)) || f.match(flow(other, 53, be6, 5353)) {
		t.Errorf("two flushes: %+v", f)
	}
}

// On the kernel: a backend's flush deletes its connection to the service and keeps the same
// host's connection on another port; two backends' flushes in one call (one reading of the
// table) delete both's (entries made with conntrack -I in a namespace).
func TestFlushConntrackOnTheKernel(t *testing.T) {
	testbed.RequireRoot(t)
	ns, err := testbed.NewNS("ctflush")
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Close()
	for _, e := range [][2]string{{"1234", "8080"}, {"1235", "8081"}, {"1236", "8080"}, {"1237", "8080"}} {
		dport, vip, be := "80", "192.0.2.10", "10.0.0.1"
		if e[0] == "1236" {
			dport = "443" // another service's port on the same VIP and backend port
		}
		if e[0] == "1237" {
			vip, be = "192.0.2.11", "10.0.0.2" // another service's backend, flushed in the same call
		}
		// DNAT-ed, as the load balancer's connections are
		if out, err := ns.Exec("conntrack", "-I", "-p", "tcp", "-s", "198.51.100.1", "-d", vip, "--sport", e[0], "--dport", dport,
			"--dst-nat", be+":"+e[1], "--state", "ESTABLISHED", "-t", "100"); err != nil {
			t.Fatal(out, err)
		}
	}
	if err := ns.Do(func() error {
		return flushConntrack([]ConntrackFlush{
			{[]netip.Addr{netip.MustParseAddr("192.0.2.10")}, []int{80}, "tcp", netip.MustParseAddr("10.0.0.1"), 8080},
			{[]netip.Addr{netip.MustParseAddr("192.0.2.11"), netip.MustParseAddr("2001:db8::11")}, []int{80}, "tcp", netip.MustParseAddr("10.0.0.2"), 8080},
		})
	}); err != nil {
		t.Fatal(err)
	}
	out, err := ns.Exec("conntrack", "-L")
	if err != nil {
		t.Fatal(out, err)
	}
	if strings.Contains(out, "sport=1234") || strings.Contains(out, "sport=1237") || !strings.Contains(out, "sport=1235") || !strings.Contains(out, "sport=1236") {
		t.Errorf("after flushing 10.0.0.1:8080 of 192.0.2.10:80 and 10.0.0.2:8080 of 192.0.2.11:80:\n%s", out)
	}
}

// BenchmarkFlushConntrack: the flushes of 100 backends that leave in one sync, on a conntrack
// table of 50,000 other entries (TCP, made over netlink in a namespace), all of them DNAT-ed
// (a load balancer's host) or 1 in 100 (a node whose connections are mostly its Pods'):
// flushConntrack against what it did before (netlink's delete with a filter, one call per
// family, each reading the whole table). None of the entries is the backends': this is the
// cost of finding them.
func BenchmarkFlushConntrack(b *testing.B) {
	testbed.RequireRoot(b)
	var flushes []ConntrackFlush
	for i := range 100 {
		flushes = append(flushes, ConntrackFlush{[]netip.Addr{netip.AddrFrom4([4]byte{192, 0, 2, byte(100 + i)})}, []int{80}, "tcp", netip.AddrFrom4([4]byte{10, 2, 0, byte(i)}), 8080})
	}
	before := func() error {
		set := conntrackFilter(flushes)
		_, err := netlink.ConntrackDeleteFilters(netlink.ConntrackTable, unix.AF_INET, netlinkFilter{set})
		if err == nil {
			_, err = netlink.ConntrackDeleteFilters(netlink.ConntrackTable, unix.AF_INET6, netlinkFilter{set})
		}
		return err
	}
	now := func() error { return flushConntrack(flushes) }
	for _, every := range []int{1, 100} {
		benchmarkFlushConntrack(b, every, before, now)
	}
}

// benchmarkFlushConntrack measures before and now on a table in which every every-th entry is
// DNAT-ed. The namespace goes before the next one's: conntrack's hash table is the host's,
// walked whole by every dump.
func benchmarkFlushConntrack(b *testing.B, every int, before, now func() error) {
	ns, err := testbed.NewNS("ctbench")
	if err != nil {
		b.Fatal(err)
	}
	defer ns.Close()
	{
		const entries = 50000
		if err := ns.Do(func() error {
			for i := range entries {
				e := testbed.ConntrackEntry{Proto: unix.IPPROTO_TCP,
					Src: netip.AddrPortFrom(netip.AddrFrom4([4]byte{198, 18, byte(i >> 8), byte(i)}), 40000),
					Dst: netip.AddrPortFrom(netip.AddrFrom4([4]byte{192, 0, 2, 10}), 80)}
				if i%every == 0 {
					e.DNAT = netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 1, byte(i >> 8), byte(i)}), 8080)
				}
				if err := testbed.AddConntrack(e); err != nil {
					return fmt.Errorf("entry %d: %w", i, err)
				}
			}
			flows, err := conntrack.List(context.Background())
			if err == nil && len(flows) != entries {
				err = fmt.Errorf("the table holds %d entries, want %d", len(flows), entries)
			}
			return err
		}); err != nil {
			b.Fatal(err)
		}
		for _, c := range []struct {
			name  string
			flush func() error
		}{{"before", before}, {"now", now}} {
			b.Run(fmt.Sprintf("1-in-%d-DNAT-ed/%s", every, c.name), func(b *testing.B) {
				for b.Loop() {
					if err := ns.Do(c.flush); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}

// netlinkFilter is a flowSet as netlink's delete takes it: what flushConntrack did before.
type netlinkFilter struct{ s flowSet }

func (n netlinkFilter) MatchConntrackFlow(fl *netlink.ConntrackFlow) bool {
	vip, _ := netip.AddrFromSlice(fl.Forward.DstIP)
	backend, _ := netip.AddrFromSlice(fl.Reverse.SrcIP)
	return n.s.match(&conntrack.Flow{
		Orig:  conntrack.Tuple{Proto: fl.Forward.Protocol, Dst: vip.Unmap(), DstPort: fl.Forward.DstPort},
		Reply: conntrack.Tuple{Src: backend.Unmap(), SrcPort: fl.Reverse.SrcPort},
	})
}
