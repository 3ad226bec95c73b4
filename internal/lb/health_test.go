package lb

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

func addrPort(t *testing.T, a net.Addr) (netip.Addr, int) {
	t.Helper()
	ap := netip.MustParseAddrPort(a.String())
	return ap.Addr(), int(ap.Port())
}

func TestCheckTypes(t *testing.T) {
	web := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/bad" {
			w.WriteHeader(503)
		}
		w.Write([]byte("healthy " + r.Host))
	}))
	defer web.Close()
	webTLS := httptest.NewTLSServer(web.Config.Handler)
	defer webTLS.Close()
	udp, _ := net.ListenPacket("udp", "127.0.0.1:0")
	defer udp.Close()
	go func() {
		buf := make([]byte, 512)
		for {
			n, from, err := udp.ReadFrom(buf)
			if err != nil {
				return
			}
			if strings.HasPrefix(string(buf[:n]), "ping") {
				udp.WriteTo([]byte("pong"), from)
			} else if n >= 12 { // a DNS query: answer NXDOMAIN with its id
				r := append([]byte{}, buf[:n]...)
				r[2], r[3] = 0x81, 0x83
				udp.WriteTo(r, from)
			}
		}
	}()
	a, webPort := addrPort(t, web.Listener.Addr())
	_, tlsPort := addrPort(t, webTLS.Listener.Addr())
	_, udpPort := addrPort(t, udp.LocalAddr())
	closed, _ := net.Listen("tcp", "127.0.0.1:0")
	_, closedPort := addrPort(t, closed.Addr())
	closed.Close()
	for _, c := range []struct {
		hc   HealthCheck
		port int
		want string // "" healthy, else part of the error
	}{
		{HealthCheck{Type: "tcp"}, webPort, ""},
		{HealthCheck{Type: "tcp"}, closedPort, "connection refused"},
		{HealthCheck{Type: "http", Path: "/", Host: "svc.example", Expect: "healthy svc.example"}, webPort, ""},
		{HealthCheck{Type: "http", Path: "/bad"}, webPort, "HTTP status 503, want 200"},
		{HealthCheck{Type: "http", Path: "/bad", ExpectStatus: 503}, webPort, ""},
		{HealthCheck{Type: "http", Expect: "sick"}, webPort, `body does not contain "sick"`},
		{HealthCheck{Type: "https"}, tlsPort, ""},
		{HealthCheck{Type: "udp", Send: "ping", Expect: "pong"}, udpPort, ""},
		{HealthCheck{Type: "udp", Send: "ping", Expect: "pang"}, udpPort, `reply does not contain "pang"`},
		{HealthCheck{Type: "dns", Query: "example.org"}, udpPort, ""},
		{HealthCheck{Type: "udp", Send: "ping"}, closedPort, "refused"},
		{HealthCheck{Type: "command", Command: []string{"/bin/sh", "-c", `test "$HOSTACCEL_BACKEND_PORT" = ` + strconv.Itoa(webPort)}}, webPort, ""},
		{HealthCheck{Type: "command", Command: []string{"/bin/sh", "-c", "echo nope; exit 3"}}, webPort, "exit status 3: nope"},
	} {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		err := check(ctx, target{Check: c.hc, Addr: a, Port: c.port})
		cancel()
		if (err == nil) != (c.want == "") || err != nil && !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s check %+v: %v, want %q", c.hc.Type, c.hc, err, c.want)
		}
	}
}

// A command check ends at its timeout even while the command's children hold its output
// open (a script that runs sleep or curl): the whole process group is killed.
func TestCommandCheckTimeoutKillsChildren(t *testing.T) {
	tg := target{Check: HealthCheck{Type: "command", Command: []string{"/bin/sh", "-c", "sleep 30; true"}},
		Service: "web", Addr: netip.MustParseAddr("10.1.0.11"), Port: 8080}
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	start := time.Now()
	err := check(ctx, tg)
	if took := time.Since(start); err == nil || took > 5*time.Second {
		t.Errorf("a check of 300 ms with a child still running: %v after %s", err, took.Round(time.Millisecond))
	}
}

// A backend goes down after fall failures in a row and up after rise successes; from
// unknown the first result decides. Transitions and the last check are recorded.
func TestCheckerRiseFall(t *testing.T) {
	var healthy atomic.Bool
	healthy.Store(true)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		if !healthy.Load() {
			w.WriteHeader(500)
		}
	}))
	defer srv.Close()
	a, port := addrPort(t, srv.Listener.Addr())
	changes := make(chan struct{}, 10)
	c := NewChecker(func() { changes <- struct{}{} }, nil)
	defer c.Stop()
	svc := Service{Name: "web", VIPs: []string{"192.0.2.1"}, Port: port, Backends: []Backend{{Address: a.String()}},
		HealthCheck: &HealthCheck{Type: "http", Interval: Duration{Duration: 50 * time.Millisecond}, Rise: 3, Fall: 2}}
	c.Update([]Service{svc})
	key := HealthKey("web", a.String())
	wait := func(want HealthState, atLeast, within time.Duration) Health {
		t.Helper()
		start := time.Now()
		select {
		case <-changes:
		case <-time.After(within):
			t.Fatalf("no change to %s within %s: %+v", want, within, c.Health()[key])
		}
		h := c.Health()[key]
		if h.State != want || time.Since(start) < atLeast {
			t.Fatalf("state %s after %s, want %s after at least %s", h.State, time.Since(start), want, atLeast)
		}
		return h
	}
	wait(HealthUp, 0, time.Second) // unknown -> up at the first success
	healthy.Store(false)
	wait(HealthDown, 50*time.Millisecond, time.Second) // two failures: at least one interval
	healthy.Store(true)
	h := wait(HealthUp, 100*time.Millisecond, time.Second) // three successes: at least two intervals
	if h.Transitions != 2 || h.LastCheck.IsZero() || h.Failures < 2 {
		t.Errorf("health: %+v", h)
	}
	// Removing the backend stops its probe and forgets its health.
	c.Update(nil)
	if _, ok := c.Health()[key]; ok {
		t.Error("health kept for a removed backend")
	}
}

// A timeout above the interval: a slow backend is checked back to back (the next check
// starts when the previous one times out), never twice at once, and goes down after fall
// timeouts.
func TestCheckerTimeoutAboveInterval(t *testing.T) {
	var slow atomic.Bool
	srv := httptest.NewServer(http.HandlerFunc(func(_ http.ResponseWriter, r *http.Request) {
		if slow.Load() {
			select {
			case <-r.Context().Done():
			case <-time.After(5 * time.Second):
			}
		}
	}))
	defer srv.Close()
	a, port := addrPort(t, srv.Listener.Addr())
	const interval, timeout = 200 * time.Millisecond, 400 * time.Millisecond
	svc := Service{Name: "web", VIPs: []string{"192.0.2.1"}, Port: port, Backends: []Backend{{Address: a.String()}},
		HealthCheck: &HealthCheck{Type: "http", Interval: Duration{Duration: interval}, Timeout: Duration{Duration: timeout}, Fall: 3}}
	if errs := ValidateServices([]Service{svc}, fieldByName([]Service{svc})); len(errs) > 0 {
		t.Fatal(errs)
	}

	changes := make(chan struct{}, 10)
	c := NewChecker(func() { changes <- struct{}{} }, nil)
	var mu sync.Mutex
	var running, most int
	var slowStarts []time.Time
	c.check = func(ctx context.Context, tg target) error {
		mu.Lock()
		running++
		most = max(most, running)
		if slow.Load() {
			slowStarts = append(slowStarts, time.Now())
		}
		mu.Unlock()
		defer func() { mu.Lock(); running--; mu.Unlock() }()
		return check(ctx, tg)
	}
	c.Update([]Service{svc})
	key := HealthKey("web", a.String())
	wait := func(want HealthState) {
		t.Helper()
		select {
		case <-changes:
		case <-time.After(5 * time.Second):
			t.Fatalf("no change to %s: %+v", want, c.Health()[key])
		}
		if h := c.Health()[key]; h.State != want {
			t.Fatalf("state %s, want %s", h.State, want)
		}
	}
	wait(HealthUp)
	slow.Store(true)
	start := time.Now()
	wait(HealthDown)
	took := time.Since(start)
	c.Stop()

	mu.Lock()
	defer mu.Unlock()
	if most != 1 {
		t.Errorf("%d checks of one backend ran at once", most)
	}
	if h := c.Health()[key]; h.Failures != 3 || !strings.Contains(h.LastError, "deadline exceeded") {
		t.Errorf("down after %+v, want 3 timeouts", h)
	}
	if took < 3*timeout || took > 3*timeout+2*interval+time.Second {
		t.Errorf("down after %s, want about 3 timeouts (%s)", took, 3*timeout)
	}
	for i := 1; i < len(slowStarts); i++ {
		if gap := slowStarts[i].Sub(slowStarts[i-1]); gap < timeout || gap > timeout+interval/2 {
			t.Errorf("check %d started %s after the previous one, want just after its timeout (%s), not an interval later", i, gap, timeout)
		}
	}
}

// Probes started together spread their first checks over the interval (no burst every
// interval), and a TCP check closes with RST: no FIN exchange, no TIME_WAIT left per check.
func TestCheckerSpreadsFirstChecksAndClosesTCPWithRST(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	a, port := addrPort(t, ln.Addr())
	const interval, n = 400 * time.Millisecond, 200
	svc := Service{Name: "many", VIPs: []string{"192.0.2.1"}, Port: port,
		HealthCheck: &HealthCheck{Type: "tcp", Interval: Duration{Duration: interval}}}
	for i := range n {
		svc.Backends = append(svc.Backends, Backend{Address: a.String(), Port: 10000 + i})
	}
	c := NewChecker(nil, nil)
	var mu sync.Mutex
	first := map[int]time.Duration{}
	start := time.Now()
	c.check = func(ctx context.Context, tg target) error {
		mu.Lock()
		defer mu.Unlock()
		if _, ok := first[tg.Port]; !ok {
			first[tg.Port] = time.Since(start)
		}
		return nil
	}
	c.Update([]Service{svc})
	time.Sleep(interval + 200*time.Millisecond)
	c.Stop()
	mu.Lock()
	early := 0
	for _, d := range first {
		if d < interval/10 {
			early++
		}
	}
	mu.Unlock()
	if len(first) != n || early > n/4 {
		t.Errorf("%d of %d backends checked, %d of them in the first tenth of the interval: want every one, spread over it", len(first), n, early)
	}

	done := make(chan error, 1)
	go func() {
		conn, err := ln.Accept()
		if err != nil {
			done <- err
			return
		}
		defer conn.Close()
		conn.SetReadDeadline(time.Now().Add(5 * time.Second))
		_, err = conn.Read(make([]byte, 1))
		done <- err
	}()
	if err := check(context.Background(), target{Check: HealthCheck{Type: "tcp"}, Addr: a, Port: port}); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err == nil || !strings.Contains(err.Error(), "connection reset") {
		t.Errorf("the backend read %v after the check, want a connection reset (RST), not EOF (FIN)", err)
	}
}

// An https check sends the check's host as the server name (SNI), as clients do: a backend
// that refuses a handshake without it (nginx's ssl_reject_handshake, ingress controllers) was
// marked down although it served its clients. A command check's output is kept in part: a
// script that printed megabytes before it failed made them the backend's LastError, held per
// backend, logged and in every status.
func TestCheckSNIAndBoundedOutput(t *testing.T) {
	var sni atomic.Value
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	srv.TLS = &tls.Config{GetConfigForClient: func(h *tls.ClientHelloInfo) (*tls.Config, error) {
		sni.Store(h.ServerName)
		if h.ServerName == "" {
			return nil, errors.New("no SNI")
		}
		return nil, nil
	}}
	srv.StartTLS()
	defer srv.Close()
	a, port := addrPort(t, srv.Listener.Addr())
	for _, host := range []string{"svc.example", "svc.example:8443"} {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		err := check(ctx, target{Check: HealthCheck{Type: "https", Host: host}, Addr: a, Port: port})
		cancel()
		if err != nil || sni.Load() != "svc.example" {
			t.Errorf("https check with host %s: %v, server name %q; want healthy, svc.example", host, err, sni.Load())
		}
	}

	cmd := HealthCheck{Type: "command", Command: []string{"/bin/sh", "-c", "echo first; head -c 3000000 /dev/zero | tr '\\0' x; echo; echo last; exit 3"}}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	err := check(ctx, target{Check: cmd, Addr: a, Port: port})
	if err == nil || len(err.Error()) > 2048 || !strings.Contains(err.Error(), "first") || !strings.Contains(err.Error(), "last") ||
		!strings.Contains(err.Error(), "bytes left out") {
		s := fmt.Sprint(err)
		t.Errorf("a failing command that printed 3 MB: error of %d bytes (%.100s...), want at most 2 KiB, its first and last lines", len(s), s)
	}
}

// A result of a check that Update has replaced (its port or path changed) or stopped counts
// for nothing: Update cancels the probe under the checker's lock, and the old probe's goroutine
// may reach record just after (a review found no guard there).
func TestCheckerResultOfAReplacedCheckIgnored(t *testing.T) {
	c := NewChecker(nil, nil)
	defer c.Stop()
	key := HealthKey("web", "10.0.0.1")
	c.health[key] = Health{State: HealthUp}
	ctx, cancel := context.WithCancel(context.Background())
	cancel() // Update replaced the probe
	c.record(ctx, key, target{Check: HealthCheck{Type: "tcp"}}, errors.New("refused on the old port"))
	if h := c.Health()[key]; h.State != HealthUp || h.Checks != 0 || h.Failures != 0 {
		t.Errorf("health after a replaced check's failure: %+v, want up and nothing counted", h)
	}
	c.record(context.Background(), key, target{Check: HealthCheck{Type: "tcp"}}, errors.New("refused"))
	if h := c.Health()[key]; h.Checks != 1 || h.Failures != 1 {
		t.Errorf("health after the current check's failure: %+v, want it counted", h)
	}
}
