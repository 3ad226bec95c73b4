package agent

import (
	"context"
	"sync"
	"time"

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

// runLB runs the load balancer's background work (health checks, local API) until ctx ends;
// with CleanupOnExit it then removes the load balancer's tables.
func (a *Agent) runLB(ctx context.Context) {
	rt := a.LB()
	rt.Run(ctx)
	if a.opts.CleanupOnExit {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		err := rt.Remove(ctx)
		a.opts.Log.Info("stopping; removed the load balancer's tables", "err", err)
	}
}
