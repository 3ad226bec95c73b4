package agent

import (
	"context"
	"errors"
	"fmt"
	"net/netip"

	"github.com/hostaccel/hostaccel/internal/config"
	"github.com/hostaccel/hostaccel/internal/datapath"
	"github.com/hostaccel/hostaccel/internal/flowtable"
	"github.com/hostaccel/hostaccel/internal/lb"
	"github.com/hostaccel/hostaccel/internal/model"
	"github.com/hostaccel/hostaccel/internal/probe"
)

// Inputs are what one pass of the pipeline works from: the node as it is now.
type Inputs struct {
	Links []config.Link
	// Strict: an interface the config names that does not exist is an error (apply: bad
	// input); otherwise it is left out with a warning until it appears (agent).
	Strict bool
	Caps   probe.Result
	// LB applies the load balancer part: the agent's runtime (health checks, API) or a
	// one-shot apply (lb.OneShot). It returns a line for the user, or "".
	LB func(context.Context, lb.Config) (string, error)
	// LBVIPs are the snat and dnat VIPs of the services in effect (the API's merged in), for
	// the external-to-loadbalancer class; false: the config's (nil: the config's).
	LBVIPs func(lb.Config) ([]netip.Addr, bool)
	Mgrs   *datapath.Managers
}

// Outcome is what one pass did.
type Outcome struct {
	State    model.State
	Warnings []string // interfaces left out
	Plan     datapath.Plan
	// PlanErr says what the kernel lacks for the plan; the parts that can run were applied
	// (then it is no error of the pass: Degraded lists it).
	PlanErr error
	LBRan   bool // the load balancer part was applied (LBErr: with this error)
	LBNote  string
	LBErr   error
	Result  datapath.Result
}

// Degraded lists why the node does less than the config asks, besides the errors: the
// interfaces left out, and what the kernel lacks for the part of the plan that could not run
// where another part runs. (Why auto set a datapath aside is a choice, not a degradation:
// Plan.Notes.)
func (o Outcome) Degraded() []string {
	d := append([]string{}, o.Warnings...)
	if o.PlanErr != nil && o.runs() {
		d = append(d, o.PlanErr.Error())
	}
	return d
}

// runs reports whether the plan has a datapath to run.
func (o Outcome) runs() bool {
	return o.Plan.Flowtable != nil || o.Plan.TC != nil || o.Plan.Sockmap != nil
}

// Apply is the one pipeline that `hostaccel apply` and every agent sync go through: the load
// balancer first (its tables must exist before the connections it balances are offloaded, so
// the fastpath sees them after the balancing decision), then the config resolved against the
// links that exist, the plan for this kernel, and the datapaths. A config the links refuse
// (Strict) changes nothing; a plan nothing of which can run leaves the kernel's fastpath as it
// is; with Strict, a plan the kernel cannot run whole changes nothing at all, and a load
// balancer transaction the kernel refuses leaves the datapaths as they are. The error joins
// the load balancer's and the datapaths', and the plan's where no datapath of it can run.
func Apply(ctx context.Context, cfg *config.Config, in Inputs) (Outcome, error) {
	var o Outcome
	vips, ok := []netip.Addr(nil), false
	if in.LBVIPs != nil {
		vips, ok = in.LBVIPs(cfg.LoadBalancer)
	}
	if !ok {
		vips = lb.NATVIPs(cfg.LoadBalancer.Services)
	}
	s, warnings, err := cfg.StateWith(in.Links, in.Strict, vips)
	if err != nil {
		return o, err
	}
	o.State, o.Warnings = s, warnings
	o.Plan, o.PlanErr = datapath.Choose(s, in.Caps)
	if in.Strict && o.PlanErr != nil {
		return o, o.PlanErr // apply: the kernel cannot do all of it, so it does none of it
	}
	if in.LB != nil {
		o.LBRan = true
		o.LBNote, o.LBErr = in.LB(ctx, cfg.LoadBalancer)
		if perr := in.Caps.Privilege(probe.PartLB); o.LBErr != nil && perr != nil {
			o.LBErr = fmt.Errorf("%w: %v", perr, o.LBErr) // the kernel's EPERM, explained
		} else if o.LBErr != nil {
			o.LBErr = fmt.Errorf("load balancer: %w", o.LBErr)
		}
		if in.Strict && o.LBErr != nil {
			// apply: the load balancer's transaction changed nothing, nor do the datapaths
			// (before, they were applied and the error named the load balancer only)
			return o, o.LBErr
		}
	}
	if o.PlanErr != nil && !o.runs() {
		return o, errors.Join(o.LBErr, o.PlanErr) // nothing can run: leave the kernel as it is
	}
	o.Result, err = in.Mgrs.Apply(ctx, o.Plan, in.Caps)
	if err != nil && in.LB != nil && o.LBErr == nil && cfg.LoadBalancer.InUse() {
		// a datapath's "nothing was changed" is of its own transaction: the load balancer's
		// came first and stays (before, the error read as if nothing at all had changed)
		err = fmt.Errorf("%w (the load balancer part was applied)", err)
	}
	// what the kernel lacks for the rest of the plan is no error: the node runs what it
	// can, degraded (Degraded); before, every sync of such a node failed, backed off and
	// raised the sync-error alert while its datapath and load balancer ran
	return o, errors.Join(o.LBErr, err)
}

// Remove takes everything hostaccel installed in this network namespace out of the kernel:
// the datapaths and the load balancer's tables. It says what it found to remove (nothing
// when hostaccel had nothing installed).
func Remove(ctx context.Context, mgrs *datapath.Managers) ([]string, error) {
	var found []string
	if mgrs.Flowtable != nil {
		if t, err := mgrs.Flowtable.Observe(ctx); err == nil && t != nil {
			found = append(found, "table inet "+flowtable.TableName)
		}
	}
	if mgrs.TC != nil {
		if st, err := mgrs.TC.Status(ctx); err == nil && len(st.Devices) > 0 {
			found = append(found, "the tc datapath")
		}
	}
	if mgrs.Sockmap != nil {
		if st, err := mgrs.Sockmap.Status(ctx); err == nil && st != nil {
			found = append(found, "the sockmap datapath")
		}
	}
	m, err := lb.NewManager()
	if err == nil {
		defer m.Close()
		m.KnownDir = lb.DefaultKnownDir // `apply`'s cache goes too
		var refs []lb.TableRef
		refs, err = m.Remove(ctx)
		for _, r := range refs {
			found = append(found, "table "+r.String())
		}
	}
	return found, errors.Join(mgrs.Remove(ctx), err)
}
