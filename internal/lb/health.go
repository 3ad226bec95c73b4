package lb

import (
	"bytes"
	"cmp"
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	mrand "math/rand/v2"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Checker runs the health checks of every backend whose service has one, each in its own
// goroutine, and calls OnChange when a backend goes up or down.
type Checker struct {
	OnChange func()
	Log      *slog.Logger
	check    func(context.Context, target) error // one check (replaceable in tests)

	mu      sync.Mutex
	probes  map[string]*probe // by HealthKey
	health  map[string]Health
	stopped bool // Stop ran: Update starts no probe
}

type probe struct {
	spec   string
	cancel context.CancelFunc
	done   chan struct{}
}

// NewChecker returns a Checker with no probes.
func NewChecker(onChange func(), log *slog.Logger) *Checker {
	if log == nil {
		log = slog.Default()
	}
	return &Checker{OnChange: onChange, Log: log, check: check, probes: map[string]*probe{}, health: map[string]Health{}}
}

// target is what one probe checks.
type target struct {
	Check   HealthCheck
	Service string
	Addr    netip.Addr
	Port    int
}

// Update starts probes for new backends (or changed checks) and stops those of backends
// that are gone. A backend keeps its health across a change of its check's settings.
func (c *Checker) Update(svcs []Service) {
	want := map[string]target{}
	for _, s := range svcs {
		hc := s.HealthCheck
		if hc == nil || hc.Type == "none" {
			continue
		}
		for _, b := range s.Backends {
			a, err := netip.ParseAddr(b.Address)
			if err != nil {
				continue
			}
			port := cmp.Or(hc.Port, cmp.Or(b.Port, s.ports()[0]))
			want[HealthKey(s.Name, BackendKey(b.Address, b.Port))] = target{*hc, s.Name, a, port}
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.stopped {
		return
	}
	for key, p := range c.probes {
		spec, _ := json.Marshal(want[key])
		if _, ok := want[key]; !ok || string(spec) != p.spec {
			p.cancel()
			delete(c.probes, key)
			if !ok {
				delete(c.health, key)
			}
		}
	}
	for key, t := range want {
		if c.probes[key] != nil {
			continue
		}
		spec, _ := json.Marshal(t)
		ctx, cancel := context.WithCancel(context.Background())
		p := &probe{spec: string(spec), cancel: cancel, done: make(chan struct{})}
		c.probes[key] = p
		if _, ok := c.health[key]; !ok {
			c.health[key] = Health{State: HealthUnknown}
		}
		go c.run(ctx, key, t, p.done)
	}
}

// Health returns a copy of every checked backend's health, by HealthKey.
func (c *Checker) Health() map[string]Health {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make(map[string]Health, len(c.health))
	for k, v := range c.health {
		out[k] = v
	}
	return out
}

// healthOf returns a copy of the health of the backends of keys (HealthKey) that are checked.
func (c *Checker) healthOf(keys []string) map[string]Health {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make(map[string]Health, len(keys))
	for _, k := range keys {
		if h, ok := c.health[k]; ok {
			out[k] = h
		}
	}
	return out
}

// Stop stops every probe and waits for them; Update starts none after it.
func (c *Checker) Stop() {
	c.mu.Lock()
	c.stopped = true
	probes := c.probes
	c.probes = map[string]*probe{}
	c.mu.Unlock()
	for _, p := range probes {
		p.cancel()
		<-p.done
	}
}

// run checks one backend until ctx ends, one check at a time: the next check starts an
// interval after the previous one started, or as soon as it ends when it took longer (a
// timeout above the interval), as HAProxy, Envoy and Kubernetes probes do.
func (c *Checker) run(ctx context.Context, key string, t target, done chan struct{}) {
	defer close(done)
	next := time.NewTimer(c.firstDelay(t.Check.interval()))
	defer next.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-next.C:
		}
		start := time.Now()
		cctx, cancel := context.WithTimeout(ctx, t.Check.timeout())
		err := c.check(cctx, t)
		cancel()
		if ctx.Err() != nil {
			return
		}
		c.record(ctx, key, t, err)
		next.Reset(time.Until(start.Add(t.Check.interval())))
	}
}

// firstDelay spreads the first checks of probes started together (the agent's start, a
// service with many backends) over an interval, as HAProxy's spread-checks does, so that
// they do not all connect in the same instant every interval. Until its first check a
// backend's health is unknown, which counts as up.
func (c *Checker) firstDelay(interval time.Duration) time.Duration {
	if interval <= 0 {
		return 0
	}
	return mrand.N(interval)
}

// record counts one result of the probe of ctx; the state flips after rise successes or fall
// failures in a row (from unknown, at the first result).
func (c *Checker) record(ctx context.Context, key string, t target, err error) {
	c.mu.Lock()
	h, ok := c.health[key]
	// The backend was removed meanwhile, or its check replaced (Update cancels a probe under
	// mu): a result of the old check (another port, path) must not count for the new one.
	if !ok || ctx.Err() != nil {
		c.mu.Unlock()
		return
	}
	now := time.Now()
	h.Checks++
	h.LastCheck = now
	prev := h.State
	if err == nil {
		h.LastError = ""
		h.streak = max(h.streak, 0) + 1
		if prev == HealthUnknown || prev == HealthDown && h.streak >= t.Check.rise() {
			h.State = HealthUp
		}
	} else {
		h.Failures++
		h.LastError = err.Error()
		h.streak = min(h.streak, 0) - 1
		if prev == HealthUnknown || prev == HealthUp && -h.streak >= t.Check.fall() {
			h.State = HealthDown
		}
	}
	changed := h.State != prev
	if changed {
		h.LastChange = now
		if prev != HealthUnknown {
			h.Transitions++
		}
	}
	c.health[key] = h
	c.mu.Unlock()
	if changed {
		c.Log.Info("backend health changed", "backend", key, "from", prev, "to", h.State, "err", h.LastError)
		if c.OnChange != nil {
			c.OnChange()
		}
	}
}

func check(ctx context.Context, t target) error {
	addr := netip.AddrPortFrom(t.Addr, uint16(t.Port)).String()
	switch t.Check.Type {
	case "tcp":
		var d net.Dialer
		c, err := d.DialContext(ctx, "tcp", addr)
		if err != nil {
			return err
		}
		// Close with RST, as HAProxy's checks do: no FIN exchange, and no TIME_WAIT socket
		// left per check (10,000 checks a second would keep 600,000 of them).
		if tc, ok := c.(*net.TCPConn); ok {
			_ = tc.SetLinger(0)
		}
		return c.Close()
	case "http", "https":
		return checkHTTP(ctx, t, addr)
	case "udp":
		return checkUDP(ctx, addr, []byte(t.Check.Send), func(b []byte) error {
			if t.Check.Expect != "" && !bytes.Contains(b, []byte(t.Check.Expect)) {
				return fmt.Errorf("reply does not contain %q", t.Check.Expect)
			}
			return nil
		})
	case "dns":
		q, id := dnsQuery(t.Check.Query)
		return checkUDP(ctx, addr, q, func(b []byte) error { return dnsCheck(b, id) })
	case "command":
		cmd := exec.CommandContext(ctx, t.Check.Command[0], t.Check.Command[1:]...)
		cmd.Env = append(os.Environ(), "HOSTACCEL_BACKEND_ADDRESS="+t.Addr.String(), "HOSTACCEL_BACKEND_PORT="+strconv.Itoa(t.Port),
			"HOSTACCEL_SERVICE="+t.Service)
		// At the timeout the command's whole process group is killed: a script's children
		// (sleep, curl) would otherwise keep the output open, and the check would wait for
		// them, its backend's health frozen. WaitDelay bounds what still holds it (a child
		// that left the group).
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
		cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
		cmd.WaitDelay = time.Second
		// The output is kept in part (it becomes the backend's LastError, logged and in every
		// status): a script that prints megabytes before it fails must not make the agent
		// hold them per backend.
		out := &headTail{}
		cmd.Stdout, cmd.Stderr = out, out
		if err := cmd.Run(); err != nil {
			return fmt.Errorf("%s: %v: %s", t.Check.Command[0], err, strings.TrimSpace(out.String()))
		}
		return nil
	}
	return fmt.Errorf("unknown check type %q", t.Check.Type)
}

// headTail is an io.Writer that keeps the first and last headTailKeep bytes written.
type headTail struct {
	head, tail []byte
	cut        int // bytes dropped between them
}

const headTailKeep = 512

func (w *headTail) Write(p []byte) (int, error) {
	n := len(p)
	if room := headTailKeep - len(w.head); room > 0 {
		k := min(room, len(p))
		w.head, p = append(w.head, p[:k]...), p[k:]
	}
	w.tail = append(w.tail, p...)
	if over := len(w.tail) - headTailKeep; over > 0 {
		w.cut += over
		w.tail = append(w.tail[:0], w.tail[over:]...)
	}
	return n, nil
}

func (w *headTail) String() string {
	if w.cut == 0 {
		return string(w.head) + string(w.tail)
	}
	return fmt.Sprintf("%s ... (%d bytes left out) ... %s", w.head, w.cut, w.tail)
}

func checkHTTP(ctx context.Context, t target, addr string) error {
	hc := t.Check
	// A health check, not a client: self-signed backends are normal. The server name
	// (SNI) is the check's host where it has one: backends that pick their certificate by
	// it, or refuse a handshake without it, answer as they do to their clients.
	tlsConf := &tls.Config{InsecureSkipVerify: true}
	if hc.Host != "" {
		tlsConf.ServerName = hc.Host
		if h, _, err := net.SplitHostPort(hc.Host); err == nil {
			tlsConf.ServerName = h
		}
	}
	tr := &http.Transport{DisableKeepAlives: true, TLSClientConfig: tlsConf}
	defer tr.CloseIdleConnections()
	path := hc.Path
	if path == "" {
		path = "/"
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, hc.Type+"://"+addr+path, nil)
	if err != nil {
		return err
	}
	if hc.Host != "" {
		req.Host = hc.Host
	}
	req.Header.Set("User-Agent", "hostaccel-health-check")
	resp, err := (&http.Client{Transport: tr, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}).Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	if err != nil {
		return err
	}
	if want := cmp.Or(hc.ExpectStatus, 200); resp.StatusCode != want {
		return fmt.Errorf("HTTP status %d, want %d", resp.StatusCode, want)
	}
	if hc.Expect != "" && !bytes.Contains(body, []byte(hc.Expect)) {
		return fmt.Errorf("body does not contain %q", hc.Expect)
	}
	return nil
}

func checkUDP(ctx context.Context, addr string, req []byte, ok func([]byte) error) error {
	var d net.Dialer
	c, err := d.DialContext(ctx, "udp", addr)
	if err != nil {
		return err
	}
	defer c.Close()
	if dl, has := ctx.Deadline(); has {
		c.SetDeadline(dl)
	}
	if _, err := c.Write(req); err != nil {
		return err
	}
	buf := make([]byte, 64<<10)
	n, err := c.Read(buf)
	if err != nil {
		return err
	}
	return ok(buf[:n])
}

// dnsQuery builds a standard query (recursion desired) for name, type A, class IN.
func dnsQuery(name string) ([]byte, uint16) {
	var idb [2]byte
	rand.Read(idb[:])
	id := binary.BigEndian.Uint16(idb[:])
	q := binary.BigEndian.AppendUint16(nil, id)
	q = append(q, 0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0) // RD; 1 question
	for _, l := range strings.Split(strings.Trim(name, "."), ".") {
		if l != "" {
			q = append(q, byte(len(l)))
			q = append(q, l...)
		}
	}
	return append(q, 0, 0, 1, 0, 1), id
}

func dnsCheck(b []byte, id uint16) error {
	if len(b) < 12 {
		return errors.New("short DNS reply")
	}
	if binary.BigEndian.Uint16(b) != id || b[2]&0x80 == 0 {
		return errors.New("not a reply to our DNS query")
	}
	if rcode := b[3] & 0x0f; rcode != 0 && rcode != 3 {
		return fmt.Errorf("DNS rcode %d", rcode)
	}
	return nil
}
