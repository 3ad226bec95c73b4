// Package lock keeps hostaccel to one writer of the kernel's state per node: the agent and
// the one-shot commands that change the kernel (apply, cleanup) hold an exclusive flock on a
// lock file, with the holder's PID written in it. The kernel drops the lock when the holder
// exits, however it exits (SIGKILL included), so a file left behind never blocks anyone.
package lock

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// DefaultPath is the node's lock file.
const DefaultPath = "/run/hostaccel/hostaccel.lock"

// Lock is a held lock; Release (or the process's exit) lets it go.
type Lock struct {
	f *os.File
}

// HeldError says that another process holds the lock.
type HeldError struct {
	Path string
	PID  int // 0: not known (the holder has not written it yet, or wrote something else)
}

func (e *HeldError) Error() string {
	who := "another hostaccel"
	if e.PID > 0 {
		who = fmt.Sprintf("another hostaccel (pid %d)", e.PID)
	}
	return fmt.Sprintf("%s holds %s: stop it, or change the config through it "+
		"(edit the file it runs with, or send it SIGHUP; `hostaccel lb ...` changes load-balancer services through its API)", who, e.Path)
}

// Acquire takes the lock at path without waiting: a *HeldError when another process holds
// it. The file (and its directory) is created when missing and never removed: removing a
// lock file lets two processes lock two different files of the same name.
func Acquire(path string) (*Lock, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, fmt.Errorf("lock file: %w", err)
	}
	// Go opens files close-on-exec: the processes the agent runs (nft, health check
	// commands) never inherit the lock, so they cannot keep it after the agent is gone.
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, fmt.Errorf("lock file: %w", err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			return nil, &HeldError{Path: path, PID: holder(path)}
		}
		return nil, fmt.Errorf("lock %s: %w", path, err)
	}
	err = f.Truncate(0)
	if err == nil {
		_, err = f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	}
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("lock file %s: writing the PID: %w", path, err)
	}
	return &Lock{f: f}, nil
}

// Release lets the lock go.
func (l *Lock) Release() error {
	if l == nil || l.f == nil {
		return nil
	}
	err := l.f.Close()
	l.f = nil
	return err
}

// holder reads the PID the holder wrote; it waits a little for a holder that has just
// taken the lock and not written it yet.
func holder(path string) int {
	for range 10 {
		b, err := os.ReadFile(path)
		if err != nil {
			return 0
		}
		if pid, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil && pid > 0 {
			return pid
		}
		time.Sleep(20 * time.Millisecond)
	}
	return 0
}

// Held reports whether some process holds the lock at path, from /proc/locks (which lists
// every flock by device and inode, whatever the holder's PID namespace): a look that takes
// nothing, so that it never makes a starting holder fail.
func Held(path string) bool {
	var st unix.Stat_t
	if unix.Stat(path, &st) != nil {
		return false
	}
	b, err := os.ReadFile("/proc/locks")
	if err != nil {
		return false
	}
	// "1: FLOCK  ADVISORY  WRITE 1234 00:19:5678 0 EOF": device major:minor (hex), inode.
	id := fmt.Sprintf("%02x:%02x:%d", unix.Major(uint64(st.Dev)), unix.Minor(uint64(st.Dev)), st.Ino)
	for line := range strings.SplitSeq(string(b), "\n") {
		if f := strings.Fields(line); len(f) > 5 && f[1] == "FLOCK" && f[5] == id {
			return true
		}
	}
	return false
}
