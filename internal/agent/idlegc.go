package agent

import (
	"runtime"
	"runtime/metrics"
	"sync"
	"sync/atomic"
)

// idleGC runs the garbage collector between syncs when the next one would start it.
//
// Go starts a collection when the heap reaches its goal. In an agent at thousands of
// Services, that moment falls inside a sync: the sync's own allocations cross the goal. The
// collection then marks the whole heap (~100 MB at 5,000 Services, ~50 ms of CPU) beside the
// sync. Its background worker and the assists it charges the sync's allocations delay the
// change on its way to the kernel. On a node with one core free, the syncs that met a
// collection took 41-77 ms from the derivation to the kernel instead of 14-24 (issue 13's
// Kubernetes bench beside a busy core, `GODEBUG=gctrace=1`; docs/benchmarks/
// 2026-11-27-785e21c-k8s-idle-gc.md).
//
// So after each sync, idleGC compares the heap's room under its goal with what was allocated
// from one sync's end to the next (the most of the last times, decaying: the Kubernetes
// source's derivation between two syncs counts with the sync it leads to). When the room is
// under two syncs' worth plus an eighth of the goal (the runtime starts a cycle before the
// goal), it starts the cycle now, on a goroutine of its own, while the agent waits for the
// next event. Collections happen about
// as often as before, a sync or two earlier, and no longer inside the sync that crossed the
// goal. GOGC and GOMEMLIMIT keep their meaning: they set the goal this reads.
type idleGC struct {
	read func() (heap, goal, allocs uint64) // heap objects' bytes, the heap goal, bytes allocated since the start
	gc   func()

	running atomic.Bool

	mu         sync.Mutex // Sync is exported: callers other than Run may call it
	lastAllocs uint64
	perSync    uint64 // the most allocated between two syncs' ends lately (halved whenever less was)
}

func newIdleGC() *idleGC {
	samples := []metrics.Sample{
		{Name: "/memory/classes/heap/objects:bytes"},
		{Name: "/gc/heap/goal:bytes"},
		{Name: "/gc/heap/allocs:bytes"},
	}
	return &idleGC{
		read: func() (uint64, uint64, uint64) {
			metrics.Read(samples)
			return samples[0].Value.Uint64(), samples[1].Value.Uint64(), samples[2].Value.Uint64()
		},
		gc: runtime.GC,
	}
}

// afterSync is called when a sync has ended. It reports whether it started a collection.
func (g *idleGC) afterSync() bool {
	g.mu.Lock()
	heap, goal, allocs := g.read()
	used := allocs - g.lastAllocs
	g.lastAllocs = allocs
	g.perSync = max(used, g.perSync/2)
	now := collectNow(heap, goal, g.perSync)
	g.mu.Unlock()
	if !now || !g.running.CompareAndSwap(false, true) {
		return false
	}
	go func() {
		defer g.running.Store(false)
		g.gc()
	}()
	return true
}

// idleGCMinGoal: below it a collection costs a few milliseconds wherever it falls, and the
// agent leaves it to the runtime.
const idleGCMinGoal = 64 << 20

// collectNow reports whether a heap of heap bytes under a goal of goal bytes (at least
// idleGCMinGoal) has less room than two syncs of perSync bytes each, plus an eighth of the
// goal.
func collectNow(heap, goal, perSync uint64) bool {
	if goal < idleGCMinGoal || perSync == 0 {
		return false
	}
	room := uint64(0)
	if goal > heap {
		room = goal - heap
	}
	return room < 2*perSync+goal/8
}
