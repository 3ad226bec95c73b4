package golden

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestDiff(t *testing.T) {
	if d := Diff("a\nb\n", "a\nb\n"); d != "" {
		t.Errorf("equal texts: diff %q", d)
	}
	d := Diff("one\ntwo\nthree\n", "one\n2\nthree\n")
	for _, want := range []string{"--- want\n", "+++ got\n", "@@ ", "\n-two\n", "\n+2\n", "\n one\n", "\n three\n"} {
		if !strings.Contains(d, want) {
			t.Errorf("diff lacks %q:\n%s", want, d)
		}
	}
	if d := Diff("x\n", "x"); d == "" {
		t.Error("a missing final newline makes no diff")
	}
}

// fakeT records failures instead of failing the test.
type fakeT struct {
	testing.TB
	errors []string
}

func (f *fakeT) Helper()                           {}
func (f *fakeT) Errorf(format string, args ...any) { f.errors = append(f.errors, format) }

func TestCheck(t *testing.T) {
	path := filepath.Join(t.TempDir(), "x.nft")
	if err := os.WriteFile(path, []byte("same\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	ft := &fakeT{TB: t}
	Check(ft, path, "same\n")
	if len(ft.errors) > 0 {
		t.Errorf("equal content reported: %v", ft.errors)
	}
	Check(ft, path, "other\n")
	if len(ft.errors) != 1 {
		t.Errorf("different content: %d failures, want 1", len(ft.errors))
	}

	*update = true
	defer func() { *update = false }()
	Check(ft, path, "new\n")
	if b, _ := os.ReadFile(path); string(b) != "new\n" || len(ft.errors) != 1 {
		t.Errorf("-update: file %q, %d failures", b, len(ft.errors))
	}
}

// Corpus files read back what was written, in Go's format (a file `go test -fuzz` wrote, too).
func TestFuzzFiles(t *testing.T) {
	dir := t.TempDir()
	vals := []any{[]byte("a\n\"b\"\x00"), "ünï", true, 3, uint(7), int64(-2), uint64(1 << 63)}
	path := filepath.Join(dir, "x")
	if err := os.WriteFile(path, MarshalFuzz(vals...), 0o644); err != nil {
		t.Fatal(err)
	}
	got, err := ReadFuzz(path)
	if err != nil || fmt.Sprintf("%#v", got) != fmt.Sprintf("%#v", vals) {
		t.Errorf("ReadFuzz: %v\n got %#v\nwant %#v", err, got, vals)
	}
	os.WriteFile(path, []byte("go test fuzz v1\n[]byte(\"\\x01\")\nuint(300)\n"), 0o644)
	if got, err := ReadFuzz(path); err != nil || len(got) != 2 || got[1] != uint(300) {
		t.Errorf("go's file: %v %#v", err, got)
	}
	os.WriteFile(path, []byte("[]byte(\"x\")\n"), 0o644)
	if _, err := ReadFuzz(path); err == nil {
		t.Error("a file without the header was read")
	}

	ft := &fakeT{TB: t}
	os.WriteFile(filepath.Join(dir, "seed-old"), nil, 0o644)
	os.WriteFile(filepath.Join(dir, "0123abcd"), nil, 0o644) // a crasher: left alone
	FuzzSeeds(ft, dir, map[string][]any{"x": {[]byte("x")}})
	if len(ft.errors) != 2 {
		t.Errorf("FuzzSeeds: missing seed-x and stale seed-old not both reported: %q", ft.errors)
	}
}
