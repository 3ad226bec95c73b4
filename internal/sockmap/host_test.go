package sockmap

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"

	"github.com/hostaccel/hostaccel/internal/model"
	"github.com/hostaccel/hostaccel/internal/testbed"
)

// Host tests: the programs attached to this host's cgroup v2 root, real TCP between two Pod
// namespaces. Their Pod CIDRs (testbed.LocalPods: 10.213.0.0/16, fd00:213::/32) are used by
// no other test, so the programs leave every other connection of the host alone.

// streamBytes is the size of the large transfer: 64 MiB by default (each direction, at the
// same time), HOSTACCEL_SOCKMAP_BYTES to change it (docs/sockmap.md: a 1 GiB run).
func streamBytes(t *testing.T) int64 {
	if s := os.Getenv("HOSTACCEL_SOCKMAP_BYTES"); s != "" {
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			t.Fatalf("HOSTACCEL_SOCKMAP_BYTES: %v", err)
		}
		return n
	}
	return 64 << 20
}

type bed struct {
	t    *testing.T
	pods *testbed.LocalPods
	m    *Manager
}

func newBed(t *testing.T, apply bool) *bed {
	testbed.RequireRoot(t)
	b := &bed{t: t, pods: testbed.NewLocalPodsT(t), m: NewManager()}
	t.Cleanup(func() {
		if err := b.m.Remove(context.Background()); err != nil {
			t.Errorf("cleanup: %v", err)
		}
	})
	if apply {
		b.apply()
	}
	return b
}

func (b *bed) desired() *Desired {
	return Render(model.State{LocalPodCIDRs: b.pods.CIDRs, Classes: []model.Class{model.LocalPodToPod}})
}

func (b *bed) apply() Result {
	b.t.Helper()
	res, err := b.m.Apply(context.Background(), b.desired())
	if err != nil {
		b.t.Fatalf("apply: %v", err)
	}
	return res
}

func (b *bed) status() Status {
	b.t.Helper()
	st, err := b.m.Status(context.Background())
	if err != nil || st == nil {
		b.t.Fatalf("status: %v %v", st, err)
	}
	return *st
}

// pair connects a socket in Pod A to a listener in Pod B (same family) and returns both ends.
func (b *bed) pair(v6 bool) (client, server *net.TCPConn) {
	return pairIn(b.t, b.pods.A, b.pods.B, b.pods.Addr(true, v6))
}

func pairIn(t *testing.T, cns, sns *testbed.NS, dst netip.Addr) (client, server *net.TCPConn) {
	t.Helper()
	var ln net.Listener
	if err := sns.Do(func() (err error) { ln, err = net.Listen("tcp", netip.AddrPortFrom(dst, 0).String()); return }); err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	acc := make(chan net.Conn, 1)
	go func() {
		c, _ := ln.Accept()
		acc <- c
	}()
	var c net.Conn
	if err := cns.Do(func() (err error) { c, err = net.Dial("tcp", ln.Addr().String()); return }); err != nil {
		t.Fatal(err)
	}
	s := <-acc
	if s == nil {
		t.Fatal("accept failed")
	}
	t.Cleanup(func() { c.Close(); s.Close() })
	return c.(*net.TCPConn), s.(*net.TCPConn)
}

// settle waits until both ends of a new connection are in the map (the passive end is
// entered when the handshake's last ACK arrives) or 2s pass.
func (b *bed) settle(want int) int {
	var n int
	for deadline := time.Now().Add(2 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if n = b.status().Sockets; n >= want {
			break
		}
	}
	return n
}

// pattern is a reproducible pseudo-random stream.
type pattern struct{ r *rand.ChaCha8 }

func newPattern(seed byte) *pattern { return &pattern{rand.NewChaCha8([32]byte{seed})} }
func (p *pattern) Read(b []byte) (int, error) {
	return p.r.Read(b)
}

// readAll reads until EOF with plain reads (never splice: io.Copy to a socket or pipe would
// use splice(2), which does not see the data sk_msg put in the socket's queue) and returns
// the count and SHA-256.
func readAll(c net.Conn) (int64, [32]byte, error) {
	h := sha256.New()
	buf := make([]byte, 256<<10)
	var n int64
	for {
		k, err := c.Read(buf)
		h.Write(buf[:k])
		n += int64(k)
		if errors.Is(err, io.EOF) {
			return n, [32]byte(h.Sum(nil)), nil
		}
		if err != nil {
			return n, [32]byte(h.Sum(nil)), err
		}
	}
}

// send writes n bytes of the pattern seeded with seed in chunks of size and half-closes;
// it returns the stream's SHA-256.
func send(c *net.TCPConn, seed byte, n int64, chunk int) ([32]byte, error) {
	h := sha256.New()
	p := newPattern(seed)
	buf := make([]byte, chunk)
	for left := n; left > 0; {
		k := int(min(int64(chunk), left))
		p.Read(buf[:k])
		h.Write(buf[:k])
		if _, err := c.Write(buf[:k]); err != nil {
			return [32]byte{}, err
		}
		left -= int64(k)
	}
	return [32]byte(h.Sum(nil)), c.CloseWrite()
}

type result struct {
	n   int64
	sum [32]byte
	err error
}

// exchange sends n bytes each way at once, in chunks, and checks what arrived.
func exchange(t *testing.T, c, s *net.TCPConn, n int64, chunk int) {
	t.Helper()
	got := make(chan result, 2)
	sent := make(chan result, 2)
	for i, pair := range [][2]*net.TCPConn{{c, s}, {s, c}} {
		go func() {
			sum, err := send(pair[0], byte(i+1), n, chunk)
			sent <- result{n, sum, err}
		}()
		go func() {
			k, sum, err := readAll(pair[1])
			got <- result{k, sum, err}
		}()
	}
	var ss, gs []result
	for range 2 {
		ss, gs = append(ss, <-sent), append(gs, <-got)
	}
	for _, r := range append(ss, gs...) {
		if r.err != nil {
			t.Fatalf("transfer: %v", r.err)
		}
	}
	for _, g := range gs {
		if g.n != n || (g.sum != ss[0].sum && g.sum != ss[1].sum) {
			t.Fatalf("received %d bytes with sha256 %x; sent %d with %x / %x", g.n, g.sum[:8], n, ss[0].sum[:8], ss[1].sum[:8])
		}
	}
}

func family(v6 bool) string {
	if v6 {
		return "ipv6"
	}
	return "ipv4"
}

// TestTraffic moves data between the two Pods over sockets in the map: a large transfer
// both ways at once, many small writes, sendfile, half-close, RST, FIONREAD, epoll (Go's
// poller); and checks the counters say it went socket to socket.
func TestTraffic(t *testing.T) {
	b := newBed(t, true)
	for _, v6 := range []bool{false, true} {
		t.Run(family(v6), func(t *testing.T) {
			run := func(name string, fn func(t *testing.T, c, s *net.TCPConn) int64) {
				t.Run(name, func(t *testing.T) {
					b := &bed{t: t, pods: b.pods, m: b.m}
					before := b.status()
					c, s := b.pair(v6)
					if n := b.settle(before.Sockets + 2); n != before.Sockets+2 {
						t.Fatalf("%d sockets in the map, want %d", n, before.Sockets+2)
					}
					redirectedAtLeast := fn(t, c, s)
					after := b.status()
					// With the bound on (the default), a reader descheduled on a
					// loaded host can fall behind by it: that direction then takes TCP by
					// design, for good. What it passed then is not expected moved (but
					// the bound, at least, was); any other pass is a failure.
					want := uint64(redirectedAtLeast)
					bn := after.Bounded.Count - before.Bounded.Count
					passed := after.Passed.Bytes - before.Passed.Bytes
					if bn > 0 {
						t.Logf("%d bounded while it ran: %d KiB took TCP by design", bn, passed>>10)
						want = min(want, after.MaxQueued)
					} else if passed != 0 {
						t.Errorf("%d bytes passed to TCP, none bounded: the peer was not found in the map", passed)
					}
					if d := after.Redirected.Bytes - before.Redirected.Bytes; d < want {
						t.Errorf("redirected %d bytes, want >= %d; status %+v", d, want, after)
					}
					if d := after.Entered[family(v6)] - before.Entered[family(v6)]; d != 2 {
						t.Errorf("entered %d %s sockets, want 2", d, family(v6))
					}
				})
			}
			run("stream", func(t *testing.T, c, s *net.TCPConn) int64 {
				n := streamBytes(t)
				start := time.Now()
				exchange(t, c, s, n, 64<<10)
				t.Logf("%d MiB each way at once in %v", n>>20, time.Since(start).Round(time.Millisecond))
				return 2 * n * 9 / 10
			})
			run("small writes", func(t *testing.T, c, s *net.TCPConn) int64 {
				exchange(t, c, s, 1<<20, 7) // 150k writes of 7 bytes each way
				return 2 << 20 * 9 / 10
			})
			run("sendfile", func(t *testing.T, c, s *net.TCPConn) int64 { return sendfile(t, c, s) })
			run("half-close", func(t *testing.T, c, s *net.TCPConn) int64 {
				c.Write([]byte("request"))
				c.CloseWrite()
				got, err := io.ReadAll(s) // plain reads: s is a *net.TCPConn, ReadAll reads into a buffer
				if err != nil || string(got) != "request" {
					t.Fatalf("server read %q, %v", got, err)
				}
				// the other direction still works after the first one closed
				s.Write([]byte("response after the client's FIN"))
				s.Close()
				got, err = io.ReadAll(c)
				if err != nil || string(got) != "response after the client's FIN" {
					t.Fatalf("client read %q, %v", got, err)
				}
				return int64(len("request") + len("response after the client's FIN"))
			})
			run("RST", func(t *testing.T, c, s *net.TCPConn) int64 {
				c.Write([]byte("x"))
				buf := make([]byte, 1)
				if _, err := io.ReadFull(s, buf); err != nil {
					t.Fatal(err)
				}
				errc := make(chan error, 1)
				go func() { _, err := s.Read(buf); errc <- err }() // blocked in the read when the RST comes
				time.Sleep(50 * time.Millisecond)
				c.SetLinger(0)
				c.Close()
				select {
				case err := <-errc:
					if !errors.Is(err, syscall.ECONNRESET) {
						t.Errorf("read after the peer's RST: %v, want ECONNRESET", err)
					}
				case <-time.After(5 * time.Second):
					t.Fatal("a read blocked on a redirected socket did not see the peer's RST")
				}
				return 1
			})
			run("FIONREAD", func(t *testing.T, c, s *net.TCPConn) int64 {
				msg := bytes.Repeat([]byte("q"), 1000)
				c.Write(msg)
				var n int
				for deadline := time.Now().Add(2 * time.Second); time.Now().Before(deadline) && n != len(msg); time.Sleep(5 * time.Millisecond) {
					n = fionread(t, s)
				}
				switch fixed, why := fionreadFixed(t); {
				case fixed && n != len(msg):
					t.Errorf("FIONREAD = %d with %d bytes waiting (%s)", n, len(msg), why)
				case !fixed && n == len(msg):
					t.Errorf("FIONREAD = %d counts the redirected bytes, but %s", n, why)
				case !fixed:
					// The kernel lacks the fix: the datapath's probe must have said so, which
					// keeps auto's local-pod-to-pod off sockmap (internal/datapath).
					t.Logf("FIONREAD = %d with %d bytes waiting, as %s", n, len(msg), why)
				}
				got := make([]byte, len(msg))
				if _, err := io.ReadFull(s, got); err != nil || !bytes.Equal(got, msg) {
					t.Fatalf("read %v", err)
				}
				return int64(len(msg))
			})
			run("epoll request-response", func(t *testing.T, c, s *net.TCPConn) int64 {
				// Go's runtime poller is edge-triggered epoll: a reader parks until EPOLLIN.
				go func() {
					buf := make([]byte, 64)
					for {
						if _, err := io.ReadFull(s, buf); err != nil {
							return
						}
						s.Write(buf)
					}
				}()
				buf := make([]byte, 64)
				for i := range 2000 {
					buf[0] = byte(i)
					c.SetDeadline(time.Now().Add(5 * time.Second))
					if _, err := c.Write(buf); err != nil {
						t.Fatal(err)
					}
					if _, err := io.ReadFull(c, buf); err != nil || buf[0] != byte(i) {
						t.Fatalf("round trip %d: %v", i, err)
					}
				}
				return 2 * 2000 * 64
			})
		})
	}
}

func sendfile(t *testing.T, c, s *net.TCPConn) int64 {
	const size = 8 << 20
	p := filepath.Join(t.TempDir(), "f")
	data := make([]byte, size)
	newPattern(9).Read(data)
	if err := os.WriteFile(p, data, 0o600); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	got := make(chan result, 1)
	go func() { n, sum, err := readAll(s); got <- result{n, sum, err} }()
	if n, err := c.ReadFrom(f); err != nil || n != size { // *os.File -> TCPConn: sendfile(2)
		t.Fatalf("sendfile: %d, %v", n, err)
	}
	c.CloseWrite()
	r := <-got
	if r.err != nil || r.n != size || r.sum != sha256.Sum256(data) {
		t.Fatalf("received %d bytes (%v), sha256 match %v", r.n, r.err, r.sum == sha256.Sum256(data))
	}
	return size * 9 / 10
}

// fionreadFixed says whether FIONREAD must count the bytes sk_msg moved to a socket here:
// by the verdict of `hostaccel probe` (sockmap_fionread) when the tests have the binary
// (HOSTACCEL_BIN: scripts/test.sh, on the host and in the VM), which this test then holds to
// what a real accelerated connection shows; without the binary, yes.
func fionreadFixed(t *testing.T) (bool, string) {
	fionreadVerdict.Do(func() { fionreadVerdict.fixed, fionreadVerdict.why, fionreadVerdict.err = probeFIONREAD() })
	if fionreadVerdict.err != nil {
		t.Fatal(fionreadVerdict.err)
	}
	return fionreadVerdict.fixed, fionreadVerdict.why
}

var fionreadVerdict struct {
	sync.Once
	fixed bool
	why   string
	err   error
}

func probeFIONREAD() (bool, string, error) {
	bin := os.Getenv("HOSTACCEL_BIN")
	if bin == "" {
		return true, "kernel fix 929e30f93125; HOSTACCEL_BIN unset, so no probe verdict to follow", nil
	}
	out, err := exec.Command(bin, "probe", "-o", "json").Output()
	if err != nil {
		return false, "", fmt.Errorf("%s probe: %w", bin, err)
	}
	var r struct {
		Features []struct {
			Name      string `json:"name"`
			Available bool   `json:"available"`
			Detail    string `json:"detail"`
		} `json:"features"`
	}
	if err := json.Unmarshal(out, &r); err != nil {
		return false, "", fmt.Errorf("%s probe: %w", bin, err)
	}
	for _, f := range r.Features {
		if f.Name == "sockmap_fionread" {
			if f.Available {
				return true, "hostaccel probe says sockmap_fionread is available", nil
			}
			return false, "hostaccel probe says sockmap_fionread is unavailable: " + f.Detail, nil
		}
	}
	return false, "", fmt.Errorf("%s probe has no sockmap_fionread", bin)
}

func fionread(t *testing.T, c *net.TCPConn) int {
	rc, err := c.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var n int
	var ierr error
	rc.Control(func(fd uintptr) { n, ierr = unix.IoctlGetInt(int(fd), unix.SIOCINQ) })
	if ierr != nil {
		t.Fatal(ierr)
	}
	return n
}

// TestNotEntered: loopback connections inside a Pod, a Pod talking to its own address, and
// sockets that were connected before the programs were attached stay on TCP, and work.
func TestNotEntered(t *testing.T) {
	b := newBed(t, false)
	oldC, oldS := b.pair(false) // before attach
	b.apply()
	for _, dst := range []netip.Addr{netip.MustParseAddr("127.0.0.1"), netip.MustParseAddr("::1"), b.pods.A4, b.pods.A6} {
		c, s := pairIn(t, b.pods.A, b.pods.A, dst)
		exchange(t, c, s, 1<<20, 16<<10)
	}
	exchange(t, oldC, oldS, 4<<20, 64<<10)
	st := b.status()
	if st.Sockets != 0 || st.Entered["ipv4"]+st.Entered["ipv6"] != 0 || st.Redirected.Count != 0 {
		t.Errorf("status %+v: want nothing entered or redirected", st)
	}
}

// TestEarlyData: a message sent while the peer's socket is not in the map (the passive end is
// entered when the handshake's last ACK arrives, and the active end may send before) takes TCP
// and waits in the peer's TCP receive queue; a later message moved to the peer's socket queue
// would be read before it. So the direction stays on TCP (tcp_only). Made deterministic here:
// the server's socket is taken out of the map, the client sends, the socket is put back (as
// sock_ops would have), the client sends again: the server must read both in order.
func TestEarlyData(t *testing.T) {
	b := newBed(t, true)
	for _, v6 := range []bool{false, true} {
		c, s := b.pair(v6)
		b.settle(2)
		o, err := observe(b.status().Cgroup)
		if err != nil {
			t.Fatal(err)
		}
		set := o.current(filepath.Join(mustBPFFS(t), "hostaccel"))
		keys, err := set.sockets()
		if err != nil {
			t.Fatal(err)
		}
		sport, cport := uint32(s.LocalAddr().(*net.TCPAddr).Port), uint32(c.LocalAddr().(*net.TCPAddr).Port)
		var skey sockmapSockKey
		for _, k := range keys {
			if k.LocalPort == sport && k.RemotePort == cport {
				skey = k
			}
		}
		if err := set.maps.HostaccelSocks.Delete(skey); err != nil {
			t.Fatal(err)
		}
		before := b.status()
		c.Write([]byte("first;"))
		time.Sleep(50 * time.Millisecond) // in the server's TCP receive queue, unread
		rc, _ := s.SyscallConn()
		rc.Control(func(fd uintptr) { err = set.maps.HostaccelSocks.Update(skey, uint64(fd), ebpf.UpdateNoExist) })
		if err != nil {
			t.Fatalf("putting the server's socket back: %v", err)
		}
		c.Write([]byte("second"))
		c.CloseWrite()
		got, err := io.ReadAll(s)
		if err != nil || string(got) != "first;second" {
			t.Errorf("%s: server read %q (%v), want \"first;second\"", family(v6), got, err)
		}
		after := b.status()
		if after.Passed.Count-before.Passed.Count < 2 || after.Redirected.Count != before.Redirected.Count {
			t.Errorf("%s: want both messages passed to TCP: before %+v after %+v", family(v6), before, after)
		}
		o.Close()
	}
	// The real race, a few times: the client writes at once after connect.
	for i := range 20 {
		c, s := b.pair(i%2 == 1)
		done := make(chan result, 1)
		go func() { n, sum, err := readAll(s); done <- result{n, sum, err} }()
		sum, err := send(c, byte(i), 256<<10, 4<<10)
		if err != nil {
			t.Fatal(err)
		}
		if r := <-done; r.err != nil || r.n != 256<<10 || r.sum != sum {
			t.Fatalf("connection %d: received %d bytes (%v), checksum ok %v", i, r.n, r.err, r.sum == sum)
		}
	}
}

// TestLifecycle: apply is idempotent and a second Manager (a later process) finds the set
// again, repairs drift, and Remove takes the programs off the cgroup and frees the maps.
// Remove with a connection in flight, its reader stalled: the data queued in the receiver's
// socket and all sent after go through, and the writer was held back (bounded memory).
func TestLifecycle(t *testing.T) {
	b := newBed(t, false)
	first := b.apply()
	if !first.Loaded || first.ElementsAdded != 4 {
		t.Fatalf("first apply: %+v", first)
	}
	again := b.apply()
	if again.Changed() || again.ProgramID != first.ProgramID {
		t.Fatalf("second apply changed something: %+v", again)
	}
	later := NewManager()
	if res, err := later.Apply(context.Background(), b.desired()); err != nil || res.Changed() || res.ProgramID != first.ProgramID {
		t.Fatalf("a later manager: %+v %v", res, err)
	}
	// The read counter: a later process finds it by its pin; its pin removed is drift.
	pinDir := filepath.Join(mustBPFFS(t), "hostaccel")
	if st, err := later.Status(context.Background()); err != nil || st == nil || (st.ReadCounter == "") != (b.status().ReadCounter == "") {
		t.Errorf("a later manager's status: %+v %v", st, err)
	}
	if st := b.status(); st.ReadCounter != "" {
		if err := os.Remove(filepath.Join(pinDir, ReaderPinName(first.ProgramID))); err != nil {
			t.Fatal(err)
		}
		if st := b.status(); st.ReadCounter != "" {
			t.Errorf("status with the read counter's pin removed: %+v", st)
		}
		res, err := b.m.Apply(context.Background(), b.desired())
		if err != nil || len(res.Drift) != 1 || b.status().ReadCounter == "" {
			t.Errorf("after the read counter's pin was removed: %+v %v; status %+v", res, err, b.status())
		}
	}
	// drift: someone deletes a trie entry, then detaches the programs
	o, err := observe(first.Cgroup)
	if err != nil {
		t.Fatal(err)
	}
	set := o.current(filepath.Join(mustBPFFS(t), "hostaccel"))
	set.deletePod(b.pods.CIDRs[0])
	res, err := b.m.Apply(context.Background(), b.desired())
	if err != nil || len(res.Drift) != 1 || res.ElementsAdded != 1 {
		t.Errorf("after a trie entry was deleted: %+v %v", res, err)
	}
	if err := link.RawDetachProgram(link.RawDetachProgramOptions{Target: int(o.fd.Fd()), Program: set.ops, Attach: ebpf.AttachCGroupSockOps}); err != nil {
		t.Fatal(err)
	}
	o.Close()
	res, err = b.m.Apply(context.Background(), b.desired())
	if err != nil || !res.Loaded || len(res.Drift) != 1 {
		t.Errorf("after the programs were detached: %+v %v", res, err)
	}

	// A connection in flight: the reader stalls, the writer sends until it blocks.
	c, s := b.pair(false)
	if n := b.settle(2); n != 2 {
		t.Fatalf("%d sockets in the map", n)
	}
	// In the VM (qemu TCG, a few MiB/s) the default bound would take minutes to reach.
	bound := uint64(DefaultMaxQueued)
	if inVM() {
		bound = 4 << 20
		b.m.MaxQueued = bound
		defer func() { b.m.MaxQueued = 0 }()
		b.apply()
	}
	wrote := make(chan result, 1)
	total := int64(bound) + 64<<20 // past the bound and what TCP's buffers then take
	go func() { sum, err := send(c, 7, total, 64<<10); wrote <- result{total, sum, err} }()
	st := b.status()
	if st.ReadCounter != "" && st.MaxQueued > 0 {
		// Until the bound is reached (or a minute passes), then a while for the writer to
		// fill what TCP buffers.
		for deadline := time.Now().Add(time.Minute); st.Bounded.Count == 0 && time.Now().Before(deadline); st = b.status() {
			time.Sleep(20 * time.Millisecond)
		}
		time.Sleep(500 * time.Millisecond)
	} else {
		time.Sleep(time.Second)
	}
	st = b.status()
	queued := st.Redirected.Bytes
	t.Logf("with the reader stalled, %d KiB of %d were moved to the receiving socket (bound %d KiB, %d directions bounded)", queued>>10, total>>10, st.MaxQueued>>10, st.Bounded.Count)
	// The bound (docs/sockmap.md): the kernel charges moved data to the global tcp_mem, not
	// to the receiving socket's buffer; past MaxQueued unread, the direction takes TCP, whose
	// flow control holds the writer back.
	if bounded(t, b, st) {
		if st.MaxQueued != bound || queued > st.MaxQueued+64<<10 || st.Bounded.Count != 1 {
			t.Errorf("stalled reader: %d bytes moved, bound %d (want %d; + one 64 KiB message), %d bounded (want 1)", queued, st.MaxQueued, bound, st.Bounded.Count)
		}
		select {
		case w := <-wrote:
			t.Fatalf("the writer finished all %d bytes with the reader stalled (%v)", total, w.err)
		default:
		}
	}
	ids := mapIDs(t, st.ProgramID)
	later.Drain = 200 * time.Millisecond
	if err := later.Remove(context.Background()); err != nil {
		t.Fatal(err)
	}
	if st, err := b.m.Status(context.Background()); err != nil || st == nil || st.ProgramID != 0 || st.Draining != 2 {
		t.Errorf("status after cleanup with a connection open: %+v %v; want 2 sockets draining", st, err)
	}
	// The stalled reader wakes up: what was moved to its socket, then what came over TCP.
	n, sum, err := readAll(s)
	w := <-wrote
	if err != nil || w.err != nil || n != total || sum != w.sum {
		t.Fatalf("after cleanup mid-transfer: received %d of %d bytes (%v, %v), checksum ok %v", n, total, err, w.err, sum == w.sum)
	}
	// Traffic after the cleanup on the open connection, both ways, took TCP.
	s.Write([]byte("after"))
	s.CloseWrite()
	if got, err := io.ReadAll(c); err != nil || string(got) != "after" {
		t.Errorf("reply after cleanup: %q %v", got, err)
	}
	c.Close()
	s.Close()
	if err := later.Remove(context.Background()); err != nil {
		t.Fatal(err)
	}
	if st, err := b.m.Status(context.Background()); err != nil || st != nil {
		t.Errorf("status after the last socket closed: %+v %v", st, err)
	}
	var left []ebpf.MapID
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		left = left[:0]
		for _, id := range ids {
			if m, err := ebpf.NewMapFromID(id); err == nil {
				m.Close()
				left = append(left, id)
			}
		}
		if len(left) == 0 {
			break
		}
	}
	if len(left) > 0 {
		t.Errorf("maps %v still exist after cleanup", left)
	}
	if readers, _ := filepath.Glob(filepath.Join(pinDir, "reader-*")); len(readers) > 0 {
		t.Errorf("read counter pins left after cleanup: %v", readers)
	}
	// new connections after cleanup go over TCP and work
	c, s = b.pair(false)
	exchange(t, c, s, 1<<20, 64<<10)
}

// bounded reports whether the set bounds what a receiver holds (hostaccel_rd attached), and
// logs why not: a kernel that can attach neither read counter.
func bounded(t *testing.T, b *bed, st Status) bool {
	t.Helper()
	if st.ReadCounter != "" && st.MaxQueued > 0 {
		t.Logf("bound %d KiB, reads counted at %s", st.MaxQueued>>10, st.ReadCounter)
		return true
	}
	res, _ := b.m.Apply(context.Background(), b.desired())
	t.Logf("SKIPPING the bound's checks: hostaccel_rd is not attached on this kernel (%s)", res.Unbounded)
	if os.Getenv("HOSTACCEL_REQUIRE_SOCKMAP_BOUND") != "" {
		t.Fatal("HOSTACCEL_REQUIRE_SOCKMAP_BOUND is set")
	}
	return false
}

// TestBound: a reader that keeps up over a large transfer gets nearly all of it moved, and the
// read counter sees every byte read; with the bound at 64 KiB a transfer turns to TCP once, for
// good, intact and in order; a reader that stalls past a lowered bound turns the direction to
// TCP, and when it resumes it gets every byte in order, and what is sent after it has read
// all still takes TCP; a non-blocking writer of 1 MiB writes to a stalled reader gets its
// stream through in order (it did not while a bounded direction came back: TCP's short
// writes and the sends the kernel made without the program left the ledger short); reads
// with MSG_PEEK are not counted as read.
func TestBound(t *testing.T) {
	b := newBed(t, true)
	if !bounded(t, b, b.status()) {
		return
	}
	// stream sends n bytes one way to a reader reading as fast as it can (after readerDelay),
	// checks them and returns the counters' changes.
	var readerDelay time.Duration
	stream := func(t *testing.T, v6 bool, n int64) (before, after Status) {
		before = b.status()
		c, s := b.pair(v6)
		defer c.Close()
		defer s.Close()
		b.settle(before.Sockets + 2)
		got := make(chan result, 1)
		go func() {
			time.Sleep(readerDelay)
			k, sum, err := readAll(s)
			got <- result{k, sum, err}
		}()
		start := time.Now()
		sum, err := send(c, 3, n, 64<<10)
		r := <-got
		if err != nil || r.err != nil || r.n != n || r.sum != sum {
			t.Fatalf("%s: received %d of %d bytes (%v, %v), checksum (content and order) ok %v", family(v6), r.n, n, err, r.err, r.sum == sum)
		}
		after = b.status()
		t.Logf("%s: %d MiB in %v, bound %d KiB: %d MiB moved, %d MiB counted read, %d bounded", family(v6), n>>20, time.Since(start).Round(time.Millisecond), after.MaxQueued>>10,
			(after.Redirected.Bytes-before.Redirected.Bytes)>>20, (after.Read.Bytes-before.Read.Bytes)>>20, after.Bounded.Count-before.Bounded.Count)
		return before, after
	}
	t.Run("keeps up", func(t *testing.T) {
		n := int64(256 << 20)
		if s := os.Getenv("HOSTACCEL_SOCKMAP_BYTES"); s != "" {
			n = streamBytes(t)
		} else if inVM() {
			n = 32 << 20 // qemu TCG moves a few MiB/s
		}
		for _, v6 := range []bool{false, true} {
			before, after := stream(t, v6, n)
			moved := after.Redirected.Bytes - before.Redirected.Bytes
			bn := after.Bounded.Count - before.Bounded.Count
			// A reader descheduled for a few ms can fall behind by the bound (1 in 4
			// transfers here, on 2 loaded cores); the direction then takes TCP for good,
			// having moved the bound at least.
			want := uint64(n) * 9 / 10
			if bn > 0 {
				want = after.MaxQueued
			}
			if after.Read.Bytes-before.Read.Bytes != uint64(n) || moved < want || bn > 1 {
				t.Errorf("%s: a reader that keeps up: %d bytes counted read (want %d), %d moved (want >= %d), %d bounded (at most 1)", family(v6), after.Read.Bytes-before.Read.Bytes, n, moved, want, bn)
			}
		}
	})
	t.Run("bounded once", func(t *testing.T) {
		// A bound of 64 KiB: the direction turns to TCP, for good. The reader starts 50 ms
		// late, so the bound is met, on any host.
		b.m.MaxQueued, readerDelay = 64<<10, 50*time.Millisecond
		defer func() { b.m.MaxQueued, readerDelay = 0, 0 }()
		b.apply()
		n := int64(64 << 20)
		if inVM() {
			n = 8 << 20
		}
		for _, v6 := range []bool{false, true} {
			before, after := stream(t, v6, n)
			// Once, and the rest over TCP; the checksum shows the order held.
			moved, passed := after.Redirected.Bytes-before.Redirected.Bytes, after.Passed.Bytes-before.Passed.Bytes
			// (passed counts the messages the program saw: the kernel sends some past it)
			if bn := after.Bounded.Count - before.Bounded.Count; bn != 1 || moved > uint64(n)/2 || passed < uint64(n)/4 {
				t.Errorf("%s: %d bounded (want 1), %d bytes moved, %d over TCP (want most of %d)", family(v6), bn, moved, passed, n)
			}
		}
	})
	t.Run("lowered", func(t *testing.T) {
		const bound = 256 << 10
		b.m.MaxQueued = bound
		defer func() { b.m.MaxQueued = 0 }()
		b.apply()
		if st := b.status(); st.MaxQueued != bound {
			t.Fatalf("status: MaxQueued %d, want %d", st.MaxQueued, bound)
		}
		for _, v6 := range []bool{false, true} {
			before := b.status()
			c, s := b.pair(v6)
			b.settle(before.Sockets + 2)
			// One stream in two parts: 16 MiB while the reader stalls, then (once the reader
			// has read all of it) 4 MiB more.
			const first, second = 16 << 20, 4 << 20
			p := newPattern(5)
			write := func(n int) error {
				buf := make([]byte, 64<<10)
				for left := n; left > 0; left -= len(buf) {
					p.Read(buf)
					if _, err := c.Write(buf); err != nil {
						return err
					}
				}
				return nil
			}
			wrote := make(chan error, 1)
			go func() { wrote <- write(first) }()
			time.Sleep(500 * time.Millisecond) // the reader stalls
			mid := b.status()
			// A peek leaves the data queued: not read.
			rc, _ := s.SyscallConn()
			peek := make([]byte, 1000)
			var pn int
			rc.Read(func(fd uintptr) bool {
				pn, _, _ = unix.Recvfrom(int(fd), peek, unix.MSG_PEEK|unix.MSG_DONTWAIT)
				return true
			})
			peeked := b.status()
			buf := make([]byte, first)
			if _, err := io.ReadFull(s, buf); err != nil { // the reader resumes
				t.Fatal(err)
			}
			if err := <-wrote; err != nil {
				t.Fatal(err)
			}
			drained := b.status()
			go func() {
				err := write(second)
				c.CloseWrite()
				wrote <- err
			}()
			n, rest, err := readAll(s)
			if werr := <-wrote; err != nil || werr != nil || n != second {
				t.Fatalf("%s: second part: %d of %d bytes (%v, %v)", family(v6), n, second, err, werr)
			}
			after := b.status()
			moved := mid.Redirected.Bytes - before.Redirected.Bytes
			t.Logf("%s: stalled: %d KiB moved, %d bounded; peeked %d bytes; first part: %d KiB over TCP; second part: %d KiB moved, %d KiB over TCP", family(v6), moved>>10, mid.Bounded.Count-before.Bounded.Count, pn, (drained.Passed.Bytes-before.Passed.Bytes)>>10, (after.Redirected.Bytes-drained.Redirected.Bytes)>>10, (after.Passed.Bytes-drained.Passed.Bytes)>>10)
			if mid.Bounded.Count-before.Bounded.Count != 1 || moved > bound+64<<10 {
				t.Errorf("%s: stalled: %d bounded (want 1), %d bytes moved (bound %d + one message)", family(v6), mid.Bounded.Count-before.Bounded.Count, moved, bound)
			}
			// Once bounded, the direction stays on TCP, also after the reader has read all.
			if bn := after.Bounded.Count - before.Bounded.Count; bn != 1 || after.Redirected.Bytes != drained.Redirected.Bytes {
				t.Errorf("%s: after the reader had read all: %d bounded (want 1), %d of %d bytes of the second part moved (want none)", family(v6), bn, after.Redirected.Bytes-drained.Redirected.Bytes, second)
			}
			if pn <= 0 || peeked.Read != mid.Read {
				t.Errorf("%s: a peek of %d bytes counted as read: %+v -> %+v", family(v6), pn, mid.Read, peeked.Read)
			}
			c.Close()
			s.Close()
			// The whole stream, in order: the first part (read above) and the second.
			all := make([]byte, first+second)
			newPattern(5).Read(all)
			if !bytes.Equal(buf, all[:first]) {
				t.Errorf("%s: the first part arrived changed or out of order", family(v6))
			}
			secondSum := sha256.Sum256(all[first:])
			if rest != secondSum {
				t.Errorf("%s: the second part arrived changed or out of order", family(v6))
			}
		}
	})
	t.Run("stalled, large writes", func(t *testing.T) {
		// A Go writer (a non-blocking socket) of 1 MiB writes to a reader that stalls for 1 s,
		// past a 256 KiB bound: TCP takes some writes only in part. Several connections,
		// each stream checked whole (a review's test; with directions moved again it failed
		// within the first few).
		b.m.MaxQueued = 256 << 10
		defer func() { b.m.MaxQueued = 0 }()
		b.apply()
		conns, n := 12, int64(128<<20)
		if inVM() {
			conns, n = 2, 8<<20
		}
		for i := range conns {
			v6 := i%2 == 1
			before := b.status()
			c, s := b.pair(v6)
			b.settle(before.Sockets + 2)
			sent := make(chan result, 1)
			go func() { sum, err := send(c, byte(20+i), n, 1<<20); sent <- result{n, sum, err} }()
			time.Sleep(time.Second) // the reader stalls
			k, sum, err := readAll(s)
			w := <-sent
			c.Close()
			s.Close()
			after := b.status()
			t.Logf("connection %d (%s): %d MiB moved, %d MiB over TCP, %d bounded", i, family(v6), (after.Redirected.Bytes-before.Redirected.Bytes)>>20, (after.Passed.Bytes-before.Passed.Bytes)>>20, after.Bounded.Count-before.Bounded.Count)
			if err != nil || w.err != nil || k != n || sum != w.sum {
				t.Fatalf("connection %d (%s): received %d of %d bytes (%v, %v), checksum (content and order) ok %v", i, family(v6), k, n, err, w.err, sum == w.sum)
			}
		}
	})
}

func mapIDs(t *testing.T, id ebpf.ProgramID) []ebpf.MapID {
	p, err := ebpf.NewProgramFromID(id)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	info, err := p.Info()
	if err != nil {
		t.Fatal(err)
	}
	ids, _ := info.MapIDs()
	return ids
}

// TestOtherSockmapUser: another program's sockmap (its own sk_msg verdict) on the node. A
// socket takes one sk_msg program: the other user cannot enter our sockets (EBUSY) and
// traffic stays intact; and the other user's sockets, open before our attach, are not entered
// into ours.
func TestOtherSockmapUser(t *testing.T) {
	b := newBed(t, false)
	other, err := ebpf.NewMap(&ebpf.MapSpec{Name: "other_sockmap", Type: ebpf.SockMap, KeySize: 4, ValueSize: 8, MaxEntries: 8})
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{Name: "other_pass", Type: ebpf.SkMsg, License: "GPL",
		Instructions: asm.Instructions{asm.Mov.Imm(asm.R0, 1 /* SK_PASS */), asm.Return()}})
	if err != nil {
		t.Fatal(err)
	}
	defer prog.Close()
	if err := link.RawAttachProgram(link.RawAttachProgramOptions{Target: other.FD(), Program: prog, Attach: ebpf.AttachSkMsgVerdict}); err != nil {
		t.Fatal(err)
	}
	enter := func(c *net.TCPConn, slot uint32) error {
		rc, _ := c.SyscallConn()
		var err error
		rc.Control(func(fd uintptr) { err = other.Put(slot, uint64(fd)) })
		return err
	}
	// The other user first: a connection made before our attach, entered into its map.
	oc, os_ := b.pair(false)
	if err := errors.Join(enter(oc, 0), enter(os_, 1)); err != nil {
		t.Fatalf("the other user entering sockets: %v", err)
	}
	b.apply()
	// Ours first: the other user's attempt fails, ours keeps working.
	c, s := b.pair(false)
	b.settle(2)
	err = errors.Join(enter(c, 2), enter(s, 3))
	t.Logf("the other user entering sockets already in ours: %v", err)
	if err == nil {
		t.Errorf("the other user entered sockets that already have our sk_msg program")
	}
	before := b.status()
	// the other user's sockets are not in our map: ours hold only our pair (a check that
	// can fail, unlike the print it replaces, found by a helper's review: the other user's
	// connection predates our attach, so this shows that an apply enters no open socket)
	if before.Sockets != 2 {
		t.Errorf("%d sockets in our map, want 2 (ours; not the other user's two)", before.Sockets)
	}
	exchange(t, c, s, 8<<20, 64<<10)
	exchange(t, oc, os_, 8<<20, 64<<10)
	after := b.status()
	if after.Redirected.Bytes-before.Redirected.Bytes < 2*8<<20*9/10 {
		t.Errorf("our connection was not redirected: %+v", after)
	}
}

func inVM() bool { return os.Getenv("HOSTACCEL_IN_VM") == "1" }

func mustBPFFS(t *testing.T) string {
	p, err := BPFFS()
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// BenchmarkReadCounterOtherSockets: what the datapath's read counter costs a socket in no
// sockmap. hostaccel_rt (the sock_recv_length tracepoint, where the kernel refuses fexit) runs
// on every recvmsg of the node; here a loopback connection inside a Pod (never entered) does
// 1-byte request-responses, and the kernel's BPF run-time statistics give the program's time
// per call (ns/call). hostaccel_rd (fexit on tcp_bpf_recvmsg) runs for sockmap sockets only:
// other sockets pay nothing, and the benchmark says so (calls/op 0).
//
//	go test -run '^$' -bench ReadCounterOtherSockets -count 5 ./internal/sockmap/
func BenchmarkReadCounterOtherSockets(b *testing.B) {
	testbed.RequireRoot(b)
	pods := testbed.NewLocalPodsT(b)
	m := NewManager()
	defer m.Remove(context.Background())
	if _, err := m.Apply(context.Background(), Render(model.State{LocalPodCIDRs: pods.CIDRs, Classes: []model.Class{model.LocalPodToPod}})); err != nil {
		b.Fatal(err)
	}
	st, err := m.Status(context.Background())
	if err != nil {
		b.Fatal(err)
	}
	var name string
	for prog, hook := range readerHooks {
		if hook == st.ReadCounter {
			name = prog
		}
	}
	prog := attachedProgram(b, name)
	stats, err := ebpf.EnableStats(uint32(unix.BPF_STATS_RUN_TIME))
	if err != nil {
		b.Fatal(err)
	}
	defer stats.Close()
	var ln net.Listener
	if err := pods.A.Do(func() (err error) { ln, err = net.Listen("tcp", "127.0.0.1:0"); return }); err != nil {
		b.Fatal(err)
	}
	defer ln.Close()
	go func() {
		s, err := ln.Accept()
		if err != nil {
			return
		}
		defer s.Close()
		buf := make([]byte, 1)
		for {
			if _, err := s.Read(buf); err != nil {
				return
			}
			s.Write(buf)
		}
	}()
	var c net.Conn
	if err := pods.A.Do(func() (err error) { c, err = net.Dial("tcp", ln.Addr().String()); return }); err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	buf := make([]byte, 1)
	before, err := prog.Stats()
	if err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	for range b.N {
		c.Write(buf)
		if _, err := io.ReadFull(c, buf); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	after, err := prog.Stats()
	if err != nil {
		b.Fatal(err)
	}
	calls := after.RunCount - before.RunCount
	b.ReportMetric(float64(calls)/float64(b.N), "calls/op")
	if calls > 0 {
		b.ReportMetric(float64(after.Runtime-before.Runtime)/float64(calls), "ns/call")
	}
	b.Logf("read counter %s", st.ReadCounter)
}

// attachedProgram finds the loaded program named name (the kernel keeps 15 characters).
func attachedProgram(tb testing.TB, name string) *ebpf.Program {
	tb.Helper()
	if name == "" {
		tb.Fatal("no read counter attached")
	}
	for id := ebpf.ProgramID(0); ; {
		next, err := ebpf.ProgramGetNextID(id)
		if err != nil {
			tb.Fatalf("no loaded program %s: %v", name, err)
		}
		id = next
		p, err := ebpf.NewProgramFromID(id)
		if err != nil {
			continue
		}
		if info, err := p.Info(); err == nil && info.Name == name {
			tb.Cleanup(func() { p.Close() })
			return p
		}
		p.Close()
	}
}

// An exclusion added, or a Pod CIDR removed, while a connection is open applies to that
// connection's next message: it takes TCP (past netfilter no more), and what was moved before
// is read first. Before, sk_msg never looked at the tries: only new connections were kept out,
// and a long-lived one (a gRPC channel, a database pool) bypassed netfilter for its life.
func TestPolicyChangeReachesOpenConnections(t *testing.T) {
	b := newBed(t, true)
	moved := func(what string, c, s net.Conn) uint64 { t.Helper(); return b.moved(t, what, c, s) }
	for _, change := range []string{"B excluded", "B's Pod CIDR removed"} {
		if _, err := b.m.Apply(context.Background(), b.desired()); err != nil {
			t.Fatal(err)
		}
		n0 := b.status().Sockets
		c, s := b.pair(false)
		if n := b.settle(n0 + 2); n < n0+2 {
			t.Fatalf("%d sockets, want %d", n, n0+2)
		}
		if d := moved(change+", before", c, s); d == 0 {
			t.Fatalf("%s: nothing moved socket to socket before the change", change)
		}
		st := model.State{LocalPodCIDRs: b.pods.CIDRs, Exclude: []netip.Prefix{netip.PrefixFrom(b.pods.B4, 32)}, Classes: []model.Class{model.LocalPodToPod}}
		if change != "B excluded" {
			st = model.State{Classes: []model.Class{model.LocalPodToPod}}
			for _, p := range b.pods.CIDRs {
				if !p.Contains(b.pods.B4) {
					st.LocalPodCIDRs = append(st.LocalPodCIDRs, p)
				}
			}
		}
		if _, err := b.m.Apply(context.Background(), Render(st)); err != nil {
			t.Fatal(err)
		}
		if d := moved(change, c, s); d > 0 {
			t.Errorf("%s: the open connection still had %d bytes moved socket to socket", change, d)
		}
		c.Close()
		s.Close()
	}
}

// More prefixes than the tries hold are refused before anything is written, naming the
// fields. Before (tries of 4,096), Apply failed part way with the exclusions that sort last
// unwritten, on a live, enabled set: new connections to those Pods were moved.
func TestTooManyPrefixesChangeNothing(t *testing.T) {
	b := newBed(t, true)
	if _, err := b.m.Apply(context.Background(), b.desired()); err != nil {
		t.Fatal(err)
	}
	before := b.status()
	var ex []netip.Prefix
	for i := range 262144 {
		ex = append(ex, netip.PrefixFrom(netip.AddrFrom4([4]byte{10, byte(100 + i>>16), byte(i >> 8), byte(i)}), 32))
	}
	res, err := b.m.Apply(context.Background(), Render(model.State{LocalPodCIDRs: b.pods.CIDRs, Exclude: ex, Classes: []model.Class{model.LocalPodToPod}}))
	if err == nil || !strings.Contains(err.Error(), "node.localPodCIDRs and exclude give") || res.ElementsAdded+res.ElementsUpdated+res.ElementsRemoved != 0 {
		t.Errorf("apply of 262,146 IPv4 prefixes: %+v, %v; want refused, nothing written", res, err)
	}
	if after := b.status(); after.ProgramID != before.ProgramID {
		t.Errorf("program %d -> %d", before.ProgramID, after.ProgramID)
	}
}

// moved sends 1 MiB from c to s and returns the bytes the datapath moved socket to socket
// meanwhile.
func (b *bed) moved(t *testing.T, what string, c, s net.Conn) uint64 {
	t.Helper()
	before := b.status()
	msg := make([]byte, 1<<20)
	go c.Write(msg)
	if _, err := io.ReadFull(s, msg); err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	return b.status().Redirected.Bytes - before.Redirected.Bytes
}
