package model

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

// sameAsLibrary fails t unless fastJSON's answer for in (when it has one) holds the values
// the YAML library's JSON holds. It reports whether fastJSON answered.
func sameAsLibrary(t *testing.T, in string) bool {
	t.Helper()
	fast, ok := fastJSON([]byte(in), nil)
	if !ok {
		return false
	}
	lib, err := yaml.YAMLToJSONStrict([]byte(in))
	if err != nil {
		t.Fatalf("fastJSON took what the YAML library refuses (%v):\n%s\nfast: %s", err, in, fast)
	}
	if f, l := jsonValue(t, fast), jsonValue(t, lib); !reflect.DeepEqual(f, l) {
		t.Fatalf("fastJSON and the YAML library differ for\n%s\nfast: %s\nlib:  %s", in, fast, lib)
	}
	return true
}

func jsonValue(t *testing.T, b []byte) any {
	t.Helper()
	d := json.NewDecoder(bytes.NewReader(b))
	d.UseNumber()
	var v any
	if err := d.Decode(&v); err != nil {
		t.Fatalf("not JSON: %v\n%s", err, b)
	}
	return v
}

// The shapes of the project's configs take the fast way, with the library's values; what it
// is unsure of goes to the library.
func TestFastJSON(t *testing.T) {
	fast := []string{
		"datapath: tc\ntc: {natCheck: off}\nnode:\n  gateways: [gw]\n  transports: [eth0]\n  localPodCIDRs: [10.255.255.0/24]\n  peerPodCIDRs:\n  - 10.0.0.0/24\n  - fd00::/64\n",
		"loadBalancer:\n  services:\n  - name: s0\n    vips: [198.18.0.1]\n    port: 80\n    backends:\n    - {address: 10.0.0.1, port: 8080, state: drain}\n    - {address: 'fd00::1', port: 8080}\n  - name: s1 # comment\n    backends: []\n",
		"a:\n  - x\n  -   b: 1\n      c: [1, -2, 0, yes, No, ~, null, '', \"q'q\", 'it''s']\n  -\n  - # nothing\n",
		"a: 10.0.0.1:80\nb: http://x/y#z\nc: x # y\nd: +x\ne: .x\nf: 1.2.3\ng: 12-3\nh: a, b\ni: {}\nj: [[a], {k: v}]\n",
		"# head\n\nkey:    value   \n'quoted key': \"a b\"\n",
		"x: 123456789012345678\nw: -1\nz: 0x\n",
	}
	for _, in := range fast {
		if !sameAsLibrary(t, in) {
			t.Errorf("not taken the fast way:\n%s", in)
		}
	}
	unsure := []string{
		"a: 1.5", "a: 0755", "a: 0x1f", "a: 1_000", "a: 2001-12-14", "a: 1e3", "a: .5", "a: .inf", "a: +1", "a: -0",
		"a: 1234567890123456789", "a: 0b101", "a: &x 1", "a: *x", "a: !!str 1", "a: |\n  x", "a: >\n  x",
		"a: \"\\n\"", "a: b\n  c", "a: 1\na: 2", "a: 1\nA: 2", "<<: {}", "a:\tb", "a: b: c", "a: [x", "a: {b}",
		"a: [x,]", "a: {b: }", "a: [a: b]", "y: 1", "---\na: 1", "a: 1\n...", "? a\n: b", "a: - b", "a:\n- - b",
		"a: 'x'y", "a: [x]y", "1: x", "yes: x", "a: \"é\"", "a: b\r\n", "a: [x, [y, {z: [#]}]]", "",
		"a:\n  b: 1\n c: 2", "a:\n- 1\n  - 2", "\"" + strings.Repeat("k", 300) + "\": 1",
	}
	for _, in := range unsure {
		if sameAsLibrary(t, in) {
			t.Errorf("taken the fast way, but is not a shape it knows for sure:\n%q", in)
		}
	}
	// What sigs.k8s.io/yaml writes (the load balancer's state file, `hostaccel lb get`) is too.
	written, err := yaml.Marshal(map[string]any{"services": []map[string]any{{
		"name": "web", "vips": []string{"10.0.0.1", "fd00::1"}, "port": 80, "every": Duration{5e9}, "empty": nil,
		"backends": []map[string]any{{"address": "10.1.0.1", "port": 8080, "state": "drain"}, {"address": "fd00::2"}},
		"labels":   map[string]string{"a": "b", "yes": "80"},
		"weird":    []string{"", "yes", "80", "a: b", "#x", "x y", "- z", "1.5", "'q'"},
	}}})
	if err != nil {
		t.Fatal(err)
	}
	if !sameAsLibrary(t, string(written)) {
		t.Errorf("what the YAML library writes is not taken the fast way:\n%s", written)
	}
	// Every example config is of the fast shape.
	paths, _ := filepath.Glob("../../examples/*.yaml")
	if len(paths) == 0 {
		t.Fatal("no example configs")
	}
	for _, p := range paths {
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		if !sameAsLibrary(t, string(b)) {
			t.Errorf("%s: not taken the fast way", p)
		}
	}
}

// UnmarshalStrict gives what the library gives, by either way: where the fast JSON does not
// fit the Go types (a number for a string), the library's conversion still applies.
func TestUnmarshalStrictFastSameResult(t *testing.T) {
	type svc struct {
		Name  string            `json:"name"`
		Port  int               `json:"port"`
		On    bool              `json:"enabled"`
		Every Duration          `json:"every"`
		Tags  map[string]string `json:"tags"`
		Any   any               `json:"any"`
	}
	type doc struct {
		Services []svc `json:"services"`
	}
	for _, in := range []string{
		"services:\n- {name: a, port: 80, enabled: yes, every: 1s, tags: {x: y}, any: [1, b]}\n",
		"services:\n- name: 80\n  tags: {x: 1}\n", // numbers into strings: the library's way
		"services:\n- name: true\n",
		"services:\n- any: {b: [~]}\n",
	} {
		var got, want doc
		err := UnmarshalStrict([]byte(in), &got)
		if werr := yaml.UnmarshalStrict([]byte(in), &want); (err == nil) != (werr == nil) || !reflect.DeepEqual(got, want) {
			t.Errorf("%s\n got %+v (%v)\nwant %+v (%v)", in, got, err, want, werr)
		}
	}
}

func FuzzFastJSON(f *testing.F) {
	paths, _ := filepath.Glob("../../examples/*.yaml")
	for _, p := range paths {
		if b, err := os.ReadFile(p); err == nil {
			f.Add(string(b))
		}
	}
	for _, s := range []string{
		"a: [1, yes, ~, 'x']\nb:\n- c: d\n  e: {f: g}\n", "a: 10.0.0.1\nb: fd00::1\nc: x # y",
		"a: 80\nb: 1\nc: on\nd:\n- {a: off, e: {x: 1, Y: yes}, j: off}\n  i: [1, true, x]\ng: 1s\nh: 5\nk: {a: 1}\nL: {A: 2}\n",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, in string) {
		sameAsLibrary(t, in)
		sameTyped(t, in)
	})
}

// fuzzDoc has a field of each kind the library treats apart (strings take numbers and bools;
// a type that decodes itself does not), under names the fuzzer's keys can hit.
type fuzzDoc struct {
	A string            `json:"a"`
	B int               `json:"b"`
	C bool              `json:"c"`
	D []fuzzDoc         `json:"d"`
	E map[string]string `json:"e"`
	F any               `json:"f"`
	G Duration          `json:"g"`
	H *string           `json:"h"`
	I []string          `json:"i"`
	J NATCheck          `json:"j"`
	K map[string]int    `json:"k"`
	L *fuzzDoc          `json:"l"`
}

// sameTyped fails t unless UnmarshalStrict decodes in as the library does: the same value,
// or both an error.
func sameTyped(t *testing.T, in string) {
	t.Helper()
	var got, want fuzzDoc
	err := UnmarshalStrict([]byte(in), &got)
	werr := yaml.UnmarshalStrict([]byte(in), &want)
	if (err == nil) != (werr == nil) || err == nil && !reflect.DeepEqual(got, want) {
		t.Fatalf("UnmarshalStrict and the library differ for\n%s\n got %+v (%v)\nwant %+v (%v)", in, got, err, want, werr)
	}
}

// A config of 2,000 services of 5 backends (10,000 lines), as the control-plane bench writes.
func BenchmarkUnmarshalStrict(b *testing.B) {
	var s strings.Builder
	s.WriteString("datapath: none\nloadBalancer:\n  services:\n")
	for i := range 2000 {
		fmt.Fprintf(&s, "  - name: s%d\n    vips: [198.18.%d.%d]\n    port: 80\n    backends:\n", i, i>>8, i&255)
		for k := range 5 {
			fmt.Fprintf(&s, "    - {address: 10.%d.%d.%d, port: 8080}\n", i>>8, i&255, k)
		}
	}
	in := []byte(s.String())
	var v any
	for _, way := range []struct {
		name string
		f    func() error
	}{
		{"fast", func() error { v = nil; return UnmarshalStrict(in, &v) }},
		{"library", func() error { v = nil; return yaml.UnmarshalStrict(in, &v) }},
	} {
		b.Run(way.name, func(b *testing.B) {
			for b.Loop() {
				if err := way.f(); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
