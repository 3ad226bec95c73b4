package sockmap

import (
	"testing"
	"time"
)

// A closed connection leaves no ledger or tcp_only entry (sock_ops' state callback deletes
// them). Before, they stayed until the LRUs evicted them: on a busy node the maps filled with
// dead connections' entries, and every new one evicted the least recently used, a live idle
// connection's (a pooled DB or gRPC connection): its next message found no ledger and its
// direction took TCP for good, or, for tcp_only, was moved past its unread TCP data (found by
// a helper's review: 400 ledgers left by 200 closed connections).
func TestClosedConnectionsLeaveNoLedgers(t *testing.T) {
	b := newBed(t, true)
	const conns = 200
	for range conns {
		c, s := b.pair(false)
		c.Write([]byte("x")) // often before the server is entered: tcp_only
		s.Write([]byte("y"))
		buf := make([]byte, 1)
		s.Read(buf)
		c.Read(buf)
		c.Close()
		s.Close()
	}
	for deadline := time.Now().Add(3 * time.Second); b.status().Sockets > 0 && time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
	}
	if n := b.status().Sockets; n != 0 {
		t.Fatalf("%d sockets still in the map", n)
	}
	set := b.currentSet()
	count := func(it interface {
		Next(any, any) bool
		Err() error
	}) int {
		n := 0
		var k sockmapSockKey
		var v []byte
		for it.Next(&k, &v) {
			n++
		}
		return n
	}
	nl := count(set.maps.Ledgers.Iterate())
	nt := count(set.maps.TcpOnly.Iterate())
	t.Logf("all %d connections closed, map empty: ledgers %d entries, tcp_only %d", conns, nl, nt)
	if nl > 0 || nt > 0 {
		t.Errorf("closed connections left %d ledger and %d tcp_only entries (of %d and %d), which only LRU eviction of live connections' entries would remove", nl, nt, set.maps.Ledgers.MaxEntries(), set.maps.TcpOnly.MaxEntries())
	}
}
