package golden

import (
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
