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
