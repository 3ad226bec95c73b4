// Package flowtable is the nftables flowtable datapath: Render turns a model.State into the
// objects of hostaccel's own table (pure, golden-testable), and Manager applies them to the
// kernel in one transaction, repairs drift and removes them.
package flowtable

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	"sigs.k8s.io/knftables"

	"github.com/hostaccel/hostaccel/internal/model"
	"github.com/hostaccel/hostaccel/internal/nftdump"
)

const (
	Family        = knftables.InetFamily
	TableName     = "hostaccel"
	FlowtableName = "fastpath"
	ChainName     = "forward"
	// OffloadChain holds the one `flow add`: a class rule ends in `goto to-fastpath`, so that a
	// packet of a matched connection leaves the forward chain at its class whether or not
	// the flow can be added yet (`flow add` ends its rule, not the chain, for a packet it
	// does not offload: a SYN, a FIN, a flow already offloaded). Without it such packets,
	// most of a short connection's, walked every later rule.
	OffloadChain = "to-fastpath"
	DevicesSet   = "fastpath-devices"
	// ChainPriority runs the offload decision after filter-priority chains of other tables
	// (network policy, firewalls): a connection they drop never becomes established, so it
	// is never offloaded.
	ChainPriority = "filter + 10"
)

// Options are kernel-dependent rendering choices (from probe).
type Options struct {
	// FlowtableCounter says the kernel has the flowtable's counter flag (>= 5.7); it is set
	// when the state asks for it (CountOffloaded), so that conntrack keeps counting packets
	// and bytes of offloaded flows.
	FlowtableCounter bool
}

// Ruleset is the desired content of table inet hostaccel.
type Ruleset struct {
	Comment   string
	Flowtable *knftables.Flowtable
	Sets      []*knftables.Set
	Elements  map[string][]string // set name -> element keys, as nft writes them
	Chain     *knftables.Chain
	Rules     []*knftables.Rule
	// Offload is the regular chain class rules go to, with its one rule (OffloadRule).
	Offload     *knftables.Chain
	OffloadRule *knftables.Rule
	// DeviceIndex is the interface index of each device where the state knew it: a device
	// the kernel no longer lists in the flowtable but that still exists with that index was
	// taken out by someone (drift), not dropped with its link (Manager.vanished).
	DeviceIndex map[string]int
}

type family struct {
	suffix string // "v4" / "v6"
	proto  string // "ip" / "ip6"
	addr   string // set type
	is     func(netip.Addr) bool
	// inline holds, per set of inlineSets (without suffix), its one prefix when it has one:
	// rules compare with it instead of looking the set up.
	inline map[string]string
}

var families = []family{
	{"v4", "ip", "ipv4_addr", netip.Addr.Is4, nil},
	{"v6", "ip6", "ipv6_addr", netip.Addr.Is6, nil},
}

// inlineSets are the sets whose rules compare with the prefix itself while the set holds one
// per family: a mask and a compare cost a slow-path packet less than an interval set's tree
// lookup (a Pod-to-Service or NodePort packet then meets no lookup at all; the TCP_CRR effect
// is below what the VM bench resolves, docs/benchmarks/2026-11-25-1a1505f-crr.md). They are
// the node's own addresses and the cluster's Service CIDRs, which a node has one of per
// family and which seldom change: a change rewrites the rule, which rebuilds the table (its
// offloaded flows restart on the normal path). Sets that change with the cluster (peer
// Pods, peer nodes, LoadBalancer IPs, exclusions) stay sets, updated element by element.
var inlineSets = []string{"local-pod", "service", "node-ip"}

// address sets, each per family; prefixes (interval) unless noted.
var addrSets = []struct{ name, comment string }{
	{"local-pod", "this node's Pod CIDRs"},
	{"peer-pod", "Pod CIDRs of peer nodes"},
	{"service", "Service CIDRs (empty: any DNAT-ed destination is a Service)"},
	{"node-ip", "this node's IPs (NodePort)"},
	{"peer-node-ip", "peer nodes' IPs"},
	{"lb-ip", "LoadBalancer ingress and external IPs"},
	{"exclude", "never offloaded, as source or destination, before or after NAT"},
}

// Render computes the ruleset for s. It is pure: no kernel, no root.
func Render(s model.State, o Options) *Ruleset {
	prio := knftables.FilterIngressPriority
	if o.FlowtableCounter && s.CountOffloaded {
		// knftables v0.0.22 has no flowtable counter field; it writes Priority verbatim after
		// "hook ingress priority", so nft's "counter ;" statement rides along in that string.
		prio = "filter ; counter"
	}
	r := &Ruleset{
		Flowtable: &knftables.Flowtable{Name: FlowtableName, Priority: &prio, Devices: s.Devices()},
		Elements:  map[string][]string{},
		Chain: &knftables.Chain{
			Name:     ChainName,
			Type:     knftables.PtrTo(knftables.FilterType),
			Hook:     knftables.PtrTo(knftables.ForwardHook),
			Priority: knftables.PtrTo(knftables.BaseChainPriority(ChainPriority)),
			Comment:  knftables.PtrTo("offload eligible forwarded connections to @" + FlowtableName),
		},
		Offload: &knftables.Chain{Name: OffloadChain, Comment: knftables.PtrTo("a class rule's connections: added to @" + FlowtableName + " once the kernel can (established, not closing)")},
		OffloadRule: &knftables.Rule{Chain: OffloadChain, Rule: "flow add @" + FlowtableName,
			Comment: knftables.PtrTo("the packet leaves the forward chain here whether or not its flow is added")},
		DeviceIndex: s.DeviceIndex,
	}
	r.Sets = append(r.Sets, &knftables.Set{Name: DevicesSet, Type: "ifname", Comment: knftables.PtrTo("devices of the flowtable")})
	for _, d := range s.Devices() {
		r.Elements[DevicesSet] = append(r.Elements[DevicesSet], `"`+d+`"`)
	}
	values := map[string][]netip.Prefix{
		"local-pod": s.LocalPodCIDRs, "peer-pod": s.PeerPodCIDRs, "service": s.ServiceCIDRs,
		"node-ip": hosts(s.NodeIPs), "peer-node-ip": hosts(s.PeerNodeIPs),
		"lb-ip": s.LoadBalancerIPs, "exclude": s.Exclude,
	}
	for _, f := range families {
		for _, as := range addrSets {
			name := as.name + "-" + f.suffix
			r.Sets = append(r.Sets, &knftables.Set{
				Name: name, Type: f.addr, Flags: []knftables.SetFlag{knftables.IntervalFlag},
				Comment: knftables.PtrTo(as.comment),
			})
			for _, p := range values[as.name] {
				if f.is(p.Addr()) {
					r.Elements[name] = append(r.Elements[name], p.String())
				}
			}
		}
	}

	rule := func(text, comment string) {
		r.Rules = append(r.Rules, &knftables.Rule{Chain: ChainName, Rule: text, Comment: knftables.PtrTo(comment)})
	}
	// The guards. The kernel offloads a TCP connection once it is established and ends the
	// offload at FIN or RST: a SYN, SYN-ACK, FIN or RST can never start one, and they are
	// most of a short connection's slow-path packets, so they leave first, uncounted (one
	// compare; `flow add` would refuse them after the class rules). The kernel would not
	// offload other protocols either, but without the second guard an ICMP echo's or error's
	// packets would be counted in a class (two compares cost less than a set lookup). The
	// device guards keep connections on other links (a second uplink, a VPN) out of the
	// flowtable, whose hook only sees its own devices (such a flow would be half offloaded).
	rule(flagsGuard, "TCP SYN, FIN and RST never start an offload (the kernel offloads established connections): they take the normal path, uncounted")
	rule("meta l4proto != tcp meta l4proto != udp return", "the flowtable offloads TCP and UDP; ICMP (errors, PMTU) always takes the normal path")
	rule(deviceGuard("iif", s.Devices(), s.DeviceIndex), "input device not in the flowtable")
	rule(deviceGuard("oif", s.Devices(), s.DeviceIndex), "output device not in the flowtable")
	// Only rules that can match exist: exclude rules while the family's exclude set has
	// elements, a class rule while every set it requires has some. Emptiness is part of the
	// spec, so such a change rebuilds the table in one transaction.
	threshold := ""
	if s.PacketThreshold > 0 {
		threshold = fmt.Sprintf(" ct packets > %d", s.PacketThreshold)
	}
	for _, f := range families {
		has := func(set string) bool { return len(r.Elements[set+"-"+f.suffix]) > 0 }
		f.inline = map[string]string{}
		for _, set := range inlineSets {
			if l := r.Elements[set+"-"+f.suffix]; len(l) == 1 {
				f.inline[set] = l[0]
			}
		}
		if has("exclude") {
			ex := "@exclude-" + f.suffix
			for _, m := range []string{"ct original " + f.proto + " saddr", "ct original " + f.proto + " daddr", "ct reply " + f.proto + " saddr", "ct reply " + f.proto + " daddr"} {
				rule(m+" "+ex+" counter return", "exclude: "+m)
			}
		}
		for _, cm := range ruleOrder(s.Classes, f, len(s.ServiceCIDRs) > 0) {
			if !slices.ContainsFunc(cm.m.needs, func(set string) bool { return !has(set) }) {
				rule(cm.m.match+threshold+" counter goto "+OffloadChain,
					fmt.Sprintf("%s %s: %s", cm.class, f.suffix, cm.m.what))
			}
		}
	}
	r.Comment = "hostaccel flowtable datapath, spec " + r.spec()
	return r
}

// flagsGuard returns TCP SYN, FIN and RST packets. It loads the four bytes at offset 12 of the
// transport header (data offset, flags, window) and masks FIN|SYN|RST in the flags byte: nf_tables
// evaluates a 4-byte load, mask and compare inline, while `tcp flags & (fin | syn | rst) != 0`
// (a 1-byte mask, which the kernel calls a function for) cost one call more on every slow-path
// TCP packet. The protocol test comes after the mask, so that an established connection's ACK,
// which the mask already fails, makes no call at all; a UDP or ICMP packet whose bytes there
// happen to match fails `meta l4proto tcp`, and one too short for the load ends the rule.
// Measured in the VM: TCP_CRR Pod-to-Service +0.8%, the other cells unchanged or up
// (docs/benchmarks/2026-11-26-9fe6591-crr-shapes.md).
const flagsGuard = "@th,96,32 & 0x70000 != 0 meta l4proto tcp return"

// maxInlineDevices is how many flowtable devices the guards compare one by one; beyond it
// they look the name up in @fastpath-devices. A compare costs a packet far less than a set
// lookup, and a node has few such devices (a gateway and a transport, often); a device that
// joins or leaves changes the guard's text, which rebuilds the table, as it already
// recreates the flowtable.
const maxInlineDevices = 4

// deviceGuard is the rule that returns packets whose device (key: "iif" or "oif") is not one
// of devs. With every device's index known it compares indexes (`iif != 3`), else names
// (`iifname != "gw"`): an index is a 4-byte compare that nf_tables makes inline, a name a
// 16-byte one, and `iif` reads the device's index where `iifname` copies its name (VM,
// TCP_CRR: +0.4% Pod-to-Pod, +0.5% Pod-to-Service). An index is in the rule's text, so a
// device deleted and created again under its name (a new index) changes the spec at the next
// sync, and the table is rebuilt; until then the old index matches nothing and the new
// device's packets take the normal path, as they would anyway: the flowtable lost the device
// with its deletion.
func deviceGuard(key string, devs []string, index map[string]int) string {
	if len(devs) == 0 || len(devs) > maxInlineDevices {
		return key + "name != @" + DevicesSet + " return"
	}
	var b strings.Builder
	indexed := !slices.ContainsFunc(devs, func(d string) bool { return index[d] <= 0 })
	for _, d := range devs {
		if indexed {
			fmt.Fprintf(&b, "%s != %d ", key, index[d])
		} else {
			fmt.Fprintf(&b, "%sname != %q ", key, d)
		}
	}
	return b.String() + "return"
}

// ruleOrder lists the class rules of a family in the order the forward chain walks them. A
// slow-path packet pays for every rule before its own, so the commonest connections come
// first: Pod-to-Pod from a local Pod (one compare and one lookup), then Pod-to-Service,
// then Pod-to-Pod towards a local Pod, then the other classes. A Pod-to-Service packet thus
// meets one failed lookup before its rule, not also the inbound Pod-to-Pod rule; and an
// inbound Pod-to-Pod packet fails the Pod-to-Service rule at its `ct status` test. The order
// changes no decision: a connection that two classes describe (a local Pod's connection
// DNAT-ed to a peer Pod, while no Service CIDR is set) is offloaded either way and counted
// under the first, as before. (Sending DNAT-ed connections to a chain of their own with one
// `ct status dnat` test saves a Pod-to-Service packet two `ct` loads and a lookup, yet
// measured -0.4% Pod-to-Service, +0.3% Pod-to-Pod TCP_CRR in the VM: not kept; see
// docs/benchmarks/2026-11-26-9fe6591-crr-shapes.md.)
func ruleOrder(cs []model.Class, f family, haveServiceCIDRs bool) []classMatch {
	var out []classMatch
	for _, c := range cs {
		for i, m := range classMatches(c, f, haveServiceCIDRs) {
			rank := 3
			switch {
			case c == model.PodToPod && i == 0:
				rank = 0
			case c == model.PodToService:
				rank = 1
			case c == model.PodToPod:
				rank = 2
			}
			out = append(out, classMatch{m, c, rank})
		}
	}
	slices.SortStableFunc(out, func(a, b classMatch) int { return a.rank - b.rank })
	return out
}

type classMatch struct {
	m     match
	class model.Class
	rank  int
}

type match struct {
	match, what string
	needs       []string // sets (without family suffix) that must have elements to match
}

// classMatches says, per class, which connections belong to it. Matches use the conntrack
// tuples (ct original / ct reply), so a rule matches a connection's packets in both
// directions, whichever packet first passes the kernel's offload checks. The cheapest,
// most selective test comes first (`ct status` before set lookups), so that a packet of
// another class leaves the rule at its first expression.
func classMatches(c model.Class, f family, haveServiceCIDRs bool) []match {
	o := func(dir, set string) string {
		op, name, _ := strings.Cut(set, "@")
		if p, ok := f.inline[name]; ok {
			return "ct original " + f.proto + " " + dir + " " + op + p
		}
		return "ct original " + f.proto + " " + dir + " " + set + "-" + f.suffix
	}
	switch c {
	case model.PodToPod:
		return []match{
			{o("saddr", "@local-pod") + " " + o("daddr", "@peer-pod"), "local Pods to peer Pods", []string{"local-pod", "peer-pod"}},
			{o("daddr", "@local-pod") + " " + o("saddr", "@peer-pod"), "peer Pods to local Pods", []string{"local-pod", "peer-pod"}},
		}
	case model.LocalPodToPod:
		return []match{{"meta l4proto tcp " + o("saddr", "@local-pod") + " " + o("daddr", "@local-pod"), "local Pods to local Pods (TCP)", []string{"local-pod"}}}
	case model.PodToService:
		m, needs := "ct status dnat "+o("saddr", "@local-pod"), []string{"local-pod"}
		if haveServiceCIDRs {
			m += " " + o("daddr", "@service")
			needs = append(needs, "service")
		}
		return []match{{m, "local Pods to Services, after DNAT", needs}}
	case model.ExternalToNodePort:
		return []match{{"ct status dnat " + o("daddr", "@node-ip") + " " + o("saddr", "!= @local-pod"), "external clients to NodePorts, after DNAT", []string{"node-ip"}}}
	case model.ExternalToLoadBalancer:
		return []match{{o("daddr", "@lb-ip") + " " + o("saddr", "!= @local-pod"), "external clients to LoadBalancer and external IPs", []string{"lb-ip"}}}
	case model.NodeToRemotePod:
		return []match{{o("saddr", "@peer-node-ip") + " " + o("daddr", "@local-pod"), "peer nodes' host network to local Pods", []string{"peer-node-ip", "local-pod"}}}
	case model.ExternalToService:
		return []match{{"ct status snat " + o("saddr", "!= @local-pod"), "external clients to Services, source-NATed by this node", []string{"local-pod"}}}
	}
	return nil
}

// spec hashes everything but set elements and devices: when it changes, the table is rebuilt.
func (r *Ruleset) spec() string {
	h := sha256.New()
	fmt.Fprintf(h, "%s\n", *r.Flowtable.Priority)
	for _, s := range r.Sets {
		fmt.Fprintf(h, "set %s %s %v\n", s.Name, s.Type, s.Flags)
	}
	fmt.Fprintf(h, "chain %s %s\n", r.Chain.Name, *r.Chain.Priority)
	fmt.Fprintf(h, "chain %s: %s # %s\n", r.Offload.Name, r.OffloadRule.Rule, *r.OffloadRule.Comment)
	for _, rl := range r.Rules {
		fmt.Fprintf(h, "rule %s # %s\n", rl.Rule, *rl.Comment)
	}
	return hex.EncodeToString(h.Sum(nil))[:16]
}

func hosts(as []netip.Addr) []netip.Prefix {
	var out []netip.Prefix
	for _, a := range as {
		out = append(out, netip.PrefixFrom(a, a.BitLen()))
	}
	return out
}

// txFlowtable is r's flowtable as a transaction writes it: knftables writes the devices as
// they are, and nft parses a device's name only quoted when it is no plain word (eth<, 1gw)
// or one of its keywords (vlan, bridge, counter, ip: a review found `gateways: [vlan]`
// failing every transaction with a syntax error), so every name is quoted. (Listings give
// the names bare, as r has them.)
func (r *Ruleset) txFlowtable() *knftables.Flowtable {
	ft := *r.Flowtable
	ft.Devices = slices.Clone(ft.Devices)
	for i, d := range ft.Devices {
		ft.Devices[i] = strconv.Quote(d)
	}
	return &ft
}

// AddAll adds the whole ruleset to tx (after the table exists in tx).
func (r *Ruleset) AddAll(tx *knftables.Transaction) {
	tx.Add(r.table())
	tx.Add(r.txFlowtable())
	for _, s := range r.Sets {
		tx.Add(s)
		for _, e := range r.Elements[s.Name] {
			tx.Add(elem(s.Name, e))
		}
	}
	tx.Add(r.Offload)
	tx.Add(r.OffloadRule)
	tx.Add(r.Chain)
	for _, rl := range r.Rules {
		tx.Add(rl)
	}
}

func (r *Ruleset) table() *knftables.Table {
	return &knftables.Table{Comment: knftables.PtrTo(r.Comment)}
}

func elem(set, key string) *knftables.Element {
	return &knftables.Element{Set: set, Key: []string{key}}
}

// Dump renders the ruleset as the nft script a fresh apply installs (the knftables Fake's
// deterministic dump), for `hostaccel render` and golden files.
// The elements bypass the Fake, whose element handling is quadratic (nftdump).
func (r *Ruleset) Dump() (string, error) {
	var elems []*knftables.Element
	for _, s := range r.Sets {
		for _, e := range r.Elements[s.Name] {
			elems = append(elems, elem(s.Name, e))
		}
	}
	bare := *r
	bare.Elements = nil
	return nftdump.Table(knftables.NewFake(Family, TableName), bare.AddAll, elems)
}

// ClassOf returns the class a rule comment belongs to ("" for non-class rules).
func ClassOf(comment string) model.Class {
	name, _, _ := strings.Cut(comment, " ")
	for _, c := range model.Classes {
		if model.Class(name) == c {
			return c
		}
	}
	return ""
}
