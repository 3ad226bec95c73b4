package bench

import (
	"net/netip"
	"strings"
	"testing"
)

func TestDefaultRuleset(t *testing.T) {
	n := ClusterPlan(3, 2).Nodes[0]
	for _, rules := range []int{0, 100, 1000} {
		s := DefaultRuleset(n, rules)
		if got := strings.Count(s, "ip saddr 10.255."); got != rules {
			t.Errorf("rules=%d: %d never-matching rules", rules, got)
		}
		for _, want := range []string{
			"table ip kube-proxy {", "table inet node-filter {",
			"type nat hook prerouting priority dstnat; policy accept;",
			"ip daddr . meta l4proto . th dport vmap @service-ips",
			"10.96.0.10 . tcp . 12865 : goto service-",
			"tcp . 30865 : goto external-",
			"meta l4proto tcp dnat to 10.244.2.2:12865",
			"masquerade fully-random",
			"ct state invalid drop",
		} {
			if !strings.Contains(s, want) {
				t.Errorf("rules=%d: missing %q", rules, want)
			}
		}
	}
}

// The peers' rulesets are the documented ones, with only devices and CIDRs filled in.
func TestPeerRulesetsVerbatim(t *testing.T) {
	n := NodeSpec{Gateway: "antrea-gw0", Transport: "eth0", PodCIDR: mustPrefix("10.244.2.0/24"),
		PeerPodCIDRs: []netipPrefix{mustPrefix("10.244.0.0/24"), mustPrefix("10.244.1.0/24")}}
	a := AntreaRuleset(n)
	for _, want := range []string{ // seed 001, line by line
		`comment "Rules for Antrea"`,
		"set peer-pod-cidr {", "type ipv4_addr", "flags interval", `comment "Set for storing IPv4 peer Pods CIDRs"`,
		"elements = { 10.244.0.0/24, 10.244.1.0/24 }",
		"flowtable fastpath {", "hook ingress priority filter", "devices = { antrea-gw0, eth0 }",
		`comment "Forward chain for storing rules"`, "type filter hook forward priority filter; policy accept;",
		`iif "antrea-gw0" ip saddr 10.244.2.0/24 oif "eth0" ip daddr @peer-pod-cidr flow add @fastpath counter comment "Accelerate IPv4 connections: local Pod CIDR to remote Pod CIDRs"`,
		`iif "eth0" ip saddr @peer-pod-cidr oif "antrea-gw0" ip daddr 10.244.2.0/24 flow add @fastpath counter comment "Accelerate IPv4 connections: remote Pod CIDRs to local Pod CIDR"`,
	} {
		if !strings.Contains(a, want) {
			t.Errorf("antrea: missing %q", want)
		}
	}
	n.Gateway = "knet379d0a5f"
	k := KindnetRuleset(n, 20)
	for _, want := range []string{ // seed 002
		"table inet kindnet-fastpath {", `comment "rules for kindnet fastpath"`,
		"flowtable kindnet-flowtables {", "hook ingress priority filter", "devices = { eth0, knet379d0a5f }",
		"chain kindnet-fastpath-chain {", "type filter hook forward priority -110; policy accept;",
		"ct packets > 20 flow add @kindnet-flowtables counter",
	} {
		if !strings.Contains(k, want) {
			t.Errorf("kindnet: missing %q", want)
		}
	}
}

func TestSinkRuleset(t *testing.T) {
	s := SinkRuleset("eth0", 9)
	if !strings.Contains(s, `type filter hook ingress device "eth0" priority 0;`) || !strings.Contains(s, `udp dport 9 counter drop comment "rx"`) {
		t.Error(s)
	}
}

func TestKubeProxyChainNames(t *testing.T) {
	s := NetperfServices(podIP(2))[0]
	if c := serviceChain(s); !strings.HasPrefix(c, "service-") || !strings.HasSuffix(c, "-bench/netperf/tcp/ctrl") || len(c) != len("service-")+8+len("-bench/netperf/tcp/ctrl") {
		t.Errorf("service chain %q", c)
	}
	if c := endpointChain(s); !strings.HasSuffix(c, "-bench/netperf/tcp/ctrl__10.244.2.2/12865") {
		t.Errorf("endpoint chain %q", c)
	}
}

type netipPrefix = netip.Prefix

func mustPrefix(s string) netip.Prefix { return netip.MustParsePrefix(s) }
