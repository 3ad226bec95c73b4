// Package testbed builds network-namespace topologies for integration tests
// and benchmarks and moves real traffic through them.
//
// Everything is created inside namespaces owned by this process: links are
// created directly in their target namespaces, so nothing ever appears in the
// root namespace, and deleting the namespaces removes everything. Namespace
// names start with NamePrefix(), which is unique per process.
package testbed

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

var (
	prefix = func() string {
		const digits = "0123456789abcdefghijklmnopqrstuvwxyz"
		b := make([]byte, 4)
		rand.Read(b)
		for i := range b {
			b[i] = digits[int(b[i])%len(digits)]
		}
		return "ha" + string(b)
	}()
	seq atomic.Uint32
)

// NamePrefix returns the prefix of every namespace created by this process
// ("ha" plus four random characters).
func NamePrefix() string { return prefix }

// RequireRoot skips the test unless running as root. With
// HOSTACCEL_REQUIRE_ROOT=1 in the environment it fails the test instead.
func RequireRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() == 0 {
		return
	}
	if os.Getenv("HOSTACCEL_REQUIRE_ROOT") == "1" {
		t.Fatal("root required (HOSTACCEL_REQUIRE_ROOT=1)")
	}
	t.Skip("root required")
}

// Skip skips t for reason, or fails it where the environment variable require is 1: the test
// suite's way of saying that this machine must run it (scripts/test.sh sets them).
func Skip(t testing.TB, require, reason string) {
	t.Helper()
	if os.Getenv(require) == "1" {
		t.Fatalf("%s (%s=1)", reason, require)
	}
	t.Skip(reason)
}

// RequireTC is the variable that makes the tc datapath's tests fail, not skip, on a kernel
// that cannot run it.
const RequireTC = "HOSTACCEL_REQUIRE_TC"

// NS is a named network namespace (as by "ip netns add"). Close deletes it
// together with everything inside, and closes servers started by its Listen
// methods.
type NS struct {
	Name string

	fd      netns.NsHandle
	mu      sync.Mutex
	handle  *netlink.Handle
	closers []io.Closer
	closed  bool
}

// NewNS creates a namespace named NamePrefix()+<seq>+"-"+role, with lo up.
func NewNS(role string) (*NS, error) {
	name := fmt.Sprintf("%s%d-%s", prefix, seq.Add(1), role)
	if out, err := exec.Command("ip", "netns", "add", name).CombinedOutput(); err != nil {
		return nil, fmt.Errorf("ip netns add %s: %w: %s", name, err, strings.TrimSpace(string(out)))
	}
	n := &NS{Name: name, fd: netns.None()}
	fd, err := netns.GetFromName(name)
	if err != nil {
		n.Close()
		return nil, fmt.Errorf("open netns %s: %w", name, err)
	}
	n.fd = fd
	if err := n.LinkUp("lo"); err != nil {
		n.Close()
		return nil, err
	}
	return n, nil
}

// Close closes tracked servers and the netlink handle and deletes the
// namespace. It is safe to call more than once.
func (n *NS) Close() error {
	n.mu.Lock()
	if n.closed {
		n.mu.Unlock()
		return nil
	}
	n.closed = true
	closers, h := n.closers, n.handle
	n.closers, n.handle = nil, nil
	n.mu.Unlock()

	var errs []error
	for i := len(closers) - 1; i >= 0; i-- {
		if err := closers[i].Close(); err != nil && !errors.Is(err, net.ErrClosed) {
			errs = append(errs, err)
		}
	}
	if h != nil {
		h.Close()
	}
	if n.fd.IsOpen() {
		n.fd.Close()
	}
	if out, err := exec.Command("ip", "netns", "del", n.Name).CombinedOutput(); err != nil {
		errs = append(errs, fmt.Errorf("ip netns del %s: %w: %s", n.Name, err, strings.TrimSpace(string(out))))
	}
	return errors.Join(errs...)
}

func (n *NS) track(c io.Closer) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.closed {
		return fmt.Errorf("netns %s: closed", n.Name)
	}
	n.closers = append(n.closers, c)
	return nil
}

// Exec runs "ip netns exec <ns> args..." and returns its combined output.
// The error includes the output.
func (n *NS) Exec(args ...string) (string, error) {
	return n.Output(context.Background(), "", args...)
}

// Do runs fn on a locked OS thread switched into the namespace and switches
// the thread back afterwards. Sockets created by fn stay in the namespace.
// fn runs on a separate goroutine, so it must not call t.FailNow.
func (n *NS) Do(fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := netns.Get()
		if err != nil {
			runtime.UnlockOSThread()
			errc <- err
			return
		}
		defer orig.Close()
		if err := netns.Set(n.fd); err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("setns %s: %w", n.Name, err)
			return
		}
		err = fn()
		if rerr := netns.Set(orig); rerr != nil {
			// Leave the thread locked: the runtime discards it when this
			// goroutine exits.
			errc <- errors.Join(err, fmt.Errorf("restore netns: %w", rerr))
			return
		}
		runtime.UnlockOSThread()
		errc <- err
	}()
	return <-errc
}

// Sysctl writes val to /proc/sys/<key> inside the namespace. Dots in key
// separate path components (net.ipv4.ip_forward); a key containing '/' is
// used as a path as is.
func (n *NS) Sysctl(key, val string) error {
	if !strings.Contains(key, "/") {
		key = strings.ReplaceAll(key, ".", "/")
	}
	return n.Do(func() error {
		return os.WriteFile("/proc/sys/"+key, []byte(val), 0)
	})
}

// Handle returns a netlink handle bound to the namespace. It is owned by n and
// closed by n.Close; callers must not close it.
func (n *NS) Handle() (*netlink.Handle, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.closed {
		return nil, fmt.Errorf("netns %s: closed", n.Name)
	}
	if n.handle == nil {
		h, err := netlink.NewHandleAt(n.fd, unix.NETLINK_ROUTE) // route only: the VM kernel has no xfrm_user
		if err != nil {
			return nil, fmt.Errorf("netlink handle %s: %w", n.Name, err)
		}
		n.handle = h
	}
	return n.handle, nil
}

// Veth creates a veth pair with end aName in a and end bName in b and sets
// both ends up. The pair never exists in the root namespace.
func Veth(a *NS, aName string, b *NS, bName string) error {
	h, err := a.Handle()
	if err != nil {
		return err
	}
	v := &netlink.Veth{
		LinkAttrs:     netlink.LinkAttrs{Name: aName},
		PeerName:      bName,
		PeerNamespace: netlink.NsFd(b.fd),
	}
	if err := h.LinkAdd(v); err != nil {
		return fmt.Errorf("veth %s/%s - %s/%s: %w", a.Name, aName, b.Name, bName, err)
	}
	if err := a.LinkUp(aName); err != nil {
		return err
	}
	return b.LinkUp(bName)
}

// Link returns link dev of the namespace.
func (n *NS) Link(dev string) (netlink.Link, error) {
	_, l, err := n.link(dev)
	return l, err
}

// link returns link dev with the handle that found it.
func (n *NS) link(dev string) (*netlink.Handle, netlink.Link, error) {
	h, err := n.Handle()
	if err != nil {
		return nil, nil, err
	}
	l, err := h.LinkByName(dev)
	if err != nil {
		return nil, nil, fmt.Errorf("%s: link %s: %w", n.Name, dev, err)
	}
	return h, l, nil
}

// LinkT returns the attributes of link dev in n as the kernel reports them
// now (index, counters such as Statistics.RxPackets), failing tb if the link
// cannot be read.
func LinkT(tb testing.TB, n *NS, dev string) *netlink.LinkAttrs {
	tb.Helper()
	l, err := n.Link(dev)
	if err != nil {
		tb.Fatal(err)
	}
	return l.Attrs()
}

// LinkUp sets link dev up.
func (n *NS) LinkUp(dev string) error {
	h, l, err := n.link(dev)
	if err != nil {
		return err
	}
	if err := h.LinkSetUp(l); err != nil {
		return fmt.Errorf("%s: link %s up: %w", n.Name, dev, err)
	}
	return nil
}

// AddrAdd adds addresses (with their prefix length) to link dev. IPv6
// addresses are added with nodad, so they are usable at once.
func (n *NS) AddrAdd(dev string, addrs ...netip.Prefix) error {
	h, l, err := n.link(dev)
	if err != nil {
		return err
	}
	for _, p := range addrs {
		a := &netlink.Addr{IPNet: ipNet(p)}
		if p.Addr().Is6() {
			a.Flags = unix.IFA_F_NODAD
		}
		if err := h.AddrAdd(l, a); err != nil {
			return fmt.Errorf("%s: addr add %s dev %s: %w", n.Name, p, dev, err)
		}
	}
	return nil
}

// RouteAdd adds a route to dst via gateway gw.
func (n *NS) RouteAdd(dst netip.Prefix, gw netip.Addr) error {
	h, err := n.Handle()
	if err != nil {
		return err
	}
	r := &netlink.Route{Dst: ipNet(dst.Masked()), Gw: gw.AsSlice()}
	if err := h.RouteAdd(r); err != nil {
		return fmt.Errorf("%s: route add %s via %s: %w", n.Name, dst, gw, err)
	}
	return nil
}

func ipNet(p netip.Prefix) *net.IPNet {
	return &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}
}
