package agent

import (
	"testing"
	"time"
)

func TestCollectNow(t *testing.T) {
	const mib = 1 << 20
	for _, c := range []struct {
		name                string
		heap, goal, perSync uint64
		want                bool
	}{
		{"room for many syncs", 100 * mib, 200 * mib, 10 * mib, false},
		// room 40: under 2*10 + 200/8 = 45
		{"room under two syncs and an eighth", 160 * mib, 200 * mib, 10 * mib, true},
		// room 46: just above 45
		{"room just above", 154 * mib, 200 * mib, 10 * mib, false},
		{"heap past its goal", 210 * mib, 200 * mib, 10 * mib, true},
		{"small heap: left to the runtime", 30 * mib, 32 * mib, 10 * mib, false},
		{"nothing allocated", 199 * mib, 200 * mib, 0, false},
		{"no goal read", 100 * mib, 0, 10 * mib, false},
	} {
		if got := collectNow(c.heap, c.goal, c.perSync); got != c.want {
			t.Errorf("%s: collectNow(%d, %d, %d MiB) = %v, want %v", c.name, c.heap/mib, c.goal/mib, c.perSync/mib, got, c.want)
		}
	}
}

// TestIdleGCAfterSync drives idleGC with a heap that a sync grows by 10 MiB: it collects
// once the room is short of two syncs, on a goroutine of its own (afterSync returns while the
// collection runs), never two at once, and again after the collection made room.
func TestIdleGCAfterSync(t *testing.T) {
	const mib = 1 << 20
	var heap, allocs uint64 = 100 * mib, 0
	const goal = 200 * mib
	release := make(chan struct{})
	collected := make(chan struct{}, 4)
	g := &idleGC{
		read: func() (uint64, uint64, uint64) { return heap, goal, allocs },
		gc: func() {
			<-release
			collected <- struct{}{}
		},
	}
	sync := func() bool {
		heap += 10 * mib
		allocs += 10 * mib
		return g.afterSync()
	}
	// The first call counts everything allocated since the start; allocs starts at 0 here.
	var started []int
	for i := range 6 {
		if sync() {
			started = append(started, i)
		}
	}
	// heap after each sync: 110 .. 160 MiB; room 90 .. 40, collect below 45: at 160 only.
	if len(started) != 1 || started[0] != 5 {
		t.Fatalf("collections started after syncs %v, want [5] (heap at 160 of 200 MiB)", started)
	}
	// While that collection runs, the next sync starts none.
	if sync() {
		t.Fatal("a second collection started while one ran")
	}
	close(release)
	select {
	case <-collected:
	case <-time.After(5 * time.Second):
		t.Fatal("the collection never ran")
	}
	for g.running.Load() {
		time.Sleep(time.Millisecond)
	}
	// The collection left 100 MiB: room again, none started.
	heap = 100 * mib
	if sync() {
		t.Fatal("a collection started with room for many syncs")
	}
	// A sync that allocated 60 MiB (a full resync) makes the next collection come sooner:
	// 2*60 + 25 > the room of 80.
	allocs += 50 * mib
	if !sync() {
		t.Fatal("no collection after a sync that allocated 60 MiB with 80 MiB of room")
	}
	<-collected
}
