package agent

import (
	"sync"

	"github.com/hostaccel/hostaccel/internal/lb"
)

// lbRuntime holds the agent's load balancer, created on first use.
type lbRuntime struct {
	once sync.Once
	rt   *lb.Runtime
}

// LB returns the agent's load balancer: its Status for `hostaccel status` and metrics
// (lb.NewCollector), its API handler.
func (a *Agent) LB() *lb.Runtime {
	a.lb.once.Do(func() {
		a.lb.rt = lb.NewRuntime(a.opts.Log.With("component", "lb"), a.TriggerNow)
		a.lb.rt.OnDrift = func(what []string) { a.driftRepaired(DriftLB, what) }
	})
	return a.lb.rt
}
