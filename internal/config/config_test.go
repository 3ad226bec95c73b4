package config

import (
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/hostaccel/hostaccel/internal/model"
)

const good = `
node:
  gateways: [gw]
  transports: [eth0]
  localPodCIDRs: [10.244.1.0/24, "fd00:10:244:1::/64"]
  peerPodCIDRs: [10.244.2.0/24]
classes: {pod-to-pod: true}
`

func TestParseDefaults(t *testing.T) {
	c, err := Parse([]byte(good))
	if err != nil {
		t.Fatal(err)
	}
	if c.Datapath != "flowtable" || c.Agent.ResyncPeriod.Seconds() != 30 || c.PacketThreshold != 0 {
		t.Errorf("defaults: %+v", c)
	}
}

// A period written as "0s" is the user's, in YAML and in JSON: no rate limit on event syncs,
// and a resync period of 0 is refused. Both were taken for missing and set to the defaults.
func TestZeroPeriodsAreTheUsers(t *testing.T) {
	y, err := Parse([]byte(good + "agent: {minSyncInterval: 0s}\n"))
	if err != nil {
		t.Fatal(err)
	}
	j, err := ParseJSON([]byte(`{"node": {"gateways": ["gw"], "transports": ["eth0"], "localPodCIDRs": ["10.244.1.0/24"]}, "classes": {"pod-to-pod": true}, "agent": {"minSyncInterval": "0s"}}`))
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []*Config{y, j} {
		if c.Agent.MinSyncInterval.Duration != 0 || c.Agent.ResyncPeriod.Duration != 30*time.Second {
			t.Errorf("minSyncInterval: 0s gave %+v", c.Agent)
		}
	}
	if _, err := Parse([]byte(good + "agent: {resyncPeriod: 0s}\n")); err == nil || !strings.Contains(err.Error(), "agent.resyncPeriod: 0s is shorter than 1s") {
		t.Errorf("resyncPeriod: 0s: %v", err)
	}
}

func TestParseErrors(t *testing.T) {
	for _, tc := range []struct{ name, yaml, want string }{
		{"unknown key", good + "bogus: 1\n", `unknown field "bogus"`},
		{"unknown nested key", strings.Replace(good, "gateways:", "gatways:", 1), `unknown field "gatways"`},
		{"unknown class", strings.Replace(good, "pod-to-pod", "pod-to-moon", 1), `classes: unknown class "pod-to-moon"`},
		{"bad cidr", strings.Replace(good, "10.244.2.0/24", "10.244.2.0/33", 1), `node.peerPodCIDRs[0]: "10.244.2.0/33" is not a valid CIDR`},
		{"host bits", strings.Replace(good, "10.244.2.0/24", "10.244.2.7/24", 1), `node.peerPodCIDRs[0]: "10.244.2.7/24" has host bits set (did you mean 10.244.2.0/24?)`},
		{"overlap peer/local", strings.Replace(good, "10.244.2.0/24", "10.244.0.0/16", 1), `node.peerPodCIDRs[0]: 10.244.0.0/16 overlaps node.localPodCIDRs[0] 10.244.1.0/24`},
		{"overlap within", good + "exclude: [10.0.0.0/8, 10.1.0.0/16]\n", `exclude[0]: 10.0.0.0/8 overlaps exclude[1] 10.1.0.0/16`},
		{"negative threshold", good + "packetThreshold: -1\n", `packetThreshold: -1 is negative`},
		{"datapath", good + "datapath: warp\n", `datapath: "warp" is not one of`},
		{"transports word", strings.Replace(good, "[eth0]", "all", 1), `node.transports: "all" is neither "auto" nor a list`},
		{"plumbing words in a value", strings.Replace(good, "[eth0]", `"json: x"`, 1), `node.transports: "json: x" is neither "auto" nor a list`},
		{"ifname", strings.Replace(good, "[gw]", "[a/b]", 1), `node.gateways[0]: "a/b" is not a valid interface name`},
		{"gateway is transport", strings.Replace(good, "[eth0]", "[gw]", 1), `node.transports[0]: "gw" is also a gateway`},
		{"node ip", strings.Replace(good, "  gateways:", "  nodeIPs: [1.2.3]\n  gateways:", 1), `node.nodeIPs[0]: "1.2.3" is not a valid IP address`},
		{"no local", strings.Replace(good, `localPodCIDRs: [10.244.1.0/24, "fd00:10:244:1::/64"]`, "localPodCIDRs: []", 1), `node.localPodCIDRs: at least one`},
		{"threshold type", good + "packetThreshold: lots\n", "packetThreshold"},
		{"tc cannot NAT", strings.Replace(good, "{pod-to-pod: true}", "{pod-to-pod: true, external-to-nodeport: true}", 1) + "datapath: tc\n",
			"classes.external-to-nodeport: datapath tc cannot serve it"},
		{"sockmap other class", good + "datapath: sockmap\n", `classes.pod-to-pod: datapath sockmap serves only local-pod-to-pod; use auto to give the other classes to tc or the flowtable`},
		{"unknown datapath", good + "datapath: ovs\n", `datapath: "ovs" is not one of flowtable, tc, sockmap, auto, none`},
		{"tc nat check", good + "tc: {natCheck: sometimes}\n", `tc.natCheck: "sometimes" is not one of both, toward-pods, off`},
		// FuzzParse: tc read these as IPv4, the flowtable and the overlap checks as IPv6.
		{"mapped prefix", strings.Replace(good, "10.244.2.0/24", `"::ffff:10.244.1.0/120"`, 1), `node.peerPodCIDRs[0]: ::ffff:10.244.1.0/120 is an IPv4-mapped IPv6 prefix; write it as IPv4`},
		{"mapped address", strings.Replace(good, "  gateways:", "  peerNodeIPs: [\"::ffff:172.18.0.2\"]\n  gateways:", 1), `node.peerNodeIPs[0]: "::ffff:172.18.0.2" is an IPv4-mapped IPv6 address; write it as IPv4 (172.18.0.2)`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse([]byte(tc.yaml))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want an error containing %q", err, tc.want)
			}
		})
	}
}

// A config with several class errors gives the same text at every parse: the classes were
// checked in the map's order, and the Kubernetes source takes a new text for a new rejection
// (an Error line and a wake-up of the agent at every EndpointSlice change).
func TestClassErrorsInOneOrder(t *testing.T) {
	bad := strings.Replace(good, "{pod-to-pod: true}", "{pod-to-pod: true, pod-to-service: true, external-to-nodeport: true, external-to-service: true, pod-to-moon: true}", 1) + "datapath: tc\n"
	_, first := Parse([]byte(bad))
	if first == nil || strings.Count(first.Error(), "\n") < 3 {
		t.Fatalf("want four class errors, got %v", first)
	}
	for range 20 {
		if _, err := Parse([]byte(bad)); err == nil || err.Error() != first.Error() {
			t.Fatalf("the errors changed order:\n%v\nthen:\n%v", first, err)
		}
	}
}

// `natCheck: off` as docs/config.md writes it, unquoted: YAML 1.1 reads it as the boolean
// false (found by FuzzParse's seeds).
func TestNATCheckOffUnquoted(t *testing.T) {
	for _, v := range []string{"off", `"off"`, "false"} {
		c, err := Parse([]byte(good + "datapath: auto\ntc: {natCheck: " + v + "}\n"))
		if err != nil || c.TC.NATCheck != model.NATCheckOff {
			t.Errorf("natCheck: %s: %v %+v", v, err, c)
		}
	}
}

// tc.natCarry: unset and true carry (the default), false hands NAT-ed flows to the flowtable.
func TestNATCarry(t *testing.T) {
	links := []Link{{"lo", true, true, 1}, {"gw", true, false, 3}, {"eth0", true, false, 2}}
	for v, off := range map[string]bool{"": false, "tc: {natCarry: true}\n": false, "tc: {natCarry: false}\n": true} {
		c, err := Parse([]byte(good + "datapath: auto\n" + v))
		if err != nil {
			t.Fatal(v, err)
		}
		s, _, err := c.State(links, true)
		if err != nil || s.TCNoNATCarry != off {
			t.Errorf("%q: TCNoNATCarry %v, want %v (%v)", v, s.TCNoNATCarry, off, err)
		}
	}
}

// An empty `transports:` is no transports (json.Marshal writes a Config without them so):
// a load-balancer-only config written back parses (found by FuzzParse's round trip).
func TestTransportsNull(t *testing.T) {
	for _, y := range []string{"datapath: none\nnode: {transports: null}\n", "datapath: none\nnode:\n  transports:\n"} {
		c, err := Parse([]byte(y))
		if err != nil || c.Node.Transports.Auto || c.Node.Transports.Names != nil {
			t.Errorf("%q: %v %+v", y, err, c)
		}
	}
	if _, err := Parse([]byte(strings.Replace(good, "[eth0]", "null", 1))); err == nil || !strings.Contains(err.Error(), `node.transports: list at least one interface, or say "auto"`) {
		t.Errorf("a fastpath without transports: %v", err)
	}
}

func TestStateResolution(t *testing.T) {
	c, err := Parse([]byte(strings.Replace(good, "[eth0]", "auto", 1) + "exclude: [10.244.1.9]\n"))
	if err != nil {
		t.Fatal(err)
	}
	links := []Link{{"lo", true, true, 1}, {"gw", true, false, 3}, {"eth1", true, false, 4}, {"eth0", true, false, 2}, {"down0", false, false, 5}}
	s, warn, err := c.State(links, true)
	if err != nil || len(warn) != 0 {
		t.Fatal(err, warn)
	}
	if got := strings.Join(s.Devices(), ","); got != "eth0,eth1,gw" {
		t.Errorf("auto transports: devices %s", got)
	}
	if want := map[string]int{"eth0": 2, "eth1": 4, "gw": 3}; !maps.Equal(s.DeviceIndex, want) {
		t.Errorf("device indexes %v, want %v", s.DeviceIndex, want)
	}
	if s.Exclude[0].String() != "10.244.1.9/32" || !s.Enabled(model.PodToPod) || s.Enabled(model.PodToService) {
		t.Errorf("state %+v", s)
	}

	// An explicit interface that does not exist: an error for apply, a warning (pruned)
	// for the agent.
	c, _ = Parse([]byte(good))
	if _, _, err := c.State(links[:2], true); err == nil || !strings.Contains(err.Error(), `node.transports[0]: interface "eth0" does not exist`) {
		t.Errorf("strict: %v", err)
	}
	s, warn, err = c.State(links[:2], false)
	if err != nil || len(warn) != 1 || len(s.Transports) != 0 {
		t.Errorf("lenient: %v %v %v", s.Transports, warn, err)
	}
}

// A gateway ending in "*" names every present interface that starts with the rest (a CNI's
// per-Pod veths); it matches nothing without error, keeps its interfaces out of `transports:
// auto`, and an explicit transport it matches is refused.
func TestGatewayPattern(t *testing.T) {
	c, err := Parse([]byte(strings.NewReplacer("[gw]", `[gw, "knet*"]`, "[eth0]", "auto").Replace(good)))
	if err != nil {
		t.Fatal(err)
	}
	links := []Link{{"lo", true, true, 0}, {"gw", true, false, 0}, {"eth0", true, false, 0}, {"knetab12", true, false, 0}, {"knet7", false, false, 0}, {"kne", true, false, 0}}
	s, warn, err := c.State(links, true)
	if err != nil || len(warn) != 0 {
		t.Fatal(err, warn)
	}
	if got, want := strings.Join(s.Gateways, ","), "gw,knet7,knetab12"; got != want {
		t.Errorf("gateways %s, want %s", got, want)
	}
	if got, want := strings.Join(s.Transports, ","), "eth0,kne"; got != want {
		t.Errorf("auto transports %s, want %s", got, want)
	}
	if s, warn, err = c.State(links[:3], true); err != nil || len(warn) != 0 || strings.Join(s.Gateways, ",") != "gw" {
		t.Errorf("no Pod veth yet: %v %v %v", s.Gateways, warn, err)
	}

	for _, bad := range []struct{ yaml, want string }{
		{strings.Replace(good, "[gw]", `["*"]`, 1), `node.gateways[0]: "*" is not a valid interface name or pattern`},
		{strings.Replace(good, "[gw]", `["a*b*"]`, 1), `node.gateways[0]: "a*b*" is not a valid interface name or pattern`},
		{strings.Replace(good, "[gw]", `["abcdefghijklmnop*"]`, 1), `node.gateways[0]: "abcdefghijklmnop*" is not a valid interface name or pattern`},
		{strings.Replace(good, "[gw]", `["eth*"]`, 1), `node.transports[0]: "eth0" is also a gateway (node.gateways: "eth*")`},
	} {
		if _, err := Parse([]byte(bad.yaml)); err == nil || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("%s: err %v, want %q", bad.want, err, bad.want)
		}
	}
}

func TestExamplesValid(t *testing.T) {
	files, _ := filepath.Glob("../../examples/*.yaml")
	if len(files) < 2 {
		t.Fatalf("examples missing: %v", files)
	}
	for _, f := range files {
		if _, err := Load(f); err != nil {
			t.Error(err)
		}
	}
	if _, err := os.Stat("../../examples/antrea-node.yaml"); err != nil {
		t.Error(err)
	}
}

// The load balancer's NAT VIPs join the external-to-loadbalancer set, once.
func TestLoadBalancerVIPsAccelerated(t *testing.T) {
	c, err := Parse([]byte(strings.Replace(good, "  gateways:", "  loadBalancerIPs: [192.0.2.0/28]\n  gateways:", 1) + `loadBalancer:
  services:
  - {name: web, vips: [192.0.2.5, 198.51.100.7], port: 80, topology: dnat, backends: [{address: 10.244.2.10}]}
`))
	if err != nil {
		t.Fatal(err)
	}
	s, _, err := c.State([]Link{{"gw", true, false, 0}, {"eth0", true, false, 0}}, true)
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(s.LoadBalancerIPs) != "[192.0.2.0/28 198.51.100.7/32]" {
		t.Errorf("loadBalancerIPs: %v", s.LoadBalancerIPs)
	}
}

// An IPv6 zone is rejected wherever an address or a CIDR is written, naming the field: it
// used to be dropped silently ("fe80::%eth0/64" became fe80::/128 and was installed).
func TestZonesRejected(t *testing.T) {
	lbSvc := func(vip, backend, snat string) string {
		return fmt.Sprintf("loadBalancer:\n  services:\n  - {name: web, vips: [%q], port: 80, topology: snat, snatAddresses: [%q], backends: [{address: %q}]}\n", vip, snat, backend)
	}
	for _, tc := range []struct{ yaml, want string }{
		{strings.Replace(good, "peerPodCIDRs: [10.244.2.0/24]", `peerPodCIDRs: [10.244.2.0/24, "fe80::%eth0/64"]`, 1),
			`node.peerPodCIDRs[1]: "fe80::%eth0/64" has an IPv6 zone (%eth0/64); zones are not allowed`},
		{strings.Replace(good, "peerPodCIDRs: [10.244.2.0/24]", `peerPodCIDRs: ["fe80::1%eth0"]`, 1),
			`node.peerPodCIDRs[0]: "fe80::1%eth0" has an IPv6 zone (%eth0)`},
		{good + "exclude: [\"fe80::1%eth0/128\"]\n", `exclude[0]: "fe80::1%eth0/128" has an IPv6 zone`},
		{strings.Replace(good, "  gateways:", "  serviceCIDRs: [\"fd00::%1/112\"]\n  gateways:", 1), `node.serviceCIDRs[0]: "fd00::%1/112" has an IPv6 zone`},
		{strings.Replace(good, "  gateways:", "  loadBalancerIPs: [\"fe80::5%gw\"]\n  gateways:", 1), `node.loadBalancerIPs[0]: "fe80::5%gw" has an IPv6 zone`},
		{strings.Replace(good, "  gateways:", "  nodeIPs: [\"fe80::2%eth0\"]\n  gateways:", 1), `node.nodeIPs[0]: "fe80::2%eth0" has an IPv6 zone`},
		{strings.Replace(good, "  gateways:", "  peerNodeIPs: [\"fe80::3%eth0\"]\n  gateways:", 1), `node.peerNodeIPs[0]: "fe80::3%eth0" has an IPv6 zone`},
		{good + lbSvc("2001:db8::1%eth0", "fd00::1", "2001:db8::2"), `loadBalancer.services[0].vips[0]: "2001:db8::1%eth0" has an IPv6 zone`},
		{good + lbSvc("2001:db8::1", "fd00::1%eth0", "2001:db8::2"), `loadBalancer.services[0].backends[0].address: "fd00::1%eth0" has an IPv6 zone`},
		{good + lbSvc("2001:db8::1", "fd00::1", "2001:db8::2%eth0"), `loadBalancer.services[0].snatAddresses[0]: "2001:db8::2%eth0" has an IPv6 zone`},
	} {
		_, err := Parse([]byte(tc.yaml))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("got %v, want an error containing %q", err, tc.want)
		}
	}
	// The same addresses without a zone are fine.
	if _, err := Parse([]byte(strings.Replace(good, "peerPodCIDRs: [10.244.2.0/24]", `peerPodCIDRs: ["fe80::/64", "fe81::1"]`, 1) + lbSvc("2001:db8::1", "fd00::1", "2001:db8::2"))); err != nil {
		t.Error(err)
	}
}

// Every decoding error names its field, with indices, and durations say what they want (they
// used to say `time: invalid duration "99999999999999h"` or `want a duration such as "30s"`).
func TestDecodeErrorsNameTheField(t *testing.T) {
	svcs := `loadBalancer:
  services:
  - {name: a, vips: [192.0.2.1], port: 80, backends: [{address: 10.0.0.1}]}
  - {name: b, vips: [192.0.2.2], port: 80, %s, backends: [{address: 10.0.0.1}, {address: 10.0.0.2%s}]}
`
	for _, tc := range []struct{ yaml, want string }{
		{good + "agent: {resyncPeriod: 99999999999999h}\n", `agent.resyncPeriod: "99999999999999h" is not a duration such as "30s" or "1m30s"`},
		{good + "agent: {resyncPeriod: 30}\n", `agent.resyncPeriod: 30 is not a duration; write one such as "30s"`},
		{good + "agent: {minSyncInterval: [1s]}\n", `agent.minSyncInterval: ["1s"] is not a duration`},
		{good + "agent: {minSyncInterval: soon}\n", `agent.minSyncInterval: "soon" is not a duration`},
		{good + fmt.Sprintf(svcs, "persistence: 5x", ""), `loadBalancer.services[1].persistence: "5x" is not a duration`},
		{good + fmt.Sprintf(svcs, "topology: dsr, interface: eth0, flowTimeout: 1", ""), `loadBalancer.services[1].flowTimeout: 1 is not a duration`},
		{good + fmt.Sprintf(svcs, "healthCheck: {type: tcp, interval: 5}", ""), `loadBalancer.services[1].healthCheck.interval: 5 is not a duration`},
		{good + fmt.Sprintf(svcs, "healthCheck: {type: tcp, timeout: 2 s}", ""), `loadBalancer.services[1].healthCheck.timeout: "2 s" is not a duration`},
		{good + fmt.Sprintf(svcs, "ports: [80, http]", ""), `loadBalancer.services[1].ports[1]: want an integer, got a string`},
		{good + fmt.Sprintf(svcs, "scheduler: rr", ", port: x"), `loadBalancer.services[1].backends[1].port: want an integer, got a string`},
		{good + fmt.Sprintf(svcs, "scheduler: rr", ", weight: 1.5"), `loadBalancer.services[1].backends[1].weight: want an integer, got number 1.5`},
		{good + "packetThreshold: lots\n", `packetThreshold: want an integer, got a string`},
		{strings.Replace(good, "{pod-to-pod: true}", "{pod-to-pod: true, pod-to-service: 3}", 1), `classes.pod-to-service: want true or false, got a number`},
		{good + "exclude: [10.9.0.0/16, [10.8.0.0/16]]\n", `exclude[1]: want a string, got a list`},
	} {
		_, err := Parse([]byte(tc.yaml))
		if err == nil || !strings.HasPrefix(err.Error(), tc.want) {
			t.Errorf("got %v\nwant an error starting with %q", err, tc.want)
		}
	}
}

// A long value is quoted cut to 64 bytes, with its length: it used to be echoed whole (a 50 MB
// string made a 50 MB error).
func TestLongValuesCut(t *testing.T) {
	long := strings.Repeat("x", 100000)
	cut := `"` + strings.Repeat("x", model.MaxQuoted) + `"…(100000 bytes)`
	y := strings.NewReplacer("LONG", long).Replace(`datapath: LONG
node:
  gateways: [LONG]
  transports: [eth0]
  localPodCIDRs: [LONG]
  nodeIPs: [LONG]
tc: {natCheck: LONG}
loadBalancer:
  stateFile: LONG
  api: {socket: LONG, listen: LONG}
  services:
  - name: LONG
    vips: [LONG]
    port: 80
    protocol: LONG
    topology: LONG
    scheduler: LONG
    hashFields: [LONG]
    snatAddresses: [LONG]
    healthCheck: {type: LONG, path: LONG, command: [LONG]}
    backends: [{address: LONG, state: LONG, mac: LONG}]
`)
	_, err := Parse([]byte(y))
	if err == nil {
		t.Fatal("accepted")
	}
	quoted := 0
	for _, l := range strings.Split(err.Error(), "\n") {
		if len(l) > 300 {
			t.Errorf("%d bytes: %.300s", len(l), l)
		}
		if strings.Contains(l, cut) {
			quoted++
		}
	}
	if quoted < 21 {
		t.Errorf("%d values quoted:\n%s", quoted, err)
	}
}

func TestLoadLimit(t *testing.T) {
	if _, err := Load("/dev/zero"); err == nil || !strings.Contains(err.Error(), "/dev/zero is larger than 16 MiB") {
		t.Errorf("/dev/zero: %v", err)
	}
}

// ParseJSON (the Kubernetes source's derived configs) gives what Parse gives for the same
// config, and refuses what Parse refuses: unknown fields, invalid values, trailing data.
func TestParseJSONAsParse(t *testing.T) {
	y := []byte("datapath: flowtable\nnode:\n  gateways: [gw]\n  transports: [eth0]\n  localPodCIDRs: [10.244.1.0/24]\n  peerPodCIDRs: [10.244.2.0/24]\nclasses: {pod-to-pod: true}\n")
	want, err := Parse(y)
	if err != nil {
		t.Fatal(err)
	}
	j, err := json.Marshal(want)
	if err != nil {
		t.Fatal(err)
	}
	got, err := ParseJSON(j)
	if err != nil || !reflect.DeepEqual(got, want) {
		t.Fatalf("ParseJSON: %v\n%+v\nwant %+v", err, got, want)
	}
	for _, bad := range []struct{ in, want string }{
		{`{"datapath": "flowtable", "bogus": 1}`, `unknown field "bogus"`},
		{`{"datapath": "warp"}`, "datapath"},
		{`{"datapath": "flowtable"} {}`, "trailing data"},
	} {
		if _, err := ParseJSON([]byte(bad.in)); err == nil || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("ParseJSON(%s): %v, want an error with %q", bad.in, err, bad.want)
		}
	}
}

// PeekDatapath names the datapath of a top-level `datapath:` line alone; anything it cannot
// tell for sure is "", and what it names is what Parse decides.
func TestPeekDatapath(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{"datapath: tc\nnode: {}\n", "tc"},
		{"node:\n  gateways: [gw]\ndatapath:   none   # a comment\n", "none"},
		{"datapath: auto\r\n", "auto"},
		{"node: {}\n", ""},                     // the default is Parse's to say
		{"{datapath: tc}\n", ""},               // flow style
		{`{"datapath": "tc"}`, ""},             // JSON
		{"datapath: \"tc\"\n", ""},             // quoted
		{"datapath: tc\ndatapath: none\n", ""}, // twice: Parse refuses it
		{"datapath: bogus\n", ""},              // not a datapath
		{"node:\n  datapath: tc\n", ""},        // not top-level
		{"description: |\n  datapath: tc\ndatapath: none\n", "none"},
	} {
		if got := PeekDatapath([]byte(c.in)); got != c.want {
			t.Errorf("PeekDatapath(%q) = %q, want %q", c.in, got, c.want)
		}
	}
	// Every example config: what it peeks is what it parses to.
	files, _ := filepath.Glob("../../examples/*.yaml")
	if len(files) == 0 {
		t.Fatal("no example configs")
	}
	peeked := 0
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		c, err := Parse(b)
		if err != nil {
			continue // not a node config (the Kubernetes examples, say)
		}
		if got := PeekDatapath(b); got != "" {
			peeked++
			if got != c.Datapath {
				t.Errorf("%s: peeked %q, parsed %q", f, got, c.Datapath)
			}
		}
	}
	if peeked == 0 {
		t.Error("no example config names its datapath on a line of its own")
	}
}
