package testbed

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// IOTimeout is the idle timeout of every read and write done by Transfer and
// of the dials made by NS.DialTCP.
var IOTimeout = 10 * time.Second

// peers records the distinct remote addresses a server has seen.
type peers struct {
	mu   sync.Mutex
	seen []netip.Addr
}

func (p *peers) add(a netip.Addr) {
	a = a.Unmap()
	p.mu.Lock()
	defer p.mu.Unlock()
	if !slices.Contains(p.seen, a) {
		p.seen = append(p.seen, a)
	}
}

// Peers returns the distinct source addresses seen, in order of first
// appearance (useful to assert that no NAT happened).
func (p *peers) Peers() []netip.Addr {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.seen)
}

// Server is a TCP echo server running in a namespace.
type Server struct {
	peers
	ln    net.Listener
	bytes atomic.Int64
	wg    sync.WaitGroup
	mu    sync.Mutex
	conns map[net.Conn]struct{}
	done  bool
}

// ListenTCP starts a TCP echo server on addr ("ip:port", port may be 0)
// inside the namespace. n.Close closes it if the caller does not.
func (n *NS) ListenTCP(addr string) (*Server, error) {
	ln, err := inNS(n, "listen tcp "+addr, func() (net.Listener, error) { return net.Listen("tcp", addr) })
	if err != nil {
		return nil, err
	}
	s := &Server{ln: ln, conns: map[net.Conn]struct{}{}}
	if err := n.track(s); err != nil {
		ln.Close()
		return nil, err
	}
	s.wg.Add(1)
	go s.serve()
	return s, nil
}

// Addr returns the listening address.
func (s *Server) Addr() netip.AddrPort { return unmap(s.ln.Addr().(*net.TCPAddr).AddrPort()) }

// Bytes returns the number of bytes received over all connections.
func (s *Server) Bytes() int64 { return s.bytes.Load() }

func (s *Server) serve() {
	defer s.wg.Done()
	for {
		c, err := s.ln.Accept()
		if err != nil {
			return
		}
		s.mu.Lock()
		if s.done {
			s.mu.Unlock()
			c.Close()
			return
		}
		s.conns[c] = struct{}{}
		s.wg.Add(1)
		s.mu.Unlock()
		s.add(c.RemoteAddr().(*net.TCPAddr).AddrPort().Addr())
		go s.echo(c)
	}
}

func (s *Server) echo(c net.Conn) {
	defer s.wg.Done()
	defer func() {
		s.mu.Lock()
		delete(s.conns, c)
		s.mu.Unlock()
		c.Close()
	}()
	buf := make([]byte, 64<<10)
	for {
		n, err := c.Read(buf)
		s.bytes.Add(int64(n))
		if n > 0 {
			if _, werr := c.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// Close stops the server, closes its connections and waits for its
// goroutines.
func (s *Server) Close() error {
	s.mu.Lock()
	s.done = true
	err := s.ln.Close()
	for c := range s.conns {
		c.Close()
	}
	s.mu.Unlock()
	s.wg.Wait()
	if errors.Is(err, net.ErrClosed) {
		err = nil
	}
	return err
}

// UDPServer is a UDP echo server running in a namespace: every datagram is
// sent back unchanged to its sender.
type UDPServer struct {
	peers
	c       *net.UDPConn
	bytes   atomic.Int64
	packets atomic.Int64
	done    chan struct{}
}

// ListenUDP starts a UDP echo server on addr inside the namespace. n.Close
// closes it if the caller does not.
func (n *NS) ListenUDP(addr string) (*UDPServer, error) {
	c, err := inNS(n, "listen udp "+addr, func() (*net.UDPConn, error) {
		ua, err := net.ResolveUDPAddr("udp", addr)
		if err != nil {
			return nil, err
		}
		return net.ListenUDP("udp", ua)
	})
	if err != nil {
		return nil, err
	}
	s := &UDPServer{c: c, done: make(chan struct{})}
	if err := n.track(s); err != nil {
		c.Close()
		return nil, err
	}
	go s.serve()
	return s, nil
}

func (s *UDPServer) serve() {
	defer close(s.done)
	buf := make([]byte, 64<<10)
	for {
		n, from, err := s.c.ReadFromUDPAddrPort(buf)
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			continue
		}
		s.bytes.Add(int64(n))
		s.packets.Add(1)
		s.add(from.Addr())
		s.c.WriteToUDPAddrPort(buf[:n], from)
	}
}

// Addr returns the listening address.
func (s *UDPServer) Addr() netip.AddrPort { return unmap(s.c.LocalAddr().(*net.UDPAddr).AddrPort()) }

// Bytes returns the number of payload bytes received.
func (s *UDPServer) Bytes() int64 { return s.bytes.Load() }

// Packets returns the number of datagrams received.
func (s *UDPServer) Packets() int64 { return s.packets.Load() }

// Close stops the server and waits for its goroutine.
func (s *UDPServer) Close() error {
	err := s.c.Close()
	<-s.done
	if errors.Is(err, net.ErrClosed) {
		err = nil
	}
	return err
}

// DialTCP connects to remote ("ip:port") from inside the namespace. local may
// be "", an IP or "ip:port" to bind as source. The caller closes the conn.
func (n *NS) DialTCP(local, remote string) (net.Conn, error) {
	d := net.Dialer{Timeout: IOTimeout}
	if local != "" {
		ap, err := localAddr(local)
		if err != nil {
			return nil, err
		}
		d.LocalAddr = net.TCPAddrFromAddrPort(ap)
	}
	return inNS(n, "dial tcp "+remote, func() (net.Conn, error) { return d.Dial("tcp", remote) })
}

// DialUDP returns a UDP socket in the namespace connected to remote. local
// may be "", an IP or "ip:port" to bind as source. The caller closes it.
func (n *NS) DialUDP(local, remote string) (*net.UDPConn, error) {
	ra, err := netip.ParseAddrPort(remote)
	if err != nil {
		return nil, err
	}
	var la *net.UDPAddr
	if local != "" {
		ap, err := localAddr(local)
		if err != nil {
			return nil, err
		}
		la = net.UDPAddrFromAddrPort(ap)
	}
	return inNS(n, "dial udp "+remote, func() (*net.UDPConn, error) {
		return net.DialUDP("udp", la, net.UDPAddrFromAddrPort(ra))
	})
}

// inNS returns what fn returns, run inside n (sockets it opens stay there). An error is
// prefixed with n's name and what.
func inNS[T any](n *NS, what string, fn func() (T, error)) (T, error) {
	var v T
	err := n.Do(func() (err error) {
		v, err = fn()
		return err
	})
	if err != nil {
		return v, fmt.Errorf("%s: %s: %w", n.Name, what, err)
	}
	return v, nil
}

func localAddr(s string) (netip.AddrPort, error) {
	if ap, err := netip.ParseAddrPort(s); err == nil {
		return ap, nil
	}
	a, err := netip.ParseAddr(s)
	if err != nil {
		return netip.AddrPort{}, fmt.Errorf("local address %q: %w", s, err)
	}
	return netip.AddrPortFrom(a, 0), nil
}

func unmap(ap netip.AddrPort) netip.AddrPort {
	return netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())
}

// pattern period; prime so that it does not line up with chunk sizes.
const period = 251

func pattern(chunk int) []byte {
	p := make([]byte, chunk+period)
	for i := range p {
		p[i] = byte(i % period)
	}
	return p
}

// Transfer writes n bytes to c in writes of at most chunk bytes and reads the
// echo back, verifying its content, so that packets flow both ways. Every
// read and write has an idle deadline of IOTimeout. Stream conns write and
// read concurrently; packet conns (UDP) send one datagram and wait for its
// echo before sending the next. The conn can be reused afterwards.
func Transfer(c net.Conn, n, chunk int) error {
	if chunk <= 0 || n < 0 {
		return fmt.Errorf("transfer: bad size n=%d chunk=%d", n, chunk)
	}
	defer c.SetDeadline(time.Time{})
	pat := pattern(chunk)
	if _, ok := c.(net.PacketConn); ok {
		return transferPackets(c, n, chunk, pat)
	}
	werr := make(chan error, 1)
	go func() {
		for off := 0; off < n; {
			k := min(chunk, n-off)
			c.SetWriteDeadline(time.Now().Add(IOTimeout))
			if _, err := c.Write(pat[off%period : off%period+k]); err != nil {
				werr <- fmt.Errorf("transfer: write at %d/%d: %w", off, n, err)
				return
			}
			off += k
		}
		werr <- nil
	}()
	rerr := readEcho(c, n, pat)
	if rerr != nil {
		c.SetWriteDeadline(time.Now()) // unblock the writer
	}
	return errors.Join(rerr, <-werr)
}

func readEcho(c net.Conn, n int, pat []byte) error {
	buf := make([]byte, len(pat)-period)
	for off := 0; off < n; {
		c.SetReadDeadline(time.Now().Add(IOTimeout))
		k, err := c.Read(buf[:min(len(buf), n-off)])
		if k > 0 && !bytes.Equal(buf[:k], pat[off%period:off%period+k]) {
			return fmt.Errorf("transfer: echo mismatch at %d/%d", off, n)
		}
		off += k
		if err != nil {
			return fmt.Errorf("transfer: read at %d/%d: %w", off, n, err)
		}
	}
	return nil
}

func transferPackets(c net.Conn, n, chunk int, pat []byte) error {
	buf := make([]byte, chunk+1)
	for off := 0; off < n; {
		k := min(chunk, n-off)
		want := pat[off%period : off%period+k]
		c.SetDeadline(time.Now().Add(IOTimeout))
		if _, err := c.Write(want); err != nil {
			return fmt.Errorf("transfer: send at %d/%d: %w", off, n, err)
		}
		m, err := c.Read(buf)
		if err != nil {
			return fmt.Errorf("transfer: receive at %d/%d: %w", off, n, err)
		}
		if !bytes.Equal(buf[:m], want) {
			return fmt.Errorf("transfer: echo mismatch at %d/%d (%d bytes, want %d)", off, n, m, k)
		}
		off += k
	}
	return nil
}

// CloseAccepted accepts ln's connections and closes each at once (a backend a TCP health
// check finds up), until ln is closed. It returns at once: the loop runs on.
func CloseAccepted(ln net.Listener) {
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
}
