package model

import (
	"reflect"
	"strings"
	"testing"
)

func TestUnmarshalStrictErrors(t *testing.T) {
	type item struct {
		Every Duration `json:"every"`
		Nums  []int    `json:"nums"`
	}
	type doc struct {
		Items [][]item `json:"items"`
		Name  string   `json:"name"`
	}
	long := strings.Repeat("k", 1000)
	for _, tc := range []struct{ yaml, want string }{
		{"items: [[{every: 1s}], [{every: 1s}, {every: 2}]]", `items[1][1].every: 2 is not a duration; write one such as "30s" or "1m30s"`},
		{"items: [[{nums: [1, 2]}, {nums: [3, x]}]]", `items[0][1].nums[1]: want an integer, got a string`},
		{"items: [[{every: null}]]\nname: 5", ""}, // null keeps the zero value; a number is a fine string in YAML
		{"name: [x]", `name: want a string, got a list`},
		{"items: [[{every: 1s}, {every: [1s]}]]", `items[0][1].every: ["1s"] is not a duration; write one such as "30s" or "1m30s"`},
		{"items: [[{every: 1s}, {every: 99999999999999h}]]", `items[0][1].every: "99999999999999h" is not a duration such as "30s" or "1m30s" (at most 2562047h)`},
		{long + ": 1", `unknown field "` + strings.Repeat("k", MaxQuoted) + `"…(1000 bytes)`},
		{`"a\"b": 1`, `unknown field "a\"b"`},
	} {
		var d doc
		err := UnmarshalStrict([]byte(tc.yaml), &d)
		if got := errString(err); got != tc.want {
			t.Errorf("%.40s:\n got %s\nwant %s", tc.yaml, got, tc.want)
		}
	}
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// A long list of YAML errors is cut at a line: each kept line still says where it is, and
// the last says how many were left off.
func TestUnmarshalStrictCutsErrorListAtLines(t *testing.T) {
	var d struct {
		S string `json:"s"`
	}
	err := UnmarshalStrict([]byte("s:\nt: \nt: \nt: \nt: \ns: \nt: \nt: \n\ns:"), &d)
	if err == nil {
		t.Fatal("duplicate keys decoded")
	}
	lines := strings.Split(err.Error(), "\n")
	if len(err.Error()) > 4*MaxQuoted || lines[0] != "yaml: unmarshal errors:" {
		t.Fatalf("message not cut to a heading and whole lines: %q", err)
	}
	for _, l := range lines[1:] {
		if !strings.HasPrefix(l, "  line ") || strings.HasSuffix(l, "…") {
			t.Fatalf("line %q of %q is not a whole error line", l, err)
		}
	}
	if last := lines[len(lines)-1]; !strings.HasSuffix(last, " more)") {
		t.Fatalf("last line %q does not say how many were left off", last)
	}
}

// The fast way decodes over what v holds, as the library does: a caller's defaults stay where
// the input has no key (config.Parse starts from them). It took only zero values, and every
// config file went the library's way, ~10x slower at 10,000 backends.
func TestFastWayOverDefaults(t *testing.T) {
	type agent struct {
		Every Duration `json:"every"`
		Min   Duration `json:"min"`
	}
	type doc struct {
		Name  string `json:"name"`
		Agent agent  `json:"agent"`
	}
	in := "name: web\nagent: {min: 0s}\n"
	j, ok := fastJSON([]byte(in), reflect.TypeFor[*doc]())
	if !ok {
		t.Fatal("fastJSON refused the document")
	}
	v := doc{Agent: agent{Every: Duration{30e9}, Min: Duration{1e9}}}
	if !decodeFresh(j, &v) {
		t.Fatal("a target with defaults took the library's way")
	}
	if want := (doc{Name: "web", Agent: agent{Every: Duration{30e9}}}); v != want {
		t.Errorf("decoded %+v, want %+v", v, want)
	}
	// A failed decode leaves v as it was.
	was := v
	if decodeFresh([]byte(`{"name": "x", "agent": {"min": 5}}`), &v) || v != was {
		t.Errorf("a failed decode: %+v, want %+v unchanged", v, was)
	}
}
