//go:build bench

// The benchmark (netperf orchestration, PNG charts, google/nftables) is built only with
// -tags bench (scripts/bench.sh builds it as hostaccel-bench): the agent does not carry it.
// Without the tag, bench_stub.go's `bench` runs that binary.

package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/sys/unix"

	"github.com/hostaccel/hostaccel/internal/bench"
)

func init() { commands = append(commands, benchCmd) }

func benchCmd(g *globals) *cobra.Command {
	o := bench.Defaults()
	var (
		variants, tests, traffic []string
		directions               []string
		vmOnly                   bool
		out, env, jsonOut        string
		renderFrom               string
	)
	c := &cobra.Command{
		Use:   "bench",
		Short: "Reproduce the seed benchmark tables on this machine: default path, hostaccel, Antrea, Kindnet, direct link",
		Long: `Builds a kind-like cluster of network namespaces and measures netperf TCP_STREAM, TCP_RR
and TCP_CRR for Pod-to-Pod, Pod-to-Service, External-to-NodePort and External-to-LoadBalancer
(a dnat service of hostaccel's load balancer), plus the per-packet
forwarding cost with pktgen, for every variant side by side: the default node path (conntrack,
kube-proxy-like NAT, N forward rules), hostaccel's datapaths, the Antrea (seed 001) and Kindnet
(seed 002) rulesets, and a direct link with no hop. Variants this kernel lacks run inside the
project's VM (vmtest/run-in-vm.sh), compared there only with the VM's own default and direct
link. Writes <date>-<commit>.md, .json (every sample) and .png (bars with spread) to --out.
Needs root; touches nothing outside the namespaces it creates, and removes them on exit,
failure or Ctrl-C.`,
		Example: `  hostaccel bench                                  # everything, 5 repetitions
  hostaccel bench --reps 1 --duration 2s --vm never  # a quick look at the host's variants
  hostaccel bench --variants default,antrea,hostaccel-flowtable --tests TCP_RR --rules 1000
  hostaccel bench --vm-only --tests '' --reps 3 --out /tmp/bench   # only the VM's per-packet rows`,
		RunE: func(c *cobra.Command, _ []string) error {
			o.Variants, o.Tests = variants, tests
			o.Traffic = nil
			for _, t := range traffic {
				o.Traffic = append(o.Traffic, bench.Traffic(t))
			}
			if len(o.Tests) == 1 && o.Tests[0] == "" {
				o.Tests = nil
			}
			o.PktgenDirections = nil
			for _, d := range directions {
				o.PktgenDirections = append(o.PktgenDirections, bench.Direction(d))
			}
			if vmOnly {
				o.VM = bench.VMOnly
			}
			// --duration is the host's run length: a VM-only run ignoring it silently
			// measured 1 s cells that its author took for 5 s ones.
			if o.VM == bench.VMOnly && c.Flags().Changed("duration") && !c.Flags().Changed("vm-duration") {
				return fmt.Errorf("--duration: the host's netperf run length, and this run has no host part (--vm only); the VM's is --vm-duration")
			}
			o.Command = bench.CommandLine(append([]string{"hostaccel"}, os.Args[1:]...))
			if err := o.Validate(); err != nil {
				return err
			}
			if renderFrom != "" {
				return rerender(renderFrom, out)
			}
			if os.Geteuid() != 0 {
				return fmt.Errorf("bench needs root (network namespaces, nftables, pktgen)")
			}
			ctx, stop := signal.NotifyContext(c.Context(), syscall.SIGINT, syscall.SIGTERM)
			defer stop()
			go func() { <-ctx.Done(); stop() }() // a second Ctrl-C kills at once
			// A --here run reports plain lines (in the VM they travel over the console).
			prog := &bench.Progress{W: os.Stderr, TTY: !o.Here && isTTY(os.Stderr)}
			defer prog.Finish()
			if o.Here {
				return benchHere(ctx, o, env, jsonOut, prog, c)
			}
			rep, err := bench.Measure(ctx, o, prog)
			prog.Finish()
			if rep == nil || len(rep.Runs) == 0 {
				return err
			}
			if g.output == "json" {
				js, jerr := rep.JSON()
				if jerr != nil {
					return jerr
				}
				fmt.Fprintln(c.OutOrStdout(), string(js))
			} else {
				md := rep.Markdown()
				if i := strings.Index(md, "\n## Machine"); i > 0 {
					md = md[:i]
				}
				fmt.Fprint(c.OutOrStdout(), md)
			}
			paths, werr := rep.Write(out)
			for _, p := range paths {
				fmt.Fprintln(os.Stderr, "wrote", p)
			}
			if err != nil {
				return fmt.Errorf("%w (the report holds what was measured)", err)
			}
			return werr
		},
	}
	f := c.Flags()
	f.StringSliceVar(&variants, "variants", nil, "variants to measure (default: "+strings.Join(bench.DefaultNames(), ",")+"; all: "+strings.Join(bench.Names(), ",")+")")
	f.StringSliceVar(&tests, "tests", bench.Tests, "netperf tests (empty: pktgen only)")
	f.StringSliceVar(&traffic, "traffic", []string{string(bench.PodToPod), string(bench.PodToService), string(bench.ExternalToNodePort), string(bench.ExternalToLoadBalancer)}, "traffic types")
	f.IntVar(&o.Reps, "reps", o.Reps, "repetitions of every cell (variants interleaved)")
	f.IntVar(&o.VMReps, "vm-reps", 0, "repetitions inside the VM (default: --reps; its icount clock repeats to a fraction of a percent)")
	f.DurationVar(&o.PhaseSpread, "phase-spread", 0, "start a variant's cells in repetition k (k-1)/reps of this period after its install, so the kernel's periodic work falls at every phase of a cell (default: 1s in the VM under icount, none on the host)")
	f.IntVar(&o.VMBoots, "vm-boots", 1, "boot the VM this many times, --vm-reps repetitions each, and pool the samples (each boot's hash seeds move a variant's cells together by up to ~0.7%)")
	f.DurationVar(&o.Duration, "duration", o.Duration, "netperf run length on the host (whole seconds)")
	f.DurationVar(&o.VMDuration, "vm-duration", o.VMDuration, "netperf run length inside the VM, in the guest's clock")
	f.IntVar(&o.Rules, "rules", o.Rules, "filter rules in the default path's forward chain (e.g. 0, 100, 1000)")
	f.StringVar(&o.Pin, "pin", o.Pin, "CPU for netperf, netserver and pktgen: auto (the last CPU), none, or a number")
	f.IntVar(&o.Nodes, "nodes", o.Nodes, "nodes in the cluster (2 or 3)")
	f.IntVar(&o.Services, "services", o.Services, "idle Services in the kube-proxy-like ruleset besides netperf's")
	f.BoolVar(&o.Pktgen, "pktgen", o.Pktgen, "measure the per-packet cost with pktgen (in the VM where this kernel has no pktgen)")
	f.DurationVar(&o.PktgenDuration, "pktgen-duration", o.PktgenDuration, "length of a pktgen round, in the kernel's clock")
	f.IntVar(&o.PktgenSize, "pktgen-size", o.PktgenSize, "pktgen packet size in bytes")
	f.StringSliceVar(&directions, "pktgen-directions", []string{string(bench.PodToRemote), string(bench.RemoteToPod)}, "per-packet directions: pod-to-remote (gateway in, transport out), remote-to-pod (transport in, gateway out)")
	f.StringVar(&o.VM, "vm", o.VM, "auto (variants this kernel lacks, and pktgen if it lacks it, run in the VM), always, never, or only (no host run)")
	f.BoolVar(&vmOnly, "vm-only", false, "measure in the VM only (same as --vm only): the quick way to re-run the VM's rows")
	f.BoolVar(&o.VMICount, "vm-icount", o.VMICount, "deterministic icount mode in the VM (one vCPU, guest clock = instruction count)")
	f.StringVar(&o.VMTest, "vmtest", "", "directory of run-in-vm.sh (default: vmtest/ found from the working directory or the binary)")
	f.DurationVar(&o.VMTimeout, "vm-timeout", 0, "give up on the VM after this long (default: estimated from the plan)")
	f.StringVar(&out, "out", ".", "directory for the report (<date>-<commit>.md, .json, .png)")
	addOutput(c, g)
	f.StringVar(&renderFrom, "render", "", "write the report again from its JSON (no measuring)")
	f.BoolVar(&o.Here, "here", false, "measure in this kernel only and print the run as JSON (what the VM runs)")
	f.StringVar(&env, "env", "host", "label of a --here run")
	f.StringVar(&jsonOut, "json-out", "-", "where a --here run writes its JSON")
	f.BoolVar(&o.RaiseConntrackMax, "raise-conntrack-max", false, "raise nf_conntrack_max to 262144 (only in a kernel the run owns)")
	for _, h := range []string{"here", "env", "json-out", "raise-conntrack-max"} {
		_ = f.MarkHidden(h)
	}
	c.AddCommand(controlPlaneCmd())
	return c
}

func controlPlaneCmd() *cobra.Command {
	o := bench.CPOptions{Reps: 3, Timeout: 5 * time.Minute}
	var out string
	c := &cobra.Command{
		Use:   "control-plane",
		Short: "Measure apply and render at 100 to 50,000 objects: tc and flowtable peers, load balancer backends",
		Long: `Runs this hostaccel binary as a user does, each repetition in a fresh network namespace:
the tc datapath with N peer Pod CIDRs (one route each): first apply, one CIDR replaced, no
change; the flowtable's render of N peer CIDRs; the load balancer with services of 100 backends
and with one service of N backends: first apply, one backend drained, no change, and growing
from a tenth to N. Beside them, raw ` + "`nft -f`" + ` of N elements and of one more (the limit).
Records the seconds and the peak memory of every sample; writes
<date>-<commit>-control-plane.md and .json to --out. Needs root.`,
		Example: `  hostaccel bench control-plane --sizes 100,1000,10000 --reps 3 --out docs/benchmarks`,
		Args:    cobra.NoArgs,
		RunE: func(c *cobra.Command, _ []string) error {
			if os.Geteuid() != 0 {
				return fmt.Errorf("bench control-plane needs root (network namespaces)")
			}
			for _, p := range o.Parts {
				if !slices.Contains(bench.CPPartsAll, p) {
					return fmt.Errorf("--parts: %q is none of %v", p, bench.CPPartsAll)
				}
			}
			if o.Reps < 1 || len(o.Sizes) == 0 {
				return fmt.Errorf("--reps and --sizes: at least one")
			}
			if err := o.Check(); err != nil {
				return err
			}
			if o.Bin == "" {
				exe, err := os.Executable()
				if err != nil {
					return err
				}
				o.Bin = exe
			}
			o.Command = bench.CommandLine(append([]string{"hostaccel"}, os.Args[1:]...))
			ctx, stop := signal.NotifyContext(c.Context(), syscall.SIGINT, syscall.SIGTERM)
			defer stop()
			prog := &bench.Progress{W: os.Stderr, TTY: isTTY(os.Stderr)}
			rep, err := bench.ControlPlane(ctx, o, prog)
			prog.Finish()
			fmt.Fprint(c.OutOrStdout(), rep.Markdown())
			paths, werr := rep.Write(out)
			for _, p := range paths {
				fmt.Fprintln(os.Stderr, "wrote", p)
			}
			return joinErr(err, werr)
		},
	}
	f := c.Flags()
	f.IntSliceVar(&o.Sizes, "sizes", []int{100, 1000, 10000, 50000}, "numbers of objects")
	f.IntVar(&o.Reps, "reps", o.Reps, "repetitions (parts rotated every repetition)")
	f.StringSliceVar(&o.Parts, "parts", bench.CPParts, "what to measure (also: k8s, which needs scripts/k8s-build-test-bins.sh)")
	f.DurationVar(&o.Timeout, "timeout", o.Timeout, "give up on a step after this long (recorded as failed)")
	f.StringVar(&o.Bin, "bin", "", "the hostaccel binary to measure (default: this one)")
	f.StringVar(&o.AgentLogs, "agent-logs", "", "keep each agent's output in this directory")
	f.StringVar(&out, "out", ".", "directory for the report")
	return c
}

func benchHere(ctx context.Context, o bench.Options, env, jsonOut string, prog *bench.Progress, c *cobra.Command) error {
	r, err := bench.RunHere(ctx, o, env, prog)
	prog.Finish()
	if r == nil {
		return err
	}
	js, jerr := json.Marshal(r)
	if jerr != nil {
		return jerr
	}
	js = append(js, '\n')
	if jsonOut == "-" {
		_, werr := c.OutOrStdout().Write(js)
		return joinErr(err, werr)
	}
	if dir := filepath.Dir(jsonOut); dir != "/dev" {
		if werr := os.MkdirAll(dir, 0o755); werr != nil {
			return joinErr(err, werr)
		}
	}
	return joinErr(err, os.WriteFile(jsonOut, js, 0o644))
}

// rerender writes a report's Markdown and PNG again from its JSON, into out.
func rerender(path, out string) error {
	data, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	var rep bench.Report
	if err := json.Unmarshal(data, &rep); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	rep.Summarize()
	paths, err := rep.Write(out)
	for _, p := range paths {
		fmt.Fprintln(os.Stderr, "wrote", p)
	}
	return err
}

func joinErr(a, b error) error {
	if a == nil {
		return b
	}
	if b == nil {
		return a
	}
	return fmt.Errorf("%w; %v", a, b)
}

func isTTY(f *os.File) bool {
	_, err := unix.IoctlGetTermios(int(f.Fd()), unix.TCGETS)
	return err == nil
}
