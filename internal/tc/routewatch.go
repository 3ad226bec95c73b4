package tc

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"
)

// routeWatch keeps the main table's routes from one Apply of a long-running Manager (the
// agent's) to the next while the kernel has announced nothing that could change them: at
// 10,000 peer Pod CIDRs their listing was a quarter of a sync's CPU (~5 ms), for a change of
// one CIDR in the config (issue 13).
//
// A socket joined to the kernel's route, address, link, rule and nexthop groups is the
// announcement: each Apply drains it, without blocking, before it decides, so whatever the
// kernel announced before that moment is seen. Links and addresses are there because IPv4
// drops the routes of a device that goes down without a route notification, nexthops because
// a route through a nexthop object changes with it silently. Only "something was announced"
// matters, so the socket's buffer is small: a burst overflows it, and a loss counts as a
// change too. A socket that fails makes every Apply list again. And an Apply that reads the
// maps whole (FullEvery) lists the routes whatever the socket says: the periodic resync
// repairs anything missed.
type routeWatch struct {
	mu       sync.Mutex
	s        *nl.NetlinkSocket // nil: closed or failed
	buf      []byte
	valid    bool
	routes   []route // read-only once kept: Applies share it
	specific bool    // a route depends on more than the destination (parseRoute)
	listed   int     // listings taken (tests)
}

// routeGroups are the multicast groups whose notifications void a listing.
var routeGroups = []uint{unix.RTNLGRP_IPV4_ROUTE, unix.RTNLGRP_IPV6_ROUTE, unix.RTNLGRP_LINK,
	unix.RTNLGRP_IPV4_IFADDR, unix.RTNLGRP_IPV6_IFADDR, unix.RTNLGRP_IPV4_RULE,
	unix.RTNLGRP_IPV6_RULE, unix.RTNLGRP_NEXTHOP}

// WatchRoutes makes the Manager keep its route listing from one Apply to the next while the
// kernel (the calling thread's network namespace) announces no change that could touch it,
// until ctx ends. For a long-running caller (the agent); the first call decides, later ones
// do nothing. On error the Manager lists the routes at every Apply, as without the watch.
func (m *Manager) WatchRoutes(ctx context.Context) error {
	if m.routes != nil {
		return nil
	}
	w := &routeWatch{buf: make([]byte, 8192)}
	m.routes = w // (without a socket, when the next lines fail: every Apply lists)
	s, err := nl.Subscribe(unix.NETLINK_ROUTE, routeGroups...)
	if err != nil {
		return fmt.Errorf("tc: watching routes: %w", err)
	}
	// the kernel's least (it doubles what it is given): a few notifications fill it
	if err := unix.SetsockoptInt(int(s.GetFd()), unix.SOL_SOCKET, unix.SO_RCVBUF, 1024); err != nil {
		s.Close()
		return fmt.Errorf("tc: watching routes: %w", err)
	}
	w.s = s
	go func() {
		<-ctx.Done()
		w.mu.Lock()
		defer w.mu.Unlock()
		w.close()
	}()
	return nil
}

func (w *routeWatch) close() {
	if w.s != nil {
		w.s.Close()
		w.s = nil
	}
}

// announced drains the socket and reports whether the kernel announced anything (or some
// announcements were lost, or the socket failed) since the last call. w.mu held.
func (w *routeWatch) announced() bool {
	if w.s == nil {
		return true
	}
	seen := false
	for {
		n, _, err := unix.Recvfrom(int(w.s.GetFd()), w.buf, unix.MSG_DONTWAIT)
		switch {
		case err == nil && n > 0, errors.Is(err, unix.ENOBUFS):
			seen = true
		case err == nil, errors.Is(err, unix.EAGAIN):
			return seen
		case errors.Is(err, unix.EINTR):
		default:
			w.close()
			return true
		}
	}
}

// list returns the main table's routes (mainRoutes): the kept listing when the kernel
// announced nothing since it was taken and fresh is false, else a new one.
func (w *routeWatch) list(fresh bool) ([]route, bool, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if changed := w.announced(); w.valid && !fresh && !changed {
		return w.routes, w.specific, nil
	}
	routes, specific, err := mainRoutes()
	w.listed++
	if err != nil {
		w.valid = false
		return nil, false, err
	}
	w.routes, w.specific, w.valid = routes, specific, true
	return routes, specific, nil
}
