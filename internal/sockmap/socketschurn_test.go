package sockmap

import (
	"math/rand/v2"
	"net"
	"path/filepath"
	"testing"
	"time"

	"github.com/cilium/ebpf"
)

// sockets() walks the sockhash with NextKey; when the key it stands on is deleted (its socket
// closed), the kernel restarts from the first key. Sockets closing while status runs are
// listed once (before, hostaccel status, hostaccel_sockmap_sockets and the draining count
// over-counted: found by a helper's review).
func TestSocketsListedOnceUnderChurn(t *testing.T) {
	b := newBed(t, true)
	const conns = 400
	fds := map[[2]uint32]*net.TCPConn{}
	for range conns {
		c, s := b.pair(false)
		for _, x := range []*net.TCPConn{c, s} {
			fds[[2]uint32{uint32(x.LocalAddr().(*net.TCPAddr).Port), uint32(x.RemoteAddr().(*net.TCPAddr).Port)}] = x
		}
	}
	if n := b.settle(2 * conns); n != 2*conns {
		t.Fatalf("%d sockets in the map", n)
	}
	set := b.currentSet()
	keys, err := set.sockets()
	if err != nil {
		t.Fatal(err)
	}
	rand.Shuffle(len(keys), func(i, j int) { keys[i], keys[j] = keys[j], keys[i] })
	done := make(chan struct{})
	go func() { // sockets closing, one by one
		defer close(done)
		for deadline := time.Now().Add(time.Second); time.Now().Before(deadline); {
			k := keys[rand.IntN(len(keys))]
			set.maps.HostaccelSocks.Delete(k)
			rc, _ := fds[[2]uint32{k.LocalPort, k.RemotePort}].SyscallConn()
			rc.Control(func(fd uintptr) { set.maps.HostaccelSocks.Update(k, uint64(fd), ebpf.UpdateAny) })
		}
	}()
	worst, walks := 0, 0
	for {
		select {
		case <-done:
			if worst > 0 {
				t.Errorf("sockets() listed %d sockets more than the map held (a key listed twice); %d walks", worst, walks)
			}
			return
		default:
		}
		walks++
		got, err := set.sockets()
		if err != nil {
			t.Fatal(err)
		}
		seen := map[sockmapSockKey]bool{}
		dup := 0
		for _, k := range got {
			if seen[k] {
				dup++
			}
			seen[k] = true
		}
		worst = max(worst, dup)
	}
}

// currentSet is the program set the bed's apply attached, open until the test ends.
func (b *bed) currentSet() *progSet {
	b.t.Helper()
	o, err := observe(b.status().Cgroup)
	if err != nil {
		b.t.Fatal(err)
	}
	b.t.Cleanup(func() { o.Close() })
	return o.current(filepath.Join(mustBPFFS(b.t), "hostaccel"))
}
