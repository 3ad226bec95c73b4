// Package datapath chooses, per traffic class, which datapath serves it (from the config's
// `datapath` and what the kernel can do), and applies that plan through the datapaths'
// managers. `auto` is a choice over datapaths, not a datapath.
package datapath

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/hostaccel/hostaccel/internal/flowtable"
	"github.com/hostaccel/hostaccel/internal/model"
	"github.com/hostaccel/hostaccel/internal/probe"
	"github.com/hostaccel/hostaccel/internal/sockmap"
	"github.com/hostaccel/hostaccel/internal/tc"
)

// ErrNoFlowtable: the kernel cannot do what was asked.
var ErrNoFlowtable = errors.New("this kernel has no nftables flowtable (load nf_flow_table_inet and nft_flow_offload, or use a kernel with CONFIG_NF_FLOW_TABLE_INET)")

// ErrNoTC: no way to attach the tc program.
var ErrNoTC = errors.New("this kernel cannot run the tc datapath (needs eBPF with cls_bpf or tcx and bpf_redirect_neigh)")

// ErrTCNotNATSafe: the tc datapath was asked for, but the kernel cannot tell it which flows
// this node NATs. Choose returns the plan with it: an agent runs that plan, degraded (the
// error is in its status), `hostaccel apply` refuses it (Strict). So the text says what the
// kernel lacks and what tc without it does, not which of the two happened.
var ErrTCNotNATSafe = errors.New("the tc datapath has no NAT check on this kernel: it lacks the conntrack kfuncs (bpf_skb_ct_lookup, Linux >= 5.18 with BTF), and without the check replies of connections this node's stack NATs to or from local Pods (a ClusterIP, a NodePort without SNAT) skip the un-NAT and break; use datapath auto, or set tc.natCheck: off if this node NATs no Pod traffic")

// ErrNoSockmap: the kernel cannot run the sockmap datapath.
var ErrNoSockmap = errors.New("this kernel cannot run the sockmap datapath (needs sockhash, sk_msg and sock_ops: CONFIG_BPF_STREAM_PARSER, CONFIG_NET_SOCK_MSG, and a cgroup v2 mount)")

// Plan says which classes each datapath serves; a nil State means the datapath is unused
// (and its kernel state is removed).
type Plan struct {
	Flowtable *model.State `json:"flowtable,omitempty"`
	TC        *model.State `json:"tc,omitempty"`
	Sockmap   *model.State `json:"sockmap,omitempty"`
	// Notes say why auto chose as it did where a faster datapath was set aside.
	Notes []string `json:"notes,omitempty"`
}

// Summary is a short human description, e.g. "tc: pod-to-pod; flowtable: pod-to-service".
func (p Plan) Summary() string {
	s := ""
	for _, x := range []struct {
		name string
		st   *model.State
	}{{"sockmap", p.Sockmap}, {"tc", p.TC}, {"flowtable", p.Flowtable}} {
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

// natSafe: the tc program can keep the flows this node NATs on the stack, or the user says
// there are none.
func natSafe(s model.State, caps probe.Result) bool {
	return caps.Has(probe.ConntrackKfuncs) || s.TCNATCheck == model.NATCheckOff
}

// noFlowtable says why the flowtable cannot run: this process's privileges, else the kernel.
func noFlowtable(caps probe.Result) error {
	if err := caps.Privilege(probe.PartFlowtable); err != nil {
		return err
	}
	return fmt.Errorf("%w: %s", ErrNoFlowtable, caps.Get(probe.Flowtable).Detail)
}

// sockmapAvailable: the kernel has the sockmap's program and map types and a cgroup v2 mount,
// and this process may attach to it.
func sockmapAvailable(caps probe.Result) bool {
	return caps.Privilege(probe.PartTC) == nil && caps.Has(probe.SockMap) && caps.Has(probe.SockMapFIONREAD)
}

func hasTCClass(s model.State) bool {
	return slices.ContainsFunc(s.Classes, func(c model.Class) bool { return slices.Contains(tc.Supported, c) })
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
			return Plan{}, noFlowtable(caps)
		}
		return Plan{Flowtable: &s}, nil
	case model.DatapathTC:
		// Privilege first: without CAP_SYS_ADMIN the tc probes fail as if the kernel lacked
		// tc, and a program loaded could not be found again by the next sync.
		if err := caps.Privilege(probe.PartTC); err != nil {
			return Plan{}, err
		}
		if !tcAvailable(caps) {
			return Plan{}, ErrNoTC
		}
		if !natSafe(s, caps) {
			return Plan{TC: &s}, ErrTCNotNATSafe
		}
		return Plan{TC: &s}, nil
	case model.DatapathSockmap:
		if err := caps.Privilege(probe.PartTC); err != nil {
			return Plan{}, err
		}
		if !caps.Has(probe.SockMap) {
			return Plan{}, fmt.Errorf("%w: %s", ErrNoSockmap, caps.Get(probe.SockMap).Detail)
		}
		p := Plan{Sockmap: &s}
		if !caps.Has(probe.SockMapFIONREAD) {
			p.Notes = append(p.Notes, "sockmap runs as asked, but "+sockmapWhyNot(caps))
		}
		return p, nil
	case model.DatapathAuto:
		// tc wins for the classes it serves (no connection setup: best for short
		// connections, seed 000's TCP_CRR); the flowtable takes the rest, which need the
		// host's NAT. tc is chosen only where it can tell the flows this node's stack NATs
		// (a backend Pod's reply to a ClusterIP connection looks like pod-to-pod): with the
		// conntrack kfuncs, or on the user's word that the host stack NATs no Pod traffic
		// (tc.natCheck: off). Otherwise nothing says this node does not DNAT, and the
		// stateful flowtable keeps those classes.
		privErr := caps.Privilege(probe.PartTC)
		useTC := privErr == nil && tcAvailable(caps) && natSafe(s, caps)
		var p Plan
		switch {
		case privErr != nil && hasTCClass(s):
			p.Notes = append(p.Notes, "auto keeps pod-to-pod and node-to-remote-pod off the tc datapath: "+privErr.Error())
		case tcAvailable(caps) && !useTC:
			p.Notes = append(p.Notes, "auto keeps pod-to-pod and node-to-remote-pod off the tc datapath: this kernel lacks bpf_skb_ct_lookup, so tc could not tell the flows this node NATs (set tc.natCheck: off if it NATs no Pod traffic)")
		}
		// local-pod-to-pod goes socket to socket where the kernel can and sockmap.auto allows
		// it (splice(2) readers lose moved data: off by default); else tc moves its
		// packets from one Pod's gateway veth into the other Pod (bpf_redirect_peer), where
		// tc is chosen; else the flowtable takes it (it passes the forward hook between two
		// gateway veths).
		useSockmap := s.SockmapInAuto && sockmapAvailable(caps)
		if s.SockmapInAuto && !useSockmap && s.Enabled(model.LocalPodToPod) {
			p.Notes = append(p.Notes, "auto keeps local-pod-to-pod off the sockmap datapath: "+sockmapWhyNot(caps))
		}
		var viaTC, viaSockmap, rest []model.Class
		for _, c := range s.Classes {
			if useSockmap && slices.Contains(sockmap.Supported, c) {
				viaSockmap = append(viaSockmap, c)
			} else if useTC && slices.Contains(tc.Supported, c) {
				viaTC = append(viaTC, c)
			} else {
				rest = append(rest, c)
			}
		}
		if len(viaTC) > 0 {
			p.TC = withClasses(s, viaTC)
		}
		if len(viaSockmap) > 0 {
			p.Sockmap = withClasses(s, viaSockmap)
		}
		if len(rest) > 0 {
			if !caps.Has(probe.Flowtable) {
				return p, fmt.Errorf("classes %v stay on the normal path: %w", rest, noFlowtable(caps))
			}
			p.Flowtable = withClasses(s, rest)
		}
		return p, nil
	}
	return Plan{}, fmt.Errorf("datapath %q is not available in this build", s.Datapath)
}

func sockmapWhyNot(caps probe.Result) string {
	if err := caps.Privilege(probe.PartTC); err != nil {
		return err.Error()
	}
	if !caps.Has(probe.SockMap) {
		return "this kernel lacks it (" + caps.Get(probe.SockMap).Detail + ")"
	}
	return "on this kernel FIONREAD does not count the data sockmap moves to a socket (" + caps.Get(probe.SockMapFIONREAD).Detail + "): programs that size their reads with it could hang"
}

// Managers apply plans; each is the only code of its datapath that touches the kernel.
type Managers struct {
	Flowtable *flowtable.Manager
	TC        *tc.Manager
	Sockmap   *sockmap.Manager
}

// Result says what one Apply did.
type Result struct {
	Flowtable flowtable.Result `json:"flowtable"`
	TC        *tc.Result       `json:"tc,omitempty"`
	Sockmap   *sockmap.Result  `json:"sockmap,omitempty"`
}

// Changed reports whether the kernel was changed.
func (r Result) Changed() bool {
	t := r.TC
	return r.Flowtable.Operations > 0 || (t != nil && (t.Loaded || len(t.Attached)+len(t.Detached)+t.ElementsAdded+t.ElementsUpdated+t.ElementsRemoved > 0)) ||
		(r.Sockmap != nil && r.Sockmap.Changed())
}

// Apply makes the kernel match the plan: each datapath in it applied, then the others
// removed, only once every one of the plan's went in (make before break: a switch whose new
// datapath the kernel refuses, a flowtable transaction say, keeps the old one working and
// says so; before, the old one was removed first and the node was left with neither, while
// the error said nothing had changed). An error names the plan's datapaths that were applied
// all the same: a failed flowtable transaction's "nothing was changed" is of that
// transaction, and the tc datapath applied before it stays attached (before, the error read
// as if the kernel had not been changed at all).
func (m *Managers) Apply(ctx context.Context, p Plan, caps probe.Result) (Result, error) {
	var res Result
	var errs []error
	var applied []string // the plan's datapaths applied without an error
	var remove []func(context.Context) error
	if p.TC != nil {
		d, err := tc.Render(*p.TC)
		if err == nil {
			var r tc.Result
			r, err = m.TC.Apply(ctx, d)
			res.TC = &r
		}
		errs = append(errs, err)
		if err == nil {
			applied = append(applied, "tc")
		}
	} else if m.TC != nil && probe.CheckPrivilege(probe.PartTC) == nil {
		// (without CAP_SYS_ADMIN no program is found by its ID, ours or another's: no
		// process of these capabilities attached ours, and every sync failed on another's)
		remove = append(remove, m.TC.Remove)
	}
	if p.Sockmap != nil && m.Sockmap == nil {
		errs = append(errs, errors.New("the plan has the sockmap datapath, but no manager for it"))
	} else if p.Sockmap != nil {
		r, err := m.Sockmap.Apply(ctx, sockmap.Render(*p.Sockmap))
		res.Sockmap = &r
		errs = append(errs, err)
		if err == nil {
			applied = append(applied, "sockmap")
		}
	} else if m.Sockmap != nil {
		remove = append(remove, m.Sockmap.Remove)
	}
	if p.Flowtable != nil {
		r, err := m.Flowtable.Apply(ctx, flowtable.Render(*p.Flowtable, flowtable.Options{FlowtableCounter: caps.Has(probe.FlowtableCounter)}))
		res.Flowtable = r
		errs = append(errs, err)
		if err == nil {
			applied = append(applied, "flowtable")
		}
	} else if m.Flowtable != nil {
		remove = append(remove, m.Flowtable.Remove)
	}
	if err := errors.Join(errs...); err != nil {
		var notes []string
		if len(applied) > 0 {
			notes = append(notes, appliedNote(applied))
		}
		if len(remove) > 0 {
			notes = append(notes, "the datapaths the plan no longer has were kept")
		}
		if len(notes) > 0 {
			err = fmt.Errorf("%w (%s)", err, strings.Join(notes, "; "))
		}
		return res, err
	}
	for _, rm := range remove {
		errs = append(errs, rm(ctx))
	}
	if err := errors.Join(errs...); err != nil {
		if len(applied) > 0 {
			// a removal's error alone reads as if the plan had not gone in either
			err = fmt.Errorf("%w (%s)", err, appliedNote(applied))
		}
		return res, err
	}
	return res, nil
}

// appliedNote says that the datapaths named were applied: "the tc datapath was applied",
// "the tc and sockmap datapaths were applied".
func appliedNote(names []string) string {
	if len(names) == 1 {
		return "the " + names[0] + " datapath was applied"
	}
	return "the " + strings.Join(names[:len(names)-1], ", ") + " and " + names[len(names)-1] + " datapaths were applied"
}

// Close ends the managers' use and leaves their datapaths in place (a one-shot apply exiting,
// the agent stopping without removing them): what only their memory holds, the tc
// datapath's clsact qdiscs that no attach took, goes with them.
func (m *Managers) Close() {
	if m.TC != nil {
		m.TC.Close()
	}
}

// Remove removes every datapath's kernel state.
func (m *Managers) Remove(ctx context.Context) error {
	var errs []error
	if m.TC != nil {
		errs = append(errs, m.TC.Remove(ctx))
	}
	if m.Sockmap != nil {
		errs = append(errs, m.Sockmap.Remove(ctx))
	}
	if m.Flowtable != nil {
		errs = append(errs, m.Flowtable.Remove(ctx))
	}
	return errors.Join(errs...)
}
