package flowtable

import (
	"context"
	"net/netip"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"sigs.k8s.io/knftables"

	"github.com/hostaccel/hostaccel/internal/config"
	"github.com/hostaccel/hostaccel/internal/golden"
	"github.com/hostaccel/hostaccel/internal/model"
)

func dump(t *testing.T, s model.State, o Options) string {
	t.Helper()
	s.Normalize()
	out, err := Render(s, o).Dump()
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func pfx(ss ...string) []netip.Prefix {
	var out []netip.Prefix
	for _, s := range ss {
		out = append(out, netip.MustParsePrefix(s))
	}
	return out
}

func base() model.State {
	return model.State{
		Datapath: "flowtable", Gateways: []string{"gw"}, Transports: []string{"eth0"},
		LocalPodCIDRs: pfx("10.244.1.0/24", "fd00:10:244:1::/64"),
		PeerPodCIDRs:  pfx("10.244.2.0/24", "fd00:10:244:2::/64"),
	}
}

// One golden file per class (IPv4 and IPv6 rules both render from one state).
func TestRenderEachClass(t *testing.T) {
	for _, c := range model.Classes {
		t.Run(string(c), func(t *testing.T) {
			s := base()
			s.Classes = []model.Class{c}
			s.NodeIPs = []netip.Addr{netip.MustParseAddr("172.18.0.2"), netip.MustParseAddr("fd00:172:18::2")}
			s.PeerNodeIPs = []netip.Addr{netip.MustParseAddr("172.18.0.3")}
			s.LoadBalancerIPs = pfx("198.51.100.80/32", "2001:db8:80::/120")
			golden.Check(t, filepath.Join("testdata", "class-"+string(c)+".nft"), dump(t, s, Options{FlowtableCounter: true}))
		})
	}
}

func TestRenderThresholdExcludeNoCounter(t *testing.T) {
	s := base()
	s.Classes = []model.Class{model.PodToPod, model.PodToService}
	s.PacketThreshold = 20
	s.ServiceCIDRs = pfx("10.96.0.0/16", "fd00:10:96::/112")
	s.Exclude = pfx("10.244.1.66/32", "fd00:10:244:1::66/128", "10.244.2.128/25")
	golden.Check(t, filepath.Join("testdata", "threshold-exclude.nft"), dump(t, s, Options{FlowtableCounter: false}))
}

// The seed nodes: Antrea's doc node (shared/seeds/001) and a Kindnet node (seed 002),
// from the example configs users start from.
func TestRenderExamples(t *testing.T) {
	up := func(names ...string) []config.Link {
		links := []config.Link{{Name: "lo", Up: true, Loopback: true}}
		for _, n := range names {
			links = append(links, config.Link{Name: n, Up: true})
		}
		return links
	}
	nodes := map[string][]config.Link{
		"antrea-node":        up("antrea-gw0", "eth0"),
		"antrea-slides-node": up("antrea-gw0", "eth0", "eth1", "eth2"),
		"kindnet-node":       up("eth0", "knet379d0a5f", "knetabb40db0"), // transports: auto
	}
	for name, links := range nodes {
		t.Run(name, func(t *testing.T) {
			c, err := config.Load("../../examples/" + name + ".yaml")
			if err != nil {
				t.Fatal(err)
			}
			s, _, err := c.State(links, false)
			if err != nil {
				t.Fatal(err)
			}
			got := dump(t, s, Options{FlowtableCounter: true})
			golden.Check(t, filepath.Join("testdata", name+".nft"), got)
			if name == "kindnet-node" && !strings.Contains(got, "ct packets > 20") {
				t.Error("kindnet threshold missing")
			}
		})
	}
}

// The rendered transaction is valid for knftables (the Fake checks references), and the
// spec hash changes with policy but not with peer set contents; the devices (up to
// maxInlineDevices) are in the guards' text, so they change it, and beyond that they do not.
func TestSpecHash(t *testing.T) {
	a := base()
	a.Classes = []model.Class{model.PodToPod}
	b := a
	b.PeerPodCIDRs = pfx("10.244.9.0/24", "fd00:10:244:9::/64")
	if Render(a, Options{}).Comment != Render(b, Options{}).Comment {
		t.Error("elements changed the spec")
	}
	b.Transports = []string{"eth0", "eth1"}
	if Render(a, Options{}).Comment == Render(b, Options{}).Comment {
		t.Error("a device added to the inline guards did not change the spec")
	}
	many, more := a, a
	many.Transports = []string{"e1", "e2", "e3", "e4", "e5"}
	more.Transports = []string{"e1", "e2", "e3", "e4", "e5", "e6"}
	if Render(many, Options{}).Comment != Render(more, Options{}).Comment {
		t.Error("devices beyond the inline guards changed the spec")
	}
	c := a
	c.Classes = []model.Class{model.PodToPod, model.PodToService}
	if Render(a, Options{}).Comment == Render(c, Options{}).Comment {
		t.Error("classes did not change the spec")
	}
	fake := knftables.NewFake(Family, TableName)
	tx := fake.NewTransaction()
	Render(c, Options{}).AddAll(tx)
	if err := fake.Run(context.Background(), tx); err != nil {
		t.Fatal(err)
	}
	// four guards, pod-to-pod v4 (2) and v6 (2), pod-to-service (no Service CIDRs: any DNAT-ed
	// destination of a local Pod) v4 and v6; no exclude rules (empty sets).
	if got := len(fake.Table.Chains[ChainName].Rules); got != 4+4+2 {
		t.Errorf("rules: %d", got)
	}
}

// Rules exist only when they can match: no exclude rules while a family's exclude set is
// empty, no class rule while a set it requires is empty; the emptiness is part of the spec,
// so that the Manager rebuilds the table when it changes.
func TestRenderOnlyRulesThatCanMatch(t *testing.T) {
	s := base()
	s.Classes = slices.Clone(model.Classes)
	s.LocalPodCIDRs = pfx("10.244.1.0/24")
	s.PeerPodCIDRs = pfx("10.244.2.0/24")
	s.NodeIPs = []netip.Addr{netip.MustParseAddr("172.18.0.2")}
	s.ServiceCIDRs = pfx("10.96.0.0/16")
	golden.Check(t, filepath.Join("testdata", "exclude-empty-v4only.nft"), dump(t, s, Options{FlowtableCounter: true}))
	empty := Render(s, Options{})
	for _, rl := range empty.Rules {
		if strings.Contains(rl.Rule, "exclude") || strings.Contains(rl.Rule, "ip6") || strings.Contains(rl.Rule, "@lb-ip") || strings.Contains(rl.Rule, "@peer-node-ip") {
			t.Errorf("rule that cannot match: %s", rl.Rule)
		}
	}
	s.Exclude = pfx("10.244.2.66/32")
	golden.Check(t, filepath.Join("testdata", "exclude-v4only.nft"), dump(t, s, Options{FlowtableCounter: true}))
	one := Render(s, Options{})
	if one.Comment == empty.Comment {
		t.Error("an exclude set no longer empty did not change the spec")
	}
	n := 0
	for _, rl := range one.Rules {
		if strings.HasPrefix(*rl.Comment, "exclude: ") {
			n++
		}
	}
	if n != 4 {
		t.Errorf("exclude rules: %d, want 4 (IPv4 only)", n)
	}
	s.Exclude = pfx("10.244.2.0/25")
	if Render(s, Options{}).Comment != one.Comment {
		t.Error("another exclude element changed the spec")
	}
}

// The node's own prefixes (Pod CIDR, Service CIDR, node IP) are compared in the rules while
// a family has one; with two the rule looks the set up, and the set always holds them (so
// status and a later process see them either way).
func TestRenderInlinesSinglePrefixes(t *testing.T) {
	rule := func(r *Ruleset, comment string) string {
		for _, rl := range r.Rules {
			if strings.HasPrefix(*rl.Comment, comment) {
				return rl.Rule
			}
		}
		t.Fatalf("no rule %q", comment)
		return ""
	}
	s := base()
	s.Classes = []model.Class{model.PodToService, model.ExternalToNodePort}
	s.ServiceCIDRs = pfx("10.96.0.0/16")
	s.NodeIPs = []netip.Addr{netip.MustParseAddr("172.18.0.2")}
	s.Normalize()
	one := Render(s, Options{})
	for comment, want := range map[string]string{
		"pod-to-service v4":       "ct status dnat ct original ip saddr 10.244.1.0/24 ct original ip daddr 10.96.0.0/16",
		"external-to-nodeport v4": "ct status dnat ct original ip daddr 172.18.0.2/32 ct original ip saddr != 10.244.1.0/24",
	} {
		if got := rule(one, comment); !strings.HasPrefix(got, want+" ") {
			t.Errorf("%s: %q, want it to start %q", comment, got, want)
		}
	}
	if got := one.Elements["service-v4"]; !slices.Equal(got, []string{"10.96.0.0/16"}) {
		t.Errorf("service-v4 elements %v", got)
	}

	s.ServiceCIDRs = pfx("10.96.0.0/16", "10.97.0.0/16")
	s.NodeIPs = append(s.NodeIPs, netip.MustParseAddr("172.19.0.2"))
	s.Normalize()
	two := Render(s, Options{})
	for comment, want := range map[string]string{
		"pod-to-service v4":       "ct original ip daddr @service-v4 ",
		"external-to-nodeport v4": "ct original ip daddr @node-ip-v4 ",
	} {
		if got := rule(two, comment); !strings.Contains(got, want) {
			t.Errorf("%s: %q, want the set lookup %q", comment, got, want)
		}
	}
	if one.Comment == two.Comment {
		t.Error("a second Service CIDR (rule text changed) left the spec as it was")
	}
}

// The flowtable's counter flag is set only when the config asks for it (flowtable.
// countOffloaded) and the kernel has it: it costs every offloaded packet (~0.4% of TCP_RR in
// the VM bench) and counts nothing unless conntrack accounting is on.
func TestRenderCountOffloaded(t *testing.T) {
	c, err := config.Parse([]byte("datapath: flowtable\nflowtable: {countOffloaded: true}\nnode:\n  gateways: [gw]\n  transports: [eth0]\n  localPodCIDRs: [10.244.1.0/24]\n  peerPodCIDRs: [10.244.2.0/24]\nclasses: {pod-to-pod: true}\n"))
	if err != nil {
		t.Fatal(err)
	}
	s, _, err := c.State([]config.Link{{Name: "gw", Up: true}, {Name: "eth0", Up: true}}, false)
	if err != nil {
		t.Fatal(err)
	}
	flagged := func(s model.State, o Options) bool {
		return strings.Contains(string(*Render(s, o).Flowtable.Priority), "counter")
	}
	if !flagged(s, Options{FlowtableCounter: true}) {
		t.Error("countOffloaded with a kernel that has the flag: no counter")
	}
	if flagged(s, Options{}) {
		t.Error("counter flag on a kernel without it")
	}
	s.CountOffloaded = false
	if flagged(s, Options{FlowtableCounter: true}) {
		t.Error("counter flag without countOffloaded")
	}
}

// With every device's index known, the device guards compare indexes; one unknown index
// makes them compare names. An index is in the spec: a device created again under its name
// (a new index) rebuilds the table.
func TestDeviceGuardsByIndex(t *testing.T) {
	s := base()
	s.Gateways, s.Transports = []string{"gw"}, []string{"eth0"}
	s.DeviceIndex = map[string]int{"gw": 7, "eth0": 3}
	s.Normalize()
	r := Render(s, Options{})
	if got := r.Rules[2].Rule + " | " + r.Rules[3].Rule; got != "iif != 3 iif != 7 return | oif != 3 oif != 7 return" {
		t.Errorf("guards: %s", got)
	}
	again := s
	again.DeviceIndex = map[string]int{"gw": 7, "eth0": 9}
	if Render(again, Options{}).Comment == r.Comment {
		t.Error("a new index did not change the spec")
	}
	names := s
	names.DeviceIndex = map[string]int{"gw": 7}
	if got := Render(names, Options{}).Rules[2].Rule; got != `iifname != "eth0" iifname != "gw" return` {
		t.Errorf("guard with an index unknown: %s", got)
	}
}
