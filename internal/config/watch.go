package config

import (
	"context"
	"os"
	"time"
)

// Watch polls path every interval and calls changed when its modification time or size
// changes, until ctx ends. Polling survives editors that replace the file and ConfigMap
// volumes that swap a symlink, which inotify on the file would miss.
func Watch(ctx context.Context, path string, interval time.Duration, changed func()) {
	var lastMod time.Time
	lastSize := int64(-1)
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		fi, err := os.Stat(path)
		if err != nil {
			continue
		}
		if lastSize >= 0 && (fi.ModTime() != lastMod || fi.Size() != lastSize) {
			changed()
		}
		lastMod, lastSize = fi.ModTime(), fi.Size()
	}
}
