package sockmap

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"os"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// kernel TLS (include/uapi/linux/tls.h)
const (
	solTLS             = 282
	tlsTX              = 1
	tls12              = 0x0303
	tlsCipherAESGCM128 = 51
)

// setKTLSTX turns on kernel TLS for c's sending direction (TLS 1.2, AES-GCM-128, a fixed key):
// what nginx with `Options KTLS` does after its handshake. It skips the test where the kernel
// has no TLS ULP or cipher (checked on a connection in no sockmap, plain), and returns the
// error of turning it on for c.
func setKTLSTX(t *testing.T, c, plain *net.TCPConn) error {
	t.Helper()
	set := func(c *net.TCPConn) error {
		raw, err := c.SyscallConn()
		if err != nil {
			t.Fatal(err)
		}
		var info [40]byte // struct tls12_crypto_info_aes_gcm_128
		binary.LittleEndian.PutUint16(info[0:], tls12)
		binary.LittleEndian.PutUint16(info[2:], tlsCipherAESGCM128)
		for i := 4; i < 40; i++ {
			info[i] = byte(i)
		}
		var serr error
		if err := raw.Control(func(fd uintptr) {
			if serr = unix.SetsockoptString(int(fd), unix.IPPROTO_TCP, unix.TCP_ULP, "tls"); serr != nil {
				serr = fmt.Errorf("TCP_ULP tls: %w", serr)
				return
			}
			_, _, e := unix.Syscall6(unix.SYS_SETSOCKOPT, fd, solTLS, tlsTX, uintptr(unsafe.Pointer(&info[0])), uintptr(len(info)), 0)
			if e != 0 {
				serr = fmt.Errorf("TLS_TX: %w", e)
			}
		}); err != nil {
			t.Fatal(err)
		}
		return serr
	}
	if err := set(plain); err != nil {
		if os.Getenv("HOSTACCEL_REQUIRE_KTLS") == "" {
			t.Skipf("kernel TLS on a plain connection: %v (HOSTACCEL_REQUIRE_KTLS=1 makes this a failure)", err)
		}
		t.Fatalf("kernel TLS on a plain connection: %v", err)
	}
	return set(c)
}

// A sender that turns on kernel TLS after its connection was entered (as a TLS server does
// after its handshake) must never hand a peer that does TLS in userspace its plaintext (the
// kernel runs the sk_msg program on a kTLS record's plaintext; a redirect would move that).
// The kernel either refuses kTLS on a socket in a sockmap (6.1: EINVAL; OpenSSL then does TLS
// in userspace, and the connection goes on, accelerated) or must put records on the wire.
func TestKernelTLSSenderNeverMovesPlaintext(t *testing.T) {
	b := newBed(t, false)
	pc, ps := b.pair(false) // before the programs: in no sockmap
	b.apply()
	c, s := b.pair(false)
	if n := b.settle(2); n != 2 {
		t.Fatalf("%d sockets in the map", n)
	}
	err := setKTLSTX(t, c, pc)
	msg := []byte("hello, plaintext")
	if _, err := c.Write(msg); err != nil {
		t.Fatal(err)
	}
	s.SetReadDeadline(time.Now().Add(5 * time.Second))
	got := make([]byte, 5)
	if _, err := io.ReadFull(s, got); err != nil {
		t.Fatal(err)
	}
	if err != nil {
		// refused: what was written is the application's own bytes (userspace TLS)
		rest := make([]byte, len(msg)-len(got))
		if _, err := io.ReadFull(s, rest); err != nil || !bytes.Equal(append(got, rest...), msg) {
			t.Fatalf("kTLS refused (%v), then the peer read %q %v", err, append(got, rest...), err)
		}
		// (and it goes on accelerated: the bytes were moved)
		if st := b.status(); st.Redirected.Bytes < uint64(len(msg)) {
			t.Errorf("kTLS refused, then %d bytes moved, want the %d written (status %+v)", st.Redirected.Bytes, len(msg), st)
		}
		t.Logf("the kernel refuses kTLS on a socket in the sockmap (%v): the application falls back to TLS in userspace; the connection goes on, accelerated", err)
		return
	}
	if got[0] != 0x17 || binary.BigEndian.Uint16(got[1:]) != tls12 {
		rest := make([]byte, 64)
		n, _ := s.Read(rest)
		t.Fatalf("kTLS on: the peer read %q, not a TLS record (the plaintext moved); status %+v", append(got, rest[:n]...), b.status())
	}
	// the plain connection's record, for comparison
	pc.Write(msg)
	ps.SetReadDeadline(time.Now().Add(5 * time.Second))
	hdr := make([]byte, 5)
	io.ReadFull(ps, hdr)
	t.Logf("kTLS on in the sockmap: record header %x (plain connection: %x)", got, hdr)
}
