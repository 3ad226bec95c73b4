package lb

import (
	"cmp"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"hash/fnv"
	"maps"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"time"

	"sigs.k8s.io/knftables"

	"github.com/hostaccel/hostaccel/internal/model"
	"github.com/hostaccel/hostaccel/internal/nftdump"
)

// Table names: the NAT topologies (and the stateless topology's conntrack bypass) live in
// `table inet hostaccel-lb`; dsr and stateless-dnat in `table netdev hostaccel-lb-<dev>`,
// one per ingress device.
const (
	NATTable           = "hostaccel-lb"
	IngressTablePrefix = "hostaccel-lb-"
	// layout is part of every table comment: a new layout rebuilds the tables.
	layout = "1"
	// DefaultFlowTableSize bounds each dynamic map (flows, persistent clients) unless the
	// service's flowTableSize says otherwise. Past it `update` fails and the packet follows
	// a hash of its key instead (recorder).
	DefaultFlowTableSize = 65536
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
	// (backend ids) its entries may point at; the manager deletes entries pointing elsewhere
	// (a backend that is down or gone), and the chains forget them too. The flow tables of dsr
	// and stateless-dnat are left to their chains.
	Dynamic map[string]map[string]bool
	// Slots are the slot maps (slot -> backend) of services whose scheduler picks a slot by
	// counter or at random: the order of their values is free, so the manager keeps each
	// value where the kernel has it and one backend leaving changes two slots, not all that
	// follow it. Hash schedulers keep the rendered order (every node maps a hash alike).
	Slots map[string]bool

	// parts are the table's objects by what they belong to: the table's own (first, owner
	// ""), then each service's (owner: its name), each rendered once and shared by later
	// renders while its service resolves to the same *ServiceState (Resolver, Renderer). The
	// lists above are their concatenation. The Manager diffs only the parts that are not the
	// ones it applied last (nil: it diffs the whole table).
	parts   []*Table
	owner   string
	byOwner map[string]*Table // parts by owner (Manager)
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
func Render(d *Desired) *Ruleset { return (&Renderer{}).Render(d) }

// Renderer renders as Render does, and keeps each service's objects for the next Render: a
// service of the same *ServiceState (Resolver returns the one it had for a service whose
// inputs did not change) is not rendered again, and the Manager, seeing the same part, does
// not diff it. Not safe for concurrent use.
type Renderer struct {
	parts map[partKey]*Table
}

type partKey struct {
	ss    *ServiceState
	table string
}

// Render computes every table for d, reusing the parts of the services rendered last time.
func (rr *Renderer) Render(d *Desired) *Ruleset {
	prev := rr.parts
	rr.parts = make(map[partKey]*Table, len(d.Services))
	// part returns ss's part of table name, rendered by fn unless the last Render had it.
	part := func(f knftables.Family, name string, ss *ServiceState, fn func(*builder)) *Table {
		k := partKey{ss, name}
		p := prev[k]
		if p == nil {
			b := newBuilder(f, name)
			b.t.owner = ss.Service.Name
			fn(b)
			p = b.t
		}
		rr.parts[k] = p
		return p
	}
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
		r.Tables = append(r.Tables, renderNAT(nat, part))
	}
	names := make([]string, 0, len(devs))
	for dev := range devs {
		names = append(names, dev)
	}
	slices.Sort(names)
	for _, dev := range names {
		r.Tables = append(r.Tables, renderIngress(dev, ingress, d.Local, part))
	}
	return r
}

// partFunc returns a service's part of a table (see Renderer.Render).
type partFunc func(f knftables.Family, table string, ss *ServiceState, render func(*builder)) *Table

// join makes the table of its own part base and the services' parts.
func join(base *Table, parts []*Table) *Table {
	t := &Table{Family: base.Family, Name: base.Name, Comment: base.Comment, parts: append([]*Table{base}, parts...)}
	var n [8]int // sized once: thousands of parts
	for _, p := range t.parts {
		for i, l := range []int{len(p.Chains), len(p.Rules), len(p.Sets), len(p.Maps), len(p.Counters), len(p.Elements), len(p.Dynamic), len(p.Slots)} {
			n[i] += l
		}
	}
	t.Chains, t.Rules, t.Sets = make([]*knftables.Chain, 0, n[0]), make([]*knftables.Rule, 0, n[1]), make([]*knftables.Set, 0, n[2])
	t.Maps, t.Counters, t.Elements = make([]*knftables.Map, 0, n[3]), make([]*knftables.Counter, 0, n[4]), make([]*knftables.Element, 0, n[5])
	t.Dynamic, t.Slots = make(map[string]map[string]bool, n[6]), make(map[string]bool, n[7])
	for _, p := range t.parts {
		t.Chains = append(t.Chains, p.Chains...)
		t.Rules = append(t.Rules, p.Rules...)
		t.Sets = append(t.Sets, p.Sets...)
		t.Maps = append(t.Maps, p.Maps...)
		t.Counters = append(t.Counters, p.Counters...)
		t.Elements = append(t.Elements, p.Elements...)
		maps.Copy(t.Dynamic, p.Dynamic)
		maps.Copy(t.Slots, p.Slots)
	}
	return t
}

type builder struct{ t *Table }

func newBuilder(f knftables.Family, name string) *builder {
	return &builder{&Table{Family: f, Name: name, Dynamic: map[string]map[string]bool{}, Slots: map[string]bool{}}}
}

// slotMap marks the slot map name of ss as free in order, unless a hash picks its slots.
func (b *builder) slotMap(name string, ss *ServiceState) {
	if ss.Sched != Hash && ss.Sched != SymHash {
		b.t.Slots[name] = true
	}
}

func (b *builder) chain(c *knftables.Chain) {
	c.Family, c.Table = b.t.Family, b.t.Name
	b.t.Chains = append(b.t.Chains, c)
}

func (b *builder) rule(chain, what, text string) {
	c := what + " [" + shortHash(chain, text) + "]"
	b.t.Rules = append(b.t.Rules, &knftables.Rule{Family: b.t.Family, Table: b.t.Name, Chain: chain, Rule: text, Comment: &c})
}

// mapping adds a map; timeout > 0 makes it a dynamic map the datapath fills, of at most
// size entries (none or 0: DefaultFlowTableSize). A size other than the default is part of
// the comment's hash: a new size replaces the map (its entries are lost).
func (b *builder) mapping(name, typeOf, what string, timeout time.Duration, size ...int) {
	m := &knftables.Map{Family: b.t.Family, Table: b.t.Name, Name: name, TypeOf: typeOf}
	n := DefaultFlowTableSize
	if len(size) > 0 && size[0] > 0 {
		n = size[0]
	}
	if timeout > 0 {
		m.Flags = []knftables.SetFlag{knftables.DynamicFlag, knftables.TimeoutFlag}
		m.Timeout = &timeout
		m.Size = knftables.PtrTo(uint64(n))
	}
	h := []string{name, typeOf, fmt.Sprint(m.Flags), fmt.Sprint(timeout)}
	if n != DefaultFlowTableSize { // (maps of the default size keep the comments they had)
		h = append(h, strconv.Itoa(n))
	}
	c := what + " [" + shortHash(h...) + "]"
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

// IngressTable is the name of the netdev table of device dev: IngressTablePrefix and the
// device's name, where that has only letters, digits, '_', '.' and '-'. Linux allows more in a
// name (eth<, eth+1); such a name's other characters become '_' and a '/' and a hash of the
// name follow (nft allows '/' inside a name, no interface name holds one: no two devices share
// a table).
func IngressTable(dev string) string {
	b, plain := []byte(dev), dev != ""
	for i, c := range b {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '.' || c == '-') {
			b[i], plain = '_', false
		}
	}
	if plain {
		return IngressTablePrefix + dev
	}
	return IngressTablePrefix + string(b) + "/" + shortHash(dev)
}

// setName is the name of a service's set or map: "SERVICE-what". nft's grammar wants a set's
// name to begin with a letter, '_' or '.', while a service's name may begin with a digit (a
// Kubernetes namespace such as "1st-team" begins its services' names): such a name gets a
// leading '_', which no service name holds, so names stay unique. (A chain's or a counter's
// name begins with its kind, "svc-" and so on.)
func setName(service, what string) string {
	if service != "" && service[0] >= '0' && service[0] <= '9' {
		service = "_" + service
	}
	return service + "-" + what
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
// service's chain in prerouting and output (dstnat), another to the snat services' chains in
// postrouting (srcnat: masquerade or snat), and raw prerouting rules that keep stateless-dnat
// traffic out of conntrack.
func renderNAT(svcs []*ServiceState, part partFunc) *Table {
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
		b.rule("postrouting", "source NAT "+f.suffix,
			"meta l4proto { tcp, udp, sctp } ct status dnat ct original "+f.nf+" daddr . meta l4proto . ct original proto-dst vmap @post-"+f.suffix)
		b.rule("raw", "stateless-dnat requests "+f.suffix, f.nf+vipTypeOf+" @stateless-fwd-"+f.suffix+" notrack")
		b.rule("raw", "stateless-dnat replies "+f.suffix, f.nf+reverseTypeOf+" @stateless-rev-"+f.suffix+" notrack")
	}
	parts := make([]*Table, 0, len(svcs))
	for _, ss := range svcs {
		parts = append(parts, part(knftables.InetFamily, NATTable, ss, func(b *builder) {
			for _, is6 := range ss.families() {
				if ss.Topology == StatelessDNAT {
					statelessBypass(b, ss, fam(is6))
				} else {
					natService(b, ss, fam(is6))
				}
			}
		}))
	}
	return join(b.t, parts)
}

// natService renders one snat/dnat service for one family. A service with persistence
// remembers its clients in a dynamic map, client -> backend id, and every new connection
// follows what that map holds (see persistent).
func natService(b *builder, ss *ServiceState, f family) {
	name, proto := ss.Service.Name, ss.Protocol
	pre := name + " " + f.suffix + ": "
	withPort := len(ss.Ports) == 1 // every backend has a port then (Resolve fills it in)
	data, dep := f.nf+" daddr", ""
	if withPort {
		data += " . " + proto + " dport"
		dep = "meta l4proto " + proto + " "
	}
	chain, post := "svc-"+name+"-"+f.suffix, "post-"+name+"-"+f.suffix
	b.chain(&knftables.Chain{Name: chain})
	if rs := sourceRanges(ss, f); rs != "" {
		b.rule(chain, pre+"source ranges", rs)
	}
	in := ss.Service.Internal
	if in != nil {
		// (before the count: the serving service counts them)
		to := "goto svc-" + in.Service + "-" + f.suffix
		if ps := prefixes(in.Sources, f); len(ps) > 0 {
			b.rule(chain, pre+"internal clients to "+in.Service, f.nf+" saddr { "+strings.Join(ps, ", ")+" } "+to)
		}
		if in.LocalHost {
			b.rule(chain, pre+"this host's clients to "+in.Service, "fib saddr type local "+to)
		}
	}
	b.rule(chain, pre+"count", b.counter(chain, pre+whatNewConnections))
	slots := ss.slots(f.is6)
	if p := ss.Service.Persistence; p != nil {
		persistent(b, ss, f, chain, data, dep, withPort, slots, p.Duration)
	} else {
		backends := setName(name, "backends-"+f.suffix)
		b.mapping(backends, "numgen inc mod 1 : "+data, pre+"slot -> backend", 0)
		b.slotMap(backends, ss)
		if len(slots) > 0 {
			b.rule(chain, pre+"schedule "+ss.Sched, dep+"dnat "+f.nf+" to "+schedExpr(ss, f, len(slots))+" map @"+backends)
		} else {
			b.rule(chain, pre+"no backend available", noBackend(ss))
		}
		for i, be := range slots {
			b.elem(backends, []string{strconv.Itoa(i)}, natTarget(be, withPort)...)
		}
	}
	snat := ss.Topology == SNAT
	hairpin := ss.Topology == DNAT && ss.Service.Hairpin
	localHost := ss.Topology == DNAT && in != nil && in.LocalHost
	offCluster := ss.Topology == DNAT && len(ss.Service.MasqueradeExcept) > 0
	if snat {
		b.chain(&knftables.Chain{Name: post})
		if a := snatAddress(ss, f); a != "" {
			b.rule(post, pre+"source NAT", "snat "+f.nf+" to "+a)
		} else {
			b.rule(post, pre+"masquerade", "masquerade")
		}
	} else if hairpin || localHost || offCluster {
		b.chain(&knftables.Chain{Name: post})
		if offCluster {
			rule := "masquerade"
			if ps := prefixes(ss.Service.MasqueradeExcept, f); len(ps) > 0 {
				rule = f.nf + " saddr != { " + strings.Join(ps, ", ") + " } masquerade"
			}
			b.rule(post, pre+"masquerade other clients", rule)
		}
		if localHost {
			// (its source may be the VIP, which the backend would answer elsewhere)
			b.rule(post, pre+"this host's clients masquerade", "fib saddr type local masquerade")
		}
		snat = true // (the post chain is entered as a snat service's)
	}
	if hairpin {
		// A backend's own connection to the service, scheduled to itself: source and
		// destination are the same backend (a set of "b . b"; nft compares no two fields).
		self := setName(name, "hairpin-"+f.suffix)
		b.set(self, f.nf+" saddr . "+f.nf+" daddr", "a backend . itself")
		b.rule(post, pre+"hairpin masquerade", f.nf+" saddr . "+f.nf+" daddr @"+self+" masquerade")
		seen := map[netip.Addr]bool{}
		for _, be := range ss.Backends {
			if be.Addr.Is6() == f.is6 && !seen[be.Addr] {
				seen[be.Addr] = true
				b.elem(self, []string{be.Addr.String(), be.Addr.String()})
			}
		}
	}
	for _, key := range vipKeys(ss, f) {
		b.elem("services-"+f.suffix, key, "goto "+chain)
		if snat {
			b.elem("post-"+f.suffix, key, "goto "+post)
		}
	}
}

// noBackend is the verdict of a new connection to ss while no backend is available.
func noBackend(ss *ServiceState) string {
	if ss.Service.NoBackend == NoBackendDrop {
		return "drop"
	}
	return "reject"
}

// sourceRanges is the rule that drops the packets of clients outside the service's source
// ranges of family f ("": no ranges; a family without any drops every client of it).
func sourceRanges(ss *ServiceState, f family) string {
	if len(ss.Service.SourceRanges) == 0 {
		return ""
	}
	in := prefixes(ss.Service.SourceRanges, f)
	if len(in) == 0 {
		return "drop"
	}
	return f.nf + " saddr != { " + strings.Join(in, ", ") + " } drop"
}

// prefixes are the CIDRs of list of family f (IPv4-mapped ones are IPv4), widest first and
// none inside another (an anonymous set's intervals may not overlap).
func prefixes(list []string, f family) []string {
	var ps []netip.Prefix
	for _, r := range list {
		p, err := netip.ParsePrefix(r)
		if err != nil {
			continue
		}
		if p = model.Unmap4in6(p); p.Addr().Is6() == f.is6 {
			ps = append(ps, p)
		}
	}
	slices.SortFunc(ps, func(a, b netip.Prefix) int { return cmp.Or(a.Bits()-b.Bits(), a.Addr().Compare(b.Addr())) })
	var in []string
	var kept []netip.Prefix
	for _, p := range ps {
		if !slices.ContainsFunc(kept, func(k netip.Prefix) bool { return k.Contains(p.Addr()) }) {
			kept = append(kept, p)
			in = append(in, p.String())
		}
	}
	return in
}

// persistent renders the service chain of a snat/dnat service with persistence. The choice
// is recorded before the packet is sent on, and read back: a new client is scheduled into a
// backend id, `update @persist` inserts it unless the client is there already (another CPU's
// first packet of this client won), and the packet then goes where the map says. So every
// connection of a client follows one entry, even when its first connections arrive at once
// on several CPUs (as IPVS's persistence templates do). The id travels in the packet's
// destination address, which the dnat overwrites (no mark is used); the VIP is read back from
// conntrack where the chain needs it again. A client whose backend is gone is forgotten and
// scheduled anew. The map keeps a client for the persistence time after its last new
// connection (update refreshes the timeout).
func persistent(b *builder, ss *ServiceState, f family, chain, data, dep string, withPort bool, slots []*BackendState, timeout time.Duration) {
	name := ss.Service.Name
	pre := name + " " + f.suffix + ": "
	persist, ids, targets := setName(name, "persist-"+f.suffix), setName(name, "slots-"+f.suffix), setName(name, "targets-"+f.suffix)
	stash := f.nf + " daddr"
	b.mapping(persist, f.nf+" saddr : "+stash, pre+"persistent client -> backend id", timeout, ss.Service.FlowTableSize)
	b.mapping(ids, "numgen inc mod 1 : "+stash, pre+"slot -> backend id", 0)
	b.slotMap(ids, ss)
	b.mapping(targets, stash+" : "+data, pre+"backend id -> backend", 0)
	alive := setName(name, "alive-"+f.suffix)
	b.set(alive, stash, pre+whatAlive)
	r := recorder{key: f.nf + " saddr", stash: stash, flows: persist, alive: alive, action: dep + "dnat " + f.nf + " to " + stash + " map @" + targets}
	if len(slots) > 0 {
		r.sched = stash + " set " + schedExpr(ss, f, len(slots)) + " map @" + ids
		r.hash = stash + " set " + keyHash(r.key, len(slots), name) + " map @" + ids
	}
	r.rules(b, chain, pre, "client", stash+" set ct original "+stash)
	if v := noBackend(ss); v == "reject" {
		// (the reject answers from the VIP: the destination the id overwrote comes back)
		b.rule(chain, pre+"no backend available", stash+" set ct original "+stash+" reject")
	} else {
		b.rule(chain, pre+"no backend available", v)
	}
	b.t.Dynamic[persist] = map[string]bool{}
	for i, be := range slots {
		b.elem(ids, []string{strconv.Itoa(i)}, idAddr(be, f))
	}
	for _, be := range ss.Backends {
		if be.Known && be.Addr.Is6() == f.is6 {
			b.elem(targets, []string{idAddr(be, f)}, natTarget(be, withPort)...)
			b.elem(alive, []string{idAddr(be, f)})
			b.t.Dynamic[persist][idAddr(be, f)] = true
		}
	}
}

// whatAlive describes a recorder's alive set.
const whatAlive = "backend ids there still are"

// recorder renders the rules that give a packet its backend id from a dynamic map (flows,
// persistent clients) and send it on, race-free: a known key follows the map; an entry whose
// backend is gone is forgotten; a new key is scheduled, inserted if still absent and read
// back. The id is kept in stash, a header field that the chain overwrites anyway after
// translating the id (no scratch register, no mark).
//
// A map is only read for its data (`key map @flows`: a miss ends the rule), never asked
// whether a key is there (`key != @flows`): Linux 6.1's nft_lookup refuses an inverted (or a
// plain membership) lookup in a map, and one such rule fails the whole transaction. So each
// rule that finds an id ends in action, which fails (ends the rule) where the id's backend is
// gone. The next rule forgets an entry only if its id is not in alive, a set (where 6.1 takes
// `!=`): the key may have been absent for the rule before and recorded by another CPU's first
// packet since, and that entry must stay (a forget of it sent that CPU's flow, or the
// client's other connections, to another backend).
//
// The map holds at most its size of keys (flowTableSize). When it is full, `update` fails
// and ends its rule: the key is not recorded, and every packet of it would be scheduled
// anew (rr and weight: to another backend each time, breaking a dsr or stateless-dnat
// flow). A key not recorded is therefore sent by a hash of the key over the same slots,
// counted by a named counter ("full-<chain>"): all its packets reach one backend while the
// map is full.
type recorder struct {
	key    string // the map's key expression
	stash  string // the header field that carries the id
	flows  string // the dynamic map: key -> id
	sched  string // "<stash> set <scheduler> map @slots", "" without an eligible backend
	hash   string // "<stash> set jhash <key's fields> ... map @slots": the map is full
	action string // sends the packet to the backend of the id in stash; a miss where it is gone
	alive  string // the set of the ids whose backends there still are (action's map's keys)
}

// rules renders the recorder's rules; restore undoes the stash after a forgotten entry (the
// scheduler may read the field).
func (r recorder) rules(b *builder, chain, pre, what, restore string) {
	update := "update @" + r.flows + " { " + r.key + " : " + r.stash + " }"
	readBack := r.stash + " set " + r.key + " map @" + r.flows
	// update refreshes a known key's timeout (its data is never replaced).
	b.rule(chain, pre+"known "+what+": to its backend", readBack+" "+update+" "+r.action)
	// Known, and its backend is gone (down, failed, removed): forgotten, and the key scheduled
	// anew below; a draining backend keeps its id, and its entries.
	b.rule(chain, pre+"forget a "+what+" whose backend is gone", strings.TrimSpace(readBack+" "+r.stash+" != @"+r.alive+
		" delete @"+r.flows+" { "+r.key+" : "+r.stash+" } "+restore))
	if r.sched == "" {
		return
	}
	// update inserts only if the key is absent (another CPU's first packet of it may have
	// won) and the packet follows what the map holds.
	b.rule(chain, pre+"new "+what+": schedule, record, to its backend", r.sched+" "+update+" "+readBack+" "+r.action)
	// not recorded: the map is full (update failed)
	b.rule(chain, pre+what+" table full: follow a hash of the "+what, r.hash+" "+
		b.counter("full-"+chain, pre+what+" "+whatTableFull)+" "+r.action)
}

// keyHash is the expression that picks one of n slots by a hash of fields (a flow's or a
// client's key) where the map that records keys is full.
func keyHash(fields string, n int, service string) string {
	return fmt.Sprintf("jhash %s mod %d seed 0x%08x", fields, n, seed(service))
}

// idAddr writes a backend id as an address of the family: IPv4 as is, IPv6 in its first 32
// bits ("4756:1b2c::").
func idAddr(be *BackendState, f family) string {
	var a [16]byte
	binary.BigEndian.PutUint32(a[:], be.ID)
	if f.is6 {
		return netip.AddrFrom16(a).String()
	}
	return netip.AddrFrom4([4]byte(a[:4])).String()
}

// idMAC writes a backend id as a MAC address ("00:00:47:56:1b:2c").
func idMAC(be *BackendState) string {
	var a [6]byte
	binary.BigEndian.PutUint32(a[2:], be.ID)
	return net.HardwareAddr(a[:]).String()
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

// vipKeys returns VIP . protocol . port for every VIP of the family and every port: none
// for an internalOnly service, whose VIPs are not dispatched to it.
func vipKeys(ss *ServiceState, f family) [][]string {
	if ss.Service.InternalOnly {
		return nil
	}
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
func renderIngress(dev string, svcs []*ServiceState, local []netip.Addr, part partFunc) *Table {
	b := newBuilder(knftables.NetDevFamily, IngressTable(dev))
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
	var parts []*Table
	for _, ss := range svcs {
		in, rev := ss.Service.Interface == dev, ss.Topology == StatelessDNAT && ss.Service.backendInterface() == dev
		if !in && !rev {
			continue
		}
		parts = append(parts, part(knftables.NetDevFamily, b.t.Name, ss, func(b *builder) {
			if in {
				ingressService(b, ss)
			}
			if rev {
				for _, is6 := range ss.families() {
					statelessReverse(b, ss, fam(is6))
				}
			}
		}))
	}
	return join(b.t, parts)
}

// ingressService renders a dsr or stateless-dnat service's chains. The backend id travels in
// the header field that the chain rewrites once it has translated the id: the destination
// MAC (dsr) or the destination address (stateless-dnat); no mark is used.
func ingressService(b *builder, ss *ServiceState) {
	name, proto := ss.Service.Name, ss.Protocol
	dsr := ss.Topology == DSR
	macs := setName(name, "macs")
	translate := false
	for _, be := range ss.Backends {
		translate = translate || !dsr && len(ss.Ports) == 1 && be.Port != ss.Ports[0]
	}
	if dsr {
		b.mapping(macs, "ether daddr : ether daddr", name+": backend id -> MAC", 0)
		alive := setName(name, "alive")
		b.set(alive, "ether daddr", name+": "+whatAlive)
		for _, be := range ss.Backends {
			if be.Known {
				b.elem(macs, []string{idMAC(be)}, be.MAC.String())
				b.elem(alive, []string{idMAC(be)})
			}
		}
	}
	for _, is6 := range ss.families() {
		f := fam(is6)
		pre := name + " " + f.suffix + ": "
		flows, slotsMap := setName(name, "flows-"+f.suffix), setName(name, "slots-"+f.suffix)
		addrs, ports := setName(name, "addrs-"+f.suffix), setName(name, "ports-"+f.suffix)
		// (dsr: one set of MAC ids for both families, as macs)
		stash, alive := "ether daddr", setName(name, "alive")
		if !dsr {
			stash, alive = f.nf+" daddr", setName(name, "alive-"+f.suffix)
		}
		// The flow key: the client's address and port (its address only with persistence).
		// nft 1.0.6 cannot update a map with a key longer than 16 bytes, so an IPv6 address
		// and port are hashed; a collision (two flows, one hash) sends both to one backend.
		fields := f.nf + " saddr . " + proto + " sport"
		key, keyType, timeout := fields, "", defaultFlowTimeout
		if f.is6 {
			key = fmt.Sprintf("jhash %s mod 4294967295 seed 0x%08x", key, seed(name))
			keyType = "numgen inc mod 1"
		}
		if ss.Service.FlowTimeout != nil {
			timeout = ss.Service.FlowTimeout.Duration
		}
		if p := ss.Service.Persistence; p != nil {
			fields, key, keyType, timeout = f.nf+" saddr", f.nf+" saddr", "", p.Duration
		}
		b.mapping(flows, cmp.Or(keyType, key)+" : "+stash, pre+"flow -> backend id", timeout, ss.Service.FlowTableSize)
		b.mapping(slotsMap, "numgen inc mod 1 : "+stash, pre+"slot -> backend id", 0)
		b.slotMap(slotsMap, ss)
		if !dsr {
			b.mapping(addrs, stash+" : "+f.nf+" daddr", pre+"backend id -> address", 0)
			b.set(alive, stash, pre+whatAlive)
			if translate {
				b.mapping(ports, stash+" : "+proto+" dport", pre+"backend id -> port", 0)
			}
		}
		chain := "dsr-" + name + "-" + f.suffix
		if !dsr {
			chain = "sdnat-" + name + "-" + f.suffix
		}
		b.chain(&knftables.Chain{Name: chain})
		b.rule(chain, pre+"count", b.counter(chain, pre+whatPackets))
		slots := ss.slots(f.is6)
		r := recorder{key: key, stash: stash, flows: flows, alive: alive}
		if dsr {
			r.action = "ether saddr set " + ss.OutMAC.String() + " ether daddr set ether daddr map @" + macs +
				" fwd to " + strconv.Quote(ss.Service.backendInterface())
		} else {
			if translate {
				r.action = proto + " dport set " + stash + " map @" + ports + " "
			}
			r.action += stash + " set " + stash + " map @" + addrs + " accept"
		}
		if len(slots) > 0 {
			r.sched = stash + " set " + schedExpr(ss, f, len(slots)) + " map @" + slotsMap
			r.hash = stash + " set " + keyHash(fields, len(slots), name) + " map @" + slotsMap
		}
		restore := "" // dsr: no scheduler hashes the destination MAC
		if !dsr {
			restore = stash + " set " + vipOf(ss, f) // stateless-dnat: one VIP per family
		}
		r.rules(b, chain, pre, "flow", restore)
		b.rule(chain, pre+"no backend available", "counter drop")
		for i, be := range slots {
			v := idMAC(be)
			if !dsr {
				v = idAddr(be, f)
			}
			b.elem(slotsMap, []string{strconv.Itoa(i)}, v)
		}
		for _, be := range ss.Backends {
			if be.Known && !dsr && be.Addr.Is6() == f.is6 {
				b.elem(addrs, []string{idAddr(be, f)}, be.Addr.String())
				b.elem(alive, []string{idAddr(be, f)})
				if translate {
					b.elem(ports, []string{idAddr(be, f)}, strconv.Itoa(be.Port))
				}
			}
		}
		for _, k := range vipKeys(ss, f) {
			b.elem("services-"+f.suffix, k, "goto "+chain)
		}
	}
}

// vipOf returns the service's (last) VIP of the family.
func vipOf(ss *ServiceState, f family) string {
	var vip string
	for _, v := range ss.VIPs {
		if v.Is6() == f.is6 {
			vip = v.String()
		}
	}
	return vip
}

// statelessReverse rewrites replies from the backends (arriving on the backend interface)
// back to the VIP and the service port.
func statelessReverse(b *builder, ss *ServiceState, f family) {
	name, vip := ss.Service.Name, vipOf(ss, f)
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
// The elements bypass the Fake, whose element handling is quadratic (nftdump).
func (r *Ruleset) Dump() (string, error) {
	tables := slices.Clone(r.Tables)
	slices.SortFunc(tables, func(a, b *Table) int {
		return cmp.Or(strings.Compare(string(a.Family), string(b.Family)), strings.Compare(a.Name, b.Name))
	})
	var out strings.Builder
	for _, t := range tables {
		// knftables' Fake sets the Handle of the named counters it is given (its other
		// objects it copies): give it copies, or the ruleset, once dumped, cannot be added
		// to a kernel.
		bare := *t
		bare.Elements, bare.Counters = nil, nil
		for _, c := range t.Counters {
			c2 := *c
			bare.Counters = append(bare.Counters, &c2)
		}
		s, err := nftdump.Table(knftables.NewFake("", ""), bare.addAll, t.Elements)
		if err != nil {
			return "", err
		}
		out.WriteString(s)
	}
	return out.String(), nil
}
