package agent

import (
	"net"

	"github.com/hostaccel/hostaccel/internal/config"
	"github.com/hostaccel/hostaccel/internal/nldump"
)

// Links lists this network namespace's interfaces for config resolution (a dump interrupted
// by a device coming or going is read again: nldump).
func Links() ([]config.Link, error) {
	ls, err := nldump.Links()
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
