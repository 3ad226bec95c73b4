package config_test

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"

	"github.com/hostaccel/hostaccel/internal/config"
	"github.com/hostaccel/hostaccel/internal/config/configtest"
	"github.com/hostaccel/hostaccel/internal/golden"
)

// namesField matches an error line that says which part of the file is wrong: a path that
// starts with a top-level key (node.gateways[0]: ...), an unknown key, a type error that
// names the struct field, or a YAML syntax or structure error (which has no field, only a
// line; a null or compound map key has not even that: sigs.k8s.io/yaml's "unsupported map key").
var namesField = regexp.MustCompile(`^(datapath|node|classes|packetThreshold|exclude|tc|agent|loadBalancer)[.:\[ ]|` +
	`^unknown field "|Go struct field \S+|^yaml: |^  line \d+: |^error converting YAML to JSON: yaml: |^unsupported map key |into Go value of type config\.Config$`)

// FuzzParse: config.Parse never panics; a rejected file's every error line names its field;
// an accepted file renders (flowtable and lb with the knftables Fake, tc's maps) and writes
// back to YAML that parses to the same Config.
func FuzzParse(f *testing.F) {
	f.Fuzz(func(t *testing.T, b []byte) {
		c, err := config.Parse(b)
		if err != nil {
			for _, line := range strings.Split(err.Error(), "\n") {
				if !namesField.MatchString(line) {
					t.Fatalf("error names no field: %q\ninput:\n%s", line, b)
				}
			}
			return
		}
		checkAccepted(t, c, b)
	})
}

func checkAccepted(t *testing.T, c *config.Config, in []byte) {
	t.Helper()
	// Round trip: the file format written from the Config parses to the same Config.
	js, err := json.Marshal(c)
	if err != nil {
		t.Fatal(err)
	}
	y, err := yaml.JSONToYAML(js)
	if err != nil {
		t.Fatal(err)
	}
	c2, err := config.Parse(y)
	if err != nil {
		t.Fatalf("accepted config does not parse back: %v\ninput:\n%s\nwritten:\n%s", err, in, y)
	}
	// The same Config (as its JSON: an empty list left out comes back as none) and the same
	// State.
	if js2, _ := json.Marshal(c2); string(js) != string(js2) {
		t.Fatalf("round trip differs:\ninput:\n%s\nwritten:\n%s\nfirst:  %s\nsecond: %s", in, y, js, js2)
	}
	s1, _, err1 := c.State(configtest.Links(c), true)
	s2, _, err2 := c2.State(configtest.Links(c2), true)
	if !reflect.DeepEqual(s1, s2) || (err1 == nil) != (err2 == nil) {
		t.Fatalf("round trip changes the state:\ninput:\n%s\nwritten:\n%s\nfirst:  %+v %v\nsecond: %+v %v", in, y, s1, err1, s2, err2)
	}
	if _, err := configtest.Render(c); err != nil {
		t.Fatalf("accepted config does not render: %v\ninput:\n%s", err, in)
	}
}

// TestFuzzParseSeeds keeps testdata/fuzz/FuzzParse's seed corpus current (go test -update
// rewrites it): the examples, and a variety of valid and invalid files around them.
func TestFuzzParseSeeds(t *testing.T) {
	seeds := map[string][]any{}
	files, _ := filepath.Glob("../../examples/*.yaml")
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		seeds["example-"+strings.TrimSuffix(filepath.Base(f), ".yaml")] = []any{b}
	}
	for name, y := range fuzzSeedYAML {
		seeds[name] = []any{[]byte(y)}
	}
	golden.FuzzSeeds(t, "testdata/fuzz/FuzzParse", seeds)
}

// The seeds themselves are valid or rejected as their names say.
func TestFuzzParseSeedsAsNamed(t *testing.T) {
	for name, y := range fuzzSeedYAML {
		_, err := config.Parse([]byte(y))
		if strings.HasPrefix(name, "bad-") != (err != nil) {
			t.Errorf("%s: %v", name, err)
		}
	}
}

const seedNode = `node:
  gateways: [gw]
  transports: [eth0]
  localPodCIDRs: [10.244.1.0/24, "fd00:10:244:1::/64"]
  peerPodCIDRs: [10.244.2.0/24]
`

const seedLB = "datapath: none\nloadBalancer:\n  services:\n"

var fuzzSeedYAML = map[string]string{
	"minimal":         seedNode + "classes: {pod-to-pod: true}\n",
	"json":            `{"node":{"gateways":["gw"],"transports":"auto","localPodCIDRs":["10.0.0.0/8"]},"classes":{"pod-to-pod":true}}`,
	"transports-auto": strings.Replace(seedNode, "[eth0]", "auto", 1) + "exclude: [10.244.1.9]\n",
	// interface names Linux allows that nft parses only quoted (the flowtable's devices), and
	// that a table's name cannot carry as they are (the load balancer's netdev tables)
	"odd-names":          "node:\n  gateways: [\"gw<\", 1gw]\n  transports: [\"eth+1\"]\n  localPodCIDRs: [10.244.1.0/24]\n  peerPodCIDRs: [10.244.2.0/24]\nclasses: {pod-to-pod: true, pod-to-service: true}\nloadBalancer:\n  services:\n  - {name: 1web, vips: [192.0.2.10], port: 80, topology: stateless-dnat, interface: \"eth<\", backendInterface: 1eth, backends: [{address: 10.1.0.11, port: 8080}]}\n  - {name: web, vips: [192.0.2.11], port: 80, topology: dsr, interface: \"eth+1\", backends: [{address: 10.1.0.12}]}\n",
	"all-classes":        seedNode + "classes: {pod-to-pod: true, pod-to-service: true, external-to-nodeport: true, external-to-loadbalancer: true, external-to-service: true, node-to-remote-pod: true}\n",
	"tc":                 seedNode + "datapath: tc\nclasses: {pod-to-pod: true, node-to-remote-pod: true}\ntc: {natCheck: toward-pods}\n",
	"auto":               seedNode + "datapath: auto\nclasses: {pod-to-pod: true, pod-to-service: true}\ntc: {natCheck: off}\n",
	"threshold-exclude":  seedNode + "packetThreshold: 20\nexclude: [10.244.1.66/32, \"fd00:10:244:1::42/128\"]\nclasses: {pod-to-pod: true}\n",
	"agent":              seedNode + "agent: {resyncPeriod: 10s, minSyncInterval: 250ms}\n",
	"addresses":          strings.Replace(seedNode, "  gateways:", "  nodeIPs: [172.18.0.4, \"fc00::4\"]\n  peerNodeIPs: [172.18.0.2]\n  serviceCIDRs: [10.96.0.0/12]\n  loadBalancerIPs: [192.0.2.0/28, 198.51.100.7]\n  gateways:", 1),
	"bad-mapped-v6":      strings.Replace(seedNode, "[10.244.2.0/24]", "[\"::ffff:10.244.1.0/120\"]", 1) + "datapath: tc\nclasses: {pod-to-pod: true}\n",
	"bad-unknown-key":    seedNode + "bogus: 1\n",
	"bad-class":          seedNode + "classes: {pod-to-moon: true}\n",
	"bad-cidr":           strings.Replace(seedNode, "10.244.2.0/24", "10.244.2.0/33", 1),
	"bad-host-bits":      strings.Replace(seedNode, "10.244.2.0/24", "10.244.2.7/24", 1),
	"bad-overlap":        strings.Replace(seedNode, "10.244.2.0/24", "10.244.0.0/16", 1),
	"bad-threshold-type": seedNode + "packetThreshold: lots\n",
	"bad-datapath":       seedNode + "datapath: ovs\n",
	"bad-transports":     strings.Replace(seedNode, "[eth0]", "all", 1),
	"bad-ifname":         strings.Replace(seedNode, "[gw]", "[a/b]", 1),
	"bad-tc-nat":         seedNode + "datapath: tc\nclasses: {external-to-nodeport: true}\n",
	"bad-resync":         seedNode + "agent: {resyncPeriod: 100ms}\n",
	"bad-duration":       seedNode + "agent: {resyncPeriod: 30}\n",
	"bad-yaml":           "node: [gateways: {\n",
	"bad-list":           "- datapath: tc\n",
	"bad-zoned-address":  strings.Replace(seedNode, "[10.244.2.0/24]", "[\"fe80::1%eth0\"]", 1),
	"lb-snat": seedLB + `  - {name: web, vips: [192.0.2.10, "2001:db8::10"], port: 443, topology: snat, snatAddresses: [203.0.113.1], scheduler: weight, persistence: 10m,
     backends: [{address: 10.0.1.11, port: 8443, weight: 3}, {address: 10.0.1.12, weight: 1000, priority: 1}, {address: "fd00:1::11", state: drain}]}
`,
	"lb-dnat-hash": seedLB + `  - {name: dns, vips: [192.0.2.53], ports: [53, 5353], protocol: udp, scheduler: hash, hashFields: [src-ip, dst-port], flushConntrack: true,
     healthCheck: {type: dns, query: example.org}, backends: [{address: 10.0.1.21}, {address: 10.0.1.22, state: down}]}
`,
	"lb-dsr": seedLB + `  - {name: d, vips: [198.51.100.20], port: 80, topology: dsr, interface: eth1, scheduler: symhash, flowTimeout: 1m,
     healthCheck: {type: udp, send: ping, expect: pong, interval: 50ms, timeout: 1h}, backends: [{address: 10.0.2.11, mac: "02:42:0a:00:02:0d"}, {address: "fd00:2::11"}]}
`,
	"lb-stateless": seedLB + `  - {name: s, vips: [203.0.113.30], port: 80, topology: stateless-dnat, interface: eth0, backendInterface: eth1, persistence: 24h,
     healthCheck: {type: command, command: [/bin/true]}, backends: [{address: 10.0.3.11, port: 8080}]}
  - {name: t, vips: [203.0.113.31], port: 80, protocol: sctp, backends: [{address: 10.0.3.11, port: 8080}]}
`,
	"lb-api":      "datapath: none\nloadBalancer: {api: {listen: \"127.0.0.1:8443\", keyFile: /etc/k}, stateFile: /var/lib/x.yaml}\n",
	"bad-lb-port": seedLB + "  - {name: web, vips: [192.0.2.10], port: 0, backends: [{address: 10.0.1.11}]}\n",
	"bad-lb-vip":  seedLB + "  - {name: web, vips: [224.0.0.1, 127.0.0.1, x], port: 80, backends: [{address: 10.0.1.11}]}\n",
	"bad-lb-dup": seedLB + `  - {name: web, vips: [192.0.2.10], port: 80, backends: [{address: 10.0.1.11}]}
  - {name: web, vips: [192.0.2.10], port: 80, topology: stateless-dnat, interface: eth0, backends: [{address: 10.0.1.11}]}
`,
	"bad-lb-weights":    seedLB + "  - {name: w, vips: [192.0.2.10], port: 80, backends: [" + manyBackends(263, 1000) + ", {address: 10.0.9.9, weight: 999}]}\n", // gcd 1: 263,999 slots
	"bad-lb-health":     seedLB + "  - {name: h, vips: [192.0.2.10], port: 80, healthCheck: {type: http, path: x, expectStatus: 99, rise: 101}, backends: [{address: 10.0.1.1}]}\n",
	"bad-lb-persist":    seedLB + "  - {name: p, vips: [192.0.2.10], port: 80, persistence: 5, backends: [{address: 10.0.1.1}]}\n",
	"bad-lb-statefile":  "datapath: none\nloadBalancer: {stateFile: relative.yaml}\n",
	"bad-lb-family":     seedLB + "  - {name: f, vips: [\"2001:db8::1\"], port: 80, backends: [{address: 10.0.1.1}]}\n",
	"bad-lb-service-ty": seedLB + "  - [1, 2]\n",
}

// manyBackends is n backends of one weight, as a flow sequence's items.
func manyBackends(n, weight int) string {
	var items []string
	for i := range n {
		items = append(items, fmt.Sprintf("{address: 10.0.%d.%d, weight: %d}", 1+i/250, 1+i%250, weight))
	}
	return strings.Join(items, ", ")
}
