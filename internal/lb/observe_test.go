package lb

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"sigs.k8s.io/knftables"
)

// A reading nothing waits for runs nft at nice 19; any other at the agent's own priority.
func TestBackgroundReadIsNiced(t *testing.T) {
	dir := t.TempDir()
	// A stand-in nft that prints its nice value (field 19 of /proc/PID/stat) after NFTList
	// had the time to set it.
	script := "#!/bin/sh\nsleep 0.3\nawk '{print $19}' /proc/$$/stat\n"
	if err := os.WriteFile(filepath.Join(dir, "nft"), []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv("PATH", dir+string(os.PathListSeparator)+os.Getenv("PATH"))
	own, err := os.ReadFile("/proc/self/stat")
	if err != nil {
		t.Fatal(err)
	}
	ownNice := strings.Fields(string(own[strings.LastIndexByte(string(own), ')')+2:]))[16]
	for _, tc := range []struct {
		ctx  context.Context
		want string
	}{{context.Background(), ownNice}, {background(context.Background()), "19"}} {
		out, err := NFTList(tc.ctx, "list", "ruleset")
		if err != nil {
			t.Fatal(err)
		}
		if got := strings.TrimSpace(string(out)); got != tc.want {
			t.Errorf("nft ran at nice %s, want %s", got, tc.want)
		}
	}
}

// nft 1.0.6 writes its JSON with ", " and ": "; a table read from it is the table read from the
// same JSON compact (rules keep their expressions compact, as the agent's known rules do).
func TestParseTableSpacedAsCompact(t *testing.T) {
	spaced := []byte(`{"nftables": [{"metainfo": {"version": "1.0.6", "json_schema_version": 1}}, ` +
		`{"table": {"family": "inet", "name": "hostaccel-lb", "handle": 1}}, ` +
		`{"map": {"family": "inet", "name": "m", "table": "hostaccel-lb", "type": "ipv4_addr", "handle": 2, "map": "verdict", "elem": [["10.0.0.1", {"accept": null}]]}}, ` +
		`{"chain": {"family": "inet", "table": "hostaccel-lb", "name": "c", "handle": 1}}, ` +
		`{"rule": {"family": "inet", "table": "hostaccel-lb", "chain": "c", "handle": 3, "comment": "x y", "expr": [{"match": {"op": "==", "left": {"payload": {"protocol": "tcp", "field": "dport"}}, "right": {"set": [80, 443]}}}, {"counter": {"packets": 0, "bytes": 0}}, {"accept": null}]}}]}`)
	var compact bytes.Buffer
	if err := json.Compact(&compact, spaced); err != nil {
		t.Fatal(err)
	}
	ref := TableRef{Family: knftables.InetFamily, Name: NATTable}
	a, err := parseTable(ref, spaced)
	if err != nil {
		t.Fatal(err)
	}
	b, err := parseTable(ref, compact.Bytes())
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(a, b) {
		t.Fatalf("spaced: %+v\ncompact: %+v", a.Chains["c"].Rules[0], b.Chains["c"].Rules[0])
	}
	if r := a.Chains["c"].Rules[0]; r.Comment != "x y" || strings.Contains(r.Expr, ": ") {
		t.Fatalf("rule %+v", r)
	}
}

// Elements read back are keyed as Render writes them: without /etc/protocols (a slim
// container image) nft lists a protocol by its number (17, not udp), and an IPv6 address in
// ::/96 as ::10.1.0.11 (netip writes ::a01:b). Such keys never matched: every full read
// deleted and added them again, and reported drift.
func TestParseTableKeysAsRenderWritesThem(t *testing.T) {
	s := Service{Name: "web", VIPs: []string{"::192.0.2.10"}, Port: 80, Protocol: "udp", Topology: StatelessDNAT,
		Interface: "eth0", BackendInterface: "eth1", Backends: []Backend{{Address: "::10.1.0.11", Port: 8080}}}
	if errs := ValidateServices([]Service{s}, fieldByName([]Service{s})); len(errs) > 0 {
		t.Fatal(errs)
	}
	rendered := map[string]*kernelTable{}
	for _, tab := range Render(Resolve([]Service{s}, nil, testEnv)).Tables {
		rendered[tab.Name] = known(tab)
	}
	addrs := rendered["hostaccel-lb-eth0"].Maps["web-addrs-v6"].Elems
	if len(addrs) != 1 {
		t.Fatalf("web-addrs-v6: %v", addrs)
	}
	var id string // the backend's id, an IPv6 address
	for id = range addrs {
	}
	for _, tc := range []struct {
		ref     TableRef
		listing string
		maps    []string
	}{
		{TableRef{knftables.InetFamily, NATTable}, `{"nftables": [{"metainfo": {"version": "1.0.6", "release_name": "Lester Gooch #5", "json_schema_version": 1}}, ` +
			`{"table": {"family": "inet", "name": "hostaccel-lb", "handle": 1}}, ` +
			`{"set": {"family": "inet", "name": "stateless-fwd-v6", "table": "hostaccel-lb", "type": ["ipv6_addr", "inet_proto", "inet_service"], "handle": 2, "elem": [{"concat": ["::10.1.0.11", 17, 8080]}]}}, ` +
			`{"set": {"family": "inet", "name": "stateless-rev-v6", "table": "hostaccel-lb", "type": ["ipv6_addr", "inet_proto", "inet_service"], "handle": 3, "elem": [{"concat": ["::192.0.2.10", 17, 80]}]}}]}`,
			[]string{"stateless-fwd-v6", "stateless-rev-v6"}},
		{TableRef{knftables.NetDevFamily, "hostaccel-lb-eth0"}, `{"nftables": [{"metainfo": {"version": "1.0.6", "release_name": "Lester Gooch #5", "json_schema_version": 1}}, ` +
			`{"table": {"family": "netdev", "name": "hostaccel-lb-eth0", "handle": 4}}, ` +
			`{"map": {"family": "netdev", "name": "services-v6", "table": "hostaccel-lb-eth0", "type": ["ipv6_addr", "inet_proto", "inet_service"], "handle": 1, "map": "verdict", "elem": [[{"concat": ["::192.0.2.10", 17, 80]}, {"goto": {"target": "sdnat-web-v6"}}]]}}, ` +
			`{"map": {"family": "netdev", "name": "web-addrs-v6", "table": "hostaccel-lb-eth0", "type": "ipv6_addr", "handle": 2, "map": "ipv6_addr", "elem": [["` + id + `", "::10.1.0.11"]]}}, ` +
			`{"map": {"family": "netdev", "name": "web-ports-v6", "table": "hostaccel-lb-eth0", "type": "ipv6_addr", "handle": 3, "map": "inet_service", "elem": [["` + id + `", 8080]]}}]}`,
			[]string{"services-v6", "web-addrs-v6", "web-ports-v6"}},
		{TableRef{knftables.NetDevFamily, "hostaccel-lb-eth1"}, `{"nftables": [{"table": {"family": "netdev", "name": "hostaccel-lb-eth1", "handle": 5}}, ` +
			`{"map": {"family": "netdev", "name": "reverse-v6", "table": "hostaccel-lb-eth1", "type": ["ipv6_addr", "inet_proto", "inet_service"], "handle": 1, "map": "verdict", "elem": [[{"concat": ["::10.1.0.11", 17, 8080]}, {"goto": {"target": "rev-web-v6"}}]]}}]}`,
			[]string{"reverse-v6"}},
	} {
		kt, err := parseTable(tc.ref, []byte(tc.listing))
		if err != nil {
			t.Fatal(err)
		}
		for _, name := range tc.maps {
			want := rendered[tc.ref.Name].Maps[name].Elems
			if len(want) == 0 {
				t.Fatalf("%s %s: rendered empty", tc.ref, name)
			}
			if got := kt.Maps[name].Elems; !reflect.DeepEqual(got, want) {
				t.Errorf("%s %s read back as %q, rendered as %q", tc.ref, name, got, want)
			}
		}
	}
	// A number is a protocol's name only where the type is inet_proto; an IPv6 address is
	// written as netip does wherever it is.
	kt, err := parseTable(TableRef{knftables.InetFamily, NATTable}, []byte(`{"nftables": [{"table": {"family": "inet", "name": "hostaccel-lb", "handle": 1}}, `+
		`{"map": {"family": "inet", "name": "m", "table": "hostaccel-lb", "type": ["inet_service", "inet_proto"], "handle": 2, "map": "ipv6_addr . inet_service", "elem": [[{"concat": [6, 6]}, {"concat": ["::10.0.0.1", 17]}]]}}, `+
		`{"set": {"family": "inet", "name": "s", "table": "hostaccel-lb", "type": "inet_proto", "handle": 3, "elem": [132, "tcp"]}}]}`))
	if err != nil {
		t.Fatal(err)
	}
	if got, want := kt.Maps["m"].Elems, map[string]string{"6 . tcp": "::a00:1 . 17"}; !reflect.DeepEqual(got, want) {
		t.Errorf("m: %q, want %q", got, want)
	}
	if got, want := kt.Maps["s"].Elems, map[string]string{"sctp": "", "tcp": ""}; !reflect.DeepEqual(got, want) {
		t.Errorf("s: %q, want %q", got, want)
	}
}
