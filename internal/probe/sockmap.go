package probe

import (
	"context"
	"errors"
	"fmt"
	"net"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/hostaccel/hostaccel/internal/scratchns"
	"github.com/hostaccel/hostaccel/internal/sockmap"
)

// SockMapFIONREAD: ioctl(FIONREAD) on a socket counts the data an sk_msg program moved to it
// (kernel fix 929e30f93125: 6.6.128+, 6.12.75+). Without it programs that size their reads
// with FIONREAD (nginx, Java, .NET) can hang on sockmap-accelerated connections, so auto does
// not pick the sockmap datapath.
const SockMapFIONREAD = "sockmap_fionread"

// SockMapBound: a program counting what receivers read can be attached (fexit on
// tcp_bpf_recvmsg, or the sock_recv_length raw tracepoint), which the sockmap datapath needs
// to bound the data a receiving socket holds unread. Without it the datapath works unbounded.
const SockMapBound = "sockmap_bound"

func probeSockmapBound() Feature {
	var hook string
	err := try(func() (err error) { hook, err = sockmap.ProbeReadCounter(); return })
	f := feature(SockMapBound, err, "needs fentry/fexit programs (BTF, CONFIG_DYNAMIC_FTRACE_WITH_DIRECT_CALLS) or the sock_recv_length tracepoint (Linux >= 6.3); without it the sockmap datapath does not bound what a stalled reader holds")
	if err == nil {
		f.Detail = hook
	}
	return f
}

// probeSockmapFIONREAD tries it in a throwaway network namespace: a TCP connection over its
// loopback, both sockets in a sockmap whose sk_msg program moves the client's messages to
// the server socket's receive queue, then FIONREAD on the server socket.
func probeSockmapFIONREAD(ctx context.Context) Feature {
	done := make(chan error, 1)
	go func() {
		var err error
		if terr := scratchns.Run(func() error { err = try(sockmapFIONREADHere); return nil }); terr != nil {
			err = fmt.Errorf("throwaway network namespace: %w", terr)
		}
		done <- err
	}()
	select {
	case err := <-done:
		return feature(SockMapFIONREAD, err, "needs kernel fix 929e30f93125 (6.6.128+, 6.12.75+); auto keeps local-pod-to-pod off sockmap")
	case <-ctx.Done():
		return feature(SockMapFIONREAD, ctx.Err(), "")
	}
}

func sockmapFIONREADHere() error {
	removeMemlock()
	lo, err := netlink.LinkByName("lo")
	if err == nil {
		err = netlink.LinkSetUp(lo)
	}
	if err != nil {
		return fmt.Errorf("loopback up: %w", err)
	}
	m, err := ebpf.NewMap(&ebpf.MapSpec{Name: "hostaccel_probe", Type: ebpf.SockMap, KeySize: 4, ValueSize: 4, MaxEntries: 2})
	if err != nil {
		return fmt.Errorf("sockmap: %w", err)
	}
	defer m.Close()
	prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{
		Name: "hostaccel_probe", Type: ebpf.SkMsg, License: "GPL",
		Instructions: asm.Instructions{ // bpf_msg_redirect_map(msg, map, 0, BPF_F_INGRESS)
			asm.LoadMapPtr(asm.R2, m.FD()),
			asm.Mov.Imm(asm.R3, 0),
			asm.Mov.Imm(asm.R4, 1),
			asm.FnMsgRedirectMap.Call(),
			asm.Return(),
		},
	})
	if err != nil {
		return fmt.Errorf("sk_msg program: %w", err)
	}
	defer prog.Close()
	if err := link.RawAttachProgram(link.RawAttachProgramOptions{Target: m.FD(), Program: prog, Attach: ebpf.AttachSkMsgVerdict}); err != nil {
		return fmt.Errorf("attach sk_msg: %w", err)
	}
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		return err
	}
	defer ln.Close()
	c, err := net.Dial("tcp4", ln.Addr().String())
	if err != nil {
		return err
	}
	defer c.Close()
	s, err := ln.Accept()
	if err != nil {
		return err
	}
	defer s.Close()
	for i, conn := range []net.Conn{s, c} { // 0: the server, the target of every redirect
		rc, err := conn.(*net.TCPConn).SyscallConn()
		if err != nil {
			return err
		}
		var perr error
		if err := rc.Control(func(fd uintptr) { perr = m.Put(uint32(i), uint32(fd)) }); err != nil {
			return err
		}
		if perr != nil {
			return fmt.Errorf("sockmap update: %w", perr)
		}
	}
	msg := make([]byte, 100)
	if _, err := c.Write(msg); err != nil {
		return err
	}
	rc, err := s.(*net.TCPConn).SyscallConn()
	if err != nil {
		return err
	}
	n := 0
	for deadline := time.Now().Add(time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		var ierr error
		if err := rc.Control(func(fd uintptr) { n, ierr = unix.IoctlGetInt(int(fd), unix.SIOCINQ) }); err != nil || ierr != nil {
			return errors.Join(err, ierr)
		}
		if n == len(msg) {
			return nil
		}
	}
	return fmt.Errorf("FIONREAD answers %d for %d bytes an sk_msg program moved to the socket", n, len(msg))
}
