package agent

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/hostaccel/hostaccel/internal/config"
	"github.com/hostaccel/hostaccel/internal/datapath"
	"github.com/hostaccel/hostaccel/internal/flowtable"
	"github.com/hostaccel/hostaccel/internal/testbed"
)

// Pod churn (veths created and deleted) while a sync lists the links: the kernel marks the
// dump interrupted (netlink's ErrDumpInterrupted), and Links reads it again. The sync failed
// on it (28 of 100 syncs).
func TestLinkDumpInterruptedIsReadAgain(t *testing.T) {
	testbed.RequireRoot(t)
	ns, err := testbed.NewNS("dumpintr")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ns.Close() })
	h, err := ns.Handle()
	if err != nil {
		t.Fatal(err)
	}
	for i := range 150 {
		if err := h.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: fmt.Sprintf("v%d", i)}, PeerName: fmt.Sprintf("p%d", i)}); err != nil {
			t.Fatal(err)
		}
	}
	h.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "gw"}, PeerName: "gwp"})
	h.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "eth0"}, PeerName: "eth0p"})
	h.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "eth1"}, PeerName: "eth1p"})
	stop, done := make(chan struct{}), make(chan struct{})
	var churned atomic.Int64
	go func() { // Pods come and go
		defer close(done)
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			name := fmt.Sprintf("c%d", i%4)
			h.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: name}, PeerName: name + "p"})
			if l, err := h.LinkByName(name); err == nil {
				h.LinkDel(l)
			}
			churned.Add(1)
		}
	}()
	path := filepath.Join(t.TempDir(), "c.yaml")
	os.WriteFile(path, []byte(cfgText), 0o644)
	ft, _ := flowtable.NewFakeManager()
	var links func() ([]config.Link, error)
	a, err := New(Options{ConfigPath: path, Probe: caps(true), Log: slog.New(slog.NewTextHandler(io.Discard, nil)),
		Links: func() ([]config.Link, error) { return links() }}, &datapath.Managers{Flowtable: ft})
	if err != nil {
		t.Fatal(err)
	}
	failed, interrupted := 0, 0
	err = ns.Do(func() error {
		links = Links
		for range 100 {
			if err := a.Sync(context.Background()); err != nil {
				failed++
				if errors.Is(err, netlink.ErrDumpInterrupted) {
					interrupted++
				}
			}
			time.Sleep(5 * time.Millisecond)
		}
		return nil
	})
	close(stop)
	<-done
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("100 syncs during %d link add/delete cycles: %d failed, %d of them on an interrupted link dump; state: %d sync errors, last %q",
		churned.Load(), failed, interrupted, a.State().SyncErrors, a.State().LastError)
	if interrupted > 0 {
		t.Errorf("%d syncs failed because a link dump was interrupted by Pod churn", interrupted)
	}
}
