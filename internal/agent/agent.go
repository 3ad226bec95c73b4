// Package agent is the reconciler: one loop that wakes on config changes (SIGHUP or the file
// changing), link events and a period, rebuilds the desired state, and applies it.
package agent

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/hostaccel/hostaccel/internal/config"
	"github.com/hostaccel/hostaccel/internal/datapath"
	"github.com/hostaccel/hostaccel/internal/lb"
	"github.com/hostaccel/hostaccel/internal/model"
	"github.com/hostaccel/hostaccel/internal/probe"
)

// Options configure an Agent.
type Options struct {
	ConfigPath string
	StatePath  string // "" disables publishing state
	// LockPath is the lock file the agent holds (recorded in its state: status checks that it
	// is still held, as a PID alone says nothing across PID namespaces).
	LockPath      string
	CleanupOnExit bool
	Log           *slog.Logger
	// Hooks, replaceable in tests.
	Probe func(context.Context) probe.Result
	Links func() ([]config.Link, error)
	// OnSync is called after every sync attempt (metrics).
	OnSync func(d time.Duration, st State, err error)
	// Source, when set, supplies the config in place of reading ConfigPath (Kubernetes mode:
	// internal/k8s.Source). The agent asks it at every sync and syncs when Changed fires.
	Source Source
	// Reload, when set, delivers SIGHUP: the caller registered it before anything slow (the
	// lock, the probe, the wait for the API server), so that a reload asked meanwhile, or
	// during the cleanup after Run, does not end the process (Go's default for SIGHUP);
	// without it Run registers its own while it runs.
	Reload <-chan os.Signal
}

// Source supplies the desired config instead of the file.
type Source interface {
	// Config returns the current config, validated; an error keeps the last good one. It
	// returns the same pointer until the config changes (the agent compares pointers: at
	// thousands of Services, writing the config out to compare it cost ~8 ms a sync).
	Config() (*config.Config, error)
	// Changed fires (coalesced) when Config, Notes or Report may have changed.
	Changed() <-chan struct{}
	// Notes say why the applied state may lag the source (reported as degraded).
	Notes() []string
	// Report is published as State.Source for `hostaccel status`.
	Report() any
}

// SyncObserver is a Source that is told each sync's outcome (the Kubernetes source answers the
// Services' health check ports 503 while its changes do not reach the kernel).
type SyncObserver interface {
	// Synced is told each sync's outcome for the Services and the config the sync applied
	// (the pointer Config returned): the load balancer part's error where it ran (a
	// datapath's failure does not keep the Services from the kernel), else the sync's.
	Synced(cfg *config.Config, err error)
}

// Agent reconciles one network namespace.
type Agent struct {
	opts Options
	mgrs *datapath.Managers
	wake chan struct{}
	// now: the next sync may not wait for MinSyncInterval (TriggerNow).
	now atomic.Bool
	// nowCh cuts short the rate limit's wait when TriggerNow comes during it
	nowCh chan struct{}
	// urgent: the sync under way was asked for by TriggerNow (it does not probe again).
	urgent atomic.Bool

	mu      sync.Mutex
	state   State
	cfg     *config.Config
	cfgHash [32]byte
	caps    *probe.Result
	probed  time.Time // when caps was probed
	lb      lbRuntime // the load balancer (lb.go)
	gc      *idleGC   // collects between syncs (idlegc.go)

	// liveBy: the loop comes round again before this time, or it is stuck (Live); syncSince:
	// when the sync under way began (0: none). Both in ns since born, on the monotonic clock
	// (a wall clock step would fail /livez, or hide a stuck loop).
	born              time.Time
	liveBy, syncSince atomic.Int64
	// tcNode: the node config of the last sync whose plan ran the tc datapath (nil: none),
	// whose gateways a new link is prepared for (watchLinks).
	tcNode atomic.Pointer[config.Node]
}

// stuckAfter is how long a sync may take before the agent counts as stuck (Live): a sync at
// 50,000 objects takes ~20 s on a loaded 2-core host; nothing in one waits for longer than the
// load balancer API's 45 s.
var stuckAfter = 2 * time.Minute

// expectLoop says that the loop comes round again within wait (and a sync's stuckAfter).
func (a *Agent) expectLoop(wait time.Duration) {
	a.liveBy.Store(int64(time.Since(a.born) + wait + stuckAfter))
}

// Live reports an error when the agent's loop has not come round when it should have: a sync
// that does not return (a kernel call that hangs, a deadlock) stops it (the agent's /livez).
func (a *Agent) Live() error {
	now := time.Since(a.born)
	if now <= time.Duration(a.liveBy.Load()) {
		return nil
	}
	if since := a.syncSince.Load(); since != 0 {
		return fmt.Errorf("stuck: a sync started %s ago has not returned", (now - time.Duration(since)).Round(time.Second))
	}
	return fmt.Errorf("stuck: the agent's loop has not come round for %s", (now - time.Duration(a.liveBy.Load()) + stuckAfter).Round(time.Second))
}

// New builds an agent; the config must load and validate.
func New(opts Options, mgrs *datapath.Managers) (*Agent, error) {
	if opts.Log == nil {
		opts.Log = slog.Default()
	}
	if opts.Probe == nil {
		opts.Probe = probe.Run
	}
	if opts.Links == nil {
		opts.Links = Links
	}
	a := &Agent{opts: opts, mgrs: mgrs, wake: make(chan struct{}, 1), nowCh: make(chan struct{}, 1), gc: newIdleGC(), born: time.Now()}
	if _, err := a.loadConfig(); err != nil {
		return nil, err
	}
	a.state = State{PID: os.Getpid(), LockFile: opts.LockPath, ConfigPath: opts.ConfigPath, Datapath: a.cfg.Datapath}
	a.expectLoop(a.cfg.Agent.ResyncPeriod.Duration + a.cfg.Agent.MinSyncInterval.Duration)
	return a, nil
}

// State returns a copy of the agent's current state.
func (a *Agent) State() State {
	a.mu.Lock()
	defer a.mu.Unlock()
	st := a.state
	st.DriftRepairs = maps.Clone(st.DriftRepairs)
	return st
}

// Trigger asks for a sync soon; triggers coalesce.
func (a *Agent) Trigger() {
	select {
	case a.wake <- struct{}{}:
	default:
	}
}

// TriggerNow asks for a sync at once, past the rate limit (agent.minSyncInterval): for
// changes someone waits for, each applied before the next is made (the load balancer's API
// calls, its health transitions, coalesced per check round).
func (a *Agent) TriggerNow() {
	a.now.Store(true)
	select {
	case a.nowCh <- struct{}{}:
	default:
	}
	a.Trigger()
}

// loadConfig (re)reads the config; it reports whether it changed.
func (a *Agent) loadConfig() (bool, error) {
	if a.opts.Source != nil {
		c, err := a.opts.Source.Config()
		if err != nil {
			return false, err
		}
		if c == a.cfg {
			return false, nil
		}
		a.cfg = c
		return true, nil
	}
	b, err := config.ReadFile(a.opts.ConfigPath)
	if err != nil {
		return false, err
	}
	h := sha256.Sum256(b)
	if a.cfg != nil && h == a.cfgHash {
		return false, nil
	}
	c, err := config.Parse(b)
	if err != nil {
		return false, fmt.Errorf("%s: %w", a.opts.ConfigPath, err)
	}
	a.cfg, a.cfgHash = c, h
	return true, nil
}

// Run reconciles until ctx ends. Rules stay in place on exit unless CleanupOnExit.
func (a *Agent) Run(ctx context.Context) error {
	log := a.opts.Log
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	defer wg.Wait()
	wg.Add(4)
	go func() { defer wg.Done(); a.watchLinks(ctx) }()
	go func() { defer wg.Done(); a.watchRouting(ctx) }()
	go func() { defer wg.Done(); a.watchSignals(ctx) }()
	if a.opts.Source != nil {
		go func() { defer wg.Done(); a.watchSource(ctx) }()
	} else {
		// The first sync reads the file after the watch's first look: an edit in between
		// would otherwise be the watch's baseline, unseen until the resync period.
		looked := make(chan struct{})
		go func() { defer wg.Done(); a.watchFile(ctx, func() { close(looked) }) }()
		select {
		case <-looked:
		case <-ctx.Done():
		}
	}

	var last time.Time
	backoff := time.Duration(0)
	a.Trigger()
	for {
		a.mu.Lock()
		period := a.cfg.Agent.ResyncPeriod.Duration
		minInterval := a.cfg.Agent.MinSyncInterval.Duration
		a.mu.Unlock()
		wait := period
		if backoff > 0 && backoff < wait {
			wait = backoff
		}
		a.expectLoop(wait + minInterval)
		timer := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			timer.Stop()
			return a.shutdown()
		case <-a.wake:
		case <-timer.C:
		}
		timer.Stop()
		// Rate limit: events arriving in a burst are served by one sync (TriggerNow's are not
		// held back, also when they come while the limit holds an ordinary event back: before,
		// an API call then waited out the rest of minSyncInterval).
		select {
		case <-a.nowCh:
		default:
		}
		urgent := a.now.Swap(false)
		if d := minInterval - time.Since(last); d > 0 && !urgent {
			held := time.NewTimer(d)
			select {
			case <-ctx.Done():
				held.Stop()
				return a.shutdown()
			case <-held.C:
			case <-a.nowCh:
				held.Stop()
				urgent = a.now.Swap(false)
			}
			select { // absorb the triggers that came in meanwhile
			case <-a.wake:
			default:
			}
		}
		last = time.Now()
		a.urgent.Store(urgent)
		err := a.Sync(ctx)
		a.urgent.Store(false)
		if err != nil {
			if ctx.Err() != nil {
				return a.shutdown()
			}
			backoff = min(max(2*backoff, time.Second), period)
			log.Error("sync failed; retrying", "err", err, "retryIn", backoff)
		} else {
			backoff = 0
		}
	}
}

// shutdown runs once the loop's last sync has returned: the load balancer's health checks and
// API stop now, not when ctx ended (that sync would have started them again, and its API
// calls would have lost their answer), and, with CleanupOnExit, nothing puts the tables back
// after they are removed (a transaction does not heed ctx).
func (a *Agent) shutdown() error {
	if !a.opts.CleanupOnExit {
		a.LB().Stop()
		a.mgrs.Close()
		a.opts.Log.Info("stopping; rules stay in place (use --cleanup-on-exit or `hostaccel cleanup` to remove them)")
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err := errors.Join(a.mgrs.Remove(ctx), a.LB().Remove(ctx))
	a.opts.Log.Info("stopping; removed hostaccel's rules and the load balancer's tables", "err", err)
	if a.opts.StatePath != "" {
		os.Remove(a.opts.StatePath)
	}
	return err
}

// Sync runs one reconciliation: config, probe, links, render, apply.
func (a *Agent) Sync(ctx context.Context) error {
	start := time.Now()
	a.syncSince.Store(max(int64(time.Since(a.born)), 1))
	defer a.syncSince.Store(0)
	var degraded []string
	var lb lbOutcome
	err := a.sync(ctx, &degraded, &lb)
	a.mu.Lock()
	st := &a.state
	st.Syncs++
	st.LastSync = start
	st.Degraded = degraded
	st.Healthy = err == nil && len(degraded) == 0
	st.LastError = ""
	if err != nil {
		st.SyncErrors++
		st.LastError = err.Error()
	}
	snapshot := *st
	snapshot.DriftRepairs = maps.Clone(st.DriftRepairs)
	cfg := a.cfg
	a.mu.Unlock()
	if s, ok := a.opts.Source.(SyncObserver); ok {
		// the Services' part: the load balancer's error where it ran (a datapath's failure
		// leaves the Services served; it made the node's health checks answer 503)
		if lb.ran {
			s.Synced(cfg, lb.err)
		} else {
			s.Synced(cfg, err)
		}
	}
	a.publish(snapshot)
	if a.opts.OnSync != nil {
		a.opts.OnSync(time.Since(start), snapshot, err)
	}
	if a.gc != nil && a.gc.afterSync() {
		a.opts.Log.Debug("garbage collection started between syncs")
	}
	return err
}

// lbOutcome is the load balancer part's outcome in a sync: whether it ran, and its error.
type lbOutcome struct {
	ran bool
	err error
}

func (a *Agent) sync(ctx context.Context, degraded *[]string, lbo *lbOutcome) error {
	log := a.opts.Log
	a.mu.Lock()
	changed, err := a.loadConfig()
	cfg := a.cfg
	a.mu.Unlock()
	if err != nil {
		*degraded = append(*degraded, "config not reloaded, keeping the last good one: "+err.Error())
		log.Error("config rejected; keeping the last good config", "err", err)
	} else if changed {
		log.Info("config loaded", "path", a.opts.ConfigPath, "datapath", cfg.Datapath)
	}
	if src := a.opts.Source; src != nil {
		*degraded = append(*degraded, src.Notes()...)
		// The report (~2 MB of JSON at 5,000 Services, written once per derivation) is
		// taken after the kernel has the change: it is for `status`, not on the way there.
		defer func() {
			var rep json.RawMessage
			switch r := src.Report().(type) {
			case json.RawMessage: // written already (compact)
				rep = r
			default:
				rep, _ = json.Marshal(r)
			}
			a.mu.Lock()
			a.state.Source = rep
			a.mu.Unlock()
		}()
	}

	// Probe again while the kernel lacks something a datapath could use: a module loaded
	// later (nf_flow_table, nf_conntrack with its kfuncs) then counts from a later sync on.
	// Not in a sync someone waits for (TriggerNow), at most every reprobeEvery, and, while
	// the agent is healthy, after this sync's change is in the kernel: probing runs nft and
	// loads programs (~0.15 s), which the change of an event must not wait for. (An agent
	// whose last sync failed, for want of the feature perhaps, probes first.) Only for a
	// feature the config's datapath could use (lacksUsable).
	a.mu.Lock()
	healthy := a.state.Healthy
	a.mu.Unlock()
	switch {
	case a.caps == nil:
		caps := a.opts.Probe(ctx)
		a.caps, a.probed = &caps, time.Now()
	case !a.urgent.Load() && time.Since(a.probed) >= reprobeEvery && lacksUsable(cfg, *a.caps):
		if healthy {
			defer a.reprobe(ctx)
		} else {
			a.reprobe(ctx)
		}
	}
	links, err := a.opts.Links()
	if err != nil {
		return fmt.Errorf("list links: %w", err)
	}
	rt := a.LB()
	rt.FullEvery = cfg.Agent.ResyncPeriod.Duration * 9 / 10 // each periodic resync repairs drift
	if a.mgrs.TC != nil {
		a.mgrs.TC.FullEvery = rt.FullEvery // so does the tc datapath's
		// and it lists the routes only when the kernel announced a change (or with the maps)
		if cfg.Datapath == model.DatapathTC || cfg.Datapath == model.DatapathAuto {
			if err := a.mgrs.TC.WatchRoutes(ctx); err != nil {
				log.Warn("the tc datapath lists the routes at every sync", "err", err)
			}
		}
	}
	o, err := Apply(ctx, cfg, Inputs{
		Links: links, Caps: *a.caps, Mgrs: a.mgrs,
		LB:     func(ctx context.Context, c lb.Config) (string, error) { return "", rt.Sync(ctx, c) },
		LBVIPs: rt.NATVIPs,
	})
	lbo.ran, lbo.err = o.LBRan, o.LBErr
	*degraded = append(*degraded, o.Degraded()...)
	if err := rt.APIError(); err != nil {
		*degraded = append(*degraded, "load balancer API: "+err.Error())
	}
	for _, w := range o.Warnings {
		log.Warn("interface pruned from the desired state", "warning", w)
	}
	a.mu.Lock()
	a.state.Devices = o.State.Devices()
	if o.Plan.Flowtable == nil && o.Plan.TC == nil && o.Plan.Sockmap == nil {
		// no datapath runs (datapath none, or a kernel without any the config can use): no
		// device is served (before, hostaccel_devices listed every desired one)
		a.state.Devices = nil
	}
	a.state.Datapath = cfg.Datapath
	a.state.LBSocket = ""
	if api := cfg.LoadBalancer.APIConfig(); api != nil {
		a.state.LBSocket = api.Socket
	}
	a.state.Plan = o.Plan.Summary()
	a.state.PlanNotes = o.Plan.Notes
	if o.Plan.TC != nil {
		a.tcNode.Store(&cfg.Node)
	} else {
		a.tcNode.Store(nil)
	}
	a.state.LastResult = o.Result
	a.mu.Unlock()
	if d := o.Result.Flowtable.Drift; d != "" {
		a.driftRepaired(DriftFlowtable, []string{d})
	}
	if t := o.Result.TC; t != nil && len(t.Drift) > 0 {
		a.driftRepaired(DriftTC, t.Drift)
	}
	if t := o.Result.TC; t != nil && t.HandedAged {
		log.Info("tc: the marks of client ends handed to the stack were aged: those of NAT-ed connections gone are void")
	}
	if sm := o.Result.Sockmap; sm != nil && len(sm.Drift) > 0 {
		a.driftRepaired(DriftSockmap, sm.Drift)
	}
	if sm := o.Result.Sockmap; sm != nil && sm.MountedBPFFS != "" {
		log.Warn("sockmap: no BPF filesystem was mounted; mounted one for the pins: in a container they go with it (mount the host's /sys/fs/bpf, as deploy/auto/ does)", "at", sm.MountedBPFFS)
	}
	if o.Result.Changed() {
		log.Info("applied", "plan", o.Plan.Summary(), "flowtable", o.Result.Flowtable, "tc", o.Result.TC, "sockmap", o.Result.Sockmap, "devices", o.State.Devices())
	}
	return err
}

// The datapaths whose drift repairs the agent counts (State.DriftRepairs,
// hostaccel_drift_repairs_total).
const (
	DriftFlowtable = "flowtable"
	DriftTC        = "tc"
	DriftSockmap   = "sockmap"
	DriftLB        = "lb"
)

// reprobe probes the kernel again after a sync; what the kernel has now counts from the next
// sync, which it asks for when the kernel has gained a feature.
//
// A feature found before stays: a kernel does not lose one while it runs (a module unloaded
// under the agent makes that datapath's apply fail, which the sync reports), but a probe can
// fail for a moment (memory, a busy netlink socket), and taking that as the kernel's answer
// would make `auto` move classes off a datapath in use: for sockmap, every connection's
// acceleration drained at once.
func (a *Agent) reprobe(ctx context.Context) {
	caps := a.opts.Probe(ctx)
	gained := false
	for _, f := range []string{probe.Flowtable, probe.ConntrackKfuncs} {
		gained = gained || caps.Has(f) && !a.caps.Has(f)
	}
	caps.Features = slices.Clone(caps.Features)
	for _, was := range a.caps.Features {
		if !was.Available || caps.Has(was.Name) {
			continue
		}
		a.opts.Log.Warn("a probe did not find a feature an earlier one found; kept", "feature", was.Name, "probe", caps.Get(was.Name).Detail)
		if i := slices.IndexFunc(caps.Features, func(f probe.Feature) bool { return f.Name == was.Name }); i >= 0 {
			caps.Features[i] = was
		} else {
			caps.Features = append(caps.Features, was)
		}
	}
	a.caps, a.probed = &caps, time.Now()
	if gained {
		a.Trigger()
	}
}

// lacksUsable reports whether the kernel lacks a feature that cfg's datapath could use: the
// flowtable (datapath flowtable, auto), the conntrack kfuncs (tc and auto, with the NAT check
// on). Any missing feature made every config probe again every reprobeEvery (nft runs, program
// loads, a throwaway namespace), forever on a kernel older than 5.18 with datapath flowtable.
func lacksUsable(cfg *config.Config, caps probe.Result) bool {
	d := cfg.Datapath
	return (d == model.DatapathFlowtable || d == model.DatapathAuto) && !caps.Has(probe.Flowtable) ||
		(d == model.DatapathTC || d == model.DatapathAuto) && cfg.TC.NATCheck != model.NATCheckOff && !caps.Has(probe.ConntrackKfuncs)
}

// reprobeEvery is how often a sync probes the kernel again while it lacks a feature.
var reprobeEvery = 30 * time.Second

// DriftDatapaths lists them.
var DriftDatapaths = []string{DriftFlowtable, DriftTC, DriftSockmap, DriftLB}

// driftRepaired records that a sync found what of datapath changed outside hostaccel and
// repaired it: a WARN, and one more repair counted.
func (a *Agent) driftRepaired(datapath string, what []string) {
	a.opts.Log.Warn("drift repaired: changed outside hostaccel, restored", "datapath", datapath, "drift", what)
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.state.DriftRepairs == nil {
		a.state.DriftRepairs = map[string]int{}
	}
	a.state.DriftRepairs[datapath]++
}

// ErrNoFlowtable: the kernel cannot do what was asked; the agent keeps retrying.
var ErrNoFlowtable = datapath.ErrNoFlowtable

// PublishStarting writes the state of an agent that holds the lock but has not synced yet
// (Kubernetes mode waits for the API server first): `status` shows it starting, waiting for
// why. It showed the state file a previous agent left, healthy, as this one's: a restarted
// container is PID 1 again and holds the same lock.
func PublishStarting(statePath, lockPath, configPath, why string) {
	(&Agent{opts: Options{StatePath: statePath}}).publish(State{PID: os.Getpid(), LockFile: lockPath, ConfigPath: configPath, Starting: why})
}

func (a *Agent) publish(st State) {
	if a.opts.StatePath == "" {
		return
	}
	b := stateJSON(st)
	_ = os.MkdirAll(filepath.Dir(a.opts.StatePath), 0o755)
	tmp := a.opts.StatePath + ".tmp"
	if os.WriteFile(tmp, b, 0o644) == nil {
		_ = os.Rename(tmp, a.opts.StatePath)
	}
}

// stateJSON is st as indented JSON, but for its source's report, which is written as the
// source gave it (compact; megabytes in Kubernetes mode at thousands of Services: indenting it
// at every sync cost more than the sync's own work; issue 13).
func stateJSON(st State) []byte {
	src := st.Source
	st.Source = nil
	b, _ := json.MarshalIndent(st, "", "  ")
	if len(src) == 0 { // (else valid, compact JSON: sync writes it with json.Marshal)
		return b
	}
	// Source is State's last field: it goes where MarshalIndent would have put it.
	end := bytes.LastIndexByte(b, '}')
	if end < 0 {
		return b
	}
	out := make([]byte, 0, len(b)+len(src)+16)
	out = append(out, bytes.TrimRight(b[:end], "\n")...)
	out = append(out, ",\n  \"source\": "...)
	out = append(out, src...)
	return append(out, "\n}"...)
}

// watchLinks triggers a sync on every link added, removed or changed; the sync prunes
// vanished devices before its transaction.
func (a *Agent) watchLinks(ctx context.Context) {
	for ctx.Err() == nil {
		ch := make(chan netlink.LinkUpdate, 64)
		done := make(chan struct{})
		errc := make(chan error, 1)
		err := netlink.LinkSubscribeWithOptions(ch, done, netlink.LinkSubscribeOptions{
			ErrorCallback: func(err error) {
				select {
				case errc <- err:
				default:
				}
			},
		})
		if err != nil {
			a.opts.Log.Error("link subscribe failed; relying on the resync period", "err", err)
			select {
			case <-ctx.Done():
			case <-time.After(5 * time.Second):
			}
			continue
		}
		a.drainLinks(ctx, ch, errc)
		close(done)
		// netlink's goroutine goes on after an error it reports but survives (a parse
		// error, an interrupted dump): read ch until it ends (the socket closed), else it
		// blocked for good on a full ch, one goroutine and socket per resubscription
		for range ch {
		}
	}
}

func (a *Agent) drainLinks(ctx context.Context, ch chan netlink.LinkUpdate, errc chan error) {
	for {
		select {
		case <-ctx.Done():
			return
		case err := <-errc:
			a.opts.Log.Warn("link subscription broke; resubscribing", "err", err)
			a.Trigger()
			return
		case u, ok := <-ch:
			if !ok {
				// netlink closes ch after it reported an error (ENOBUFS: events were
				// dropped), and the select may take this before that error: resync either way.
				a.Trigger()
				return
			}
			a.opts.Log.Debug("link event", "link", u.Attrs().Name, "type", u.Header.Type)
			a.prepareTC(u)
			a.Trigger()
		}
	}
}

// prepareTC readies a new device that the tc datapath's gateways name for its attach at the
// next sync (tc.Manager.Prepare: without tcx, its clsact qdisc now, before a new Pod's veth
// carries anything).
func (a *Agent) prepareTC(u netlink.LinkUpdate) {
	n := a.tcNode.Load()
	if n == nil || a.mgrs == nil || a.mgrs.TC == nil || u.Header.Type != unix.RTM_NEWLINK || !n.IsGateway(u.Attrs().Name) {
		return
	}
	if err := a.mgrs.TC.Prepare(u.Attrs().Index); err != nil {
		a.opts.Log.Debug("tc: could not prepare a new gateway; the next sync attaches it", "link", u.Attrs().Name, "err", err)
	}
}

func (a *Agent) watchSignals(ctx context.Context) {
	ch := a.opts.Reload
	if ch == nil {
		own := make(chan os.Signal, 1)
		signal.Notify(own, syscall.SIGHUP)
		defer signal.Stop(own)
		ch = own
	}
	for {
		select {
		case <-ctx.Done():
			return
		case <-ch:
			a.opts.Log.Info("SIGHUP: reloading config")
			a.Trigger()
		}
	}
}

// watchFile watches the config file (config.WatchFrom: inotify on its directory, and a look
// every second); started is called after its first look.
func (a *Agent) watchFile(ctx context.Context, started func()) {
	config.WatchFrom(ctx, a.opts.ConfigPath, time.Second, a.Trigger, started)
}

// watchSource triggers a sync whenever the config source says something changed.
func (a *Agent) watchSource(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-a.opts.Source.Changed():
			a.Trigger()
		}
	}
}
