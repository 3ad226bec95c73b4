// Package config reads hostaccel's one declarative YAML file, validates it strictly (unknown
// keys are errors, every error names the field and the value) and turns it into a model.State.
package config

import (
	"bytes"
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strings"
	"time"

	"github.com/hostaccel/hostaccel/internal/lb"
	"github.com/hostaccel/hostaccel/internal/model"
)

// Config is the file format. See docs/config.md and examples/.
type Config struct {
	// Datapath: flowtable, tc, sockmap, auto or none.
	Datapath string `json:"datapath"`
	Node     Node   `json:"node"`
	// Classes to accelerate, each on or off. Classes left out are off.
	Classes map[string]bool `json:"classes"`
	// PacketThreshold offloads a connection only once it has carried more than this many
	// packets (both directions, `ct packets > N`, as Kindnet's --fastpath-threshold).
	// 0 offloads at the first eligible packet (as Antrea does).
	PacketThreshold int `json:"packetThreshold"`
	// Exclude lists CIDRs never offloaded, as source or destination, before or after NAT:
	// offloaded packets skip the forward and postrouting hooks, so traffic that policy or
	// QoS must see belongs here.
	Exclude []string `json:"exclude"`
	// Flowtable tunes the flowtable datapath (datapath flowtable, or auto where it picks it).
	Flowtable Flowtable `json:"flowtable"`
	// TC tunes the tc datapath (datapath tc, or auto where it picks tc).
	TC TC `json:"tc"`
	// Sockmap tunes the sockmap datapath.
	Sockmap Sockmap `json:"sockmap"`
	Agent   Agent   `json:"agent"`
	// LoadBalancer is the nftables L4 load balancer (docs/lb.md).
	LoadBalancer lb.Config `json:"loadBalancer"`
}

// Flowtable tunes the flowtable datapath.
type Flowtable struct {
	// CountOffloaded sets the flowtable's counter flag (Linux >= 5.7), so that conntrack's
	// packet and byte counters keep running for offloaded flows. Off by default: conntrack
	// has counters only with net.netfilter.nf_conntrack_acct=1, and the flag costs every
	// offloaded packet (~0.4% of TCP_RR in the VM bench).
	CountOffloaded bool `json:"countOffloaded"`
}

// Sockmap tunes the sockmap datapath.
type Sockmap struct {
	// Auto lets `datapath: auto` put local-pod-to-pod on the sockmap datapath where the
	// kernel can. Off by default: a receiver that reads with splice(2), as Go's io.Copy from
	// one TCP connection to another does (every Go TCP proxy), does not see the data moved
	// socket to socket and loses it at EOF, silently. Turn it on where no Pod does that.
	Auto bool `json:"auto"`
}

// TC tunes the tc datapath.
type TC struct {
	// NATCheck says where the tc program asks conntrack whether this node's stack NATs a
	// flow, so that such flows stay on the stack: both (default), toward-pods, off. See
	// docs/config.md for what each risks.
	NATCheck model.NATCheck `json:"natCheck"`
	// NATCarry (default true) lets the tc program carry the established TCP connections this
	// node NATs that the flowtable offloaded (translated as conntrack says, and redirected),
	// instead of handing them to the flowtable; false leaves them to the flowtable. Needs
	// the NAT check. See docs/config.md.
	NATCarry *bool `json:"natCarry,omitempty"`
}

// Node describes this node's interfaces and addresses.
type Node struct {
	// Gateways are interface names; one ending in "*" names every interface whose name starts
	// with what precedes it (a CNI's per-Pod veths: "knet*", "cali*"), as they come and go.
	Gateways   []string   `json:"gateways"`
	Transports Transports `json:"transports"`

	LocalPodCIDRs   []string `json:"localPodCIDRs"`
	PeerPodCIDRs    []string `json:"peerPodCIDRs"`
	ServiceCIDRs    []string `json:"serviceCIDRs"`
	NodeIPs         []string `json:"nodeIPs"`
	PeerNodeIPs     []string `json:"peerNodeIPs"`
	LoadBalancerIPs []string `json:"loadBalancerIPs"`
}

// IsGateway reports whether an entry of Gateways names interface name.
func (n Node) IsGateway(name string) bool { return n.gateway(name) != "" }

// gateway returns the entry of Gateways that names interface name (itself, or a pattern that
// matches it), or "".
func (n Node) gateway(name string) string {
	for _, g := range n.Gateways {
		if gatewayNames(g, name) {
			return g
		}
	}
	return ""
}

// gatewayNames reports whether gateway entry g names interface name: g is name, or a pattern
// ("knet*") that name starts with.
func gatewayNames(g, name string) bool {
	p, ok := strings.CutSuffix(g, "*")
	return g == name || ok && strings.HasPrefix(name, p)
}

// Transports is either the word "auto" (every up, non-loopback link that is not a gateway)
// or a list of interface names.
type Transports struct {
	Auto  bool
	Names []string
}

func (t *Transports) UnmarshalJSON(b []byte) error {
	if string(b) == "null" { // `transports:` left empty (json.Marshal writes no transports so too)
		*t = Transports{}
		return nil
	}
	var s string
	if json.Unmarshal(b, &s) == nil {
		if s != "auto" {
			return fmt.Errorf("node.transports: %s is neither \"auto\" nor a list of interfaces", model.Quote(s))
		}
		*t = Transports{Auto: true}
		return nil
	}
	var names []string
	if err := json.Unmarshal(b, &names); err != nil {
		return fmt.Errorf("node.transports: want \"auto\" or a list of interface names")
	}
	*t = Transports{Names: names}
	return nil
}

func (t Transports) MarshalJSON() ([]byte, error) {
	if t.Auto {
		return json.Marshal("auto")
	}
	return json.Marshal(t.Names)
}

// Agent tunes the daemon.
type Agent struct {
	// ResyncPeriod is how often the agent compares the kernel with the desired state and
	// repairs drift (default 30s).
	ResyncPeriod model.Duration `json:"resyncPeriod"`
	// MinSyncInterval rate-limits syncs triggered by events (default 1s).
	MinSyncInterval model.Duration `json:"minSyncInterval"`
}

// ReadFile reads a config file; one larger than 16 MiB (model.MaxConfigSize) is an error.
func ReadFile(path string) ([]byte, error) { return model.ReadConfigFile(path) }

// Load reads and validates a config file.
func Load(path string) (*Config, error) {
	b, err := ReadFile(path)
	if err != nil {
		return nil, err
	}
	c, err := Parse(b)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return c, nil
}

// Parse decodes YAML strictly and validates it.
func Parse(b []byte) (*Config, error) {
	c := Defaults()
	if err := model.UnmarshalStrict(b, &c); err != nil {
		return nil, err
	}
	return c.finish()
}

// ParseJSON is Parse for a config written as JSON by a program (the Kubernetes source's
// derivation): encoding/json, strict, without the YAML parser, which costs a second for a
// config of 5,000 services. The checks and defaults are Parse's.
func ParseJSON(b []byte) (*Config, error) {
	c, err := decodeJSON(b)
	if err != nil {
		return nil, err
	}
	return c.finish()
}

// decodeJSON decodes one config object strictly: no unknown fields, nothing after it.
func decodeJSON(b []byte) (Config, error) {
	c := Defaults()
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&c); err != nil {
		return c, err
	}
	if dec.More() {
		return c, errors.New("trailing data after the config")
	}
	return c, nil
}

// ParseJSONServices is ParseJSON for a config written as JSON without its load balancer's
// services (rest) and those services, decoded already (svcs): the Kubernetes source keeps the
// services that did not change from one derivation to the next instead of writing and reading
// thousands again. was, when not nil, are the services of a config that passed these checks:
// the services are then checked with lb.ValidateChange (the same errors).
func ParseJSONServices(rest []byte, svcs, was []lb.Service) (*Config, error) {
	c, err := decodeJSON(rest)
	if err != nil {
		return nil, err
	}
	if len(c.LoadBalancer.Services) > 0 {
		return nil, errors.New("loadBalancer.services: given twice")
	}
	c.LoadBalancer.Services = svcs
	return c.finishChange(was)
}

// Defaults is the config a decode starts from: the agent's periods are there unless the
// input sets them, so that a period written as "0s" is the user's (a minimum sync interval
// of none; a resync period the checks refuse), not taken for a missing one.
func Defaults() Config {
	var c Config
	c.Agent.ResyncPeriod.Duration = 30 * time.Second
	c.Agent.MinSyncInterval.Duration = time.Second
	return c
}

// finish fills in the defaults and validates.
func (c Config) finish() (*Config, error) { return c.finishChange(nil) }

// finishChange is finish; with was not nil, the load balancer's services are checked against
// was (lb.Config.ValidateChange).
func (c Config) finishChange(was []lb.Service) (*Config, error) {
	if c.Datapath == "" {
		c.Datapath = model.DatapathFlowtable
	}
	if err := c.validate(was); err != nil {
		return nil, err
	}
	return &c, nil
}

// Errors collects every validation error so that a user fixes them in one go.
type Errors []error

func (e Errors) Error() string {
	s := make([]string, len(e))
	for i, err := range e {
		s[i] = err.Error()
	}
	return strings.Join(s, "\n")
}

func (c *Config) validate(lbWas []lb.Service) error {
	var errs Errors
	bad := func(format string, a ...any) { errs = append(errs, fmt.Errorf(format, a...)) }

	if !slices.Contains(datapaths, c.Datapath) {
		bad("datapath: %s is not one of flowtable, tc, sockmap, auto, none", model.Quote(c.Datapath))
	}
	fastpath := c.Datapath != model.DatapathNone
	if fastpath && len(c.Node.Gateways) == 0 {
		bad("node.gateways: at least one gateway interface is required")
	}
	checkNames := func(field string, names []string) {
		for i, n := range names {
			if !model.ValidInterfaceName(n) {
				bad("%s[%d]: %s is not a valid interface name", field, i, model.Quote(n))
			}
		}
	}
	for i, n := range c.Node.Gateways {
		if p, ok := strings.CutSuffix(n, "*"); ok && (!model.ValidInterfaceName(p) || strings.Contains(p, "*")) {
			bad("node.gateways[%d]: %s is not a valid interface name or pattern (a name, or the start of names followed by one *)", i, model.Quote(n))
		} else if !ok && !model.ValidInterfaceName(n) {
			bad("node.gateways[%d]: %s is not a valid interface name", i, model.Quote(n))
		}
	}
	checkNames("node.transports", c.Node.Transports.Names)
	if fastpath && !c.Node.Transports.Auto && len(c.Node.Transports.Names) == 0 {
		bad("node.transports: list at least one interface, or say \"auto\"")
	}
	for i, n := range c.Node.Transports.Names {
		if g := c.Node.gateway(n); g != "" {
			bad("node.transports[%d]: %s is also a gateway (node.gateways: %s)", i, model.Quote(n), model.Quote(g))
		}
	}

	local := parsePrefixes(&errs, "node.localPodCIDRs", c.Node.LocalPodCIDRs)
	peer := parsePrefixes(&errs, "node.peerPodCIDRs", c.Node.PeerPodCIDRs)
	svc := parsePrefixes(&errs, "node.serviceCIDRs", c.Node.ServiceCIDRs)
	lb := parsePrefixes(&errs, "node.loadBalancerIPs", c.Node.LoadBalancerIPs)
	excl := parsePrefixes(&errs, "exclude", c.Exclude)
	parseAddrs(&errs, "node.nodeIPs", c.Node.NodeIPs)
	parseAddrs(&errs, "node.peerNodeIPs", c.Node.PeerNodeIPs)
	if fastpath && len(c.Node.LocalPodCIDRs) == 0 {
		bad("node.localPodCIDRs: at least one local Pod CIDR is required")
	}
	noOverlap(&errs, local)
	noOverlap(&errs, peer)
	noOverlap(&errs, svc) // (an nft interval set refuses overlapping elements)
	noOverlapWith(&errs, peer, local)
	noOverlapWith(&errs, svc, local)
	noOverlapWith(&errs, svc, peer)
	noOverlap(&errs, lb)
	noOverlap(&errs, excl)
	// The tc datapath reads an IPv4-mapped IPv6 prefix as IPv4, the flowtable as IPv6 (where
	// it never matches), and the overlap checks above as IPv6: only one spelling is allowed.
	for _, fs := range [][]field{local, peer, svc, lb, excl} {
		for _, f := range fs {
			if f.p.Addr().Is4In6() {
				bad("%s: %s is an IPv4-mapped IPv6 prefix; write it as IPv4", f.name(), f.p)
			}
		}
	}
	for _, l := range []struct {
		name string
		in   []string
	}{{"node.nodeIPs", c.Node.NodeIPs}, {"node.peerNodeIPs", c.Node.PeerNodeIPs}} {
		for i, s := range l.in {
			if a, err := netip.ParseAddr(s); err == nil && a.Is4In6() {
				bad("%s[%d]: %q is an IPv4-mapped IPv6 address; write it as IPv4 (%s)", l.name, i, s, a.Unmap())
			}
		}
	}

	// (in name order: a map's order would change the error text from parse to parse, and the
	// Kubernetes source takes a new text for a new rejection)
	for _, name := range slices.Sorted(maps.Keys(c.Classes)) {
		on := c.Classes[name]
		switch {
		case !slices.Contains(model.Classes, model.Class(name)):
			bad("classes: unknown class %s (known: %s)", model.Quote(name), classList())
		case on && c.Datapath == model.DatapathTC && !slices.Contains(model.TCClasses, model.Class(name)):
			bad("classes.%s: datapath tc cannot serve it (it needs the host stack's NAT); use flowtable or auto", name)
		case on && c.Datapath == model.DatapathSockmap && model.Class(name) != model.LocalPodToPod:
			bad("classes.%s: datapath sockmap serves only local-pod-to-pod; use auto to give the other classes to tc or the flowtable", name)
		}
	}
	if c.TC.NATCheck == "false" { // YAML 1.1 reads the documented bare `off` as the boolean false
		c.TC.NATCheck = model.NATCheckOff
	}
	if n := c.TC.NATCheck; n != "" && !slices.Contains(model.NATChecks, n) {
		bad("tc.natCheck: %s is not one of both, toward-pods, off", model.Quote(string(n)))
	}
	if c.PacketThreshold < 0 {
		bad("packetThreshold: %d is negative; use 0 to offload at once", c.PacketThreshold)
	}
	if c.Agent.ResyncPeriod.Duration < time.Second {
		bad("agent.resyncPeriod: %s is shorter than 1s", c.Agent.ResyncPeriod.Duration)
	}
	if c.Agent.MinSyncInterval.Duration < 0 {
		bad("agent.minSyncInterval: %s is negative", c.Agent.MinSyncInterval.Duration)
	}
	if lbWas != nil {
		errs = append(errs, c.LoadBalancer.ValidateChange(lbWas)...)
	} else {
		errs = append(errs, c.LoadBalancer.Validate()...)
	}
	if len(errs) > 0 {
		return errs
	}
	return nil
}

func classList() string {
	s := make([]string, len(model.Classes))
	for i, c := range model.Classes {
		s[i] = string(c)
	}
	return strings.Join(s, ", ")
}

// field is entry i of the config's list named list, a prefix. (Its name is spelled only for
// an error: at 10,000 peer CIDRs spelling every one cost a one-shot apply ~2 ms.)
type field struct {
	list string
	i    int
	p    netip.Prefix
}

// name is the field's name in errors: list[i].
func (f *field) name() string { return fmt.Sprintf("%s[%d]", f.list, f.i) }

func parsePrefixes(errs *Errors, name string, in []string) []field {
	out := make([]field, 0, len(in))
	for i, s := range in {
		p, err := model.ParsePrefix(s)
		if err != nil {
			*errs = append(*errs, fmt.Errorf("%s[%d]: %w", name, i, err))
			continue
		}
		out = append(out, field{name, i, p})
	}
	return out
}

func parseAddrs(errs *Errors, name string, in []string) []netip.Addr {
	var out []netip.Addr
	for i, s := range in {
		a, err := model.ParseAddr(s)
		if err != nil {
			*errs = append(*errs, fmt.Errorf("%s[%d]: %w", name, i, err))
			continue
		}
		out = append(out, a)
	}
	return out
}

// noOverlap reports overlapping prefixes within a.
func noOverlap(errs *Errors, a []field) { overlaps(errs, a, nil, true) }

// noOverlapWith reports the prefixes of a that overlap one of b (none when either is empty).
func noOverlapWith(errs *Errors, a, b []field) {
	if len(a) > 0 && len(b) > 0 {
		overlaps(errs, a, b, false)
	}
}

// overlaps reports overlapping prefixes within a, or between a and b. CIDRs either nest or
// are disjoint, so one sweep over the prefixes sorted by first address, keeping the chain of
// entries that contain the current one (one per prefix length at most), finds every
// overlapping pair: O(n log n) plus the pairs (comparing every pair took 20 s for 40k
// excludes). Copies of a prefix are reported against its first entry, not against each other.
func overlaps(errs *Errors, a, b []field, within bool) {
	// an entry: its list (0: a, 1: b) and its index there (16 bytes, where a copy of the
	// field was 64: at 10,000 peer CIDRs the copies cost a new process ~4 ms of fresh memory)
	type entry struct{ list, idx int }
	lists := [2][]field{a, b}
	at := func(e entry) *field { return &lists[e.list][e.idx] }
	all := make([]entry, 0, len(a)+len(b))
	for i := range a {
		all = append(all, entry{0, i})
	}
	for i := range b {
		all = append(all, entry{1, i})
	}
	// (in prefix order, a's entries before b's where equal, each list in its order: the order
	// of a stable sort, without moving the entries)
	order := model.SortedOrder(len(all), func(i int) netip.Prefix { return at(all[i]).p })
	var chain [2][]entry // per list: the entries containing the current one, outermost first
	var found [][2]entry // [reported, the one it overlaps]
	for _, i := range order {
		e := all[i]
		p := at(e).p
		for l := range chain {
			c := chain[l]
			for len(c) > 0 && !at(c[len(c)-1]).p.Contains(p.Addr()) {
				c = c[:len(c)-1]
			}
			chain[l] = c
		}
		other := 1 - e.list
		if within {
			other = 0
		}
		c := chain[other]
		for k := len(c) - 1; k >= 0; k-- {
			x, y := c[k], e
			if e.list < x.list || e.list == x.list && e.idx < x.idx { // a's entry first, then the one listed first
				x, y = y, x
			}
			found = append(found, [2]entry{x, y})
		}
		if c := chain[e.list]; len(c) == 0 || at(c[len(c)-1]).p != p { // a copy stays out: the chain is at most 129 long
			chain[e.list] = append(c, e)
		}
	}
	slices.SortFunc(found, func(x, y [2]entry) int { return cmp.Or(x[0].idx-y[0].idx, x[1].idx-y[1].idx) })
	for _, f := range found {
		x, y := at(f[0]), at(f[1])
		*errs = append(*errs, fmt.Errorf("%s: %s overlaps %s %s", x.name(), x.p, y.name(), y.p))
	}
}

// datapaths are the values of a config's datapath.
var datapaths = []string{model.DatapathFlowtable, model.DatapathTC, model.DatapathSockmap, model.DatapathAuto, model.DatapathNone}

// PeekDatapath returns the datapath a config names on a top-level line of its own
// (`datapath: tc`, a comment may follow), without parsing the rest: a one-shot `apply`
// starts the kernel's probe for it while the config is parsed (at 10,000 peer CIDRs the
// parse is ~6 ms; the probe takes the same time at any size). "" when no such line names
// one, or two lines do (a flow-style or JSON config, a key quoted): the caller then waits for
// Parse, whose answer is the one that counts.
func PeekDatapath(b []byte) string {
	found := ""
	for line := range bytes.Lines(b) {
		rest, ok := bytes.CutPrefix(line, []byte("datapath:"))
		if !ok {
			continue
		}
		if i := bytes.IndexByte(rest, '#'); i >= 0 {
			rest = rest[:i]
		}
		v := string(bytes.TrimSpace(rest))
		if found != "" || !slices.Contains(datapaths, v) {
			return ""
		}
		found = v
	}
	return found
}
