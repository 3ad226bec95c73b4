package agent

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"testing"

	"github.com/vishvananda/netlink"
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
