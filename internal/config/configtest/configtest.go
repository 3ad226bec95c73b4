// Package configtest holds what the tests of config's consumers share: Render, which
// computes what `hostaccel render` and apply install for a config, and checks what rendering
// must keep of validation's promises (the fuzz targets of config and k8s, and the host test
// that applies rendered fuzz corpus configs to a real kernel).
package configtest

import (
	"fmt"
	"slices"
	"strings"

	"github.com/hostaccel/hostaccel/internal/config"
	"github.com/hostaccel/hostaccel/internal/datapath"
	"github.com/hostaccel/hostaccel/internal/flowtable"
	"github.com/hostaccel/hostaccel/internal/lb"
	"github.com/hostaccel/hostaccel/internal/model"
	"github.com/hostaccel/hostaccel/internal/probe"
	"github.com/hostaccel/hostaccel/internal/tc"
)

// Rendered is what apply would install for a config on a kernel with every feature.
type Rendered struct {
	State     model.State
	Plan      datapath.Plan
	Flowtable *flowtable.Ruleset // nil: no flowtable
	TC        *tc.Desired        // nil: no tc datapath
	LB        *lb.Ruleset        // nil: no load balancer services
}

// AutoLinks are the interfaces `transports: auto` finds besides the ones the config names.
var AutoLinks = []config.Link{{Name: "lo", Up: true, Loopback: true}, {Name: "eth0", Up: true}, {Name: "eth9", Up: false}}

// Links are the interfaces Render takes as present for c: AutoLinks and every gateway and
// transport c names (for a gateway pattern "p*", the interface "p0").
func Links(c *config.Config) []config.Link {
	links := slices.Clone(AutoLinks)
	for _, n := range append(slices.Clone(c.Node.Gateways), c.Node.Transports.Names...) {
		if p, ok := strings.CutSuffix(n, "*"); ok && slices.Contains(c.Node.Gateways, n) {
			n = p + "0"
		}
		if !slices.ContainsFunc(links, func(l config.Link) bool { return l.Name == n }) {
			links = append(links, config.Link{Name: n, Up: true})
		}
	}
	return links
}

// Render is `hostaccel render` for a validated config: the interfaces of Links present,
// every kernel feature available. Every ruleset is also run through the knftables Fake.
func Render(c *config.Config) (*Rendered, error) {
	s, _, err := c.State(Links(c), true)
	if err != nil {
		return nil, fmt.Errorf("state: %w", err)
	}
	all := probe.Result{}
	for _, f := range probe.All {
		all.Features = append(all.Features, probe.Feature{Name: f, Available: true})
	}
	plan, err := datapath.Choose(s, all)
	if err != nil {
		return nil, fmt.Errorf("plan: %w", err)
	}
	r := &Rendered{State: s, Plan: plan}
	if plan.Flowtable != nil {
		r.Flowtable = flowtable.Render(*plan.Flowtable, flowtable.Options{FlowtableCounter: true})
		if _, err := r.Flowtable.Dump(); err != nil {
			return nil, fmt.Errorf("flowtable: %w", err)
		}
	}
	if plan.TC != nil {
		if r.TC, err = tc.Render(*plan.TC); err != nil {
			return nil, fmt.Errorf("tc: %w", err)
		}
		// Validation keeps local and peer Pod CIDRs apart; so must the program's maps.
		for _, l := range r.TC.LocalPod {
			for _, p := range r.TC.PeerPod {
				if l.Overlaps(p) {
					return nil, fmt.Errorf("tc: local Pod CIDR %s overlaps peer Pod CIDR %s", l, p)
				}
			}
		}
	}
	if svcs := c.LoadBalancer.Services; len(svcs) > 0 {
		r.LB = lb.Render(lb.Resolve(svcs, nil, lb.OfflineEnv(svcs, lb.Env{})))
		if _, err := r.LB.Dump(); err != nil {
			return nil, fmt.Errorf("lb: %w", err)
		}
	}
	return r, nil
}
