// Package linklist lists a network namespace's links as netlink does, read again where the
// kernel marks the dump interrupted.
package linklist

import (
	"errors"

	"github.com/vishvananda/netlink"
)

// tries is how often List dumps the links when the kernel says a device came or went during
// the dump (Pods starting and stopping).
const tries = 10

// List is netlink.LinkList, read again up to 10 times where the kernel marks the dump
// interrupted (a device added or deleted meanwhile: the list may lack one or hold one twice,
// and netlink says ErrDumpInterrupted). During Pod churn a quarter of the dumps were, and
// each failed what listed them: an agent's sync, a tc or load balancer apply.
func List() ([]netlink.Link, error) {
	var ls []netlink.Link
	var err error
	for try := 0; try < tries; try++ {
		if ls, err = netlink.LinkList(); !errors.Is(err, netlink.ErrDumpInterrupted) {
			break
		}
	}
	return ls, err
}
