package agent

import (
	"context"
	"errors"
	"os"
	"slices"
	"strings"
	"syscall"
	"time"
	"unsafe"

	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"
)

// watchRouting triggers a sync when a routing rule is added or deleted, or a route the tc
// datapath's kept answers depend on (routingChange): the tc datapath keeps the FIB's answers per destination only while routing
// depends on the destination alone, which each sync decides (tc's destinationRouting). Without
// this, a rule added between syncs (a CNI's per-Pod rule) was ignored for a resync period: the
// answers another source's packets kept were used for the new rule's sources too.
func (a *Agent) watchRouting(ctx context.Context) {
	for ctx.Err() == nil {
		s, err := subscribeRouting()
		if err == nil {
			err = readRouting(ctx, s, a.Trigger, a.tcServes)
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

// readRouting calls changed for every rule added or deleted and every route added or deleted
// that routingChange names (and when notifications were lost), until ctx ends or the socket
// fails.
func readRouting(ctx context.Context, s *nl.NetlinkSocket, changed func(), serves func(fam uint8) bool) error {
	for ctx.Err() == nil {
		msgs, _, err := s.Receive()
		// forwarding is read at most once per family and batch, and only for a family the tc
		// datapath serves (a BGP daemon loading a table sends a million route messages)
		off := map[uint8]bool{}
		sendsByRoute := func(fam uint8) bool {
			v, ok := off[fam]
			if !ok {
				v = serves(fam) && forwardingOff(fam)
				off[fam] = v
			}
			return v
		}
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
			if routingChange(&msgs[i], sendsByRoute) {
				changed()
				break
			}
		}
	}
	return nil
}

// routingChange reports whether m is a rule added or deleted, or a main-table route added or
// deleted that the tc datapath's way of keeping FIB answers depends on (tc's parseRoute reads
// the main table only): one with an MTU of its own (RTA_METRICS holding RTAX_MTU), a TOS
// selector, a source prefix (IPv6 `from`) or several next hops (RTA_MULTIPATH); or a unicast
// route, not a link-local one, of a family for which sendsByRoute (the tc datapath serves
// it and its forwarding is off: the program sends by the route device the agent computed for
// each CIDR at the last sync). (Before, only rules and MTU routes made a sync: the others were
// followed a resync period late.)
func routingChange(m *syscall.NetlinkMessage, sendsByRoute func(fam uint8) bool) bool {
	switch m.Header.Type {
	case unix.RTM_NEWRULE, unix.RTM_DELRULE:
		return true
	case unix.RTM_NEWROUTE, unix.RTM_DELROUTE:
	default:
		return false
	}
	if len(m.Data) < unix.SizeofRtMsg {
		return true // unreadable: let the sync decide
	}
	rt := (*unix.RtMsg)(unsafe.Pointer(&m.Data[0]))
	if rt.Flags&unix.RTM_F_CLONED != 0 {
		return false // a cached route (an exception: PMTU, redirect), not the table's
	}
	attrs, err := syscall.ParseNetlinkRouteAttr(m)
	if err != nil {
		return true
	}
	table := uint32(rt.Table)
	var dst []byte
	specific := rt.Tos != 0 || rt.Src_len != 0
	for _, a := range attrs {
		switch a.Attr.Type {
		case unix.RTA_TABLE:
			if len(a.Value) >= 4 {
				table = *(*uint32)(unsafe.Pointer(&a.Value[0]))
			}
		case unix.RTA_DST:
			dst = a.Value
		case unix.RTA_MULTIPATH:
			specific = true
		case unix.RTA_METRICS:
			metrics, err := nl.ParseRouteAttr(a.Value)
			if err != nil {
				return true
			}
			for _, mt := range metrics {
				specific = specific || mt.Attr.Type == unix.RTAX_MTU
			}
		}
	}
	if table != unix.RT_TABLE_MAIN {
		return false
	}
	if specific {
		return true
	}
	linkLocal := len(dst) == 16 && dst[0] == 0xfe && dst[1]&0xc0 == 0x80
	return rt.Type == unix.RTN_UNICAST && !linkLocal && sendsByRoute(rt.Family)
}

// forwardingOff reports whether forwarding is off for family fam in this network namespace
// (read per batch of route events: forwarding may be switched at any time). Unreadable: off
// (a sync too many costs less than a route device missed).
var forwardingOff = func(fam uint8) bool {
	path := "/proc/sys/net/ipv4/conf/all/forwarding"
	if fam == unix.AF_INET6 {
		path = "/proc/sys/net/ipv6/conf/all/forwarding"
	}
	b, err := os.ReadFile(path)
	return err != nil || strings.TrimSpace(string(b)) == "0"
}

// tcServes reports whether the tc datapath of the last sync serves family fam: its node has
// a Pod CIDR of that family.
func (a *Agent) tcServes(fam uint8) bool {
	n := a.tcNode.Load()
	if n == nil {
		return false
	}
	for _, c := range slices.Concat(n.LocalPodCIDRs, n.PeerPodCIDRs) {
		if strings.Contains(c, ":") == (fam == unix.AF_INET6) {
			return true
		}
	}
	return false
}
