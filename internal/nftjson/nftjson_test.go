package nftjson

import (
	"bytes"
	"context"
	"errors"
	"os"
	"strings"
	"testing"
)

// testdata/host-table.json is real `nft --json list table` output (nft 1.0.6).
func TestParseRealOutput(t *testing.T) {
	b, err := os.ReadFile("testdata/host-table.json")
	if err != nil {
		t.Fatal(err)
	}
	tab, err := Parse(b)
	if err != nil {
		t.Fatal(err)
	}
	if tab.Family != "inet" || tab.Name != "hostaccel" {
		t.Errorf("table: %s %s", tab.Family, tab.Name)
	}
	if got := strings.Join(tab.Sets["peer-pod-v4"].Elements, ","); got != "10.1.0.1-10.1.0.9,10.244.2.0/24,10.9.9.9" {
		t.Errorf("elements: %s", got)
	}
	if got := strings.Join(tab.Sets["fastpath-devices"].Elements, ","); got != "eth0,gw" {
		t.Errorf("ifname elements: %s", got)
	}
	if s := tab.Sets["local-pod-v4"]; s.Type != "ipv4_addr" || strings.Join(s.Flags, ",") != "interval" {
		t.Errorf("set: %+v", s)
	}
	ch := tab.Chains["forward"]
	if ch == nil || ch.Hook != "forward" || ch.Prio != 10 || len(ch.Rules) != 9 {
		t.Fatalf("chain: %+v", ch)
	}
	r := ch.Rules[5]
	if r.Comment != "pod-to-pod" || !r.Counter || r.Handle == 0 || !strings.Contains(r.Expr, `{"counter":{}}`) {
		t.Errorf("rule: %+v", r)
	}
	if ch.Rules[0].Counter {
		t.Error("counter on a rule without one")
	}
}

// Counter values do not change the fingerprint; anything else does.
func TestFingerprint(t *testing.T) {
	b, _ := os.ReadFile("testdata/host-table.json")
	a, _ := Parse(b)
	moreTraffic, _ := Parse([]byte(strings.Replace(string(b), `"packets": 0, "bytes": 0`, `"packets": 5, "bytes": 900`, 1)))
	if a.Fingerprint() != moreTraffic.Fingerprint() {
		t.Error("counter values changed the fingerprint")
	}
	if moreTraffic.Chains["forward"].Rules[3].Packets != 5 {
		t.Errorf("counter not read: %+v", moreTraffic.Chains["forward"].Rules[3])
	}
	edited, _ := Parse([]byte(strings.Replace(string(b), `"10.244.2.0"`, `"10.244.3.0"`, 1)))
	if a.Fingerprint() == edited.Fingerprint() {
		t.Error("an element change kept the fingerprint")
	}
}

func TestListNoTable(t *testing.T) {
	_, err := List(context.Background(), func(context.Context, string, string) ([]byte, error) { return nil, ErrNoTable }, "inet", "x")
	if !errors.Is(err, ErrNoTable) {
		t.Fatal(err)
	}
	if _, err := Parse([]byte("not json")); err == nil {
		t.Error("garbage parsed")
	}
}

// nft 1.0.6 leaves the table comment out of --json; it is taken from the text listing.
func TestTableCommentFromText(t *testing.T) {
	js := []byte(`{"nftables": [{"metainfo": {"version": "1.0.6"}}, {"table": {"family": "inet", "name": "hostaccel", "handle": 22}}]}`)
	text := []byte("table inet hostaccel {\n\tcomment \"hostaccel flowtable datapath, spec 5f946c40e89a037c\"\n\tset fastpath-devices {\n")
	out, err := withTableComment(js, text)
	if err != nil {
		t.Fatal(err)
	}
	tab, err := Parse(out)
	if err != nil || tab.Comment != "hostaccel flowtable datapath, spec 5f946c40e89a037c" || tab.Name != "hostaccel" {
		t.Fatalf("%+v %v", tab, err)
	}
	if out, _ := withTableComment(js, []byte("table inet hostaccel {\n\tset x {\n\t\tcomment \"a set\"\n")); string(out) != string(js) {
		t.Errorf("a set comment was taken for the table's: %s", out)
	}
}

// A table object's fields other than family, name and comment are not read: "sets": null
// panicked on the next set, a chain with a null rule in the fingerprint (FuzzParse's seeds
// seed-table-nulls and seed-table-fields).
func TestParseTableObjectFields(t *testing.T) {
	tab, err := Parse([]byte(`{"nftables": [{"table": {"family": "inet", "name": "x", "sets": null, "chains": {"c": {"rules": [null]}}}}, {"set": {"name": "s", "type": "ifname"}}]}`))
	if err != nil {
		t.Fatal(err)
	}
	if tab.Name != "x" || tab.Sets["s"] == nil || len(tab.Chains) != 0 {
		t.Errorf("table: %+v", tab)
	}
	tab.Fingerprint()
}

// Captured from nft 1.0.6 in a scratch namespace: the same table before and after
// `nft chain inet t c '{ policy drop; }'` (which blackholes every forwarded packet the
// chain does not accept).
const listedAccept = `{"nftables": [{"metainfo": {"version": "1.0.6", "release_name": "Lester Gooch #5", "json_schema_version": 1}}, {"table": {"family": "inet", "name": "t", "handle": 2, "comment": "hello"}}, {"chain": {"family": "inet", "table": "t", "name": "c", "handle": 1, "type": "filter", "hook": "forward", "prio": 0, "policy": "accept"}}, {"rule": {"family": "inet", "table": "t", "chain": "c", "handle": 4, "comment": "r1", "expr": [{"counter": {"packets": 0, "bytes": 0}}]}}]}`
const listedDrop = `{"nftables": [{"metainfo": {"version": "1.0.6", "release_name": "Lester Gooch #5", "json_schema_version": 1}}, {"table": {"family": "inet", "name": "t", "handle": 2, "comment": "hello"}}, {"chain": {"family": "inet", "table": "t", "name": "c", "handle": 1, "type": "filter", "hook": "forward", "prio": 0, "policy": "drop"}}, {"rule": {"family": "inet", "table": "t", "chain": "c", "handle": 4, "comment": "r1", "expr": [{"counter": {"packets": 0, "bytes": 0}}]}}]}`

// `nft add table inet t '{ flags dormant; }'`: the whole table stops working (nft >= 1.0.7
// writes the flags in its JSON; 1.0.6 writes garbage there).
const listedDormant = `{"nftables": [{"metainfo": {"version": "1.1.1", "release_name": "x", "json_schema_version": 1}}, {"table": {"family": "inet", "name": "t", "handle": 2, "comment": "hello", "flags": ["dormant"]}}, {"chain": {"family": "inet", "table": "t", "name": "c", "handle": 1, "type": "filter", "hook": "forward", "prio": 0, "policy": "accept"}}, {"rule": {"family": "inet", "table": "t", "chain": "c", "handle": 4, "comment": "r1", "expr": [{"counter": {"packets": 0, "bytes": 0}}]}}]}`

// A base chain's policy and the table's flags are in the fingerprint: a forward chain whose
// policy became drop, or a table made dormant, stops forwarding with every rule as it was,
// and was no drift.
func TestFingerprintSeesPolicyAndDormant(t *testing.T) {
	fp := func(s string) string {
		tab, err := Parse([]byte(s))
		if err != nil {
			t.Fatal(err)
		}
		return tab.Fingerprint()
	}
	base := fp(listedAccept)
	if fp(listedDrop) == base {
		t.Error("a base chain's policy changed from accept to drop: same fingerprint (drift not seen)")
	}
	if fp(listedDormant) == base {
		t.Error("the table was made dormant: same fingerprint (drift not seen)")
	}
}

// A number element is as nft wrote it (a float64 printed 3000000 as "3e+06").
func TestElementLargeNumber(t *testing.T) {
	tab, err := Parse([]byte(`{"nftables": [{"table": {"family": "inet", "name": "t"}}, {"set": {"family": "inet", "name": "m", "table": "t", "type": "mark", "handle": 3, "elem": [5, 3000000]}}]}`))
	if err != nil {
		t.Fatal(err)
	}
	if got := tab.Sets["m"].Elements; got[0] != "3000000" && got[1] != "3000000" {
		t.Errorf("elements %q, nft lists 5 and 3000000", got)
	}
}

// bothWays parses a listing with its table comment put in from the text listing (a), as NFT
// does, and without (b).
func bothWays(t *testing.T, js, text []byte) (a, b *Table) {
	t.Helper()
	withText, err := withTableComment(js, text)
	if err != nil {
		t.Fatal(err)
	}
	if a, err = Parse(withText); err != nil {
		t.Fatal(err)
	}
	if b, err = Parse(js); err != nil {
		t.Fatal(err)
	}
	return a, b
}

// The same table has one fingerprint whether its comment came from the text listing (the
// JSON written again) or not: the rules' expressions were spaced apart by the two ways.
func TestSameTableSameFingerprint(t *testing.T) {
	js := []byte(`{"nftables": [{"metainfo": {"version": "1.0.6", "release_name": "Lester Gooch #5", "json_schema_version": 1}}, {"table": {"family": "inet", "name": "t", "handle": 3}}, {"chain": {"family": "inet", "table": "t", "name": "c", "handle": 1, "type": "filter", "hook": "forward", "prio": 10, "policy": "accept"}}, {"rule": {"family": "inet", "table": "t", "chain": "c", "handle": 2, "comment": "r1", "expr": [{"match": {"op": "==", "left": {"payload": {"protocol": "ip", "field": "saddr"}}, "right": {"prefix": {"addr": "10.0.0.0", "len": 8}}}}, {"counter": {"packets": 0, "bytes": 0}}, {"accept": null}]}}]}`)
	text := []byte("table inet t {\n\tcomment \"hello\"\n\tchain c {\n\t\ttype filter hook forward priority filter + 10; policy accept;\n\t\tip saddr 10.0.0.0/8 counter packets 0 bytes 0 accept comment \"r1\"\n\t}\n}\n")
	a, b := bothWays(t, js, text)
	if a.Comment != "hello" || b.Comment != "" {
		t.Fatalf("comments %q and %q, want hello and none", a.Comment, b.Comment)
	}
	b.Comment = a.Comment
	if a.Fingerprint() != b.Fingerprint() {
		t.Errorf("same table, two fingerprints:\n%s\n%s", a.Chains["c"].Rules[0].Expr, b.Chains["c"].Rules[0].Expr)
	}
	// flags come before the comment in the text listing of a dormant table
	if got, _ := withTableComment(js, []byte("table inet t {\n\tflags dormant\n\tcomment \"hello\"\n}\n")); !bytes.Contains(got, []byte(`"comment":"hello"`)) {
		t.Errorf("comment after flags not found: %s", got)
	}
}

// TestSameTableSameFingerprint with an operator encoding/json escapes as HTML ("ct packets > 10",
// the packetThreshold rule; "&" of a bitwise match): the table written again keeps ">" (it was
// "\u003e", and the rule had two fingerprints).
func TestSameFingerprintWithHTMLCharacters(t *testing.T) {
	js := []byte(`{"nftables": [{"table": {"family": "inet", "name": "t", "handle": 3}}, {"chain": {"family": "inet", "table": "t", "name": "c", "handle": 1, "type": "filter", "hook": "forward", "prio": 10, "policy": "accept"}}, {"rule": {"family": "inet", "table": "t", "chain": "c", "handle": 2, "comment": "r1", "expr": [{"match": {"op": ">", "left": {"ct": {"key": "packets"}}, "right": 10}}, {"accept": null}]}}]}`)
	text := []byte("table inet t {\n\tcomment \"hello\"\n}\n")
	a, b := bothWays(t, js, text)
	b.Comment = a.Comment
	if a.Fingerprint() != b.Fingerprint() {
		t.Errorf("same table, two fingerprints:\n%s\n%s", a.Chains["c"].Rules[0].Expr, b.Chains["c"].Rules[0].Expr)
	}
}
