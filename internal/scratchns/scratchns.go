// Package scratchns runs code in a throwaway network namespace: a new, unnamed one that
// vanishes with everything in it once the code returns. The kernel probes try features in
// one, and the load balancer has nft render its rules in one (no ruleset to load there).
package scratchns

import (
	"runtime"

	"github.com/vishvananda/netns"
)

// Run runs fn on a thread moved into a new network namespace; processes fn starts from that
// thread (os/exec) start in it too. Run must be called on a goroutine of its own or one that
// may lose its thread: if the thread cannot be moved back, it stays locked and dies with the
// goroutine.
func Run(fn func() error) error {
	runtime.LockOSThread()
	orig, err := netns.Get()
	if err != nil {
		runtime.UnlockOSThread()
		return err
	}
	defer orig.Close()
	ns, err := netns.New() // moves this thread into the new namespace
	if err != nil {
		if netns.Set(orig) == nil {
			runtime.UnlockOSThread()
		}
		return err
	}
	defer ns.Close()
	defer func() {
		if netns.Set(orig) == nil {
			runtime.UnlockOSThread()
		}
	}()
	return fn()
}
