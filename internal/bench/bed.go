package bench

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/hostaccel/hostaccel/internal/testbed"
)

// RecordDir holds one file per running bench process, listing the namespaces it created, so
// that a run killed before its teardown (SIGKILL, a second Ctrl-C) is cleaned up by the next.
var RecordDir = "/run/hostaccel-bench"

// Bed is a built Plan: its namespaces and the processes started in them. Close removes all
// of it; it is safe to call more than once and on a partly built Bed.
type Bed struct {
	Plan Plan

	mu        sync.Mutex
	ns        map[string]*testbed.NS
	order     []string
	pids      []int
	record    string
	closeOnce sync.Once
}

// NS returns the namespace of a role (nil if the plan has none).
func (b *Bed) NS(role string) *testbed.NS {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.ns[role]
}

// Names returns the namespace names, in creation order.
func (b *Bed) Names() []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	var out []string
	for _, r := range b.order {
		out = append(out, b.ns[r].Name)
	}
	return out
}

// PIDs returns the process ids of the processes started with Start.
func (b *Bed) PIDs() []int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return slices.Clone(b.pids)
}

// Build creates everything in p. On error or cancellation everything created so far is
// removed before it returns.
func Build(ctx context.Context, p Plan) (_ *Bed, err error) {
	if err := p.Validate(); err != nil {
		return nil, err
	}
	CleanStale()
	b := &Bed{Plan: p, ns: map[string]*testbed.NS{}}
	defer func() {
		if err != nil {
			err = errors.Join(err, b.Close())
		}
	}()
	if err := b.openRecord(); err != nil {
		return nil, err
	}
	step := func(what string, fn func() error) error {
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("build: %w", err)
		}
		if err := fn(); err != nil {
			return fmt.Errorf("build: %s: %w", what, err)
		}
		return nil
	}
	for _, s := range p.Namespaces {
		if err := step("namespace "+s.Role, func() error { return b.addNS(s) }); err != nil {
			return nil, err
		}
	}
	for _, br := range p.Bridges {
		if err := step("bridge "+br.Name, func() error { return b.addBridge(br) }); err != nil {
			return nil, err
		}
	}
	for _, l := range p.Links {
		if err := step(fmt.Sprintf("link %s/%s-%s/%s", l.A, l.AName, l.B, l.BName), func() error { return b.addLink(l) }); err != nil {
			return nil, err
		}
	}
	for _, a := range p.Addrs {
		if err := step(fmt.Sprintf("address %s on %s/%s", a.Prefix, a.Role, a.Dev), func() error { return b.ns[a.Role].AddrAdd(a.Dev, a.Prefix) }); err != nil {
			return nil, err
		}
	}
	for _, r := range p.Routes {
		if err := step(fmt.Sprintf("route %s via %s in %s", r.Dst, r.Via, r.Role), func() error { return b.ns[r.Role].RouteAdd(r.Dst, r.Via) }); err != nil {
			return nil, err
		}
	}
	for _, c := range p.Checks {
		if err := step(fmt.Sprintf("check %s -> %s (%s)", c.From, c.To, c.Addr), func() error { return b.check(ctx, c) }); err != nil {
			return nil, err
		}
	}
	return b, nil
}

func (b *Bed) addNS(s NSSpec) error {
	n, err := testbed.NewNS(s.Role)
	if err != nil {
		return err
	}
	b.mu.Lock()
	b.ns[s.Role] = n
	b.order = append(b.order, s.Role)
	b.mu.Unlock()
	if err := b.writeRecord(); err != nil {
		return err
	}
	fwd := "0"
	if s.Forward {
		fwd = "1"
	}
	// IPv4 only: no IPv6 on any link, so neither router solicitations nor MLD reports show
	// up in the counters that prove which path the traffic took.
	for _, kv := range [][2]string{
		{"net.ipv6.conf.all.disable_ipv6", "1"},
		{"net.ipv6.conf.default.disable_ipv6", "1"},
		{"net.ipv4.ip_forward", fwd},
		{"net.ipv4.conf.all.rp_filter", "0"},
		{"net.ipv4.conf.default.rp_filter", "0"},
		{"net.ipv4.ip_local_port_range", "10000 64999"},
		{"net.ipv4.tcp_tw_reuse", "1"},
		// No TIME_WAIT sockets: TCP_CRR leaves tens of thousands, and a later cell whose
		// connections share the server's side of the tuple (Pod-to-Service after
		// Pod-to-Pod; masqueraded NodePort clients) stalls on them for a second each.
		{"net.ipv4.tcp_max_tw_buckets", "0"},
	} {
		if err := n.Sysctl(kv[0], kv[1]); err != nil {
			return err
		}
	}
	return nil
}

func (b *Bed) addBridge(br BridgeSpec) error {
	h, err := b.ns[br.Role].Handle()
	if err != nil {
		return err
	}
	if err := h.LinkAdd(&netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: br.Name}}); err != nil {
		return err
	}
	return b.ns[br.Role].LinkUp(br.Name)
}

func (b *Bed) addLink(l LinkSpec) error {
	if err := testbed.Veth(b.ns[l.A], l.AName, b.ns[l.B], l.BName); err != nil {
		return err
	}
	if l.Master == "" {
		return nil
	}
	h, err := b.ns[l.B].Handle()
	if err != nil {
		return err
	}
	port, err := h.LinkByName(l.BName)
	if err != nil {
		return err
	}
	br, err := h.LinkByName(l.Master)
	if err != nil {
		return err
	}
	return h.LinkSetMasterByIndex(port, br.Attrs().Index)
}

// check connects over TCP until it works or 10 s pass.
func (b *Bed) check(ctx context.Context, c CheckSpec) error {
	srv, err := b.ns[c.To].ListenTCP(netip.AddrPortFrom(c.Addr, 0).String())
	if err != nil {
		return err
	}
	defer srv.Close()
	deadline := time.Now().Add(10 * time.Second)
	for {
		conn, err := b.ns[c.From].DialTCP("", srv.Addr().String())
		if err == nil {
			return conn.Close()
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("not reachable: %w", err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// Start runs args inside the namespace of role until Close (or until it exits). It runs in
// its own process group, which Close kills.
func (b *Bed) Start(role string, args ...string) error {
	n := b.NS(role)
	if n == nil {
		return fmt.Errorf("start %s: no namespace %q", args[0], role)
	}
	p, err := n.Start(args...)
	if err != nil {
		return fmt.Errorf("start in %s: %w", role, err)
	}
	b.mu.Lock()
	b.pids = append(b.pids, p.PID())
	b.mu.Unlock()
	return nil
}

// Close deletes the namespaces (killing the processes started in them, and with them every
// link, address, route and nft table inside) and removes the record. Calls after the first
// return nil.
func (b *Bed) Close() (err error) {
	b.closeOnce.Do(func() {
		b.mu.Lock()
		order := b.order
		b.mu.Unlock()
		var errs []error
		for i := len(order) - 1; i >= 0; i-- {
			if err := b.ns[order[i]].Close(); err != nil {
				errs = append(errs, err)
			}
		}
		if b.record != "" && len(errs) == 0 {
			if err := os.Remove(b.record); err != nil && !errors.Is(err, os.ErrNotExist) {
				errs = append(errs, err)
			}
		}
		err = errors.Join(errs...)
	})
	return err
}

func (b *Bed) openRecord() error {
	if err := os.MkdirAll(RecordDir, 0o755); err != nil {
		return fmt.Errorf("record dir: %w", err)
	}
	f, err := os.CreateTemp(RecordDir, strconv.Itoa(os.Getpid())+".*")
	if err != nil {
		return fmt.Errorf("record: %w", err)
	}
	b.record = f.Name()
	return f.Close()
}

func (b *Bed) writeRecord() error {
	return os.WriteFile(b.record, []byte(strings.Join(b.Names(), "\n")+"\n"), 0o644)
}

// CleanStale deletes the namespaces recorded by bench processes that no longer run.
func CleanStale() {
	files, _ := filepath.Glob(filepath.Join(RecordDir, "*.*"))
	for _, f := range files {
		pid, err := strconv.Atoi(strings.SplitN(filepath.Base(f), ".", 2)[0])
		if err != nil || pid == os.Getpid() || syscall.Kill(pid, 0) != syscall.ESRCH {
			continue
		}
		data, _ := os.ReadFile(f)
		for name := range strings.FieldsSeq(string(data)) {
			if _, err := os.Stat(filepath.Join("/run/netns", name)); err == nil {
				_ = exec.Command("ip", "netns", "del", name).Run()
			}
		}
		_ = os.Remove(f)
	}
}
