package lb

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"hash/fnv"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"time"

	"sigs.k8s.io/knftables"
)

// Table names: the NAT topologies (and the stateless topology's conntrack bypass) live in
// `table inet hostaccel-lb`; dsr and stateless-dnat in `table netdev hostaccel-lb-<dev>`,
// one per ingress device.
const (
	NATTable           = "hostaccel-lb"
	IngressTablePrefix = "hostaccel-lb-"
	// layout is part of every table comment: a new layout rebuilds the tables.
	layout = "1"
	// flowMapSize bounds each dynamic map (flows, persistent clients).
	flowMapSize = 65536
)

// Ruleset is the desired content of every table of the load balancer.
type Ruleset struct {
	Tables []*Table
}

// Table is one table's desired objects. Rules, maps and sets carry comments that end in a
// hash of their definition, so that the manager can tell from the kernel's listing which
// ones changed; elements are compared one by one.
type Table struct {
	Family   knftables.Family
	Name     string
	Comment  string
	Chains   []*knftables.Chain
	Rules    []*knftables.Rule
	Sets     []*knftables.Set
	Maps     []*knftables.Map
	Counters []*knftables.Counter // named: they survive a rewrite of their chain
	Elements []*knftables.Element
	// Dynamic lists, for each map of persistent clients (which the datapath fills), the values
	// its entries may point at; the manager deletes entries pointing elsewhere (a backend that
	// is down or gone). The flow tables of dsr and stateless-dnat need no such care: their
	// chains forget a flow whose backend is gone by themselves.
	Dynamic map[string]map[string]bool
	// Paired maps a dynamic map to the one it completes (persistent client -> port completes
	// client -> address): its entries go when their key leaves the other map.
	Paired map[string]string
}

type family struct {
	is6    bool
	suffix string // v4, v6
	nf     string // ip, ip6
}

func fam(is6 bool) family {
	if is6 {
		return family{true, "v6", "ip6"}
	}
	return family{false, "v4", "ip"}
}

// Render computes every table for d. It is pure: no kernel, no root.
func Render(d *Desired) *Ruleset {
	r := &Ruleset{}
	var nat, ingress []*ServiceState
	devs := map[string]bool{}
	for _, ss := range d.Services {
		if ss.Skipped != "" {
			continue
		}
		switch ss.Topology {
		case SNAT, DNAT:
			nat = append(nat, ss)
		case StatelessDNAT:
			nat = append(nat, ss) // conntrack bypass
			devs[ss.Service.backendInterface()] = true
			fallthrough
		case DSR:
			ingress = append(ingress, ss)
			devs[ss.Service.Interface] = true
		}
	}
	if len(nat) > 0 {
		r.Tables = append(r.Tables, renderNAT(nat))
	}
	names := make([]string, 0, len(devs))
	for dev := range devs {
		names = append(names, dev)
	}
	slices.Sort(names)
	for _, dev := range names {
		r.Tables = append(r.Tables, renderIngress(dev, ingress, d.Local))
	}
	return r
}

type builder struct{ t *Table }

func newBuilder(f knftables.Family, name string) *builder {
	return &builder{&Table{Family: f, Name: name, Dynamic: map[string]map[string]bool{}, Paired: map[string]string{}}}
}

func (b *builder) chain(c *knftables.Chain) {
	c.Family, c.Table = b.t.Family, b.t.Name
	b.t.Chains = append(b.t.Chains, c)
}

func (b *builder) rule(chain, what, text string) {
	c := what + " [" + shortHash(chain, text) + "]"
	b.t.Rules = append(b.t.Rules, &knftables.Rule{Family: b.t.Family, Table: b.t.Name, Chain: chain, Rule: text, Comment: &c})
}

// mapping adds a map; timeout > 0 makes it a dynamic map the datapath fills.
func (b *builder) mapping(name, typeOf, what string, timeout time.Duration) {
	m := &knftables.Map{Family: b.t.Family, Table: b.t.Name, Name: name, TypeOf: typeOf}
	if timeout > 0 {
		m.Flags = []knftables.SetFlag{knftables.DynamicFlag, knftables.TimeoutFlag}
		m.Timeout = &timeout
		m.Size = knftables.PtrTo(uint64(flowMapSize))
	}
	c := what + " [" + shortHash(name, typeOf, fmt.Sprint(m.Flags), fmt.Sprint(timeout)) + "]"
	m.Comment = &c
	b.t.Maps = append(b.t.Maps, m)
}

// counter adds a named counter (the chain's name) and returns the statement that counts.
func (b *builder) counter(chain, what string) string {
	b.t.Counters = append(b.t.Counters, &knftables.Counter{Family: b.t.Family, Table: b.t.Name, Name: chain, Comment: &what})
	return "counter name " + strconv.Quote(chain)
}

func (b *builder) set(name, typeOf, what string) {
	c := what + " [" + shortHash(name, typeOf) + "]"
	b.t.Sets = append(b.t.Sets, &knftables.Set{Family: b.t.Family, Table: b.t.Name, Name: name, TypeOf: typeOf, Comment: &c})
}

func (b *builder) elem(set string, key []string, value ...string) {
	e := &knftables.Element{Family: b.t.Family, Table: b.t.Name, Key: key, Value: value}
	if value == nil {
		e.Set = set
	} else {
		e.Map = set
	}
	b.t.Elements = append(b.t.Elements, e)
}

// base finishes the table's fixed part: its comment hashes the base chains.
func (b *builder) base(what string) {
	h := []string{layout}
	for _, c := range b.t.Chains {
		h = append(h, fmt.Sprint(c.Name, deref(c.Type), deref(c.Hook), deref(c.Priority), deref(c.Device)))
	}
	b.t.Comment = fmt.Sprintf("hostaccel load balancer: %s (layout %s, %s)", what, layout, shortHash(h...))
	b.t.Sets = append(b.t.Sets, &knftables.Set{Family: b.t.Family, Table: b.t.Name, Name: layoutSet, Type: "mark", Comment: &b.t.Comment})
}

func deref[T any](p *T) any {
	if p == nil {
		return ""
	}
	return *p
}

func shortHash(parts ...string) string {
	h := sha256.Sum256([]byte(strings.Join(parts, "\x00")))
	return hex.EncodeToString(h[:4])
}

func baseChain(name string, t knftables.BaseChainType, hook knftables.BaseChainHook, prio knftables.BaseChainPriority) *knftables.Chain {
	return &knftables.Chain{Name: name, Type: &t, Hook: &hook, Priority: &prio}
}

const (
	vipTypeOf     = " daddr . meta l4proto . th dport"
	reverseTypeOf = " saddr . meta l4proto . th sport"
)

// renderNAT builds table inet hostaccel-lb: a verdict map from VIP . protocol . port to each
// service's chain in prerouting and output (dstnat), another to per-service chains in
// postrouting (srcnat: masquerade or snat, and remembering persistent clients), and raw
// prerouting rules that keep stateless-dnat traffic out of conntrack.
func renderNAT(svcs []*ServiceState) *Table {
	b := newBuilder(knftables.InetFamily, NATTable)
	b.chain(baseChain("prerouting", knftables.NATType, knftables.PreroutingHook, knftables.DNATPriority))
	b.chain(baseChain("output", knftables.NATType, knftables.OutputHook, knftables.DNATPriority))
	b.chain(baseChain("postrouting", knftables.NATType, knftables.PostroutingHook, knftables.SNATPriority))
	b.chain(baseChain("raw", knftables.FilterType, knftables.PreroutingHook, knftables.RawPriority))
	b.base("snat, dnat, stateless-dnat conntrack bypass")
	for _, f := range []family{fam(false), fam(true)} {
		b.mapping("services-"+f.suffix, f.nf+vipTypeOf+" : verdict", "VIP . protocol . port -> service chain", 0)
		b.mapping("post-"+f.suffix, f.nf+vipTypeOf+" : verdict", "original VIP . protocol . port -> source NAT chain", 0)
		b.set("stateless-fwd-"+f.suffix, f.nf+vipTypeOf, "stateless-dnat backends: untracked")
		b.set("stateless-rev-"+f.suffix, f.nf+reverseTypeOf, "stateless-dnat VIPs (replies): untracked")
	}
	for _, f := range []family{fam(false), fam(true)} {
		vmap := f.nf + vipTypeOf + " vmap @services-" + f.suffix
		b.rule("prerouting", "services "+f.suffix, vmap)
		b.rule("output", "services "+f.suffix+" (local clients)", vmap)
		b.rule("postrouting", "source NAT and persistence "+f.suffix,
			"meta l4proto { tcp, udp, sctp } ct status dnat ct original "+f.nf+" daddr . meta l4proto . ct original proto-dst vmap @post-"+f.suffix)
		b.rule("raw", "stateless-dnat requests "+f.suffix, f.nf+vipTypeOf+" @stateless-fwd-"+f.suffix+" notrack")
		b.rule("raw", "stateless-dnat replies "+f.suffix, f.nf+reverseTypeOf+" @stateless-rev-"+f.suffix+" notrack")
	}
	for _, ss := range svcs {
		for _, is6 := range ss.families() {
			if ss.Topology == StatelessDNAT {
				statelessBypass(b, ss, fam(is6))
			} else {
				natService(b, ss, fam(is6))
			}
		}
	}
	return b.t
}

// natService renders one snat/dnat service for one family. Persistent clients are kept in
// two dynamic maps, client -> backend address and client -> backend port, filled in
// postrouting from the connection's conntrack tuples (the dnat statement ends the chain, so
// the choice is read back from conntrack); one map of concatenations would be simpler, but nft
// 1.0.6 cannot update a map whose data is an IPv6 address and a port.
func natService(b *builder, ss *ServiceState, f family) {
	name, proto := ss.Service.Name, ss.Protocol
	pre := name + " " + f.suffix + ": "
	withPort := len(ss.Ports) == 1 // every backend has a port then (Resolve fills it in)
	data, dep := f.nf+" daddr", ""
	if withPort {
		data += " . " + proto + " dport"
		dep = "meta l4proto " + proto + " "
	}
	backends := name + "-backends-" + f.suffix
	persist, persistPort := name+"-persist-"+f.suffix, name+"-persist-port-"+f.suffix
	chain, post := "svc-"+name+"-"+f.suffix, "post-"+name+"-"+f.suffix
	b.mapping(backends, "numgen inc mod 1 : "+data, pre+"slot -> backend", 0)
	b.chain(&knftables.Chain{Name: chain})
	b.rule(chain, pre+"count", b.counter(chain, pre+whatNewConnections))
	p := ss.Service.Persistence
	if p != nil {
		b.mapping(persist, f.nf+" saddr : "+f.nf+" daddr", pre+"persistent client -> backend address", p.Duration)
		b.t.Dynamic[persist] = map[string]bool{}
		target := f.nf + " saddr map @" + persist
		if withPort {
			b.mapping(persistPort, f.nf+" saddr : "+proto+" dport", pre+"persistent client -> backend port", p.Duration)
			b.t.Dynamic[persistPort] = map[string]bool{}
			b.t.Paired[persistPort] = persist
			target += " : " + f.nf + " saddr map @" + persistPort
		}
		b.rule(chain, pre+"persistent client", dep+"dnat "+f.nf+" to "+target)
	}
	slots := ss.slots(f.is6)
	if len(slots) > 0 {
		b.rule(chain, pre+"schedule "+ss.Sched, dep+"dnat "+f.nf+" to "+schedExpr(ss, f, len(slots))+" map @"+backends)
	} else {
		b.rule(chain, pre+"no backend available", "reject")
	}
	for i, be := range slots {
		b.elem(backends, []string{strconv.Itoa(i)}, natTarget(be, withPort)...)
	}
	for _, be := range ss.Backends {
		if be.Known && be.Addr.Is6() == f.is6 && p != nil {
			b.t.Dynamic[persist][be.Addr.String()] = true
			if withPort {
				b.t.Dynamic[persistPort][strconv.Itoa(be.Port)] = true
			}
		}
	}
	snat := ss.Topology == SNAT
	if snat || p != nil {
		b.chain(&knftables.Chain{Name: post})
		if p != nil {
			remember := dep + "update @" + persist + " { ct original " + f.nf + " saddr : ct reply " + f.nf + " saddr }"
			if withPort {
				remember += " update @" + persistPort + " { ct original " + f.nf + " saddr : ct reply proto-src }"
			}
			b.rule(post, pre+"remember the client's backend", remember)
		}
		if snat {
			if a := snatAddress(ss, f); a != "" {
				b.rule(post, pre+"source NAT", "snat "+f.nf+" to "+a)
			} else {
				b.rule(post, pre+"masquerade", "masquerade")
			}
		}
	}
	for _, key := range vipKeys(ss, f) {
		b.elem("services-"+f.suffix, key, "goto "+chain)
		if snat || p != nil {
			b.elem("post-"+f.suffix, key, "goto "+post)
		}
	}
}

func natTarget(be *BackendState, withPort bool) []string {
	if withPort {
		return []string{be.Addr.String(), strconv.Itoa(be.Port)}
	}
	return []string{be.Addr.String()}
}

func snatAddress(ss *ServiceState, f family) string {
	for _, a := range ss.Service.SNATAddresses {
		if strings.Contains(a, ":") == f.is6 {
			return a
		}
	}
	return ""
}

// vipKeys returns VIP . protocol . port for every VIP of the family and every port.
func vipKeys(ss *ServiceState, f family) [][]string {
	var out [][]string
	for _, v := range ss.VIPs {
		if v.Is6() != f.is6 {
			continue
		}
		for _, p := range ss.Ports {
			out = append(out, []string{v.String(), ss.Protocol, strconv.Itoa(p)})
		}
	}
	return out
}

// backendPorts returns the ports a backend receives on: its own, or (a multi-port service)
// the service's.
func backendPorts(ss *ServiceState, be *BackendState) []int {
	if be.Port != 0 {
		return []int{be.Port}
	}
	return ss.Ports
}

func statelessBypass(b *builder, ss *ServiceState, f family) {
	for _, be := range ss.Backends {
		if be.Known && be.Addr.Is6() == f.is6 {
			for _, p := range backendPorts(ss, be) {
				b.elem("stateless-fwd-"+f.suffix, []string{be.Addr.String(), ss.Protocol, strconv.Itoa(p)})
			}
		}
	}
	for _, key := range vipKeys(ss, f) {
		b.elem("stateless-rev-"+f.suffix, key)
	}
}

func schedExpr(ss *ServiceState, f family, n int) string {
	switch ss.Sched {
	case Weighted:
		return fmt.Sprintf("numgen random mod %d", n)
	case SymHash:
		return fmt.Sprintf("symhash mod %d", n)
	case Hash:
		fields := ss.Service.HashFields
		if len(fields) == 0 {
			fields = []string{"src-ip"}
		}
		var ex []string
		for _, h := range fields {
			ex = append(ex, map[string]string{
				"src-ip": f.nf + " saddr", "dst-ip": f.nf + " daddr",
				"src-port": ss.Protocol + " sport", "dst-port": ss.Protocol + " dport",
			}[h])
		}
		return fmt.Sprintf("jhash %s mod %d seed 0x%08x", strings.Join(ex, " . "), n, seed(ss.Service.Name))
	}
	return fmt.Sprintf("numgen inc mod %d", n)
}

func seed(name string) uint32 {
	h := fnv.New32a()
	h.Write([]byte(name))
	return h.Sum32()
}

// renderIngress builds table netdev hostaccel-lb-<dev>: verdict maps from VIP . protocol .
// port to the dsr / stateless-dnat service chains, and from backend . protocol . port to the
// stateless-dnat reverse chains. Each service keeps its own flow table (a dynamic map from
// the client's address and port, or address only with persistence, to a backend id), so that
// every packet of a flow reaches the backend its first packet was given, whatever the
// scheduler, and established flows keep their backend when backends change.
func renderIngress(dev string, svcs []*ServiceState, local []netip.Addr) *Table {
	b := newBuilder(knftables.NetDevFamily, IngressTablePrefix+dev)
	c := baseChain("ingress", knftables.FilterType, knftables.IngressHook, knftables.FilterPriority)
	c.Device = &dev
	b.chain(c)
	b.base("dsr and stateless-dnat on " + dev)
	for _, f := range []family{fam(false), fam(true)} {
		b.mapping("services-"+f.suffix, f.nf+vipTypeOf+" : verdict", "VIP . protocol . port -> service chain", 0)
		b.mapping("reverse-"+f.suffix, f.nf+reverseTypeOf+" : verdict", "backend . protocol . port -> reply rewrite", 0)
		b.set("local-"+f.suffix, f.nf+" daddr", "this host's addresses: packets to them are not replies to rewrite")
		for _, a := range local {
			if a.Is6() == f.is6 {
				b.elem("local-"+f.suffix, []string{a.String()})
			}
		}
	}
	for _, f := range []family{fam(false), fam(true)} {
		b.rule("ingress", "services "+f.suffix, f.nf+vipTypeOf+" vmap @services-"+f.suffix)
		b.rule("ingress", "stateless-dnat replies "+f.suffix, f.nf+reverseTypeOf+" vmap @reverse-"+f.suffix)
	}
	for _, ss := range svcs {
		if ss.Service.Interface == dev {
			ingressService(b, ss)
		}
		if ss.Topology == StatelessDNAT && ss.Service.backendInterface() == dev {
			for _, is6 := range ss.families() {
				statelessReverse(b, ss, fam(is6))
			}
		}
	}
	return b.t
}

func ingressService(b *builder, ss *ServiceState) {
	name, proto := ss.Service.Name, ss.Protocol
	dsr := ss.Topology == DSR
	macs, ports := name+"-macs", name+"-ports"
	translate := false
	for _, be := range ss.Backends {
		translate = translate || !dsr && len(ss.Ports) == 1 && be.Port != ss.Ports[0]
	}
	if dsr {
		b.mapping(macs, "meta mark : ether daddr", name+": backend id -> MAC", 0)
	} else if translate {
		b.mapping(ports, "meta mark : "+proto+" dport", name+": backend id -> port", 0)
	}
	for _, be := range ss.Backends {
		switch {
		case !be.Known:
		case dsr:
			b.elem(macs, []string{id(be)}, be.MAC.String())
		case translate:
			b.elem(ports, []string{id(be)}, strconv.Itoa(be.Port))
		}
	}
	for _, is6 := range ss.families() {
		f := fam(is6)
		pre := name + " " + f.suffix + ": "
		flows, slotsMap, addrs := name+"-flows-"+f.suffix, name+"-slots-"+f.suffix, name+"-addrs-"+f.suffix
		// The flow key: the client's address and port (its address only with persistence).
		// nft 1.0.6 cannot update a map with a key longer than 16 bytes, so an IPv6 address
		// and port are hashed; a collision (two flows, one hash) sends both to one backend.
		key, keyType, timeout := f.nf+" saddr . "+proto+" sport", "", defaultFlowTimeout
		if f.is6 {
			key = fmt.Sprintf("jhash %s mod 4294967295 seed 0x%08x", key, seed(name))
			keyType = "numgen inc mod 1"
		}
		if ss.Service.FlowTimeout != nil {
			timeout = ss.Service.FlowTimeout.Duration
		}
		if p := ss.Service.Persistence; p != nil {
			key, keyType, timeout = f.nf+" saddr", "", p.Duration
		}
		b.mapping(flows, cmp.Or(keyType, key)+" : meta mark", pre+"flow -> backend id", timeout)
		b.mapping(slotsMap, "numgen inc mod 1 : meta mark", pre+"slot -> backend id", 0)
		if !dsr {
			b.mapping(addrs, "meta mark : "+f.nf+" daddr", pre+"backend id -> address", 0)
		}
		chain := "dsr-" + name + "-" + f.suffix
		if !dsr {
			chain = "sdnat-" + name + "-" + f.suffix
		}
		b.chain(&knftables.Chain{Name: chain})
		b.rule(chain, pre+"count", b.counter(chain, pre+whatPackets)+" meta mark set 0")
		slots := ss.slots(f.is6)
		sched := ""
		if len(slots) > 0 {
			sched = " meta mark set " + schedExpr(ss, f, len(slots)) + " map @" + slotsMap
			b.rule(chain, pre+"new flow: schedule "+ss.Sched, key+" != @"+flows+sched)
		}
		b.rule(chain, pre+"known flow", key+" @"+flows+" meta mark set "+key+" map @"+flows)
		// A flow whose backend is gone (down, failed, removed) is forgotten and scheduled
		// anew; a draining backend stays in the id map, so its flows stay.
		ids := macs
		if !dsr {
			ids = addrs
		}
		if sched == "" {
			sched = " meta mark set 0"
		}
		b.rule(chain, pre+"forget a flow whose backend is gone", "meta mark != 0 meta mark != @"+ids+" delete @"+flows+" { "+key+" : meta mark }"+sched)
		remember := "meta mark != 0 update @" + flows + " { " + key + " : meta mark } "
		if dsr {
			b.rule(chain, pre+"to the backend's MAC", remember+"ether saddr set "+ss.OutMAC.String()+
				" ether daddr set meta mark map @"+macs+" meta mark set 0 fwd to "+strconv.Quote(ss.Service.backendInterface()))
		} else {
			rw := remember + f.nf + " daddr set meta mark map @" + addrs
			if translate {
				rw += " " + proto + " dport set meta mark map @" + ports
			}
			b.rule(chain, pre+"to the backend's address", rw+" meta mark set 0 accept")
		}
		b.rule(chain, pre+"no backend available", "counter drop")
		for i, be := range slots {
			b.elem(slotsMap, []string{strconv.Itoa(i)}, id(be))
		}
		for _, be := range ss.Backends {
			if be.Known && !dsr && be.Addr.Is6() == f.is6 {
				b.elem(addrs, []string{id(be)}, be.Addr.String())
			}
		}
		for _, k := range vipKeys(ss, f) {
			b.elem("services-"+f.suffix, k, "goto "+chain)
		}
	}
}

// statelessReverse rewrites replies from the backends (arriving on the backend interface)
// back to the VIP and the service port.
func statelessReverse(b *builder, ss *ServiceState, f family) {
	name := ss.Service.Name
	var vip string
	for _, v := range ss.VIPs {
		if v.Is6() == f.is6 {
			vip = v.String()
		}
	}
	chain := "rev-" + name + "-" + f.suffix
	b.chain(&knftables.Chain{Name: chain})
	b.rule(chain, name+" "+f.suffix+": to this host (health checks)", f.nf+" daddr @local-"+f.suffix+" accept")
	rw := f.nf + " saddr set " + vip
	if len(ss.Ports) == 1 {
		rw += " " + ss.Protocol + " sport set " + strconv.Itoa(ss.Ports[0])
	}
	b.rule(chain, name+" "+f.suffix+": replies from the VIP", rw+" accept")
	for _, be := range ss.Backends {
		if be.Known && be.Addr.Is6() == f.is6 {
			for _, p := range backendPorts(ss, be) {
				b.elem("reverse-"+f.suffix, []string{be.Addr.String(), ss.Protocol, strconv.Itoa(p)}, "goto "+chain)
			}
		}
	}
}

func id(be *BackendState) string { return strconv.FormatUint(uint64(be.ID), 10) }

// AddAll adds every table of r, whole, to tx.
func (r *Ruleset) AddAll(tx *knftables.Transaction) {
	for _, t := range r.Tables {
		t.addAll(tx)
	}
}

func (t *Table) ref() TableRef { return TableRef{t.Family, t.Name} }

func (t *Table) table() *knftables.Table {
	return &knftables.Table{Family: t.Family, Name: t.Name, Comment: &t.Comment}
}

func (t *Table) addAll(tx *knftables.Transaction) {
	tx.Add(t.table())
	addEach(tx, t.Sets)
	addEach(tx, t.Maps)
	addEach(tx, t.Counters)
	addEach(tx, t.Chains)
	addEach(tx, t.Rules)
	addEach(tx, t.Elements)
}

func addEach[O knftables.Object](tx *knftables.Transaction, objs []O) {
	for _, o := range objs {
		tx.Add(o)
	}
}

// Dump renders the ruleset as the nft script a fresh apply installs (the knftables Fake's
// deterministic dump), for `hostaccel render` and golden files.
func (r *Ruleset) Dump() (string, error) {
	fake := knftables.NewFake("", "")
	tx := fake.NewTransaction()
	// knftables' Fake sets the Handle of the named counters it is given (its other objects it
	// copies): give it copies, or the ruleset, once dumped, cannot be added to a kernel.
	cp := &Ruleset{}
	for _, t := range r.Tables {
		t2 := *t
		t2.Counters = nil
		for _, c := range t.Counters {
			c2 := *c
			t2.Counters = append(t2.Counters, &c2)
		}
		cp.Tables = append(cp.Tables, &t2)
	}
	cp.AddAll(tx)
	if err := fake.Run(context.Background(), tx); err != nil {
		return "", err
	}
	return fake.Dump(), nil
}
