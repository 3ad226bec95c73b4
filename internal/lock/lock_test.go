package lock

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// A second Acquire fails while the first holds the lock, naming the holder's PID and what
// to do; after Release it succeeds. The directory is created.
func TestAcquireExcludes(t *testing.T) {
	path := filepath.Join(t.TempDir(), "run", "hostaccel.lock")
	l, err := Acquire(path)
	if err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(path); strings.TrimSpace(string(b)) != fmt.Sprint(os.Getpid()) {
		t.Errorf("lock file holds %q, want our PID %d", b, os.Getpid())
	}
	_, err = Acquire(path)
	var held *HeldError
	if !errors.As(err, &held) || held.PID != os.Getpid() || held.Path != path {
		t.Fatalf("second Acquire: %v", err)
	}
	want := fmt.Sprintf("another hostaccel (pid %d) holds %s: stop it, or change the config through it", os.Getpid(), path)
	if !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), "SIGHUP") {
		t.Errorf("error %q lacks %q and SIGHUP", err, want)
	}
	if err := l.Release(); err != nil {
		t.Fatal(err)
	}
	l2, err := Acquire(path)
	if err != nil {
		t.Fatalf("Acquire after Release: %v", err)
	}
	l2.Release()
}

// A holder killed with SIGKILL leaves the file behind, with its PID, but not the lock; the
// lock is not inherited by the holder's children either (close-on-exec).
func TestSIGKILLReleases(t *testing.T) {
	if os.Getenv("LOCK_TEST_HOLD") != "" {
		if _, err := Acquire(os.Getenv("LOCK_TEST_HOLD")); err != nil {
			fmt.Println("error:", err)
			os.Exit(1)
		}
		// A child that outlives us must not keep the lock.
		child := exec.Command("sleep", "30")
		child.Start()
		fmt.Println("locked", child.Process.Pid)
		time.Sleep(time.Minute)
		return
	}
	path := filepath.Join(t.TempDir(), "hostaccel.lock")
	cmd := exec.Command(os.Args[0], "-test.run=^TestSIGKILLReleases$")
	cmd.Env = append(os.Environ(), "LOCK_TEST_HOLD="+path)
	out, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var child int
	line, _ := bufio.NewReader(out).ReadString('\n')
	if _, err := fmt.Sscanf(line, "locked %d", &child); err != nil {
		cmd.Process.Kill()
		t.Fatalf("holder: %q", line)
	}
	defer syscall.Kill(child, syscall.SIGKILL)
	_, err := Acquire(path)
	var held *HeldError
	if !errors.As(err, &held) || held.PID != cmd.Process.Pid {
		t.Fatalf("Acquire while another process holds the lock: %v (holder %d)", err, cmd.Process.Pid)
	}
	cmd.Process.Signal(syscall.SIGKILL)
	cmd.Wait()
	l, err := Acquire(path)
	if err != nil {
		t.Fatalf("Acquire after the holder was killed (its child %d still runs): %v", child, err)
	}
	l.Release()
}

// Held sees a lock another holder has, and none once it is released; it takes nothing.
func TestHeld(t *testing.T) {
	path := filepath.Join(t.TempDir(), "hostaccel.lock")
	if Held(path) {
		t.Fatal("a missing file is held")
	}
	l, err := Acquire(path)
	if err != nil {
		t.Fatal(err)
	}
	if !Held(path) {
		t.Error("the lock is held, Held says no")
	}
	if other := filepath.Join(filepath.Dir(path), "other.lock"); os.WriteFile(other, nil, 0o644) != nil || Held(other) {
		t.Error("another file is held")
	}
	l.Release()
	if Held(path) {
		t.Error("released, Held says yes")
	}
}
