package agent

import (
	"context"
	"errors"
	"testing"

	"github.com/hostaccel/hostaccel/internal/config"
	"github.com/hostaccel/hostaccel/internal/datapath"
	"github.com/hostaccel/hostaccel/internal/flowtable"
	"github.com/hostaccel/hostaccel/internal/lb"
)

// The one pipeline: the load balancer before the fastpath; with Strict (apply) a kernel that
// cannot run the plan whole changes nothing, not even the load balancer; lenient (agent) it
// applies what can run.
func TestApplyPipeline(t *testing.T) {
	cfg, err := config.Parse([]byte(cfgText))
	if err != nil {
		t.Fatal(err)
	}
	links := []config.Link{{Name: "gw", Up: true}, {Name: "eth0", Up: true}, {Name: "eth1", Up: true}}
	run := func(strict, flowtableOK bool) (Outcome, error, []string) {
		var order []string
		ft, fake := flowtable.NewFakeManager()
		in := Inputs{Links: links, Strict: strict, Caps: caps(flowtableOK)(context.Background()), Mgrs: &datapath.Managers{Flowtable: ft},
			LB: func(context.Context, lb.Config) (string, error) {
				if fake.Table != nil {
					order = append(order, "lb after the fastpath")
				}
				order = append(order, "lb")
				return "", nil
			}}
		o, err := Apply(context.Background(), cfg, in)
		if fake.Table != nil {
			order = append(order, "fastpath")
		}
		return o, err, order
	}
	for _, strict := range []bool{true, false} {
		o, err, order := run(strict, true)
		if err != nil || len(order) != 2 || order[0] != "lb" || order[1] != "fastpath" || o.Plan.Summary() != "flowtable: [pod-to-pod]" {
			t.Errorf("strict=%v, full kernel: %v, order %v, plan %s", strict, err, order, o.Plan.Summary())
		}
	}
	if _, err, order := run(true, false); !errors.Is(err, datapath.ErrNoFlowtable) || len(order) != 0 {
		t.Errorf("strict, no flowtable: %v, order %v; want the error and nothing applied", err, order)
	}
	if _, err, order := run(false, false); !errors.Is(err, datapath.ErrNoFlowtable) || len(order) != 1 || order[0] != "lb" {
		t.Errorf("agent, no flowtable: %v, order %v; want the error and the load balancer applied", err, order)
	}
}
