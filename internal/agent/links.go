package agent

import (
	"errors"
	"net"

	"github.com/vishvananda/netlink"

	"github.com/hostaccel/hostaccel/internal/config"
)

// linkDumpTries is how often Links lists the links again when the kernel says a device came or
// went during the dump (Pods starting and stopping).
const linkDumpTries = 10

// Links lists this network namespace's interfaces for config resolution. A dump the kernel
// marks interrupted (a device added or deleted meanwhile: the list may lack one or hold one
// twice) is read again, up to linkDumpTries times: during Pod churn a quarter of the dumps
// were, and each failed its sync.
func Links() ([]config.Link, error) {
	var ls []netlink.Link
	var err error
	for try := 0; try < linkDumpTries; try++ {
		if ls, err = netlink.LinkList(); !errors.Is(err, netlink.ErrDumpInterrupted) {
			break
		}
	}
	if err != nil {
		return nil, err
	}
	out := make([]config.Link, 0, len(ls))
	for _, l := range ls {
		a := l.Attrs()
		out = append(out, config.Link{
			Name:     a.Name,
			Index:    a.Index,
			Up:       a.Flags&net.FlagUp != 0,
			Loopback: a.Flags&net.FlagLoopback != 0,
		})
	}
	return out, nil
}
