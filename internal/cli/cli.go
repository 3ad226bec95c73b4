// Package cli holds hostaccel's cobra commands: thin wrappers over config, probe, the
// datapaths and the agent.
package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	"os/signal"
	"path/filepath"
	"runtime/debug"
	pprofruntime "runtime/pprof"
	"slices"
	"strings"
	"sync/atomic"
	"syscall"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/hostaccel/hostaccel/internal/agent"
	"github.com/hostaccel/hostaccel/internal/config"
	"github.com/hostaccel/hostaccel/internal/datapath"
	"github.com/hostaccel/hostaccel/internal/flowtable"
	"github.com/hostaccel/hostaccel/internal/lb"
	"github.com/hostaccel/hostaccel/internal/lock"
	"github.com/hostaccel/hostaccel/internal/metrics"
	"github.com/hostaccel/hostaccel/internal/model"
	"github.com/hostaccel/hostaccel/internal/probe"
	"github.com/hostaccel/hostaccel/internal/sockmap"
	"github.com/hostaccel/hostaccel/internal/tc"
)

// Main runs the CLI and returns the exit code.
func Main(args []string) int {
	if p := os.Getenv(EnvCPUProfile); p != "" {
		if f, err := os.Create(p); err == nil && pprofruntime.StartCPUProfile(f) == nil {
			defer func() { pprofruntime.StopCPUProfile(); f.Close() }()
		}
	}
	root := newRoot()
	root.SetArgs(args)
	if err := root.Execute(); err != nil {
		fmt.Fprintln(os.Stderr, "hostaccel:", err)
		return 1
	}
	return 0
}

// oneShotGC lets a one-shot command's heap grow to five times what it keeps (GOGC=400)
// before the garbage collector runs, unless GOGC says otherwise: the process exits within
// tens of milliseconds, and at 10,000 backends the collector's work was ~10 ms of one
// change's apply (issue 13). Its peak memory grows by 5-12 MiB at 10,000 backends or peer
// CIDRs (39-44 MiB before, 47-56 after, in bench control-plane), not at 100.
func oneShotGC() {
	if os.Getenv("GOGC") == "" {
		debug.SetGCPercent(400)
	}
}

// probeFor probes what the plan of a config with datapath dp looks at: a config without a
// datapath (a load balancer alone) only its privileges, the tc datapath the tc and BPF
// features only, any other all of them.
func probeFor(ctx context.Context, dp string) probe.Result {
	switch dp {
	case model.DatapathNone:
		return probe.Privileges()
	case model.DatapathTC:
		return probe.ForTC(ctx)
	}
	return probe.Run(ctx)
}

// probeLater runs probeFor on another goroutine.
func probeLater(ctx context.Context, dp string) <-chan probe.Result {
	ch := make(chan probe.Result, 1)
	go func() { ch <- probeFor(ctx, dp) }()
	return ch
}

// EnvCPUProfile names a file that receives a CPU profile of the command (go tool pprof):
// where a one-shot `apply` spends its time.
const EnvCPUProfile = "HOSTACCEL_CPUPROFILE"

type globals struct {
	logLevel  string
	logFormat string
	output    string
}

func newRoot() *cobra.Command {
	g := &globals{}
	root := &cobra.Command{
		Use:           "hostaccel",
		Short:         "Accelerate host-network forwarding (nftables flowtable, tc eBPF) and load-balance with nftables",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.PersistentFlags().StringVar(&g.logLevel, "log-level", "info", "debug, info, warn or error")
	root.PersistentFlags().StringVar(&g.logFormat, "log-format", "text", "text or json")
	// a mistyped value is an error naming the flag (before, it gave info and text silently)
	root.PersistentPreRunE = func(*cobra.Command, []string) error {
		var lvl slog.Level
		if err := lvl.UnmarshalText([]byte(g.logLevel)); err != nil {
			return fmt.Errorf("--log-level: %q is not one of debug, info, warn, error", g.logLevel)
		}
		if g.logFormat != "text" && g.logFormat != "json" {
			return fmt.Errorf("--log-format: %q is not one of text, json", g.logFormat)
		}
		return nil
	}
	root.AddCommand(probeCmd(g), renderCmd(), applyCmd(g), agentCmd(g), statusCmd(g), cleanupCmd())
	for _, c := range commands {
		root.AddCommand(c(g))
	}
	return root
}

// commands are added by the files that define them (lb.go, bench.go, ...) from init.
var commands []func(*globals) *cobra.Command

func (g *globals) logger() *slog.Logger {
	var lvl slog.Level
	_ = lvl.UnmarshalText([]byte(g.logLevel))
	o := &slog.HandlerOptions{Level: lvl}
	if g.logFormat == "json" {
		return slog.New(slog.NewJSONHandler(os.Stderr, o))
	}
	return slog.New(slog.NewTextHandler(os.Stderr, o))
}

func addOutput(c *cobra.Command, g *globals) {
	outputFlag(c, &g.output, "table or json", "table", "json")
}

// outputFlag adds -o/--output to c, into p: one of allowed (the first is the default); any
// other value is refused when the flags are parsed, naming the flag and the choices (before,
// an unknown format printed the default one).
func outputFlag(c *cobra.Command, p *string, help string, allowed ...string) {
	*p = allowed[0]
	c.Flags().VarP(&oneOf{p, allowed}, "output", "o", help)
}

// oneOf is a string flag that takes one of a few values.
type oneOf struct {
	p       *string
	allowed []string
}

func (o *oneOf) String() string { return *o.p }
func (o *oneOf) Type() string   { return "format" }
func (o *oneOf) Set(v string) error {
	if !slices.Contains(o.allowed, v) {
		return fmt.Errorf("not one of %s", strings.Join(o.allowed, ", "))
	}
	*o.p = v
	return nil
}

func writeJSON(w io.Writer, v any) error {
	e := json.NewEncoder(w)
	e.SetIndent("", "  ")
	return e.Encode(v)
}

func probeCmd(g *globals) *cobra.Command {
	c := &cobra.Command{
		Use:   "probe",
		Args:  cobra.NoArgs, // a stray word is refused: `--flag false` made it true
		Short: "Show what this kernel supports",
		RunE: func(c *cobra.Command, _ []string) error {
			r := probe.Run(c.Context())
			if g.output == "json" {
				return writeJSON(c.OutOrStdout(), r)
			}
			r.WriteTable(c.OutOrStdout())
			return nil
		},
	}
	addOutput(c, g)
	return c
}

func renderCmd() *cobra.Command {
	var file string
	var counter bool
	c := &cobra.Command{
		Use:   "render -f CONFIG",
		Args:  cobra.NoArgs, // a stray word is refused: `--flag false` made it true
		Short: "Print what apply would install: the nft ruleset, and the tc datapath's map contents (no root needed)",
		Long: "Renders offline, for a kernel that has every feature (auto then splits classes between tc and the\n" +
			"flowtable as it would on such a kernel). Interfaces named in the config are taken as present;\n" +
			"`transports: auto` expands to this machine's links, a gateway pattern (knet*) to the links it\n" +
			"matches here, or to knet0 where none does.",
		RunE: func(c *cobra.Command, _ []string) error {
			cfg, err := config.Load(file)
			if err != nil {
				return err
			}
			links, _ := agent.Links()
			for _, n := range append(slices.Clone(cfg.Node.Gateways), cfg.Node.Transports.Names...) {
				// A gateway pattern (knet*) is not a device: it stands for this machine's
				// links it matches, or for knet0 where none does.
				if p, ok := strings.CutSuffix(n, "*"); ok && slices.Contains(cfg.Node.Gateways, n) {
					if slices.ContainsFunc(links, func(l config.Link) bool { return strings.HasPrefix(l.Name, p) }) {
						continue
					}
					n = p + "0"
				}
				links = append(links, config.Link{Name: n, Up: true})
			}
			s, _, err := cfg.State(links, false)
			if err != nil {
				return err
			}
			all := probe.Result{}
			for _, f := range probe.All {
				all.Features = append(all.Features, probe.Feature{Name: f, Available: f != probe.FlowtableCounter || counter})
			}
			plan, err := datapath.Choose(s, all)
			if err != nil {
				return err
			}
			out := c.OutOrStdout()
			if plan.Flowtable != nil {
				dump, err := flowtable.Render(*plan.Flowtable, flowtable.Options{FlowtableCounter: counter}).Dump()
				if err != nil {
					return err
				}
				fmt.Fprint(out, dump)
			}
			if plan.TC != nil {
				d, err := tc.Render(*plan.TC)
				if err != nil {
					return err
				}
				fmt.Fprintln(out, "# tc datapath: eBPF program on each device's tc ingress, with these map contents")
				if err := writeJSON(out, d); err != nil {
					return err
				}
			}
			if plan.Sockmap != nil {
				fmt.Fprintln(out, "# sockmap datapath: sock_ops on the cgroup v2 root, sk_msg on a sockhash; Pod CIDR tries with these contents")
				if err := writeJSON(out, sockmap.Render(*plan.Sockmap)); err != nil {
					return err
				}
			}
			if plan.Flowtable == nil && plan.TC == nil && plan.Sockmap == nil {
				fmt.Fprintln(out, "# no fastpath (datapath: none)")
			}
			return nil
		},
	}
	c.Flags().StringVarP(&file, "file", "f", "", "config file (required)")
	c.Flags().BoolVar(&counter, "flowtable-counter", true, "render the flowtable's counter flag (kernel >= 5.7; apply probes it)")
	_ = c.MarkFlagRequired("file")
	return c
}

func managers() (*datapath.Managers, error) {
	if err := probe.CheckPrivilege(probe.PartNFT); err != nil { // every datapath changes the kernel's network state
		return nil, err
	}
	ft := flowtable.NewManager()
	ft.KnownDir = flowtable.DefaultKnownDir // the next process starts from what this one left
	return &datapath.Managers{Flowtable: ft, TC: tc.NewManager(), Sockmap: sockmap.NewManager()}, nil
}

// addLockFlag adds --lock-file to a command that changes the kernel.
func addLockFlag(c *cobra.Command, path *string) {
	c.Flags().StringVar(path, "lock-file", lock.DefaultPath,
		"held while this command may change the kernel: one writer per node (the agent, apply, cleanup)")
}

func applyCmd(g *globals) *cobra.Command {
	var file, lockPath string
	c := &cobra.Command{
		Use:   "apply -f CONFIG",
		Args:  cobra.NoArgs, // a stray word is refused: `--flag false` made it true
		Short: "Install the config; nothing changes when the config or the kernel cannot do it",
		RunE: func(c *cobra.Command, _ []string) error {
			ctx := c.Context()
			oneShotGC()
			slog.SetDefault(g.logger()) // --log-level debug: how the load balancer read the kernel
			b, err := config.ReadFile(file)
			if err != nil {
				return err
			}
			// The kernel's probe takes the same time at any size (the tc datapath's: ~1 ms
			// where the kernel has tcx, 15-45 ms where it tries cls_bpf in a throwaway
			// namespace; every feature's: ~0.2 s); the config's parse and the tc datapath's
			// reading of the kernel grow with the config (~6 and ~15 ms at 10,000 peer CIDRs).
			// The three run side by side (issue 13). The probe starts on the datapath the file
			// names, before the file is parsed: probes change nothing in the kernel, so they
			// need no lock. The tc datapath's reading starts as soon as the lock is held.
			peeked := config.PeekDatapath(b)
			var early <-chan probe.Result
			if peeked != "" && peeked != model.DatapathNone {
				early = probeLater(ctx, peeked)
			}
			var m *datapath.Managers
			l, lerr := lock.Acquire(lockPath)
			if lerr == nil {
				defer l.Release()
				m, lerr = managers()
			}
			if lerr == nil {
				defer m.Close() // (under the lock: deferred after its Release)
			}
			if lerr == nil && peeked == model.DatapathTC {
				m.TC.Prefetch() // Apply takes it, or Remove drops it where the plan has no tc
			}
			cfg, err := config.Parse(b)
			if err != nil {
				return fmt.Errorf("%s: %w", file, err) // the config's mistakes come first
			}
			if lerr != nil {
				return lerr
			}
			links, err := agent.Links()
			if err != nil {
				return err
			}
			var caps probe.Result
			if early != nil && cfg.Datapath == peeked {
				caps = <-early
			} else {
				caps = probeFor(ctx, cfg.Datapath)
			}
			oneShot := &lb.OneShot{} // the state file read once, for the VIPs and the transaction
			o, err := agent.Apply(ctx, cfg, agent.Inputs{Links: links, Strict: true, Caps: caps, LB: oneShot.Apply, LBVIPs: oneShot.NATVIPs, Mgrs: m})
			if errors.Is(err, datapath.ErrNoFlowtable) || errors.Is(err, datapath.ErrNoTC) || errors.Is(err, datapath.ErrNoSockmap) {
				err = fmt.Errorf("%w\n(`hostaccel probe` lists what this kernel can do; the README's demo runs the flowtable in a VM on such hosts)", err)
			}
			if o.LBNote != "" {
				fmt.Fprintln(c.OutOrStdout(), o.LBNote)
			}
			if err != nil {
				return fmt.Errorf("%s: %w", file, err)
			}
			plan, res := o.Plan, o.Result
			if plan.Flowtable != nil {
				what := "no change"
				if res.Flowtable.Operations > 0 {
					what = res.Flowtable.Reason
				}
				fmt.Fprintf(c.OutOrStdout(), "applied table inet %s (%s): devices %s, classes %v, %d operations\n",
					flowtable.TableName, what, strings.Join(plan.Flowtable.Devices(), ","), plan.Flowtable.Classes, res.Flowtable.Operations)
			}
			if t := res.TC; t != nil {
				fmt.Fprintf(c.OutOrStdout(), "applied tc datapath (%s, program %d): classes %v, attached %v, missing %v, elements +%d ~%d -%d\n",
					t.Mode, t.ProgramID, plan.TC.Classes, t.Attached, t.Missing, t.ElementsAdded, t.ElementsUpdated, t.ElementsRemoved)
			}
			if r := res.Sockmap; r != nil {
				fmt.Fprintf(c.OutOrStdout(), "applied sockmap datapath (cgroup %s, program %d): classes %v, elements +%d ~%d -%d\n",
					r.Cgroup, r.ProgramID, plan.Sockmap.Classes, r.ElementsAdded, r.ElementsUpdated, r.ElementsRemoved)
				if r.MountedBPFFS != "" {
					fmt.Fprintf(c.OutOrStdout(), "mounted the BPF filesystem at %s for sockmap's pins (none was mounted)\n", r.MountedBPFFS)
				}
			}
			return nil
		},
	}
	c.Flags().StringVarP(&file, "file", "f", "", "config file (required)")
	addLockFlag(c, &lockPath)
	_ = c.MarkFlagRequired("file")
	return c
}

func agentCmd(g *globals) *cobra.Command {
	var file, metricsAddr, statePath, lockPath string
	var cleanup, profiling bool
	var kube *kubeFlags
	c := &cobra.Command{
		Use:   "agent -f CONFIG",
		Args:  cobra.NoArgs, // a stray word is refused: `--flag false` made it true
		Short: "Run the daemon: reconcile on config change, link events and periodically",
		RunE: func(c *cobra.Command, _ []string) error {
			// SIGHUP (reload) is caught from the start and never let go: Go's default for it
			// ends the process, and a reload asked while the agent starts (the lock, the
			// probe, the wait for the API server) or cleans up must not.
			reload := make(chan os.Signal, 1)
			signal.Notify(reload, syscall.SIGHUP)
			log := g.logger()
			slog.SetDefault(log) // what packages log by slog's default (the load balancer's cache and shapes at debug) goes where the agent's log does
			// The paths the state records, absolute: `hostaccel status` run from another
			// directory checks that lock (a relative one hid the running agent).
			for _, p := range []*string{&lockPath, &file} {
				if *p != "" {
					if abs, err := filepath.Abs(*p); err == nil {
						*p = abs
					}
				}
			}
			// First of all: a second agent must not touch the kernel, the API socket or
			// the state file of the one that runs.
			l, err := lock.Acquire(lockPath)
			if err != nil {
				return err
			}
			defer l.Release()
			m, err := managers()
			if err != nil {
				return err
			}
			starting := "its first sync"
			if kube.enabled {
				starting = "the Kubernetes API server (its first sync comes after the first derivation)"
			}
			agent.PublishStarting(statePath, lockPath, file, starting)
			ctx, stop := signal.NotifyContext(c.Context(), syscall.SIGINT, syscall.SIGTERM)
			defer stop()
			var met *metrics.Metrics
			opts := agent.Options{ConfigPath: file, StatePath: statePath, LockPath: lockPath, CleanupOnExit: cleanup, Log: log, Reload: reload}
			// The metrics address serves from the start: /livez answers while the agent waits
			// for the API server (Kubernetes mode), so that a liveness probe does not restart
			// a node's agent in a loop while the API server is away (before, nothing listened
			// until the wait ended); /healthz answers 503 until the agent runs.
			var running atomic.Pointer[agent.Agent]
			if metricsAddr != "" {
				met = metrics.New(func(ctx context.Context) agent.Status { return agent.Gather(ctx, m, "") })
				opts.OnSync = met.ObserveSync
				mux := http.NewServeMux()
				mux.Handle("/metrics", met.Handler())
				mux.HandleFunc("/healthz", func(w http.ResponseWriter, r *http.Request) {
					if a := running.Load(); a != nil {
						healthz(a.State)(w, r)
						return
					}
					w.WriteHeader(http.StatusServiceUnavailable)
					fmt.Fprintln(w, "starting: the agent does not run yet (Kubernetes mode waits for the API server)")
				})
				mux.HandleFunc("/livez", livez(func() error {
					if a := running.Load(); a != nil {
						return a.Live()
					}
					return nil // waiting for the API server is alive
				}))
				if profiling {
					mux.HandleFunc("/debug/pprof/", pprof.Index)
					mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
					mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
					mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
				}
				// Listening here, not in the goroutine: an address that cannot be served (a
				// typo, an IPv6 address without brackets, a port in use) ends the agent with
				// the flag's name. It ran without /metrics, /healthz and /livez, and a
				// liveness probe restarted it in a loop.
				ln, err := net.Listen("tcp", metricsAddr)
				if err != nil {
					return fmt.Errorf("--metrics-address %s: %w", metricsAddr, err)
				}
				srv := &http.Server{Handler: mux}
				go func() {
					if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
						log.Error("metrics server", "err", err)
					}
				}()
				defer srv.Close()
				log.Info("serving metrics", "address", metricsAddr)
			}
			if kube.enabled {
				src, err := kube.startSource(ctx, log, file, 0)
				if err != nil {
					return err
				}
				opts.Source = src
			}
			a, err := agent.New(opts, m)
			if err != nil {
				return err
			}
			if met != nil {
				kube.registerMetrics(met.Registry)
				registerLBMetrics(met.Registry, a)
			}
			running.Store(a)
			return a.Run(ctx)
		},
	}
	c.Flags().StringVarP(&file, "file", "f", "", "config file (required)")
	c.Flags().StringVar(&metricsAddr, "metrics-address", "", "serve /metrics, /healthz and /livez here, e.g. 127.0.0.1:9464 (off when empty)")
	c.Flags().BoolVar(&profiling, "profiling", false, "also serve Go's /debug/pprof on --metrics-address (CPU, heap, goroutines)")
	c.Flags().StringVar(&statePath, "state-file", agent.DefaultStatePath, "where the agent publishes its state (read by hostaccel status)")
	c.Flags().BoolVar(&cleanup, "cleanup-on-exit", false, "remove hostaccel's rules when the agent stops")
	addLockFlag(c, &lockPath)
	_ = c.MarkFlagRequired("file")
	kube = addKubeFlags(c, true)
	return c
}

// livez answers 200 "ok" while live() says the agent is alive, 503 with its reason when its
// loop is stuck (a sync that does not return), so that a liveness probe restarts it.
func livez(live func() error) http.HandlerFunc {
	return func(w http.ResponseWriter, _ *http.Request) {
		if err := live(); err != nil {
			w.WriteHeader(http.StatusServiceUnavailable)
			fmt.Fprintln(w, err)
			return
		}
		fmt.Fprintln(w, "ok")
	}
}

// healthz answers 200 "ok" when the last sync was healthy (as hostaccel_healthy says), and
// 503 with the reasons otherwise: no sync yet, the sync's error, what is degraded (a config
// rejected and the last good one kept, a missing interface, the Kubernetes API unreachable).
func healthz(state func() agent.State) http.HandlerFunc {
	return func(w http.ResponseWriter, _ *http.Request) {
		st := state()
		if st.Syncs > 0 && st.Healthy {
			fmt.Fprintln(w, "ok")
			return
		}
		w.WriteHeader(http.StatusServiceUnavailable)
		if st.Syncs == 0 {
			fmt.Fprintln(w, "not synced yet")
		}
		if st.LastError != "" {
			fmt.Fprintln(w, "error:", st.LastError)
		}
		for _, d := range st.Degraded {
			fmt.Fprintln(w, "degraded:", d)
		}
	}
}

func statusCmd(g *globals) *cobra.Command {
	var statePath string
	c := &cobra.Command{
		Use:   "status",
		Args:  cobra.NoArgs, // a stray word is refused: `--flag false` made it true
		Short: "Show hostaccel's tables, devices, rule counters and offloaded connections",
		RunE: func(c *cobra.Command, _ []string) error {
			m, err := managers()
			if err != nil {
				return err
			}
			st := agent.Gather(c.Context(), m, statePath)
			socket := ""
			if st.Agent != nil {
				socket = st.Agent.LBSocket
			}
			lbStatus := fetchLBStatus(c.Context(), socket) // from the running agent's local API, if any
			if g.output == "json" {
				return writeJSON(c.OutOrStdout(), struct {
					agent.Status
					LB *lb.Status `json:"lb,omitempty"`
				}{st, lbStatus})
			}
			writeStatus(c.OutOrStdout(), st)
			if lbStatus != nil {
				fmt.Fprintln(c.OutOrStdout())
				lb.WriteStatus(c.OutOrStdout(), *lbStatus)
			}
			return nil
		},
	}
	c.Flags().StringVar(&statePath, "state-file", agent.DefaultStatePath, "the agent's state file")
	addOutput(c, g)
	return c
}

func writeStatus(out io.Writer, st agent.Status) {
	if err, bad := st.Errors["nftables"]; bad {
		fmt.Fprintf(out, "table inet %s: unknown (error reading nftables: %s)\n", flowtable.TableName, err)
	} else if st.Table == nil {
		fmt.Fprintf(out, "table inet %s: not installed\n", flowtable.TableName)
	} else {
		fmt.Fprintf(out, "table inet %s: %s\n", flowtable.TableName, st.Table.Comment)
		if ft := st.Table.Flowtables[flowtable.FlowtableName]; ft != nil {
			fmt.Fprintf(out, "flowtable %s: devices %s", flowtable.FlowtableName, strings.Join(ft.Devices, ", "))
			if len(ft.Flags) > 0 {
				fmt.Fprintf(out, " (flags %s)", strings.Join(ft.Flags, ","))
			}
			fmt.Fprintln(out)
		}
	}
	if st.Agent != nil {
		a := st.Agent
		health := "healthy"
		if !a.Healthy {
			health = "DEGRADED"
		}
		if a.Starting != "" {
			fmt.Fprintf(out, "agent: pid %d, starting: waiting for %s\n", a.PID, a.Starting)
		} else {
			fmt.Fprintf(out, "agent: pid %d, %s, datapath %s (%s), %d syncs (%d failed), last %s\n",
				a.PID, health, a.Datapath, a.Plan, a.Syncs, a.SyncErrors, a.LastSync.Format("15:04:05"))
		}
		for _, d := range a.Degraded {
			fmt.Fprintf(out, "  degraded: %s\n", d)
		}
		for _, n := range a.PlanNotes {
			fmt.Fprintf(out, "  note: %s\n", n)
		}
		if len(a.DriftRepairs) > 0 {
			var ds []string
			for _, d := range slices.Sorted(maps.Keys(a.DriftRepairs)) {
				ds = append(ds, fmt.Sprintf("%s %d", d, a.DriftRepairs[d]))
			}
			fmt.Fprintf(out, "  drift repairs (changed outside hostaccel, restored): %s\n", strings.Join(ds, ", "))
		}
		if a.LastError != "" {
			fmt.Fprintf(out, "  last error: %s\n", a.LastError)
		}
		writeKubernetesStatus(out, a.Source)
	}
	if len(st.Classes) > 0 {
		fmt.Fprintln(out, "\nclasses (packets that took the normal path before offload):")
		table(out, "CLASS\tRULES\tPACKETS\tBYTES", len(st.Classes), func(i int) []any {
			c := st.Classes[i]
			return []any{c.Class, c.Rules, c.Packets, c.Bytes}
		})
	}
	if len(st.Rules) > 0 {
		fmt.Fprintln(out, "\nrules:")
		table(out, "PACKETS\tBYTES\tRULE", len(st.Rules), func(i int) []any {
			r := st.Rules[i]
			return []any{r.Packets, r.Bytes, r.Comment}
		})
	}
	if t := st.TC; t != nil {
		fmt.Fprintf(out, "\ntc datapath: %s, program %d, devices:", t.Mode, t.ProgramID)
		for _, d := range t.Devices {
			peer := ""
			if d.Peer {
				peer = ",peer"
			}
			fmt.Fprintf(out, " %s(%s%s)", d.Name, d.Role, peer)
		}
		fmt.Fprintf(out, "\n  NAT check (conntrack): %s\n", t.NATCheck)
		if h := t.Handed; h != nil {
			fmt.Fprintf(out, "  client ends handed to the stack, marked: %d of %d (aged %d times)\n", h.Marked, h.Of, h.Epoch-1)
		}
		if t.NATCarry {
			fmt.Fprintln(out, "  NAT-ed TCP flows the flowtable offloaded: carried here (via nat-carried; by the NAT express lane: in via express too)")
		}
		fmt.Fprintln(out, "  redirected past the host stack:")
		table(out, "CLASS\tFAMILY\tPACKETS\tBYTES", len(t.Classes), func(i int) []any {
			c := t.Classes[i]
			return []any{c.Class, c.Family, c.Packets, c.Bytes}
		})
		fmt.Fprint(out, "  of those, sent by:")
		for _, k := range slices.Sorted(maps.Keys(t.Via)) {
			fmt.Fprintf(out, " %s=%d", k, t.Via[k].Packets)
		}
		fmt.Fprint(out, "\n  handed to the stack:")
		for _, k := range slices.Sorted(maps.Keys(t.Passed)) {
			fmt.Fprintf(out, " %s=%d", k, t.Passed[k].Packets)
		}
		fmt.Fprintln(out)
	}
	if m := st.Sockmap; m != nil {
		if m.ProgramID != 0 {
			fmt.Fprintf(out, "\nsockmap datapath: cgroup %s, sock_ops program %d, sk_msg program %d\n", m.Cgroup, m.ProgramID, m.MsgProgramID)
			fmt.Fprintf(out, "  sockets in the map: %d (entered: ipv4=%d ipv6=%d, failed=%d)\n", m.Sockets, m.Entered["ipv4"], m.Entered["ipv6"], m.EnterFailed)
			fmt.Fprintf(out, "  messages redirected socket to socket: %d (%d bytes); left on TCP: %d (%d bytes)\n", m.Redirected.Count, m.Redirected.Bytes, m.Passed.Count, m.Passed.Bytes)
			if m.ReadCounter != "" && m.MaxQueued > 0 {
				fmt.Fprintf(out, "  unread bound: %d bytes per receiving socket (reads counted at %s); directions bounded (on TCP since): %d\n", m.MaxQueued, m.ReadCounter, m.Bounded.Count)
			} else {
				fmt.Fprintf(out, "  unread bound: none (no read counter attached: see hostaccel probe, sockmap_bound)\n")
			}
		}
		if m.Draining > 0 {
			fmt.Fprintf(out, "  draining: %d sockets of removed program sets (their messages take TCP; the maps go when they close)\n", m.Draining)
		}
	}
	if err, bad := st.Errors["conntrack"]; bad {
		fmt.Fprintf(out, "\noffloaded connections (conntrack [OFFLOAD]): unknown (error reading conntrack: %s)\n", err)
	} else {
		fmt.Fprintf(out, "\noffloaded connections (conntrack [OFFLOAD]): %d\n", len(st.Offloaded))
	}
	for _, f := range st.Offloaded {
		fmt.Fprintf(out, "  %s\n", f)
	}
	for _, k := range slices.Sorted(maps.Keys(st.Errors)) {
		fmt.Fprintf(out, "error reading %s: %s\n", k, st.Errors[k])
	}
}

// table writes an indented, aligned table: the header's tab-separated columns, then n rows.
func table(out io.Writer, header string, n int, row func(int) []any) {
	tw := tabwriter.NewWriter(out, 2, 8, 2, ' ', 0)
	fmt.Fprintln(tw, "  "+header)
	for i := range n {
		cells := make([]string, 0, 4)
		for _, c := range row(i) {
			cells = append(cells, fmt.Sprint(c))
		}
		fmt.Fprintln(tw, "  "+strings.Join(cells, "\t"))
	}
	tw.Flush()
}

func cleanupCmd() *cobra.Command {
	var lockPath string
	c := &cobra.Command{
		Use:   "cleanup",
		Args:  cobra.NoArgs, // a stray word is refused: `--flag false` made it true
		Short: "Remove everything hostaccel installed, and nothing else",
		RunE: func(c *cobra.Command, _ []string) error {
			l, err := lock.Acquire(lockPath)
			if err != nil {
				return err
			}
			defer l.Release()
			m, err := managers()
			if err != nil {
				return err
			}
			removed, err := agent.Remove(c.Context(), m)
			switch {
			case len(removed) > 0:
				fmt.Fprintf(c.OutOrStdout(), "removed %s\n", strings.Join(removed, ", "))
			case err == nil:
				fmt.Fprintln(c.OutOrStdout(), "nothing to remove: hostaccel had nothing installed in this network namespace")
			}
			return err
		},
	}
	addLockFlag(c, &lockPath)
	return c
}
