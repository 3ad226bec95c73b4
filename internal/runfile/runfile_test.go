package runfile

import (
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"
)

// Prune leaves the keep newest files of the pattern, the one just written among them even
// when it is the oldest, and every other file.
func TestPrune(t *testing.T) {
	dir := t.TempDir()
	now := time.Now()
	write := func(name string, age time.Duration) {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, nil, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Chtimes(p, now.Add(-age), now.Add(-age)); err != nil {
			t.Fatal(err)
		}
	}
	for i, name := range []string{"c-1.json", "c-2.json", "c-3.json", "c-4.json", "c-5.json"} {
		write(name, time.Duration(i)*time.Minute) // c-1 newest
	}
	write("c-9.json", time.Hour)           // just written, but dated the oldest
	write("c-7.json.123.tmp", 2*time.Hour) // not of the pattern
	write("other.gob", 2*time.Hour)
	if err := os.Mkdir(filepath.Join(dir, "c-8.json"), 0o755); err != nil { // not a regular file
		t.Fatal(err)
	}
	Prune(filepath.Join(dir, "c-9.json"), "c-*.json", 3)
	var got []string
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		got = append(got, e.Name())
	}
	want := []string{"c-1.json", "c-2.json", "c-7.json.123.tmp", "c-8.json", "c-9.json", "other.gob"}
	if !slices.Equal(got, want) {
		t.Errorf("left %v, want %v", got, want)
	}
}
