// Package datapath chooses, per traffic class, which datapath serves it (from the config's
// `datapath` and what the kernel can do), and applies that plan through the datapaths'
// managers. `auto` is a choice over datapaths, not a datapath.
package datapath

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/hostaccel/hostaccel/internal/flowtable"
	"github.com/hostaccel/hostaccel/internal/model"
	"github.com/hostaccel/hostaccel/internal/probe"
	"github.com/hostaccel/hostaccel/internal/tc"
)

// ErrNoFlowtable: the kernel cannot do what was asked.
var ErrNoFlowtable = errors.New("this kernel has no nftables flowtable (load nf_flow_table_inet and nft_flow_offload, or use a kernel with CONFIG_NF_FLOW_TABLE_INET)")

// ErrNoTC: no way to attach the tc program.
var ErrNoTC = errors.New("this kernel cannot run the tc datapath (needs eBPF with cls_bpf or tcx and bpf_redirect_neigh)")

// Plan says which classes each datapath serves; a nil State means the datapath is unused
// (and its kernel state is removed).
type Plan struct {
	Flowtable *model.State `json:"flowtable,omitempty"`
	TC        *model.State `json:"tc,omitempty"`
}

// Summary is a short human description, e.g. "tc: pod-to-pod; flowtable: pod-to-service".
func (p Plan) Summary() string {
	s := ""
	for _, x := range []struct {
		name string
		st   *model.State
	}{{"tc", p.TC}, {"flowtable", p.Flowtable}} {
		if x.st == nil {
			continue
		}
		if s != "" {
			s += "; "
		}
		s += fmt.Sprintf("%s: %v", x.name, x.st.Classes)
	}
	if s == "" {
		return "no fastpath"
	}
	return s
}

func tcAvailable(caps probe.Result) bool {
	return (caps.Has(probe.TCX) || caps.Has(probe.ClsBPF)) && caps.Has(probe.RedirectNeigh)
}

func withClasses(s model.State, cs []model.Class) *model.State {
	s.Classes = cs
	return &s
}

// Choose makes the plan for s on a kernel with caps. The error says what the kernel lacks;
// the plan is still returned with every part that can run (auto degrades class by class).
func Choose(s model.State, caps probe.Result) (Plan, error) {
	switch s.Datapath {
	case model.DatapathNone:
		return Plan{}, nil
	case model.DatapathFlowtable:
		if !caps.Has(probe.Flowtable) {
			return Plan{}, fmt.Errorf("%w: %s", ErrNoFlowtable, caps.Get(probe.Flowtable).Detail)
		}
		return Plan{Flowtable: &s}, nil
	case model.DatapathTC:
		if !tcAvailable(caps) {
			return Plan{}, ErrNoTC
		}
		return Plan{TC: &s}, nil
	case model.DatapathAuto:
		// tc wins for the classes it serves (stateless: best for short connections, seed
		// 000's TCP_CRR); the flowtable takes the rest, which need the host's NAT. But when
		// this node DNATs Pod traffic itself (pod-to-service), a backend Pod's reply looks
		// like pod-to-pod to the stateless program and would skip the un-DNAT: then
		// pod-to-pod stays on the (stateful) flowtable too.
		useTC := tcAvailable(caps) && !s.Enabled(model.PodToService)
		var viaTC, rest []model.Class
		for _, c := range s.Classes {
			if useTC && slices.Contains(tc.Supported, c) {
				viaTC = append(viaTC, c)
			} else {
				rest = append(rest, c)
			}
		}
		var p Plan
		if len(viaTC) > 0 {
			p.TC = withClasses(s, viaTC)
		}
		if len(rest) > 0 {
			if !caps.Has(probe.Flowtable) {
				return p, fmt.Errorf("classes %v stay on the normal path: %w: %s", rest, ErrNoFlowtable, caps.Get(probe.Flowtable).Detail)
			}
			p.Flowtable = withClasses(s, rest)
		}
		return p, nil
	}
	return Plan{}, fmt.Errorf("datapath %q is not available in this build", s.Datapath)
}

// Managers apply plans; each is the only code of its datapath that touches the kernel.
type Managers struct {
	Flowtable *flowtable.Manager
	TC        *tc.Manager
}

// Result says what one Apply did.
type Result struct {
	Flowtable flowtable.Result `json:"flowtable"`
	TC        *tc.Result       `json:"tc,omitempty"`
}

// Changed reports whether the kernel was changed.
func (r Result) Changed() bool {
	t := r.TC
	return r.Flowtable.Operations > 0 || (t != nil && (t.Loaded || len(t.Attached)+len(t.Detached)+t.ElementsAdded+t.ElementsUpdated+t.ElementsRemoved > 0))
}

// Apply makes the kernel match the plan: each datapath in it applied, the others removed.
func (m *Managers) Apply(ctx context.Context, p Plan, caps probe.Result) (Result, error) {
	var res Result
	var errs []error
	if p.TC != nil {
		d, err := tc.Render(*p.TC)
		if err == nil {
			var r tc.Result
			r, err = m.TC.Apply(ctx, d)
			res.TC = &r
		}
		errs = append(errs, err)
	} else if m.TC != nil {
		errs = append(errs, m.TC.Remove(ctx))
	}
	if p.Flowtable != nil {
		r, err := m.Flowtable.Apply(ctx, flowtable.Render(*p.Flowtable, flowtable.Options{FlowtableCounter: caps.Has(probe.FlowtableCounter)}))
		res.Flowtable = r
		errs = append(errs, err)
	} else if m.Flowtable != nil {
		errs = append(errs, m.Flowtable.Remove(ctx))
	}
	return res, errors.Join(errs...)
}

// Remove removes every datapath's kernel state.
func (m *Managers) Remove(ctx context.Context) error {
	var errs []error
	if m.TC != nil {
		errs = append(errs, m.TC.Remove(ctx))
	}
	if m.Flowtable != nil {
		errs = append(errs, m.Flowtable.Remove(ctx))
	}
	return errors.Join(errs...)
}
