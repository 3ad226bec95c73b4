package golden

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// Fuzz corpus files (testdata/fuzz/FuzzXxx/NAME) in Go's format: a "go test fuzz v1" line,
// then one Go literal per fuzz argument.
const fuzzHeader = "go test fuzz v1"

// MarshalFuzz encodes one corpus entry as `go test -fuzz` writes it. It takes the argument
// types the project's targets use: []byte, string, bool, int, uint, int64, uint64.
func MarshalFuzz(vals ...any) []byte {
	var b strings.Builder
	b.WriteString(fuzzHeader + "\n")
	for _, v := range vals {
		switch v := v.(type) {
		case []byte:
			fmt.Fprintf(&b, "[]byte(%q)\n", v)
		case string:
			fmt.Fprintf(&b, "string(%q)\n", v)
		case bool, int, uint, int64, uint64:
			fmt.Fprintf(&b, "%T(%v)\n", v, v)
		default:
			panic(fmt.Sprintf("golden.MarshalFuzz: unsupported type %T", v))
		}
	}
	return []byte(b.String())
}

// ReadFuzz decodes a corpus file written by MarshalFuzz or by `go test -fuzz`.
func ReadFuzz(path string) ([]any, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) == 0 || lines[0] != fuzzHeader {
		return nil, fmt.Errorf("%s: not a fuzz corpus file (no %q line)", path, fuzzHeader)
	}
	var vals []any
	for i, l := range lines[1:] {
		typ, arg, ok := strings.Cut(strings.TrimSpace(l), "(")
		arg, ok2 := strings.CutSuffix(arg, ")")
		if !ok || !ok2 {
			return nil, fmt.Errorf("%s:%d: %q is not TYPE(VALUE)", path, i+2, l)
		}
		var v any
		switch typ {
		case "[]byte", "string":
			var s string
			if s, err = strconv.Unquote(arg); err == nil {
				v = s
				if typ == "[]byte" {
					v = []byte(s)
				}
			}
		case "bool":
			v, err = strconv.ParseBool(arg)
		case "int", "int64":
			var n int64
			n, err = strconv.ParseInt(arg, 0, 64)
			v = n
			if typ == "int" {
				v = int(n)
			}
		case "uint", "uint64":
			var n uint64
			n, err = strconv.ParseUint(arg, 0, 64)
			v = n
			if typ == "uint" {
				v = uint(n)
			}
		default:
			err = fmt.Errorf("type %s not supported", typ)
		}
		if err != nil {
			return nil, fmt.Errorf("%s:%d: %v", path, i+2, err)
		}
		vals = append(vals, v)
	}
	return vals, nil
}

// FuzzSeeds checks that dir (testdata/fuzz/FuzzXxx) holds exactly the seed entries given,
// as files named seed-NAME; other files there (crashers kept as regression inputs) are left
// alone. With -update it writes them and removes stale seed files.
func FuzzSeeds(t testing.TB, dir string, seeds map[string][]any) {
	t.Helper()
	stale, _ := filepath.Glob(filepath.Join(dir, "seed-*"))
	if *update {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for name, vals := range seeds {
		path := filepath.Join(dir, "seed-"+name)
		stale = slices.DeleteFunc(stale, func(s string) bool { return s == path })
		want := MarshalFuzz(vals...)
		if *update {
			if err := os.WriteFile(path, want, 0o644); err != nil {
				t.Fatal(err)
			}
			continue
		}
		if got, err := os.ReadFile(path); err != nil || string(got) != string(want) {
			t.Errorf("%s is missing or stale (go test -update rewrites the seed corpus)", path)
		}
	}
	for _, s := range stale {
		if *update {
			os.Remove(s)
		} else {
			t.Errorf("%s is not a seed any more (go test -update removes it)", s)
		}
	}
}
