package bench

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/hostaccel/hostaccel/internal/datapath"
	"github.com/hostaccel/hostaccel/internal/flowtable"
	"github.com/hostaccel/hostaccel/internal/model"
	"github.com/hostaccel/hostaccel/internal/probe"
	"github.com/hostaccel/hostaccel/internal/tc"
)

// Variant names of the datapaths chosen through internal/datapath.
const VariantTC = "hostaccel-tc"

// tcVariant is registered by variant.go's init, after the flowtable (init order follows
// file names).
var tcVariant = Variant{
	Name: VariantTC, Title: "hostaccel tc", Default: true,
	Needs: []string{probe.ClsBPF, probe.RedirectNeigh},
	Setup: func(ctx context.Context, n *Node) error {
		_, err := applyPlan(ctx, n, tcState(n))
		return err
	},
	Teardown: func(ctx context.Context, n *Node) error {
		return n.NS.Do(func() error { return tc.NewManager().Remove(ctx) })
	},
	Ruleset: func(n *Node) (string, error) { return renderTC(tcState(n)) },
	Note:    "hostaccel's tc datapath (internal/tc: eBPF at tc ingress, bpf_fib_lookup + bpf_redirect_neigh), stateless, so only the classes without NAT (pod-to-pod); the rest takes the normal path",
}

// autoVariant is `datapath: auto` with every class on, as a user enables them (the
// flowtable variant's classes): internal/datapath.Choose decides, per class, tc, the flowtable
// or (what this kernel lacks) the normal path. Its report shows what it chose in each kernel.
var autoVariant = Variant{
	Name: VariantAuto, Title: "hostaccel auto", Default: true,
	Setup: func(ctx context.Context, n *Node) error {
		_, err := applyPlan(ctx, n, flowtableState(n, model.DatapathAuto))
		return err
	},
	Teardown: removeAll,
	Ruleset: func(n *Node) (string, error) {
		plan, cerr := datapath.Choose(flowtableState(n, model.DatapathAuto), n.Caps)
		text := "datapath auto chooses here: " + plan.Summary() + "\n"
		if cerr != nil {
			text += "the rest takes the normal path: " + cerr.Error() + "\n"
		}
		if plan.TC != nil {
			t, err := renderTC(*plan.TC)
			if err != nil {
				return "", err
			}
			text += t
		}
		if plan.Flowtable != nil {
			dump, err := flowtable.Render(*plan.Flowtable, flowtable.Options{FlowtableCounter: n.Caps.Has(probe.FlowtableCounter)}).Dump()
			if err != nil {
				return "", err
			}
			text += dump
		}
		return text, nil
	},
	Note: "datapath auto (internal/datapath.Choose) with every class on, as a user enables them: tc for the classes it serves, the flowtable for the rest, the normal path for what this kernel lacks (what it chose, per kernel, below)",
}

// renderTC describes what the tc datapath loads for s.
func renderTC(s model.State) (string, error) {
	d, err := tc.Render(s)
	if err != nil {
		return "", err
	}
	return fmt.Sprintf("eBPF program at tc ingress (internal/tc), maps:\ndevices  %v\nlocalPod %v\npeerPod  %v\npeerNode %v\nclasses  %v\n", d.Devices, d.LocalPod, d.PeerPod, d.PeerNode, d.Classes), nil
}

// tcState is the node's state with the tc datapath and the classes it can serve.
func tcState(n *Node) model.State {
	s := flowtableState(n, model.DatapathTC)
	s.Classes = slices.Clone(tc.Supported)
	s.Normalize()
	return s
}

// applyPlan chooses datapaths for s as the agent does (internal/datapath) and applies them
// in the node. A partial plan (auto on a kernel without the flowtable) is applied and its
// error dropped. An empty plan is an error, but for auto: the agent then leaves every class
// on the normal path, and so does the bench (auto measures as Default there).
func applyPlan(ctx context.Context, n *Node, s model.State) (datapath.Plan, error) {
	plan, cerr := datapath.Choose(s, n.Caps)
	if plan.TC == nil && plan.Flowtable == nil {
		if s.Datapath == model.DatapathAuto {
			return plan, nil
		}
		return plan, fmt.Errorf("no datapath for %s here: %w", s.Datapath, cerr)
	}
	err := n.NS.Do(func() error {
		m := &datapath.Managers{TC: tc.NewManager()}
		if plan.Flowtable != nil || s.Datapath == model.DatapathAuto && n.Caps.Has(probe.Flowtable) {
			m.Flowtable = flowtable.NewManager()
		}
		_, err := m.Apply(ctx, plan, n.Caps)
		return err
	})
	return plan, err
}

// removeAll removes every hostaccel datapath from the node.
func removeAll(ctx context.Context, n *Node) error {
	return n.NS.Do(func() error {
		errs := []error{tc.NewManager().Remove(ctx)}
		if n.Caps.Has(probe.Flowtable) {
			errs = append(errs, flowtable.NewManager().Remove(ctx))
		}
		return errors.Join(errs...)
	})
}

// tcPaths reads how the first node's tc program took packets so far (nil where the variant
// runs no tc program there): "redirected" (every class), each way of tc.Status.Via and
// "passed:REASON".
func tcPaths(ctx context.Context, nodes []*Node, v Variant) map[string]uint64 {
	if v.Direct || len(nodes) == 0 || !nodes[0].Caps.Has(probe.ClsBPF) {
		return nil
	}
	var st tc.Status
	err := nodes[0].NS.Do(func() (err error) { st, err = tc.NewManager().Status(ctx); return err })
	if err != nil || st.Mode == "" {
		return nil
	}
	out := map[string]uint64{}
	for _, c := range st.Classes {
		out["redirected"] += c.Packets
	}
	for k, c := range st.Via {
		out[k] = c.Packets
	}
	for k, c := range st.Passed {
		out["passed:"+k] = c.Packets
	}
	return out
}

// tcPathsSince is after - before, without the ways no packet took.
func tcPathsSince(before, after map[string]uint64) map[string]uint64 {
	if after == nil {
		return nil
	}
	out := map[string]uint64{}
	for k, n := range after {
		if d := n - before[k]; d > 0 {
			out[k] = d
		}
	}
	return out
}
