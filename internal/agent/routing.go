package agent

import (
	"context"
	"errors"
	"syscall"
	"time"

	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"
)

// watchRouting triggers a sync when a routing rule is added or deleted, or a route with an MTU
// of its own: the tc datapath keeps the FIB's answers per destination only while routing
// depends on the destination alone, which each sync decides (tc's destinationRouting). Without
// this, a rule added between syncs (a CNI's per-Pod rule) was ignored for a resync period: the
// answers another source's packets kept were used for the new rule's sources too.
func (a *Agent) watchRouting(ctx context.Context) {
	for ctx.Err() == nil {
		s, err := subscribeRouting()
		if err == nil {
			err = readRouting(ctx, s, a.Trigger)
			s.Close()
		}
		if ctx.Err() != nil {
			return
		}
		a.opts.Log.Warn("routing rule watch failed; resubscribing", "err", err)
		a.Trigger()
		select {
		case <-ctx.Done():
		case <-time.After(5 * time.Second):
		}
	}
}

// subscribeRouting opens a socket on the rule and route notifications of the calling thread's
// network namespace; its reads time out every routingPoll, so that readRouting sees ctx end.
func subscribeRouting() (*nl.NetlinkSocket, error) {
	s, err := nl.Subscribe(unix.NETLINK_ROUTE, unix.RTNLGRP_IPV4_RULE, unix.RTNLGRP_IPV6_RULE,
		unix.RTNLGRP_IPV4_ROUTE, unix.RTNLGRP_IPV6_ROUTE)
	if err != nil {
		return nil, err
	}
	if err := s.SetReceiveTimeout(&unix.Timeval{Usec: routingPoll.Microseconds()}); err != nil {
		s.Close()
		return nil, err
	}
	return s, nil
}

const routingPoll = 200 * time.Millisecond

// readRouting calls changed for every rule added or deleted and every route with an MTU added
// or deleted (and when notifications were lost), until ctx ends or the socket fails.
func readRouting(ctx context.Context, s *nl.NetlinkSocket, changed func()) error {
	for ctx.Err() == nil {
		msgs, _, err := s.Receive()
		switch {
		case errors.Is(err, unix.EAGAIN), errors.Is(err, unix.EINTR):
			continue
		case errors.Is(err, unix.ENOBUFS):
			changed()
			continue
		case err != nil:
			return err
		}
		for i := range msgs {
			if routingChange(&msgs[i]) {
				changed()
				break
			}
		}
	}
	return nil
}

// routingChange reports whether m is a rule added or deleted, or a route with an MTU of its own
// (RTA_METRICS holding RTAX_MTU).
func routingChange(m *syscall.NetlinkMessage) bool {
	switch m.Header.Type {
	case unix.RTM_NEWRULE, unix.RTM_DELRULE:
		return true
	case unix.RTM_NEWROUTE, unix.RTM_DELROUTE:
	default:
		return false
	}
	attrs, err := syscall.ParseNetlinkRouteAttr(m)
	if err != nil {
		return true // unreadable: let the sync decide
	}
	for _, a := range attrs {
		if a.Attr.Type != unix.RTA_METRICS {
			continue
		}
		metrics, err := nl.ParseRouteAttr(a.Value)
		if err != nil {
			return true
		}
		for _, mt := range metrics {
			if mt.Attr.Type == unix.RTAX_MTU {
				return true
			}
		}
	}
	return false
}
