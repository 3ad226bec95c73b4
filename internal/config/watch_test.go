package config

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// TestWatchSeesChangesAtOnce: with a poll an hour apart, only the directory's inotify watch
// can see a change: a write in place, a file renamed over the config (editors, config
// management), and a ConfigMap volume's symlink swap.
func TestWatchSeesChangesAtOnce(t *testing.T) {
	dir := t.TempDir()
	write := func(name, s string) {
		t.Helper()
		if err := os.WriteFile(filepath.Join(dir, name), []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	// A ConfigMap volume: config.yaml -> ..data/config.yaml, ..data -> ..v1 (swapped atomically).
	if err := os.Mkdir(filepath.Join(dir, "..v1"), 0o755); err != nil {
		t.Fatal(err)
	}
	write("..v1/config.yaml", "datapath: none\n")
	for _, l := range [][2]string{{"..v1", "..data"}, {"..data/config.yaml", "config.yaml"}} {
		if err := os.Symlink(l[0], filepath.Join(dir, l[1])); err != nil {
			t.Fatal(err)
		}
	}
	write("plain.yaml", "datapath: none\n")

	watch := func(name string) <-chan struct{} {
		ctx, cancel := context.WithCancel(context.Background())
		t.Cleanup(cancel)
		ch := make(chan struct{}, 16)
		go Watch(ctx, filepath.Join(dir, name), time.Hour, func() { ch <- struct{}{} })
		time.Sleep(100 * time.Millisecond) // the watch is set up
		return ch
	}
	seen := func(ch <-chan struct{}, what string) {
		t.Helper()
		select {
		case <-ch:
		case <-time.After(5 * time.Second):
			t.Fatalf("%s: not seen (the poll is an hour apart)", what)
		}
	}

	plain := watch("plain.yaml")
	write("plain.yaml", "datapath: none\nagent: {resyncPeriod: 10s}\n")
	seen(plain, "a write in place")
	write("new.yaml", "datapath: none\n")
	if err := os.Rename(filepath.Join(dir, "new.yaml"), filepath.Join(dir, "plain.yaml")); err != nil {
		t.Fatal(err)
	}
	seen(plain, "a file renamed over it")

	cm := watch("config.yaml")
	if err := os.Mkdir(filepath.Join(dir, "..v2"), 0o755); err != nil {
		t.Fatal(err)
	}
	write("..v2/config.yaml", "datapath: none\nagent: {resyncPeriod: 20s}\n")
	if err := os.Symlink("..v2", filepath.Join(dir, "..data_tmp")); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(filepath.Join(dir, "..data_tmp"), filepath.Join(dir, "..data")); err != nil {
		t.Fatal(err)
	}
	seen(cm, "a ConfigMap's symlink swap")

	select {
	case <-plain:
		t.Fatal("a change seen twice, or a change to another file seen")
	case <-time.After(200 * time.Millisecond):
	}
}

// TestWatchFromReportsAfterStarted: a change made right after started is reported, also of a
// file that did not exist at the first look (it is created later).
func TestWatchFromReportsAfterStarted(t *testing.T) {
	for _, exists := range []bool{true, false} {
		path := filepath.Join(t.TempDir(), "config.yaml")
		if exists {
			if err := os.WriteFile(path, []byte("datapath: none\n"), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		ctx, cancel := context.WithCancel(context.Background())
		changed, started := make(chan struct{}, 16), make(chan struct{})
		go WatchFrom(ctx, path, time.Hour, func() { changed <- struct{}{} }, func() { close(started) })
		<-started
		if err := os.WriteFile(path, []byte("datapath: none\nagent: {resyncPeriod: 10s}\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		select {
		case <-changed:
		case <-time.After(5 * time.Second):
			t.Errorf("existed at the first look %v: a change after started not seen", exists)
		}
		cancel()
	}
}
