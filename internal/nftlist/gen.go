package nftlist

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// Generation is the nftables ruleset's generation in the calling thread's network
// namespace: the kernel counts every transaction that changed something (any table, by
// anyone; nothing else changes the ruleset, except the entries the datapath adds to dynamic
// sets and that time out), so an unchanged generation means an unchanged ruleset.
type Generation struct {
	ID uint32
	// NetNS is the namespace's cookie: unique for the boot, never reused (Linux 5.14 and
	// later; 0 when the kernel does not tell). NetNSInode is its inode (reused once it is
	// gone: a name for files, not an identity).
	NetNS, NetNSInode uint64
	// Boot is the kernel's boot id: cookies and generations start over at every boot.
	Boot string
}

// soNetNSCookie is SO_NETNS_COOKIE (asm-generic; golang.org/x/sys has it for a few
// architectures only).
const soNetNSCookie = 71

// GetGeneration asks the kernel for the ruleset's generation (NFT_MSG_GETGEN), over
// netlink: nft would list the whole ruleset for it.
func GetGeneration(context.Context) (Generation, error) {
	var g Generation
	c, err := netlink.Dial(unix.NETLINK_NETFILTER, nil)
	if err != nil {
		return g, fmt.Errorf("nftables generation: %w", err)
	}
	defer c.Close()
	if b, err := os.ReadFile("/proc/sys/kernel/random/boot_id"); err == nil {
		g.Boot = strings.TrimSpace(string(b))
	}
	var st unix.Stat_t
	if unix.Stat("/proc/thread-self/ns/net", &st) == nil {
		g.NetNSInode = st.Ino
	}
	if rc, err := c.SyscallConn(); err == nil {
		_ = rc.Control(func(fd uintptr) {
			if v, err := unix.GetsockoptUint64(int(fd), unix.SOL_SOCKET, soNetNSCookie); err == nil {
				g.NetNS = v
			}
		})
	}
	msgs, err := c.Execute(netlink.Message{
		Header: netlink.Header{Type: netlink.HeaderType(unix.NFNL_SUBSYS_NFTABLES<<8 | unix.NFT_MSG_GETGEN), Flags: netlink.Request},
		Data:   []byte{unix.AF_UNSPEC, unix.NFNETLINK_V0, 0, 0}, // nfgenmsg
	})
	if err != nil {
		return g, fmt.Errorf("nftables generation: %w", err)
	}
	for _, m := range msgs {
		if m.Header.Type != netlink.HeaderType(unix.NFNL_SUBSYS_NFTABLES<<8|unix.NFT_MSG_NEWGEN) || len(m.Data) < 4 {
			continue
		}
		ad, err := netlink.NewAttributeDecoder(m.Data[4:])
		if err != nil {
			return g, fmt.Errorf("nftables generation: %w", err)
		}
		ad.ByteOrder = binary.BigEndian
		for ad.Next() {
			if ad.Type() == unix.NFTA_GEN_ID {
				g.ID = ad.Uint32()
				return g, ad.Err()
			}
		}
	}
	return g, errors.New("nftables generation: no answer from the kernel")
}

// Next is the generation after one more change (the kernel skips 0).
func (g Generation) Next() Generation {
	g.ID++
	if g.ID == 0 {
		g.ID = 1
	}
	return g
}
