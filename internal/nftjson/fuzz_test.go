package nftjson

import (
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/hostaccel/hostaccel/internal/golden"
)

// FuzzParse: `nft --json list table` output as the kernel (or someone else's nft) gives it.
// Parse never panics, its errors say what failed to parse, and an accepted table has sorted
// set elements and a fingerprint that parsing the same output again reproduces.
//
// The corpus holds real nft 1.0.6 listings (nft-*: the load balancer's golden rulesets as
// the kernel lists them) and hand-made edge cases (seed-*).
func FuzzParse(f *testing.F) {
	f.Fuzz(func(t *testing.T, b []byte) {
		tab, err := Parse(b)
		if err != nil {
			if !strings.HasPrefix(err.Error(), "parse nft json") {
				t.Fatalf("error %q does not say what failed\ninput: %q", err, b)
			}
			return
		}
		fp := tab.Fingerprint()
		for name, s := range tab.Sets {
			if !slices.IsSorted(s.Elements) {
				t.Fatalf("set %s: elements not sorted: %q", name, s.Elements)
			}
		}
		again, err := Parse(b)
		if err != nil || again.Fingerprint() != fp {
			t.Fatalf("parsing again: %v, fingerprint %s then %s\ninput: %q", err, fp, again.Fingerprint(), b)
		}
	})
}

// TestFuzzSeeds keeps FuzzParse's hand-made seeds current (go test -update rewrites them).
func TestFuzzSeeds(t *testing.T) {
	host, err := os.ReadFile("testdata/host-table.json")
	if err != nil {
		t.Fatal(err)
	}
	seeds := map[string][]any{"host-table": {host}}
	for name, js := range map[string]string{
		"empty":          `{"nftables": []}`,
		"table-only":     `{"nftables": [{"table": {"family": "inet", "name": "x", "comment": "c"}}]}`,
		"table-nulls":    `{"nftables": [{"table": {"family": "inet", "name": "x", "sets": null, "chains": null, "flowtables": null}}, {"set": {"name": "s", "type": "ifname"}}]}`,
		"table-fields":   `{"nftables": [{"table": {"family": "inet", "name": "x", "chains": {"c": {"rules": [null]}}}}]}`,
		"set-elems":      `{"nftables": [{"set": {"name": "s", "type": ["ipv4_addr", "inet_service"], "flags": "interval", "elem": ["a", 1, {"prefix": {"addr": "10.0.0.0", "len": 8}}, {"range": ["10.0.0.1", "10.0.0.9"]}, {"elem": {"val": "x", "timeout": 5}}, {"concat": ["1.2.3.4", 80]}, [1], null, true]}}]}`,
		"nested-elem":    `{"nftables": [{"set": {"name": "s", "elem": [{"elem": {"val": {"elem": {"val": {"range": [{"prefix": {"addr": "::", "len": 0}}, {"concat": []}]}}}}}]}}]}`,
		"flowtable":      `{"nftables": [{"flowtable": {"name": "f", "dev": "eth0", "flags": ["counter"]}}, {"flowtable": {"name": "g", "dev": ["b", "a"]}}]}`,
		"rule-no-chain":  `{"nftables": [{"rule": {"chain": "c", "handle": 4, "comment": "x", "expr": [{"counter": {"packets": 1, "bytes": 2}}, {"counter": null}, {"accept": null}]}}]}`,
		"chain-and-rule": `{"nftables": [{"chain": {"name": "c", "hook": "forward", "prio": -150}}, {"rule": {"chain": "c", "expr": [{"counter": {"packets": 18446744073709551615, "bytes": 1}}, {"counter": {"packets": 1, "bytes": 1}}]}}]}`,
		"bad-kind":       `{"nftables": [{"table": []}]}`,
		"bad-set":        `{"nftables": [{"set": {"name": 1}}]}`,
		"bad-rule":       `{"nftables": [{"rule": {"expr": {}}}]}`,
		"bad-json":       `{"nftables": [`,
		"not-object":     `[1]`,
		"unknown-kind":   `{"nftables": [{"metainfo": {"version": "1.0.6"}}, {"map": {"name": "m"}}, {"counter": {"name": "c"}}]}`,
	} {
		seeds[name] = []any{[]byte(js)}
	}
	golden.FuzzSeeds(t, "testdata/fuzz/FuzzParse", seeds)
}
