package agent

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"testing"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/hostaccel/hostaccel/internal/config"
	"github.com/hostaccel/hostaccel/internal/datapath"
	"github.com/hostaccel/hostaccel/internal/scratchns"
	"github.com/hostaccel/hostaccel/internal/tc"
)

// vishvananda/netlink's subscription goroutine, on a Receive error (ENOBUFS: the kernel
// dropped link events), calls ErrorCallback and then closes ch. drainLinks may see either
// first; both ask for a sync, or the dropped events would wait for the resync period.
func TestBrokenLinkSubscriptionResyncs(t *testing.T) {
	a := &Agent{opts: Options{Log: slog.New(slog.NewTextHandler(io.Discard, nil))}, wake: make(chan struct{}, 1)}
	lost := 0
	for range 200 {
		ch := make(chan netlink.LinkUpdate, 64)
		errc := make(chan error, 1)
		errc <- errors.New("Receive failed: no buffer space available") // cberr(...)
		close(ch)                                                       // then defer close(ch)
		a.drainLinks(context.Background(), ch, errc)
		select {
		case <-a.wake:
		default:
			lost++
		}
	}
	if lost > 0 {
		t.Errorf("%d of 200 subscription failures asked for no sync", lost)
	}
}

// A link event of a new device that the tc datapath's gateways name prepares it (without tcx:
// its clsact qdisc, before the sync that attaches there); other devices, and any device while
// the plan runs no tc datapath, are left alone.
func TestLinkEventPreparesTCGateway(t *testing.T) {
	err := scratchns.Run(func() error {
		a := &Agent{opts: Options{Log: slog.New(slog.NewTextHandler(io.Discard, nil))}, mgrs: &datapath.Managers{TC: &tc.Manager{Mode: tc.ModeClsBPF}}}
		event := func(name string) {
			if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: name}, PeerName: name + "p"}); err != nil {
				t.Fatal(err)
			}
			l, err := netlink.LinkByName(name)
			if err != nil {
				t.Fatal(err)
			}
			a.prepareTC(netlink.LinkUpdate{Header: unix.NlMsghdr{Type: unix.RTM_NEWLINK}, Link: l})
		}
		hasQdisc := func(name string) bool {
			l, err := netlink.LinkByName(name)
			if err != nil {
				t.Fatal(err)
			}
			qs, err := netlink.QdiscList(l)
			if err != nil {
				t.Fatal(err)
			}
			for _, q := range qs {
				if q.Type() == "clsact" {
					return true
				}
			}
			return false
		}
		event("knet1") // no tc plan yet
		a.tcNode.Store(&config.Node{Gateways: []string{"antrea-gw0", "knet*"}})
		event("knet2")
		event("other0")
		for name, want := range map[string]bool{"knet1": false, "knet2": true, "other0": false} {
			if got := hasQdisc(name); got != want {
				t.Errorf("%s: clsact %v, want %v", name, got, want)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
