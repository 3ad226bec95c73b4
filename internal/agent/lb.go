package agent

import (
	"context"

	"github.com/hostaccel/hostaccel/internal/config"
)

// runLB runs the load balancer's background work (health checks, local API) until ctx ends.
func (a *Agent) runLB(ctx context.Context) { <-ctx.Done() }

// syncLB applies the load balancer part of cfg; it runs inside every sync, before the
// fastpath, so that balanced connections are offloaded after the balancing decision.
func (a *Agent) syncLB(ctx context.Context, cfg *config.Config) error { return nil }
