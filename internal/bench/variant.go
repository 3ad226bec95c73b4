package bench

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"github.com/hostaccel/hostaccel/internal/flowtable"
	"github.com/hostaccel/hostaccel/internal/lb"
	"github.com/hostaccel/hostaccel/internal/model"
	"github.com/hostaccel/hostaccel/internal/probe"
	"github.com/hostaccel/hostaccel/internal/testbed"
)

// Node is a forwarding namespace of a built bed, as a Variant sees it.
type Node struct {
	NodeSpec
	NS *testbed.NS
	// Caps is what the kernel can do (probed once per run).
	Caps probe.Result
}

// Variant is one configuration of the nodes' forwarding path. Every variant but Direct runs
// on top of the default path (conntrack, kube-proxy-like NAT, the forward rules): the
// rulesets of hostaccel, Antrea and Kindnet are what those projects add to such a node.
type Variant struct {
	Name  string
	Title string // as the report's rows say it
	// Needs are probe features the kernel must have (probe.Flowtable, ...).
	Needs []string
	// Direct variants measure the direct link (no node on the path) instead of the cluster.
	Direct bool
	// Default marks the variants a plain `hostaccel bench` runs.
	Default bool
	// Setup installs the variant on one node; Teardown removes it again. Either may be nil.
	Setup    func(ctx context.Context, n *Node) error
	Teardown func(ctx context.Context, n *Node) error
	// Ruleset returns what Setup installs, for the report (empty: nothing).
	Ruleset func(n *Node) (string, error)
	// Note is shown under the table.
	Note string
	// LocalOnly variants run only the same-node traffic (LocalTraffics).
	LocalOnly bool
	// PktgenOnly variants run only the per-packet measurement (a limit, not a datapath).
	PktgenOnly bool
}

var registry []Variant

// Register adds a variant (from init; a datapath's bench file registers itself).
func Register(v Variant) {
	if _, ok := Lookup(v.Name); ok {
		panic("bench: variant registered twice: " + v.Name)
	}
	registry = append(registry, v)
}

// Lookup finds a registered variant by name.
func Lookup(name string) (Variant, bool) {
	i := slices.IndexFunc(registry, func(v Variant) bool { return v.Name == name })
	if i < 0 {
		return Variant{}, false
	}
	return registry[i], true
}

// Names lists every registered variant, in registration order.
func Names() []string {
	var out []string
	for _, v := range registry {
		out = append(out, v.Name)
	}
	return out
}

// DefaultNames lists the variants a plain `hostaccel bench` runs.
func DefaultNames() []string {
	var out []string
	for _, v := range registry {
		if v.Default {
			out = append(out, v.Name)
		}
	}
	return out
}

// Missing returns the features of v that caps lacks.
func (v Variant) Missing(caps probe.Result) []string {
	var out []string
	for _, f := range v.Needs {
		if !caps.Has(f) {
			out = append(out, f)
		}
	}
	return out
}

// Variant names.
const (
	VariantDefault   = "default"
	VariantDirect    = "direct"
	VariantFlowtable = "hostaccel-flowtable"
	VariantAuto      = "hostaccel-auto"
	VariantAntrea    = "antrea"
	VariantKindnet   = "kindnet"
)

// KindnetThreshold is Kindnet's default fastpath threshold (seed 002).
const KindnetThreshold = 20

func init() {
	Register(Variant{
		Name: VariantDefault, Title: "Default", Default: true,
		Note: "conntrack, kube-proxy-like NAT for the Services, the node's forward rules; no fastpath",
	})
	Register(Variant{
		Name: VariantDirect, Title: "Direct link (limit)", Default: true, Direct: true,
		Note: "client and server on one veth: no node, no forwarding hop; the same samples stand in every traffic type",
	})
	Register(Variant{
		Name: VariantFlowtable, Title: "hostaccel flowtable", Default: true,
		Needs:    []string{probe.Flowtable},
		Setup:    func(ctx context.Context, n *Node) error { return applyFlowtable(ctx, n, model.DatapathFlowtable) },
		Teardown: removeFlowtable,
		Ruleset:  func(n *Node) (string, error) { return renderFlowtable(n) },
		Note:     "hostaccel's flowtable datapath (internal/flowtable Render + Manager.Apply), every class on",
	})
	Register(tcVariant)
	Register(autoVariant)
	Register(floorVariant)
	Register(Variant{
		Name: VariantSockmap, Title: "hostaccel sockmap", Default: true, LocalOnly: true,
		Needs: []string{probe.SockMap},
		Note:  "hostaccel's sockmap datapath (internal/sockmap: sock_ops + SOCKHASH + sk_msg ingress redirect), the local-pod-to-pod class: same-node traffic only",
	})
	Register(Variant{
		Name: VariantLoopback, Title: "Loopback in one Pod (limit)", Default: true, LocalOnly: true,
		Note: "netperf to 127.0.0.1 inside one Pod: the same-node limit",
	})
	Register(Variant{
		Name: VariantAntrea, Title: "Antrea ruleset", Default: true,
		Needs:    []string{probe.Flowtable},
		Setup:    func(ctx context.Context, n *Node) error { return nftApply(ctx, n, AntreaRuleset(n.NodeSpec)) },
		Teardown: func(ctx context.Context, n *Node) error { return nftDelete(ctx, n, "ip antrea") },
		Ruleset:  func(n *Node) (string, error) { return AntreaRuleset(n.NodeSpec), nil },
		Note:     "Antrea's hostNetworkAcceleration ruleset from its docs (seed 001), verbatim but for devices and CIDRs: pod-to-pod only",
	})
	Register(Variant{
		Name: VariantKindnet, Title: "Kindnet ruleset", Default: true,
		Needs: []string{probe.Flowtable},
		Setup: func(ctx context.Context, n *Node) error {
			return nftApply(ctx, n, KindnetRuleset(n.NodeSpec, KindnetThreshold))
		},
		Teardown: func(ctx context.Context, n *Node) error { return nftDelete(ctx, n, "inet kindnet-fastpath") },
		Ruleset:  func(n *Node) (string, error) { return KindnetRuleset(n.NodeSpec, KindnetThreshold), nil },
		Note:     fmt.Sprintf("Kindnet's fastpath table from its docs (seed 002), verbatim but for devices: every connection after %d packets", KindnetThreshold),
	})
}

// flowtableState is the hostaccel config of a bench node: its gateway and transport, its
// Pod CIDR, the peers, the Service CIDR, every class on.
func flowtableState(n *Node, datapath string) model.State {
	s := model.State{
		Datapath:        datapath,
		Gateways:        []string{n.Gateway},
		Transports:      []string{n.Transport},
		LocalPodCIDRs:   []netip.Prefix{n.PodCIDR},
		PeerPodCIDRs:    slices.Clone(n.PeerPodCIDRs),
		ServiceCIDRs:    []netip.Prefix{ServiceCIDR},
		NodeIPs:         []netip.Addr{n.IP},
		PeerNodeIPs:     slices.Clone(n.PeerIPs),
		LoadBalancerIPs: []netip.Prefix{host(LoadBalancerVIP)},
		// Every class but local-pod-to-pod: the cluster has no same-node traffic, and the
		// sockmap datapath attaches to the host's cgroup root, where it would see other
		// processes' sockets between these Pod CIDRs.
		Classes: slices.DeleteFunc(slices.Clone(model.Classes), func(c model.Class) bool { return c == model.LocalPodToPod }),
	}
	s.Normalize()
	return withIndexes(n.NS, s)
}

// withIndexes adds the devices' interface indexes in ns to s, as the agent reads them from
// the kernel (config.State); without ns (a test's plan), s is returned as it is.
func withIndexes(ns *testbed.NS, s model.State) model.State {
	if ns != nil {
		s.SetDeviceIndexes(func(d string) int {
			if l, err := ns.Link(d); err == nil {
				return l.Attrs().Index
			}
			return 0
		})
	}
	return s
}

func renderFlowtable(n *Node) (string, error) {
	r := flowtable.Render(flowtableState(n, model.DatapathFlowtable), flowtable.Options{FlowtableCounter: n.Caps.Has(probe.FlowtableCounter)})
	return r.Dump()
}

func applyFlowtable(ctx context.Context, n *Node, datapath string) error {
	return applyFlowtableRuleset(ctx, n.NS, flowtable.Render(flowtableState(n, datapath), flowtable.Options{FlowtableCounter: n.Caps.Has(probe.FlowtableCounter)}))
}

// applyFlowtableRuleset applies a rendered flowtable ruleset in namespace ns.
func applyFlowtableRuleset(ctx context.Context, ns *testbed.NS, r *flowtable.Ruleset) error {
	return ns.Do(func() error {
		_, err := flowtable.NewManager().Apply(ctx, r)
		return err
	})
}

func removeFlowtable(ctx context.Context, n *Node) error { return removeFlowtableIn(ctx, n.NS) }

// removeFlowtableIn removes the flowtable datapath from namespace ns.
func removeFlowtableIn(ctx context.Context, ns *testbed.NS) error {
	return ns.Do(func() error {
		return flowtable.NewManager().Remove(ctx)
	})
}

// LoadBalancerServices is the load balancer of the server node: one dnat service on
// LoadBalancerVIP carrying netperf's control and data ports to the server Pod.
func LoadBalancerServices() []lb.Service {
	return []lb.Service{{
		Name: "netperf-lb", VIPs: []string{LoadBalancerVIP.String()}, Ports: []int{CtrlPort, DataPort},
		Topology: lb.DNAT, HealthCheck: &lb.HealthCheck{Type: "none"},
		Backends: []lb.Backend{{Address: podIP(2).String()}},
	}}
}

// applyLoadBalancer installs LoadBalancerServices with internal/lb (Render + Manager.Apply),
// as the agent would; it stays for every variant, like the kube-proxy-like ruleset.
func applyLoadBalancer(ctx context.Context, n *Node) error {
	svcs := LoadBalancerServices()
	if errs := lb.ValidateServices(svcs, func(i int) string { return fmt.Sprintf("services[%d]", i) }); len(errs) > 0 {
		return errors.Join(errs...)
	}
	r := lb.Render(lb.Resolve(svcs, nil, lb.OfflineEnv(svcs, lb.Env{})))
	return n.NS.Do(func() error {
		m, err := lb.NewManager()
		if err != nil {
			return err
		}
		defer m.Close()
		_, err = m.Apply(ctx, r)
		return err
	})
}

// nftApply loads an nft script into the node in one transaction.
func nftApply(ctx context.Context, n *Node, script string) error {
	_, err := n.NS.Output(ctx, script, "nft", "-f", "-")
	return err
}

// nftDelete deletes tables ("family name"); absent ones are fine.
func nftDelete(ctx context.Context, n *Node, tables ...string) error {
	for _, t := range tables {
		if _, err := n.NS.Output(ctx, "", append([]string{"nft", "delete", "table"}, strings.Fields(t)...)...); err != nil &&
			!strings.Contains(err.Error(), "No such file or directory") {
			return err
		}
	}
	return nil
}
