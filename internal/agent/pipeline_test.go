package agent

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"testing"

	"github.com/hostaccel/hostaccel/internal/config"
	"github.com/hostaccel/hostaccel/internal/datapath"
	"github.com/hostaccel/hostaccel/internal/flowtable"
	"github.com/hostaccel/hostaccel/internal/lb"
	"github.com/hostaccel/hostaccel/internal/probe"
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

// `hostaccel apply` (Strict) whose load balancer part the kernel refuses changes nothing else:
// the datapaths are not applied either. Before (a review), the flowtable was installed and
// the error named the load balancer only. The agent (not Strict) still applies what it can.
func TestStrictApplyStopsAtTheLoadBalancer(t *testing.T) {
	cfg, err := config.Parse([]byte("node:\n  gateways: [gw]\n  transports: [eth0]\n  localPodCIDRs: [10.244.1.0/24]\n  peerPodCIDRs: [10.244.2.0/24]\nclasses: {pod-to-pod: true}\n"))
	if err != nil {
		t.Fatal(err)
	}
	for _, strict := range []bool{true, false} {
		m, f := flowtable.NewFakeManager()
		caps := probe.Result{Features: []probe.Feature{{Name: probe.Flowtable, Available: true}}}
		_, err = Apply(context.Background(), cfg, Inputs{
			Links:  []config.Link{{Name: "gw", Up: true, Index: 2}, {Name: "eth0", Up: true, Index: 3}},
			Strict: strict, Caps: caps, Mgrs: &datapath.Managers{Flowtable: m},
			LB: func(context.Context, lb.Config) (string, error) {
				return "", errors.New("the kernel refused the transaction")
			},
		})
		if err == nil || !strings.Contains(err.Error(), "load balancer: the kernel refused") {
			t.Errorf("strict %v: error %v, want the load balancer's", strict, err)
		}
		if installed := f.Table != nil; installed == strict {
			t.Errorf("strict %v: flowtable installed %v, want %v", strict, installed, !strict)
		}
	}
}

// The datapaths' load balancer addresses come from the services in effect (Inputs.LBVIPs: the
// API's merged in), the config's when the merge is not valid.
func TestPipelineTakesTheLoadBalancersVIPs(t *testing.T) {
	cfg, err := config.Parse([]byte("node:\n  gateways: [gw]\n  transports: [eth0]\n  localPodCIDRs: [10.244.1.0/24]\nclasses: {external-to-loadbalancer: true}\n" +
		"loadBalancer:\n  services:\n  - {name: web, vips: [192.0.2.10], port: 80, backends: [{address: 10.244.1.5}]}\n"))
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		ok   bool
		want string
	}{{true, "[192.0.2.20/32]"}, {false, "[192.0.2.10/32]"}} {
		m, _ := flowtable.NewFakeManager()
		o, _ := Apply(context.Background(), cfg, Inputs{
			Links: []config.Link{{Name: "gw", Up: true, Index: 2}, {Name: "eth0", Up: true, Index: 3}},
			Caps:  probe.Result{Features: []probe.Feature{{Name: probe.Flowtable, Available: true}}}, Mgrs: &datapath.Managers{Flowtable: m},
			LB:     func(context.Context, lb.Config) (string, error) { return "", nil },
			LBVIPs: func(lb.Config) ([]netip.Addr, bool) { return []netip.Addr{netip.MustParseAddr("192.0.2.20")}, c.ok },
		})
		if got := fmt.Sprint(o.State.LoadBalancerIPs); got != c.want {
			t.Errorf("merge valid %v: loadBalancerIPs %s, want %s", c.ok, got, c.want)
		}
	}
}
