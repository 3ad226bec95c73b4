// Package nldump lists a network namespace's links, addresses and neighbours as netlink
// does, each dump read again where the kernel marks it interrupted.
package nldump

import (
	"errors"

	"github.com/vishvananda/netlink"
)

// Tries is how often Retry dumps when the kernel says the table changed during the dump
// (Pods starting and stopping).
const Tries = 10

// Retry calls dump until it returns anything but netlink's ErrDumpInterrupted, up to Tries
// times, and returns its last answer. The kernel marks a dump interrupted
// (NLM_F_DUMP_INTR) when what it lists changed meanwhile, a device added or deleted say:
// the list may lack an entry or hold one twice. During Pod churn a quarter of the link
// dumps were, and one in a hundred of the address dumps (a review), and each failed what listed
// them: an agent's sync, a tc or load balancer apply. dump starts afresh each time (what it
// appends to, it resets).
func Retry[T any](dump func() (T, error)) (T, error) {
	var v T
	var err error
	for try := 0; try < Tries; try++ {
		if v, err = dump(); !errors.Is(err, netlink.ErrDumpInterrupted) {
			break
		}
	}
	return v, err
}

// Links is netlink.LinkList, read again where interrupted.
func Links() ([]netlink.Link, error) {
	return Retry(netlink.LinkList)
}

// Addrs is netlink.AddrList of every link and family, read again where interrupted.
func Addrs() ([]netlink.Addr, error) {
	return Retry(func() ([]netlink.Addr, error) { return netlink.AddrList(nil, netlink.FAMILY_ALL) })
}

// Neighs is netlink.NeighList of the link with index linkIndex, every family, read again
// where interrupted.
func Neighs(linkIndex int) ([]netlink.Neigh, error) {
	return Retry(func() ([]netlink.Neigh, error) { return netlink.NeighList(linkIndex, netlink.FAMILY_ALL) })
}
