package bench

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net"
	"net/netip"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/google/nftables"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/hostaccel/hostaccel/internal/probe"
	"github.com/hostaccel/hostaccel/internal/testbed"
)

// Sample is one netperf run of one cell.
type Sample struct {
	Variant string        `json:"variant"`
	Traffic Traffic       `json:"traffic"`
	Test    string        `json:"test"`
	Rep     int           `json:"rep"`
	Boot    int           `json:"boot,omitempty"` // the VM boot (from 1) when a run pooled several
	Value   float64       `json:"value"`          // 0 with Error set when the run failed
	Unit    string        `json:"unit"`
	Elapsed float64       `json:"elapsedSeconds,omitempty"`
	CPU     [2]int        `json:"cpuBind"` // netperf's, netserver's (-1: not bound)
	Path    *PathEvidence `json:"path,omitempty"`
	Error   string        `json:"error,omitempty"`
	At      time.Time     `json:"at"`
}

// PathEvidence are counter deltas over one sample: which way the traffic went.
type PathEvidence struct {
	// Nodes are the nodes on the path (for the direct link: the nodes it must not touch).
	Nodes []string `json:"nodes"`
	// NodePackets were received by those nodes on their gateway and transport links.
	NodePackets uint64 `json:"nodePackets"`
	// SlowPathPackets went through those nodes' forward hook (the normal path): the counter
	// after the node's forward rules. Offloaded packets skip it.
	SlowPathPackets uint64 `json:"slowPathPackets"`
	// ServiceConns are connections balanced by a kube-proxy-like Service chain.
	ServiceConns uint64 `json:"serviceConns"`
}

// SlowShare is the fraction of the nodes' packets that took the normal path (NaN: none).
func (p *PathEvidence) SlowShare() float64 {
	if p == nil || p.NodePackets == 0 {
		return math.NaN()
	}
	return float64(p.SlowPathPackets) / float64(p.NodePackets)
}

// Cell summarises the samples of one variant × traffic × test.
type Cell struct {
	Variant string  `json:"variant"`
	Traffic Traffic `json:"traffic"`
	Test    string  `json:"test"`
	Unit    string  `json:"unit"`
	Stats   Stats   `json:"stats"`
	Errors  int     `json:"errors"`
	// FirstError is the first line of the first failed run's error: why the cell failed.
	FirstError string `json:"firstError,omitempty"`
	// SlowShare is the median share of packets that took the nodes' normal path.
	SlowShare float64 `json:"slowPathShare"`
}

// PktgenSample is one pktgen round.
type PktgenSample struct {
	Variant string `json:"variant"`
	// Direction is the way the flow crossed the node (empty in older reports: Pod -> remote).
	Direction Direction `json:"direction,omitempty"`
	Rep       int       `json:"rep"`
	Sent      uint64    `json:"sent"`
	Received  uint64    `json:"received"`
	USec      uint64    `json:"usec"`
	PPS       float64   `json:"pps"` // received per second of the generator's run
	// SlowPathPackets went through the node's forward hook during the round.
	SlowPathPackets uint64 `json:"slowPathPackets"`
	// TC is how the tc program on the node took the round's packets (redirected: the FIB's
	// direct answer; peer, neigh, ...: see tc.Status.Via; passed: handed to the stack), where
	// the variant runs it.
	TC     map[string]uint64 `json:"tc,omitempty"`
	Kept   bool              `json:"kept"`
	Reason string            `json:"reason,omitempty"` // why it was discarded
}

// PktgenCell summarises the kept rounds of one variant in one direction.
type PktgenCell struct {
	Variant   string    `json:"variant"`
	Direction Direction `json:"direction,omitempty"`
	Stats     Stats     `json:"stats"` // packets/s at the sink
	Discarded int       `json:"discarded"`
	VsDirect  float64   `json:"vsDirect"`  // median / direct's median
	VsDefault float64   `json:"vsDefault"` // median / default's median
}

// VariantInfo says what became of a requested variant in one environment.
type VariantInfo struct {
	Name    string `json:"name"`
	Title   string `json:"title"`
	Note    string `json:"note,omitempty"`
	Ran     bool   `json:"ran"`
	Skipped string `json:"skipped,omitempty"`
	Ruleset string `json:"ruleset,omitempty"` // what it installs on the first node
}

// Run is everything measured in one kernel (the host's, or the VM's).
type Run struct {
	Env      string  `json:"env"` // "host" or "vm"
	Label    string  `json:"label"`
	Machine  Machine `json:"machine"`
	Pin      Pinning `json:"pinning"`
	Duration float64 `json:"durationSeconds"` // per netperf run, in this kernel's clock
	Reps     int     `json:"reps"`
	Boots    int     `json:"boots,omitempty"` // VM boots pooled (Reps counts all of them)
	// PhaseSpread is Options.PhaseSpread, in seconds.
	PhaseSpread float64       `json:"phaseSpreadSeconds,omitempty"`
	Rules       int           `json:"forwardRules"`
	Nodes       int           `json:"nodes"`
	Variants    []VariantInfo `json:"variants"`
	// DefaultRuleset is the default path of the first node.
	DefaultRuleset string         `json:"defaultRuleset,omitempty"`
	Samples        []Sample       `json:"samples"`
	Cells          []Cell         `json:"cells"`
	Pktgen         []PktgenSample `json:"pktgen,omitempty"`
	PktgenCells    []PktgenCell   `json:"pktgenCells,omitempty"`
	PktgenSize     int            `json:"pktgenSize,omitempty"`
	PktgenSkipped  string         `json:"pktgenSkipped,omitempty"`
	Notes          []string       `json:"notes,omitempty"`
	Started        time.Time      `json:"started"`
	Finished       time.Time      `json:"finished"`
}

// testHookBuilt is called once the netperf cluster runs (tests interrupt it then).
var testHookBuilt func(*Bed)

// splitVariants returns the variants of the cluster bed's netperf cells and those of its
// pktgen rounds. pktgen runs on the cluster bed: a same-node variant (sockmap, loopback)
// installs nothing there, and measured the default path under its own name.
func splitVariants(variants []Variant) (netperf, pktgen []Variant) {
	for _, v := range variants {
		if !v.LocalOnly && !v.PktgenOnly {
			netperf = append(netperf, v)
		}
		if !v.LocalOnly {
			pktgen = append(pktgen, v)
		}
	}
	return netperf, pktgen
}

// RunHere measures the variants this kernel supports, in this kernel. env labels the run.
func RunHere(ctx context.Context, o Options, env string, prog *Progress) (*Run, error) {
	if err := o.Validate(); err != nil {
		return nil, err
	}
	pin, err := ParsePin(o.Pin, runtime.NumCPU())
	if err != nil {
		return nil, err
	}
	caps := probe.Run(ctx)
	r := &Run{Env: env, Machine: CollectMachine(), Pin: pin, Duration: o.Duration.Seconds(), Reps: o.Reps, PhaseSpread: o.PhaseSpread.Seconds(), Rules: o.Rules, Nodes: o.Nodes, Started: time.Now()}
	r.Label = fmt.Sprintf("%s (kernel %s)", env, r.Machine.Kernel)
	if o.RaiseConntrackMax {
		testbed.RaiseConntrackMax(262144) // (in the VM, which goes with the run: not put back)
	}
	names := o.Variants
	if len(names) == 0 {
		names = DefaultNames()
	}
	var variants []Variant
	missing := map[string]bool{}
	for _, name := range names {
		v, _ := Lookup(name)
		info := VariantInfo{Name: v.Name, Title: v.Title, Note: v.Note}
		if miss := v.Missing(caps); len(miss) > 0 {
			info.Skipped = "this kernel lacks " + strings.Join(miss, ", ")
			for _, f := range miss {
				if !missing[f] {
					missing[f] = true
					r.Notes = append(r.Notes, fmt.Sprintf("probe: %s: %s", f, caps.Get(f).Detail))
				}
			}
		} else {
			info.Ran = true
			variants = append(variants, v)
		}
		r.Variants = append(r.Variants, info)
	}
	if !slices.ContainsFunc(variants, func(v Variant) bool { return v.Name == VariantDefault }) {
		r.Notes = append(r.Notes, "no default variant: percentages are not shown")
	}

	// Plan the work so that the progress line knows the total.
	pktgenErr := error(nil)
	if o.Pktgen {
		pktgenErr = PktgenAvailable(ctx)
		if pktgenErr != nil {
			r.PktgenSkipped = pktgenErr.Error()
		}
	}
	total := 0
	var cluster, local []Traffic
	for _, t := range o.Traffic {
		if t.local() {
			local = append(local, t)
		} else {
			cluster = append(cluster, t)
		}
	}
	clusterVariants, pktgenVariants := splitVariants(variants)
	for _, v := range variants {
		switch {
		case v.Direct && len(cluster) > 0:
			total += len(o.Tests) * o.Reps
		case !v.LocalOnly && !v.PktgenOnly && !v.Direct:
			total += len(o.Tests) * len(cluster) * o.Reps
		}
	}
	total += len(o.Tests) * len(local) * len(localVariants(variants)) * o.Reps
	if o.Pktgen && pktgenErr == nil {
		total += len(pktgenVariants) * o.Reps * len(o.PktgenDirections)
	}
	prog.Add(total)

	var errs []error
	if len(o.Tests) > 0 && len(clusterVariants) > 0 && len(cluster) > 0 {
		co := o
		co.Traffic = cluster
		if err := r.netperf(ctx, co, clusterVariants, caps, prog); err != nil {
			errs = append(errs, err)
		}
	}
	if len(o.Tests) > 0 && len(local) > 0 && ctx.Err() == nil {
		if err := r.localPods(ctx, o, variants, caps, prog); err != nil {
			errs = append(errs, err)
		}
	}
	if o.Pktgen && pktgenErr == nil && len(pktgenVariants) > 0 && ctx.Err() == nil {
		r.PktgenSize = o.PktgenSize
		if err := r.pktgen(ctx, o, pktgenVariants, caps, prog); err != nil {
			errs = append(errs, err)
		}
	}
	r.summarize()
	r.Finished = time.Now()
	return r, errors.Join(errs...)
}

// phaseDelay is how long repetition rep (from 1) of reps waits after a variant's install,
// so that the repetitions start at evenly spaced phases of a period (Options.PhaseSpread).
func phaseDelay(period time.Duration, rep, reps int) time.Duration {
	if period <= 0 || reps <= 1 {
		return 0
	}
	return period * time.Duration((rep-1)%reps) / time.Duration(reps)
}

// rotate returns vs rotated left by k, so that no variant always runs first.
func rotate[T any](vs []T, k int) []T {
	if len(vs) == 0 {
		return vs
	}
	k %= len(vs)
	return append(slices.Clone(vs[k:]), vs[:k]...)
}

// nodesOf returns the bed's nodes with their namespaces.
func nodesOf(b *Bed, caps probe.Result) []*Node {
	var out []*Node
	for _, s := range b.Plan.Nodes {
		out = append(out, &Node{NodeSpec: s, NS: b.NS(s.Role), Caps: caps})
	}
	return out
}

// installDefault puts the default path on every node and turns on conntrack accounting
// (Kindnet's `ct packets` and the flowtable's counter need it; on for every variant so
// that all pay the same).
func installDefault(ctx context.Context, nodes []*Node, rules int) error {
	for _, n := range nodes {
		if err := nftApply(ctx, n, DefaultRuleset(n.NodeSpec, rules)+CountersRuleset()); err != nil {
			return fmt.Errorf("default path on %s: %w", n.Role, err)
		}
		if err := n.NS.Sysctl("net.netfilter.nf_conntrack_acct", "1"); err != nil {
			return fmt.Errorf("%s: %w", n.Role, err)
		}
		if n.Role == RoleServerNode {
			if err := applyLoadBalancer(ctx, n); err != nil {
				return fmt.Errorf("load balancer on %s: %w", n.Role, err)
			}
		}
	}
	return nil
}

func setupAll(ctx context.Context, v Variant, nodes []*Node) error {
	if v.Setup == nil {
		return nil
	}
	for _, n := range nodes {
		if err := v.Setup(ctx, n); err != nil {
			return fmt.Errorf("variant %s on %s: %w", v.Name, n.Role, err)
		}
	}
	return nil
}

func teardownAll(v Variant, nodes []*Node) error {
	if v.Teardown == nil {
		return nil
	}
	// Not the run's context: a cancelled run still removes what it installed.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var errs []error
	for _, n := range nodes {
		if err := v.Teardown(ctx, n); err != nil {
			errs = append(errs, fmt.Errorf("variant %s teardown on %s: %w", v.Name, n.Role, err))
		}
	}
	return errors.Join(errs...)
}

// flushConntrack empties the nodes' conntrack tables, so that every sample starts alike
// (TCP_CRR leaves thousands of TIME_WAIT entries).
func flushConntrack(ctx context.Context, nodes []*Node) error {
	for _, n := range nodes {
		err := n.NS.Do(func() error {
			h, err := netlink.NewHandle(unix.NETLINK_NETFILTER)
			if err != nil {
				return err
			}
			defer h.Close()
			return h.ConntrackTableFlush(netlink.ConntrackTable)
		})
		if err != nil {
			if _, err2 := n.NS.Output(ctx, "", "conntrack", "-F"); err2 != nil {
				return fmt.Errorf("flush conntrack on %s: %w", n.Role, errors.Join(err, err2))
			}
		}
	}
	return nil
}

// route is how one traffic type reaches the netperf server.
type route struct {
	client     string
	host       string
	ctrl, data int
	nodes      []string // nodes on the path
	svcNode    string   // node whose Service chain balances it
}

func routeOf(t Traffic) route {
	switch t {
	case PodToPod:
		return route{client: RoleClientPod, host: podIP(2).String(), ctrl: CtrlPort, data: DataPort, nodes: []string{RoleClientNode, RoleServerNode}}
	case PodToService:
		return route{client: RoleClientPod, host: NetperfVIP.String(), ctrl: CtrlPort, data: DataPort, nodes: []string{RoleClientNode, RoleServerNode}, svcNode: RoleClientNode}
	case ExternalToNodePort:
		return route{client: RoleExternal, host: nodeIP(2).String(), ctrl: NodePortCtrl, data: NodePortData, nodes: []string{RoleServerNode}, svcNode: RoleServerNode}
	case ExternalToLoadBalancer:
		return route{client: RoleExternal, host: LoadBalancerVIP.String(), ctrl: CtrlPort, data: DataPort, nodes: []string{RoleServerNode}, svcNode: RoleServerNode}
	}
	return route{client: RoleDirectClient, host: DirectServer.String(), ctrl: CtrlPort, data: DataPort, nodes: []string{RoleClientNode, RoleServerNode}}
}

// reachable opens one TCP connection from the client to netperf's control port the way the
// traffic goes (nil: it works).
func reachable(ctx context.Context, b *Bed, nodes []*Node, rt route) error {
	if err := flushConntrack(ctx, nodes); err != nil {
		return err
	}
	addr := net.JoinHostPort(rt.host, strconv.Itoa(rt.ctrl))
	var last error
	for range 2 {
		err := b.NS(rt.client).Do(func() error {
			c, err := (&net.Dialer{Timeout: 2 * time.Second}).DialContext(ctx, "tcp", addr)
			if err == nil {
				c.Close()
			}
			return err
		})
		if err == nil {
			return nil
		}
		last = err
	}
	return fmt.Errorf("connection to %s through this variant failed: %w", addr, last)
}

// snapshot reads the counters that make up PathEvidence.
type snapshot struct{ rx, slow, svc uint64 }

func readSnapshot(ctx context.Context, b *Bed, rt route) (snapshot, error) {
	var s snapshot
	for _, role := range rt.nodes {
		n := b.NS(role)
		rx, err := linkRx(n, GatewayName, TransportName)
		if err != nil {
			return s, err
		}
		s.rx += rx
		slow, err := ChainPackets(n, nftables.TableFamilyINet, CountersTable, "forward")
		if err != nil {
			return s, err
		}
		s.slow += slow
		if role == rt.svcNode {
			svc, err := ChainPackets(n, nftables.TableFamilyINet, CountersTable, "prerouting")
			if err != nil {
				return s, err
			}
			s.svc += svc
		}
	}
	return s, nil
}

// buildBed builds p and installs the default ruleset on its nodes. The caller closes the Bed.
func buildBed(ctx context.Context, p Plan, caps probe.Result, rules int) (*Bed, []*Node, error) {
	b, err := Build(ctx, p)
	if err != nil {
		return nil, nil, err
	}
	nodes := nodesOf(b, caps)
	if err := installDefault(ctx, nodes, rules); err != nil {
		return nil, nil, errors.Join(err, b.Close())
	}
	return b, nodes, nil
}

func linkRx(n *testbed.NS, devs ...string) (uint64, error) {
	var sum uint64
	for _, d := range devs {
		l, err := n.Link(d)
		if err != nil {
			return 0, err
		}
		if st := l.Attrs().Statistics; st != nil {
			sum += st.RxPackets
		}
	}
	return sum, nil
}

func (r *Run) netperf(ctx context.Context, o Options, variants []Variant, caps probe.Result, prog *Progress) (err error) {
	prog.Status("building the cluster")
	b, nodes, err := buildBed(ctx, ClusterPlan(o.Nodes, o.Services), caps, o.Rules)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, b.Close()) }()
	r.DefaultRuleset = DefaultRuleset(nodes[0].NodeSpec, o.Rules)
	for _, role := range []string{RoleServerPod, RoleDirectServer} {
		if err := b.Start(role, NetserverArgs(r.Pin)...); err != nil {
			return err
		}
	}
	if testHookBuilt != nil {
		testHookBuilt(b)
	}
	r.recordRulesets(variants, nodes[0])
	time.Sleep(300 * time.Millisecond) // netservers listening

	for rep := 1; rep <= o.Reps; rep++ {
		for _, v := range rotate(variants, rep-1) {
			if err := ctx.Err(); err != nil {
				return err
			}
			if err := setupAll(ctx, v, nodes); err != nil {
				return errors.Join(err, teardownAll(v, nodes))
			}
			time.Sleep(phaseDelay(o.PhaseSpread, rep, o.Reps))
			traffic := o.Traffic
			if v.Direct {
				traffic = []Traffic{DirectLink}
			}
			for _, t := range traffic {
				// A path the variant breaks fails here in seconds, not in netperf's
				// minutes of SYN retries; its cells are recorded as failed.
				broken := reachable(ctx, b, nodes, routeOf(t))
				for _, test := range o.Tests {
					if broken != nil {
						r.Samples = append(r.Samples, Sample{Variant: v.Name, Traffic: t, Test: test, Rep: rep, Unit: Unit(test), CPU: [2]int{-1, -1}, At: time.Now(), Error: broken.Error()})
						prog.Done(fmt.Sprintf("%s %s %s %s rep %d/%d: error: %s", r.Env, v.Name, t, test, rep, o.Reps, broken))
						continue
					}
					s := r.sample(ctx, b, nodes, o, v.Name, t, test, rep, prog)
					if ctx.Err() != nil {
						return errors.Join(ctx.Err(), teardownAll(v, nodes))
					}
					r.Samples = append(r.Samples, s)
				}
			}
			if err := teardownAll(v, nodes); err != nil {
				return err
			}
		}
	}
	return nil
}

func (r *Run) sample(ctx context.Context, b *Bed, nodes []*Node, o Options, variant string, t Traffic, test string, rep int, prog *Progress) Sample {
	rt := routeOf(t)
	s := Sample{Variant: variant, Traffic: t, Test: test, Rep: rep, Unit: Unit(test), CPU: [2]int{-1, -1}, At: time.Now()}
	prog.Status(fmt.Sprintf("%s %s %s %s rep %d/%d", r.Env, variant, t, test, rep, o.Reps))
	fail := func(err error) Sample {
		s.Error = err.Error()
		prog.Done(fmt.Sprintf("%s %s %s %s rep %d/%d: error: %s", r.Env, variant, t, test, rep, o.Reps, firstLines(s.Error, 1)))
		return s
	}
	if err := flushConntrack(ctx, nodes); err != nil {
		return fail(err)
	}
	before, err := readSnapshot(ctx, b, rt)
	if err != nil {
		return fail(err)
	}
	cmd := NetperfCmd{Test: test, Host: rt.host, Ctrl: rt.ctrl, Data: rt.data, Duration: o.Duration, Pin: r.Pin}
	res, _, err := cmd.Run(ctx, b.NS(rt.client))
	if err != nil && ctx.Err() == nil && !errors.Is(err, context.DeadlineExceeded) {
		// One retry: a netserver child still exiting, a port in TIME_WAIT.
		time.Sleep(time.Second)
		if err2 := flushConntrack(ctx, nodes); err2 == nil {
			if b2, err3 := readSnapshot(ctx, b, rt); err3 == nil {
				before = b2
			}
		}
		res, _, err = cmd.Run(ctx, b.NS(rt.client))
	}
	if err != nil {
		return fail(err)
	}
	after, err := readSnapshot(ctx, b, rt)
	if err != nil {
		return fail(err)
	}
	s.Value, s.Elapsed, s.CPU = res.Value, res.Elapsed, [2]int{res.LocalCPU, res.RemoteCPU}
	s.Path = &PathEvidence{Nodes: rt.nodes, NodePackets: after.rx - before.rx, SlowPathPackets: after.slow - before.slow, ServiceConns: after.svc - before.svc}
	prog.Done(fmt.Sprintf("%s %s %s %s rep %d/%d: %.2f %s", r.Env, variant, t, test, rep, o.Reps, s.Value, s.Unit))
	return s
}

func (r *Run) recordRulesets(variants []Variant, n *Node) {
	for _, v := range variants {
		if v.Ruleset == nil {
			continue
		}
		i := slices.IndexFunc(r.Variants, func(vi VariantInfo) bool { return vi.Name == v.Name })
		if i < 0 || r.Variants[i].Ruleset != "" {
			continue
		}
		text, err := v.Ruleset(n)
		if err != nil {
			text = "(cannot render: " + err.Error() + ")"
		}
		r.Variants[i].Ruleset = text
	}
}

// pktgen measures the per-packet cost: 64-byte UDP through one node, from a local Pod to a
// remote sink and from the remote to the local Pod (o.PktgenDirections), the receiver
// counting and dropping at its ingress; the direct variant sends over one veth.
func (r *Run) pktgen(ctx context.Context, o Options, variants []Variant, caps probe.Result, prog *Progress) (err error) {
	prog.Status("building the pktgen bed")
	b, nodes, err := buildBed(ctx, PktgenPlan(o.Services), caps, o.Rules)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, b.Close()) }()
	if r.DefaultRuleset == "" {
		r.DefaultRuleset = DefaultRuleset(nodes[0].NodeSpec, o.Rules)
	}
	r.recordRulesets(variants, nodes[0])
	thread := max(r.Pin.CPU, 0)
	flows := map[Direction]map[bool]pktFlow{}
	defer func() {
		for _, fs := range flows {
			for _, f := range fs {
				_ = f.pg.Remove()
			}
		}
	}()
	for _, d := range o.PktgenDirections {
		fs, err := pktgenFlows(ctx, b, d, thread, o.PktgenSize)
		if err != nil {
			return err
		}
		flows[d] = fs
	}
	counts := map[string]uint64{}
	for rep := 1; rep <= o.Reps; rep++ {
		for _, v := range rotate(variants, rep-1) {
			if err := ctx.Err(); err != nil {
				return err
			}
			prog.Status(fmt.Sprintf("%s pktgen %s rep %d/%d", r.Env, v.Name, rep, o.Reps))
			if err := setupAll(ctx, v, nodes); err != nil {
				return errors.Join(err, teardownAll(v, nodes))
			}
			// Both directions under one setup, their order rotated too.
			err := r.pktgenDirections(ctx, b, nodes, v, flows, rotate(o.PktgenDirections, rep-1), rep, o, counts, prog)
			if terr := teardownAll(v, nodes); terr != nil {
				err = errors.Join(err, terr)
			}
			if err != nil {
				return err
			}
		}
	}
	return nil
}

// pktgenDirections measures one repetition of variant v in each direction. A round that
// fails (the variant breaks the flow: it cannot be established, or pktgen fails) is recorded
// with its reason, like a discarded one, and the run goes on.
func (r *Run) pktgenDirections(ctx context.Context, b *Bed, nodes []*Node, v Variant, flows map[Direction]map[bool]pktFlow, dirs []Direction, rep int, o Options, counts map[string]uint64, prog *Progress) error {
	for _, d := range dirs {
		label := fmt.Sprintf("%s pktgen %s %s rep %d/%d", r.Env, v.Name, d, rep, o.Reps)
		prog.Status(label)
		s, err := r.pktgenRound(ctx, b, nodes, v, flows[d][v.Direct], o.PktgenDuration, counts)
		if err != nil {
			if ctx.Err() != nil {
				return fmt.Errorf("%s: %w", label, err)
			}
			s = append(s, PktgenSample{Variant: v.Name, Direction: d, Reason: "failed: " + firstLines(err.Error(), 1)})
		}
		for i := range s {
			s[i].Rep = rep
		}
		r.Pktgen = append(r.Pktgen, s...)
		last := s[len(s)-1]
		if last.Kept {
			prog.Done(fmt.Sprintf("%s: %.0f pps", label, last.PPS))
		} else {
			prog.Done(fmt.Sprintf("%s: no round kept (%s)", label, last.Reason))
		}
	}
	return nil
}

// pktgen ports, one per direction: each receiver drops only the flow it sinks, so the
// packet back that makes the other direction's flow ESTABLISHED passes.
const (
	pktgenPort        = 9
	pktgenPortReverse = 10
)

// pktFlow is one per-packet flow: pktgen in gen sends cfg's packets to sink, which counts
// and drops them at its ingress.
type pktFlow struct {
	dir       Direction
	gen, sink string
	pg        Pktgen
	cfg       PktgenConfig
}

// pktgenFlows prepares one direction's flows, through the node (false) and over the direct
// link (true), and puts the sink's counting rule on their receivers. Pod -> remote: the
// generator Pod sends to the remote Pod behind the sink, through the node's gateway;
// remote -> Pod: the sink's namespace sends as the remote Pod to the generator Pod, through
// the node's transport. The direct link is one veth either way, sent over in that direction.
func pktgenFlows(ctx context.Context, b *Bed, dir Direction, thread, size int) (map[bool]pktFlow, error) {
	gen, sink, src, dst, in, port := RoleGen, RoleSink, GenIP, SinkIP, GatewayName, uint16(pktgenPort)
	dgen, dsink, dsrc, ddst := RoleDirectGen, RoleDirectSink, DirectClient, DirectServer
	if dir == RemoteToPod {
		gen, sink, src, dst, in, port = RoleSink, RoleGen, SinkIP, GenIP, TransportName, pktgenPortReverse
		dgen, dsink, dsrc, ddst = RoleDirectSink, RoleDirectGen, DirectServer, DirectClient
	}
	mac, err := linkMAC(b.NS(RolePktNode), in)
	if err != nil {
		return nil, err
	}
	dmac, err := linkMAC(b.NS(dsink), "eth0")
	if err != nil {
		return nil, err
	}
	for _, role := range []string{sink, dsink} {
		if _, err := b.NS(role).Output(ctx, SinkRuleset("eth0", port), "nft", "-f", "-"); err != nil {
			return nil, err
		}
	}
	flow := func(gen, sink string, src, dst netip.Addr, mac net.HardwareAddr) pktFlow {
		return pktFlow{dir: dir, gen: gen, sink: sink,
			pg:  Pktgen{NS: b.NS(gen), Dev: "eth0", Thread: thread},
			cfg: PktgenConfig{Size: size, Src: src, Dst: dst, DstMAC: mac, Port: port}}
	}
	return map[bool]pktFlow{false: flow(gen, sink, src, dst, mac), true: flow(dgen, dsink, dsrc, ddst, dmac)}, nil
}

func linkMAC(n *testbed.NS, dev string) (net.HardwareAddr, error) {
	l, err := n.Link(dev)
	if err != nil {
		return nil, err
	}
	return l.Attrs().HardwareAddr, nil
}

// pktgenRound establishes the flow, warms it up (so that Kindnet's threshold is passed and
// the flow offloaded), sizes the round to last about d, and measures; a round whose sink did
// not receive every packet sent is discarded and tried again (up to three times).
func (r *Run) pktgenRound(ctx context.Context, b *Bed, nodes []*Node, v Variant, f pktFlow, d time.Duration, counts map[string]uint64) ([]PktgenSample, error) {
	gen, sink, pg, cfg := f.gen, f.sink, f.pg, f.cfg
	if err := flushConntrack(ctx, nodes); err != nil {
		return nil, err
	}
	if err := establishUDP(b.NS(gen), b.NS(sink), cfg.Src, cfg.Dst, cfg.Port); err != nil {
		return nil, fmt.Errorf("establish the UDP flow: %w", err)
	}
	cfg.Count = 2000
	if err := pg.Configure(cfg); err != nil {
		return nil, err
	}
	warm, err := pg.Run(ctx)
	if err != nil {
		return nil, fmt.Errorf("warm-up: %w", err)
	}
	// The count follows from the first warm-up of each variant, so that every round of a
	// variant sends the same number of packets.
	key := v.Name + "/" + string(f.dir)
	n := counts[key]
	if n == 0 {
		pps := warm.PPS
		if pps <= 0 && warm.USec > 0 {
			pps = float64(warm.Sent) / (float64(warm.USec) / 1e6)
		}
		n = uint64(max(pps*d.Seconds(), 1000))
		n = (n + 999) / 1000 * 1000
		counts[key] = n
	}
	if err := pg.SetCount(n); err != nil {
		return nil, err
	}
	var out []PktgenSample
	for attempt := 0; attempt < 3; attempt++ {
		s := PktgenSample{Variant: v.Name, Direction: f.dir}
		before, err := ChainPackets(b.NS(sink), nftables.TableFamilyNetdev, "sink", "in")
		if err != nil {
			return out, err
		}
		var slow0, slow1 uint64
		if !v.Direct {
			if slow0, err = ChainPackets(nodes[0].NS, nftables.TableFamilyINet, CountersTable, "forward"); err != nil {
				return out, err
			}
		}
		tc0 := tcPaths(ctx, nodes, v)
		res, err := pg.Run(ctx)
		if err != nil {
			return out, err
		}
		s.TC = tcPathsSince(tc0, tcPaths(ctx, nodes, v))
		after, err := ChainPackets(b.NS(sink), nftables.TableFamilyNetdev, "sink", "in")
		if err != nil {
			return out, err
		}
		if !v.Direct {
			if slow1, err = ChainPackets(nodes[0].NS, nftables.TableFamilyINet, CountersTable, "forward"); err != nil {
				return out, err
			}
		}
		s.Sent, s.USec = res.Sent, res.USec
		s.Received = after - before
		s.SlowPathPackets = slow1 - slow0
		if s.USec > 0 {
			s.PPS = float64(s.Received) / (float64(s.USec) / 1e6)
		}
		switch {
		case s.Sent == 0 || s.USec == 0:
			s.Reason = "nothing sent"
		case s.Received != s.Sent:
			s.Reason = fmt.Sprintf("sent %d, received %d", s.Sent, s.Received)
		default:
			s.Kept = true
		}
		out = append(out, s)
		if s.Kept {
			break
		}
	}
	return out, nil
}
