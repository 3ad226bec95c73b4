package bench

import (
	"context"
	"fmt"

	"sigs.k8s.io/knftables"

	"github.com/hostaccel/hostaccel/internal/flowtable"
	"github.com/hostaccel/hostaccel/internal/model"
	"github.com/hostaccel/hostaccel/internal/probe"
)

// VariantFlowtableBefore is hostaccel's flowtable datapath with the forward chain it had up
// to commit 1e4a0fb (three guards, eight counted exclude rules whether or not the exclude
// sets have elements, then one rule per class and family with the set lookups first): the
// "before" of the forward chain's rework, measured in the same run as the "after".
const VariantFlowtableBefore = "hostaccel-flowtable-before"

func init() {
	Register(Variant{
		Name: VariantFlowtableBefore, Title: "hostaccel flowtable (before)",
		Needs:    []string{probe.Flowtable},
		Setup:    applyFlowtableBefore,
		Teardown: removeFlowtable,
		Ruleset:  func(n *Node) (string, error) { return flowtableBefore(n).Dump() },
		Note:     "hostaccel's flowtable datapath with the forward chain as it was before the rework (1e4a0fb), every class on: the same sets and flowtable, the old rules",
	})
}

func flowtableBefore(n *Node) *flowtable.Ruleset {
	s := flowtableState(n, model.DatapathFlowtable)
	r := flowtable.Render(s, flowtable.Options{FlowtableCounter: n.Caps.Has(probe.FlowtableCounter)})
	r.Comment = "hostaccel flowtable datapath, before the forward chain rework"
	r.Rules = nil
	rule := func(text, comment string) {
		r.Rules = append(r.Rules, &knftables.Rule{Chain: flowtable.ChainName, Rule: text, Comment: knftables.PtrTo(comment)})
	}
	rule("meta l4proto != { tcp, udp } return", "the flowtable offloads TCP and UDP; ICMP (errors, PMTU) always takes the normal path")
	rule("iifname != @"+flowtable.DevicesSet+" return", "input device not in the flowtable")
	rule("oifname != @"+flowtable.DevicesSet+" return", "output device not in the flowtable")
	fams := []struct{ suffix, proto string }{{"v4", "ip"}, {"v6", "ip6"}}
	for _, f := range fams {
		ex := "@exclude-" + f.suffix
		for _, m := range []string{"ct original " + f.proto + " saddr", "ct original " + f.proto + " daddr", "ct reply " + f.proto + " saddr", "ct reply " + f.proto + " daddr"} {
			rule(m+" "+ex+" counter return", "exclude: "+m)
		}
	}
	threshold := ""
	if s.PacketThreshold > 0 {
		threshold = fmt.Sprintf(" ct packets > %d", s.PacketThreshold)
	}
	for _, c := range s.Classes {
		for _, f := range fams {
			o := func(dir, set string) string { return "ct original " + f.proto + " " + dir + " " + set + "-" + f.suffix }
			var ms [][2]string
			switch c {
			case model.PodToPod:
				ms = [][2]string{
					{o("saddr", "@local-pod") + " " + o("daddr", "@peer-pod"), "local Pods to peer Pods"},
					{o("saddr", "@peer-pod") + " " + o("daddr", "@local-pod"), "peer Pods to local Pods"},
				}
			case model.PodToService:
				m := o("saddr", "@local-pod") + " ct status dnat"
				if len(s.ServiceCIDRs) > 0 {
					m += " " + o("daddr", "@service")
				}
				ms = [][2]string{{m, "local Pods to Services, after DNAT"}}
			case model.ExternalToNodePort:
				ms = [][2]string{{o("saddr", "!= @local-pod") + " " + o("daddr", "@node-ip") + " ct status dnat", "external clients to NodePorts, after DNAT"}}
			case model.ExternalToLoadBalancer:
				ms = [][2]string{{o("saddr", "!= @local-pod") + " " + o("daddr", "@lb-ip"), "external clients to LoadBalancer and external IPs"}}
			case model.NodeToRemotePod:
				ms = [][2]string{{o("saddr", "@peer-node-ip") + " " + o("daddr", "@local-pod"), "peer nodes' host network to local Pods"}}
			case model.ExternalToService:
				ms = [][2]string{{o("saddr", "!= @local-pod") + " ct status snat", "external clients to Services, source-NATed by this node"}}
			}
			for _, m := range ms {
				rule(m[0]+threshold+" counter flow add @"+flowtable.FlowtableName+" accept", fmt.Sprintf("%s %s: %s", c, f.suffix, m[1]))
			}
		}
	}
	return r
}

func applyFlowtableBefore(ctx context.Context, n *Node) error {
	return applyFlowtableRuleset(ctx, n.NS, flowtableBefore(n))
}
