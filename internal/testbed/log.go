package testbed

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"
)

// SyncBuffer collects a process's output (an agent's log) for tests that read it while the
// process still writes.
type SyncBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (s *SyncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *SyncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// Tail returns the last n lines.
func (s *SyncBuffer) Tail(n int) string {
	lines := strings.Split(s.String(), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

// HTTPGet fetches http://addr/path from inside the namespace (dialing in the thread Do moved
// into it: http.Client would dial from another thread, outside) and returns the status code
// and body. The exchange is given 30 seconds (a guard against a hang: /metrics reads the
// kernel, slowly under TCG).
func (n *NS) HTTPGet(addr, path string) (code int, body string, err error) {
	err = n.Do(func() error {
		c, err := net.DialTimeout("tcp", addr, 2*time.Second)
		if err != nil {
			return err
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(30 * time.Second))
		req, _ := http.NewRequest("GET", "http://"+addr+path, nil)
		if err := req.Write(c); err != nil {
			return err
		}
		resp, err := http.ReadResponse(bufio.NewReader(c), req)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		code, body = resp.StatusCode, string(b)
		return err
	})
	return code, body, err
}

// WaitFor checks cond every interval until it holds and returns how long that took; it fails
// tb if cond does not hold within timeout.
func WaitFor(tb testing.TB, what string, timeout, interval time.Duration, cond func() bool) time.Duration {
	tb.Helper()
	start := time.Now()
	for !cond() {
		if time.Since(start) > timeout {
			tb.Fatalf("timed out after %s waiting for %s", timeout, what)
		}
		time.Sleep(interval)
	}
	return time.Since(start)
}
