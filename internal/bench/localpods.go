package bench

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"time"

	"golang.org/x/sys/unix"

	"github.com/hostaccel/hostaccel/internal/datapath"
	"github.com/hostaccel/hostaccel/internal/flowtable"
	"github.com/hostaccel/hostaccel/internal/model"
	"github.com/hostaccel/hostaccel/internal/probe"
	"github.com/hostaccel/hostaccel/internal/sockmap"
	"github.com/hostaccel/hostaccel/internal/tc"
	"github.com/hostaccel/hostaccel/internal/testbed"
)

// Pod-to-Pod (same node): TCP between two Pods of one node (testbed.LocalPods: each Pod behind
// its own gateway veth of the node, routed), netperf with 64-byte and 64-KiB messages.
const (
	LocalPodToPod64  Traffic = "local-pod-to-pod-64"
	LocalPodToPod64K Traffic = "local-pod-to-pod-64k"
)

// LocalTraffics are the same-node paths; not in a plain `hostaccel bench` (--traffic
// local-pod-to-pod-64,local-pod-to-pod-64k).
var LocalTraffics = []Traffic{LocalPodToPod64, LocalPodToPod64K}

// allTraffics lists every traffic type in report order.
func allTraffics() []Traffic { return append(slices.Clone(Traffics), LocalTraffics...) }

func (t Traffic) local() bool { return slices.Contains(LocalTraffics, t) }

// msgSize is the message size of a same-node traffic type (netperf -m / -r).
func (t Traffic) msgSize() int {
	if t == LocalPodToPod64 {
		return 64
	}
	return 64 << 10
}

// Variants of the same-node traffic only.
const (
	VariantSockmap  = "hostaccel-sockmap"
	VariantLoopback = "loopback"
)

// localSetups are what each variant installs for the same-node traffic (the others do not run
// it): nothing (Default: the node routes between its two gateways), the sockmap datapath, the
// tc datapath (bpf_redirect_peer), or the limit, a loopback connection inside one Pod.
var localSetups = map[string]func(ctx context.Context, p *testbed.LocalPods, caps probe.Result) (undo func() error, err error){
	VariantDefault:  nil,
	VariantLoopback: nil,
	VariantSockmap: func(ctx context.Context, p *testbed.LocalPods, _ probe.Result) (func() error, error) {
		return localSockmap(ctx, localState(p, model.DatapathSockmap))
	},
	VariantTC: func(ctx context.Context, p *testbed.LocalPods, _ probe.Result) (func() error, error) {
		return localTC(ctx, p, localState(p, model.DatapathTC))
	},
	VariantAuto: func(ctx context.Context, p *testbed.LocalPods, caps probe.Result) (func() error, error) {
		plan, err := datapath.Choose(localState(p, model.DatapathAuto), caps)
		switch {
		case plan.Sockmap != nil:
			return localSockmap(ctx, *plan.Sockmap)
		case plan.TC != nil:
			return localTC(ctx, p, *plan.TC)
		case plan.Flowtable != nil:
			r := flowtable.Render(*plan.Flowtable, flowtable.Options{FlowtableCounter: caps.Has(probe.FlowtableCounter)})
			return func() error { return removeFlowtableIn(context.Background(), p.Node) }, applyFlowtableRuleset(ctx, p.Node, r)
		}
		return nil, fmt.Errorf("auto chose nothing for local-pod-to-pod here: %v", err)
	},
}

// localState is the node of the same-node traffic with datapath dp: its two gateways, both
// Pods' CIDRs local, the local-pod-to-pod class only.
func localState(p *testbed.LocalPods, dp string) model.State {
	s := model.State{Datapath: dp, Gateways: []string{"gwa", "gwb"}, LocalPodCIDRs: p.CIDRs, Classes: []model.Class{model.LocalPodToPod}}
	s.Normalize()
	return withIndexes(p.Node, s)
}

// localSockmap applies the sockmap datapath for s; undo removes it.
func localSockmap(ctx context.Context, s model.State) (func() error, error) {
	// A BPF filesystem of its own for the pin, so that the bench never mounts one on
	// the host's /sys/fs/bpf.
	dir, err := os.MkdirTemp("", "hostaccel-bench-bpffs")
	if err != nil {
		return nil, err
	}
	if err := unix.Mount("bpf", dir, "bpf", 0, "mode=0700"); err != nil {
		os.Remove(dir)
		return nil, fmt.Errorf("bpffs for the sockmap pin: %w", err)
	}
	m := &sockmap.Manager{PinDir: dir}
	undo := func() error {
		m.Drain = 5 * time.Second // netperf's connections are closed: the map empties
		err := m.Remove(context.Background())
		return errors.Join(err, unix.Unmount(dir, unix.MNT_DETACH), os.Remove(dir))
	}
	if _, err := m.Apply(ctx, sockmap.Render(s)); err != nil {
		return nil, errors.Join(err, undo())
	}
	return undo, nil
}

// localTC applies the tc datapath for s in the node: its local-pod-to-pod class moves each
// packet from one Pod's gateway veth into the other Pod (bpf_redirect_peer); undo removes it.
func localTC(ctx context.Context, p *testbed.LocalPods, s model.State) (func() error, error) {
	d, err := tc.Render(s)
	if err != nil {
		return nil, err
	}
	err = p.Node.Do(func() error { _, err := tc.NewManager().Apply(ctx, d); return err })
	return func() error { return p.Node.Do(func() error { return tc.NewManager().Remove(context.Background()) }) }, err
}

// localNote is printed under the report when the same-node traffic ran.
const localNote = "Pod-to-Pod (same node): two Pods behind their own gateway veths of one node (10.213.0.0/16), netperf with 64-byte messages (-m 64 for TCP_STREAM, -r 64,64 otherwise) and 64-KiB ones. Default: the node routes between the gateways. hostaccel tc: the tc datapath's local-pod-to-pod class (both gateways, the NAT check on), each packet moved from one Pod's veth into the other Pod with bpf_redirect_peer. hostaccel sockmap: socket to socket. hostaccel auto: what datapath auto chooses for the class on this kernel with its defaults (tc, else the flowtable; sockmap only with sockmap.auto: true, and where FIONREAD counts its data). Loopback: netperf to 127.0.0.1 inside one Pod, the limit. Other variants do not run this traffic."

// localPods measures the same-node traffic types of o for the variants that have a setup for
// it, interleaved (each repetition rotates the variants).
func (r *Run) localPods(ctx context.Context, o Options, variants []Variant, caps probe.Result, prog *Progress) (err error) {
	prog.Status("building two Pods on one node")
	pods, err := testbed.NewLocalPods()
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, pods.Close()) }()
	for _, n := range []*testbed.NS{pods.A, pods.B} {
		if _, err := n.Start(NetserverArgs(r.Pin)...); err != nil {
			return err
		}
	}
	time.Sleep(300 * time.Millisecond) // netservers listening
	r.Notes = append(r.Notes, localNote)
	for rep := 1; rep <= o.Reps; rep++ {
		for _, v := range rotate(localVariants(variants), rep-1) {
			if err := ctx.Err(); err != nil {
				return err
			}
			undo := func() error { return nil }
			if setup := localSetups[v.Name]; setup != nil {
				if undo, err = setup(ctx, pods, caps); err != nil {
					return fmt.Errorf("%s: %w", v.Name, err)
				}
			}
			time.Sleep(phaseDelay(o.PhaseSpread, rep, o.Reps))
			for _, t := range o.Traffic {
				if !t.local() {
					continue
				}
				for _, test := range o.Tests {
					r.Samples = append(r.Samples, r.localSample(ctx, pods, o, v.Name, t, test, rep, prog))
				}
			}
			if err := undo(); err != nil {
				return fmt.Errorf("%s: teardown: %w", v.Name, err)
			}
		}
	}
	return nil
}

func localVariants(vs []Variant) []Variant {
	var out []Variant
	for _, v := range vs {
		if _, ok := localSetups[v.Name]; ok {
			out = append(out, v)
		}
	}
	return out
}

func (r *Run) localSample(ctx context.Context, pods *testbed.LocalPods, o Options, variant string, t Traffic, test string, rep int, prog *Progress) Sample {
	s := Sample{Variant: variant, Traffic: t, Test: test, Rep: rep, Unit: Unit(test), CPU: [2]int{-1, -1}, At: time.Now()}
	prog.Status(fmt.Sprintf("%s %s %s %s rep %d/%d", r.Env, variant, t, test, rep, o.Reps))
	host, client := pods.B4.String(), pods.A
	if variant == VariantLoopback {
		host = "127.0.0.1"
	}
	cmd := NetperfCmd{Test: test, Host: host, Ctrl: CtrlPort, Data: DataPort, Duration: o.Duration, Pin: r.Pin, MsgSize: t.msgSize()}
	res, _, err := cmd.Run(ctx, client)
	if err != nil && ctx.Err() == nil {
		time.Sleep(time.Second) // a netserver child still exiting, a port in TIME_WAIT
		res, _, err = cmd.Run(ctx, client)
	}
	if err != nil {
		s.Error = err.Error()
		prog.Done(fmt.Sprintf("%s %s %s %s rep %d/%d: error: %s", r.Env, variant, t, test, rep, o.Reps, firstLines(s.Error, 1)))
		return s
	}
	s.Value, s.Elapsed, s.CPU = res.Value, res.Elapsed, [2]int{res.LocalCPU, res.RemoteCPU}
	prog.Done(fmt.Sprintf("%s %s %s %s rep %d/%d: %.2f %s", r.Env, variant, t, test, rep, o.Reps, s.Value, s.Unit))
	return s
}
