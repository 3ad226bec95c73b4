package config

import (
	"context"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"github.com/fsnotify/fsnotify"
)

// watchSettle is how long Watch waits after an event in the file's directory before it looks:
// a file written in several chunks is looked at once, after the writes.
const watchSettle = 20 * time.Millisecond

// Watch calls changed when path may have changed (its modification time, size or inode is
// not the last look's), until ctx ends. It watches the file's directory with inotify, so a
// change is seen at once, also when an editor replaces the file or a ConfigMap volume swaps
// a symlink (a watch on the file itself would miss both), and it still looks every interval,
// for file systems without inotify (NFS) and for events the kernel dropped.
func Watch(ctx context.Context, path string, interval time.Duration, changed func()) {
	WatchFrom(ctx, path, interval, changed, nil)
}

// WatchFrom is Watch that calls started (when not nil) once it has taken its first look: a
// change after that is reported, so a caller that reads the file only after started misses
// none (one that reads it before may: the first look takes the changed file as its baseline).
func WatchFrom(ctx context.Context, path string, interval time.Duration, changed, started func()) {
	var last os.FileInfo
	looked := false
	look := func() {
		fi, err := os.Stat(path)
		if err != nil {
			looked = true
			return // a file that is gone is reported when it is back
		}
		if looked && (last == nil || fi.ModTime() != last.ModTime() || fi.Size() != last.Size() || inode(fi) != inode(last)) {
			changed()
		}
		last, looked = fi, true
	}
	var events <-chan fsnotify.Event
	var errs <-chan error
	if w, err := fsnotify.NewWatcher(); err == nil {
		defer w.Close()
		if w.Add(filepath.Dir(path)) == nil {
			events, errs = w.Events, w.Errors
		}
	}
	look()
	if started != nil {
		started()
	}
	t := time.NewTicker(interval)
	defer t.Stop()
	var settle <-chan time.Time
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			look()
		case _, ok := <-events:
			if !ok {
				events = nil
				continue
			}
			settle = time.After(watchSettle)
		case _, ok := <-errs: // e.g. the event queue overflowed: look
			if !ok {
				errs = nil
				continue
			}
			settle = time.After(watchSettle)
		case <-settle:
			settle = nil
			look()
		}
	}
}

func inode(fi os.FileInfo) uint64 {
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		return st.Ino
	}
	return 0
}
