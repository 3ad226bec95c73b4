// Package golden compares test output with files under testdata/ and prints
// what differs as a unified diff. `go test -update` rewrites the files.
package golden

import (
	"flag"
	"os"
	"testing"

	"github.com/pmezard/go-difflib/difflib"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata/")

// Check fails t unless got equals the content of the file at path, printing a
// unified diff (the file's content is "want"). With -update it writes got to
// path instead.
func Check(t testing.TB, path, got string) {
	t.Helper()
	if *update {
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test -update to create it)", err)
	}
	if diff := Diff(string(want), got); diff != "" {
		t.Errorf("%s differs from the golden file (go test -update rewrites it):\n%s", path, diff)
	}
}

// Diff returns a unified diff from want to got with three lines of context,
// or "" if they are equal.
func Diff(want, got string) string {
	if want == got {
		return ""
	}
	diff, err := difflib.GetUnifiedDiffString(difflib.UnifiedDiff{
		A: difflib.SplitLines(want), B: difflib.SplitLines(got),
		FromFile: "want", ToFile: "got", Context: 3,
	})
	if err != nil || diff == "" {
		// Only a difference difflib does not show (such as a missing final
		// newline) gets here: show both.
		return "--- want\n" + want + "\n+++ got\n" + got
	}
	return diff
}
