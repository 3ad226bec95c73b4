// Package runfile keeps the directory of the files hostaccel caches per network namespace
// (/run/hostaccel): the load balancer's and the flowtable's knowledge of their tables, one file
// per namespace, named after its inode.
package runfile

import (
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"time"
)

// Keep is how many cache files of a kind Prune leaves. A namespace that is gone never removes
// its own file, so without a bound a host that runs applies in short-lived namespaces (tests,
// CI, containers) piles them up (a load balancer's is up to megabytes at 10,000 backends). 16
// is more namespaces than a host runs hostaccel in by far (the host's, a few containers'). An
// evicted file of a live one costs its next apply a full read of the tables (the load
// balancer), or a restarted agent the check of rules edited in place (the flowtable, whose
// agent touches its file so that it stays among the newest).
const Keep = 16

// Prune removes the regular files beside path (just written: kept) whose names match
// pattern (filepath.Match), beyond the keep most recently modified. They are caches: a file
// removed costs its namespace's next process a full read, so errors are only logged.
func Prune(path, pattern string, keep int) {
	dir, self := filepath.Split(path)
	entries, err := os.ReadDir(dir)
	if err != nil {
		slog.Debug("cannot list the cache files", "dir", dir, "err", err)
		return
	}
	type file struct {
		name string
		mod  time.Time
	}
	var files []file
	for _, e := range entries {
		if ok, _ := filepath.Match(pattern, e.Name()); !ok || e.Name() == self || !e.Type().IsRegular() {
			continue
		}
		if fi, err := e.Info(); err == nil {
			files = append(files, file{e.Name(), fi.ModTime()})
		}
	}
	if len(files) < keep {
		return
	}
	// The newest keep-1 stay, and path.
	slices.SortFunc(files, func(a, b file) int { return b.mod.Compare(a.mod) })
	for _, f := range files[max(keep-1, 0):] {
		if err := os.Remove(filepath.Join(dir, f.name)); err != nil && !errors.Is(err, os.ErrNotExist) {
			slog.Debug("cannot remove an old cache file", "file", f.name, "err", err)
		}
	}
}
