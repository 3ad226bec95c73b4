package nftlist

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"

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

// GenReader reads the ruleset's generation (NFT_MSG_GETGEN, over netlink: nft would list the
// whole ruleset for it) on a socket it keeps until Close. Closing a netfilter socket waits for
// the kernel to release the last transaction's old objects (an RCU grace period: 5-19 ms on
// this project's 2-core host after a rule change): a socket per reading paid it in every apply
// that read the generation after its commit. A reading from a thread in another network
// namespace than the socket's opens one there. Safe for concurrent use.
type GenReader struct {
	mu   sync.Mutex
	c    *netlink.Conn
	base Generation // c's namespace: cookie, inode; the boot
}

// Read returns the ruleset's generation in the calling thread's network namespace.
func (r *GenReader) Read(context.Context) (Generation, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.c == nil || r.base.NetNSInode != ThreadNetNSInode() {
		if err := r.dial(); err != nil {
			return Generation{}, fmt.Errorf("nftables generation: %w", err)
		}
	}
	g, err := r.getgen()
	if err != nil {
		r.closeLocked() // the next reading starts on a new socket
	}
	return g, err
}

// Close closes the socket (a later Read opens another).
func (r *GenReader) Close() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.closeLocked()
}

func (r *GenReader) closeLocked() error {
	if r.c == nil {
		return nil
	}
	err := r.c.Close()
	r.c = nil
	return err
}

// dial opens the socket in the calling thread's namespace, and notes that namespace.
func (r *GenReader) dial() error {
	r.closeLocked()
	c, err := netlink.Dial(unix.NETLINK_NETFILTER, nil)
	if err != nil {
		return err
	}
	g := Generation{Boot: BootID(), NetNSInode: ThreadNetNSInode()}
	if rc, err := c.SyscallConn(); err == nil {
		_ = rc.Control(func(fd uintptr) {
			if v, err := unix.GetsockoptUint64(int(fd), unix.SOL_SOCKET, soNetNSCookie); err == nil {
				g.NetNS = v
			}
		})
	}
	r.c, r.base = c, g
	return nil
}

// BootID is the kernel's boot id ("" when it does not tell): it changes at every boot.
func BootID() string {
	b, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}

// ThreadNetNSInode is the inode of the calling thread's network namespace (0: unknown).
func ThreadNetNSInode() uint64 {
	var st unix.Stat_t
	if unix.Stat("/proc/thread-self/ns/net", &st) != nil {
		return 0
	}
	return st.Ino
}

// getgen asks r.c's namespace for its generation.
func (r *GenReader) getgen() (Generation, error) {
	g := r.base
	msgs, err := r.c.Execute(netlink.Message{
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

// Namespace is the calling thread's network namespace and the boot, as a Generation without
// an ID: cookie (0 when the kernel does not tell), inode, boot id. It opens no netfilter
// socket (whose close waits for the kernel, GenReader).
func Namespace() Generation {
	g := Generation{Boot: BootID(), NetNSInode: ThreadNetNSInode()}
	if fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0); err == nil {
		if v, err := unix.GetsockoptUint64(fd, unix.SOL_SOCKET, soNetNSCookie); err == nil {
			g.NetNS = v
		}
		unix.Close(fd)
	}
	return g
}
