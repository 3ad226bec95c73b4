package lb

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"sigs.k8s.io/knftables"
)

// Runtime is the load balancer inside the agent: it merges the config's services with the
// API's, runs the health checks and the API, and applies the result on every Sync. The agent
// calls Sync from its reconcile loop; everything else calls Trigger to ask for one.
type Runtime struct {
	Log     *slog.Logger
	Trigger func()
	// Hooks, replaceable in tests.
	NewManager     func() (*Manager, error)
	Env            func(devs []string) (Env, error)
	FlushConntrack func([]ConntrackFlush) error // every flush of a sync at once
	Solicit        func(addrs []netip.Addr)     // makes the kernel resolve dsr backends' MACs
	// FullEvery: how often the tables are read back whole to repair drift (the agent sets
	// it just under its resync period); 0: DefaultFullEvery.
	FullEvery time.Duration
	// OnDrift, when set, is told what a successful sync found changed outside hostaccel and
	// repaired (Result.Drift); the agent logs and counts it.
	OnDrift func(what []string)

	mu          sync.Mutex
	changeSem   chan struct{}  // API changes, one at a time (lockChanges)
	pending     *pendingChange // a change whose sync had not come when it was answered
	overlayErr  error          // why the state file at cfg.StatePath() is not loaded
	apiErr      error          // why the API (or its TCP listener) did not serve at the last sync
	cfg         Config
	overlay     Overlay
	overlayPath string
	overlayVer  uint64 // bumped whenever overlay is replaced
	// valid is the last merge of config and overlay that passed validation, with what it
	// came from (the config's services by their first element's address: a reloaded config
	// is a new slice); an API change validates it, and the sync it triggers need not again
	// (at 2,000 services ~12 ms of the caller's wait).
	valid struct {
		cfg     *Service
		n       int
		overlay uint64
		svcs    []Service
	}
	gen        uint64 // bumped by every API change
	applied    uint64 // gen of the last successful sync
	failed     uint64 // gen of the last failed sync
	lastErr    error
	lastSync   time.Time
	synced     chan struct{} // closed and replaced after every sync
	closed     bool          // Stop ran: no API or health check starts again
	closing    chan struct{} // closed by Stop: API calls waiting for a sync answer
	desired    *Desired
	result     Result
	mgr        *Manager
	checker    *Checker
	api        *apiServer
	apiCfg     API
	installed  bool
	solicited  time.Time
	urgent     atomic.Bool // a health transition or an API change is waiting: skip the full read
	reading    atomic.Bool // readFull runs
	settleRuns atomic.Bool // a settle's reading runs
	// mgrMu serialises the manager between syncs and the settle timer (a sync's chains
	// rewritten in a hurry are read back settleAfter later, off the caller's wait).
	mgrMu    sync.Mutex
	settling *time.Timer
	// resolver and renderer keep each service's state and objects for the next sync: an
	// unchanged service is neither resolved, rendered nor diffed again (mgrMu).
	resolver Resolver
	renderer Renderer
	// macs (dsr) is the MAC each backend's neighbour entry had when a sync last saw it, by
	// backend interface and address, for the backends configured (mgrMu): see neighbours.
	macs map[string]map[netip.Addr]net.HardwareAddr
}

// settleAfter is how long after a change someone waited for (API call, health transition)
// the chains it rewrote are read back for drift detection: after a burst of such changes,
// one reading.
var settleAfter = time.Second

// NewRuntime returns a Runtime that asks for syncs through trigger.
func NewRuntime(log *slog.Logger, trigger func()) *Runtime {
	if log == nil {
		log = slog.Default()
	}
	return &Runtime{Log: log, Trigger: trigger, NewManager: NewManager, Env: HostEnv, FlushConntrack: flushConntrack,
		Solicit: solicitNeighbours, synced: make(chan struct{}), closing: make(chan struct{})}
}

// errStopped: Sync after Stop.
var errStopped = errors.New("lb: the load balancer is stopped")

// errStopping: an API change saved while the agent stops, before a sync applied it.
var errStopping = errors.New("the agent is stopping: the change is applied when it starts again")

// Sync applies cfg (with the API's changes and current health) to the kernel.
func (r *Runtime) Sync(ctx context.Context, cfg Config) (err error) {
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		return errStopped
	}
	r.cfg = cfg
	gen := r.gen
	r.mu.Unlock()
	defer func() { r.done(gen, err) }()

	if !cfg.InUse() {
		r.stop(false)
		r.mu.Lock()
		defer r.mu.Unlock()
		r.desired, r.apiErr = nil, nil
		if !r.installed || r.mgr == nil {
			return nil
		}
		r.mgrMu.Lock()
		refs, err := r.mgr.Remove(ctx)
		r.mgrMu.Unlock()
		if err == nil {
			r.installed = false
			r.Log.Info("load balancer removed", "tables", refs)
		}
		return err
	}
	// The API first: where the state file conflicts with the config, `hostaccel lb reset`
	// and `delete` (through it) are the way out.
	apiErr := r.serveAPI(cfg.APIConfig())
	if apiErr != nil {
		r.Log.Error("load balancer API", "err", apiErr)
	}
	r.mu.Lock()
	r.apiErr = apiErr
	r.mu.Unlock()
	svcs, err := r.services(cfg)
	if err != nil {
		return err
	}
	r.mu.Lock()
	if r.checker == nil {
		r.checker = NewChecker(r.debouncedTrigger(), r.Log)
		if r.closed { // Stop ran since this sync began: it checks nothing
			r.checker.Stop()
		}
	}
	checker := r.checker
	if r.mgr == nil {
		if r.mgr, err = r.NewManager(); err != nil {
			r.mu.Unlock()
			return err
		}
		r.mgr.DeferFull = true     // the periodic full read runs apart (readFull)
		r.mgr.DeferReadBack = true // a rebuilt table is read back apart (settleLater)
		r.mgr.Log = r.Log
	}
	mgr, prev := r.mgr, r.desired
	if r.FullEvery > 0 {
		mgr.FullEvery = r.FullEvery
	}
	r.mu.Unlock()

	checker.Update(svcs)
	env, err := r.Env(interfaces(svcs))
	if err != nil {
		return err
	}
	health := checker.Health()
	start := time.Now()
	apply := mgr.Apply
	if r.urgent.Swap(false) {
		apply = mgr.ApplyChanges
	}
	r.mgrMu.Lock()
	nenv := r.neighbours(svcs, env)
	d := r.resolver.Resolve(svcs, health, nenv)
	if prev == nil {
		// (until the first sync went in, neighbours knows no MAC: an agent restarted after
		// a backend's entry vanished keeps the one the last process installed)
		if kept, ok := mgr.installedMACs(ctx, d, nenv); ok {
			d = r.resolver.Resolve(svcs, health, r.neighbours(svcs, kept))
		}
	}
	res, err := apply(ctx, r.renderer.Render(d))
	if err == nil && mgr.Unsettled() {
		r.settleLater(mgr)
	}
	if err == nil && mgr.FullDue() && r.reading.CompareAndSwap(false, true) {
		go r.readFull(mgr)
	}
	r.mgrMu.Unlock()
	r.mu.Lock()
	r.installed = r.installed || err == nil
	if err == nil {
		r.desired, r.result = d, res
	}
	r.mu.Unlock()
	if err != nil {
		return err
	}
	if len(res.Drift) > 0 && r.OnDrift != nil {
		r.OnDrift(res.Drift)
	}
	if res.Changed() {
		r.Log.Info("load balancer applied", "rebuilt", res.Rebuilt, "removed", res.Removed, "chainsRewritten", res.ChainsRewritten,
			"elementsAdded", res.ElementsAdded, "elementsRemoved", res.ElementsRemoved, "flowsForgotten", res.FlowsForgotten, "ops", res.Operations, "netlink", res.Netlink, "took", time.Since(start).Round(time.Millisecond))
	}
	r.flush(prev, d)
	r.solicit(d, env)
	return nil
}

// settleLater reads back, settleAfter from now, the chains mgr left unread (r.mgrMu held).
// A sync re-arms it, so that a burst of changes is read once, after it.
func (r *Runtime) settleLater(mgr *Manager) {
	if r.settling != nil {
		r.settling.Stop()
	}
	r.settling = time.AfterFunc(settleAfter, func() {
		// One reading at a time: at thousands of services each lists the whole ruleset for
		// seconds, and readings started after every event of a steady stream piled up until
		// none finished within its timeout. The running one re-arms when it ends.
		if !r.settleRuns.CompareAndSwap(false, true) {
			return
		}
		defer r.settleRuns.Store(false)
		r.mgrMu.Lock()
		s := mgr.StartSettle()
		r.mgrMu.Unlock()
		// nft lists without the manager held: a sync meanwhile (the next EndpointSlice event)
		// need not wait for it. If one applies, the reading is dropped and read again later.
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		err := s.Read(ctx)
		if err != nil {
			r.Log.Warn("reading back rewritten chains (drift detection waits for the next full read)", "err", err)
		}
		r.mgrMu.Lock()
		defer r.mgrMu.Unlock()
		if err == nil {
			mgr.FinishSettle(s)
		}
		if err == nil && mgr.Unsettled() {
			r.settleLater(mgr)
		}
	})
}

// readFull reads the tables whole for drift repair without holding the manager (nft lists
// the whole ruleset: seconds at 5,000 services, which an event's sync used to wait for),
// then asks for the sync that diffs against the reading. A sync that applies meanwhile makes
// the reading stale; the next sync starts another.
func (r *Runtime) readFull(mgr *Manager) {
	defer r.reading.Store(false)
	r.mgrMu.Lock()
	f := mgr.StartFullRead()
	r.mgrMu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := f.Read(ctx); err != nil {
		r.Log.Warn("reading the tables for drift repair (retried at the next sync)", "err", err)
		return
	}
	r.mgrMu.Lock()
	kept := mgr.FinishFullRead(f)
	r.mgrMu.Unlock()
	if kept && r.Trigger != nil {
		r.Trigger()
	}
}

// debouncedTrigger coalesces the health changes of one check round (probes of one
// interval flip within milliseconds of each other) into one sync.
func (r *Runtime) debouncedTrigger() func() {
	var mu sync.Mutex
	var pending bool
	return func() {
		mu.Lock()
		defer mu.Unlock()
		if pending {
			return
		}
		pending = true
		time.AfterFunc(healthDebounce, func() {
			mu.Lock()
			pending = false
			mu.Unlock()
			r.urgent.Store(true)
			r.Trigger()
		})
	}
}

const healthDebounce = 20 * time.Millisecond

// services merges the config's services with the state file's.
func (r *Runtime) services(cfg Config) ([]Service, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if err := r.loadOverlay(cfg); err != nil {
		return nil, err
	}
	if svcs, ok := r.validated(cfg.Services); ok {
		return svcs, nil
	}
	svcs := Merge(cfg.Services, r.overlay)
	validate := ValidateServices
	if was := r.valid.svcs; was != nil { // a config rebuilt per event (Kubernetes): validate what changed
		validate = func(svcs []Service, field func(int) string) []error { return ValidateChange(was, svcs, field) }
	}
	if errs := validate(svcs, fieldByName(svcs)); len(errs) > 0 {
		return nil, fmt.Errorf("the services changed through the API (%s) conflict with the config; keeping the last good state: %w",
			r.overlayPath, errors.Join(errs...))
	}
	r.remember(cfg.Services, svcs)
	return svcs, nil
}

// validated returns the valid merge of cfgSvcs and the current overlay, if it is known
// (r.mu held). The merge is shared: its readers do not modify it.
func (r *Runtime) validated(cfgSvcs []Service) ([]Service, bool) {
	v := &r.valid
	if v.svcs == nil || len(cfgSvcs) == 0 || v.cfg != &cfgSvcs[0] || v.n != len(cfgSvcs) || v.overlay != r.overlayVer {
		return nil, false
	}
	return v.svcs, true
}

// remember records svcs as the valid merge of cfgSvcs and the current overlay (r.mu held).
func (r *Runtime) remember(cfgSvcs []Service, svcs []Service) {
	if len(cfgSvcs) == 0 {
		return
	}
	r.valid.cfg, r.valid.n, r.valid.overlay, r.valid.svcs = &cfgSvcs[0], len(cfgSvcs), r.overlayVer, svcs
}

// loadOverlay reads the state file cfg names, unless it is the one read last (r.mu held).
func (r *Runtime) loadOverlay(cfg Config) error {
	if path := cfg.StatePath(); path != r.overlayPath {
		o, err := LoadOverlay(path)
		if err != nil {
			r.overlayErr = err
			return fmt.Errorf("loadBalancer.stateFile: %w", err)
		}
		r.overlay, r.overlayPath, r.overlayErr = o, path, nil
		r.overlayVer++
	}
	return nil
}

// NATVIPs are the snat and dnat VIPs of the services in effect for cfg (the API's merged in),
// as the next Sync balances them; false when the merge is not valid (Sync keeps the last
// good state then).
func (r *Runtime) NATVIPs(cfg Config) ([]netip.Addr, bool) {
	if !cfg.InUse() {
		return nil, true
	}
	svcs, err := r.services(cfg)
	return NATVIPs(svcs), err == nil
}

// OneShot is the load balancer part of one one-shot apply (`hostaccel apply`) of one config:
// the services in effect (the state file merged in) are read once, for the datapaths' VIPs
// (NATVIPs) and for the transaction (Apply).
type OneShot struct {
	read bool
	svcs []Service
	err  error
}

func (o *OneShot) effective(cfg Config) ([]Service, error) {
	if !o.read {
		o.svcs, o.err = checkedEffective(cfg)
		o.read = true
	}
	return o.svcs, o.err
}

// NATVIPs is Runtime.NATVIPs for a one-shot apply.
func (o *OneShot) NATVIPs(cfg Config) ([]netip.Addr, bool) {
	if !cfg.InUse() {
		return nil, true
	}
	svcs, err := o.effective(cfg)
	return NATVIPs(svcs), err == nil
}

// Effective returns the services in effect for cfg: the config's merged with the state
// file's, validated together.
func Effective(cfg Config) ([]Service, error) {
	return (&Runtime{}).services(cfg)
}

// checkedEffective is Effective for a section that passed Validate (config.Load checks it):
// its services are checked together again only when the state file has some to merge in
// (at 10,000 backends the check is ~10 ms of a one-shot apply).
func checkedEffective(cfg Config) ([]Service, error) {
	r := &Runtime{}
	r.mu.Lock()
	err := r.loadOverlay(cfg)
	r.mu.Unlock()
	switch {
	case err != nil:
		return nil, err
	case len(r.overlay.Services) == 0 && len(r.overlay.Deleted) == 0:
		return Merge(cfg.Services, r.overlay), nil
	}
	return r.services(cfg)
}

// OfflineEnv completes env for rendering without the real host (`lb render`): interfaces and
// dsr backends' MACs that are unknown here become 00:00:00:00:00:00.
func OfflineEnv(svcs []Service, env Env) Env {
	zero := net.HardwareAddr{0, 0, 0, 0, 0, 0}
	out := Env{Links: map[string]net.HardwareAddr{}, Neighbors: map[string]map[netip.Addr]net.HardwareAddr{}}
	for k, v := range env.Links {
		out.Links[k] = v
	}
	for _, s := range svcs {
		for _, dev := range []string{s.Interface, s.backendInterface()} {
			if dev != "" && len(out.Links[dev]) != 6 {
				out.Links[dev] = zero
			}
		}
		if s.Topology == DSR {
			dev := s.backendInterface()
			if out.Neighbors[dev] == nil {
				out.Neighbors[dev] = map[netip.Addr]net.HardwareAddr{}
			}
			for _, b := range s.Backends {
				if a, err := netip.ParseAddr(b.Address); err == nil {
					mac := env.Neighbors[dev][a]
					if len(mac) != 6 {
						mac = zero
					}
					out.Neighbors[dev][a] = mac
				}
			}
		}
	}
	return out
}

func fieldByName(svcs []Service) func(int) string {
	return func(i int) string {
		// A name that is not valid (it may hold "]" or be long) would garble the path:
		// such a service is named by its index, and its name error quotes the name.
		if validName.MatchString(svcs[i].Name) {
			return fmt.Sprintf("services[%s]", svcs[i].Name)
		}
		return fmt.Sprintf("services[%d]", i)
	}
}

func (r *Runtime) done(gen uint64, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.lastErr, r.lastSync = err, time.Now()
	if err == nil {
		r.applied = max(r.applied, gen)
	} else {
		r.failed = max(r.failed, gen)
	}
	close(r.synced)
	r.synced = make(chan struct{})
}

// waitApplied waits until a sync has applied generation gen, or one that carried it failed
// (a sync that began before gen, and failed, says nothing of it: the next one carries it).
// Both are checked on one reading before it waits: the sync may have ended (failed, too)
// before the caller began to wait, and the channel read with them is closed only by the next.
func (r *Runtime) waitApplied(ctx context.Context, gen uint64) error {
	for {
		r.mu.Lock()
		applied, failed, err, ch, closed := r.applied, r.failed, r.lastErr, r.synced, r.closed
		r.mu.Unlock()
		if applied >= gen {
			return nil
		}
		if failed >= gen && err != nil {
			return fmt.Errorf("saved, but the apply failed: %w", err)
		}
		if closed {
			return fmt.Errorf("saved, but not applied yet: %w", errStopping)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("saved, but not applied yet: %w (last sync: %v)", ctx.Err(), err)
		case <-ch:
		case <-r.closing:
		}
	}
}

// Run waits until ctx ends, then Stops. A caller with a sync loop of its own (the agent)
// calls Stop after the loop's last sync instead: a sync that ends after Stop starts no API
// or health check, but the API calls it would have answered are told it is not applied.
func (r *Runtime) Run(ctx context.Context) {
	<-ctx.Done()
	r.Stop()
}

// Stop ends the health checks and the API for good: API calls waiting for a sync are
// answered (with the last sync's outcome, or that the change is saved and applied when the
// agent starts again) before the API closes, and later Syncs fail.
func (r *Runtime) Stop() {
	r.mu.Lock()
	if !r.closed {
		r.closed = true
		close(r.closing)
	}
	r.mu.Unlock()
	r.stop(true)
}

// stop stops the health checks and the API: gracefully for Stop (the API calls under way are
// answered: Stop woke those waiting for a sync), at once from a sync (one waiting for that
// very sync would hold a graceful close until apiCloseWait: the sync stalled).
func (r *Runtime) stop(graceful bool) {
	r.mu.Lock()
	c, a := r.checker, r.api
	r.checker, r.api, r.apiCfg = nil, nil, API{}
	r.mu.Unlock()
	r.mgrMu.Lock()
	if r.settling != nil {
		r.settling.Stop()
	}
	r.mgrMu.Unlock()
	if c != nil {
		c.Stop()
	}
	if a != nil {
		a.close(graceful)
	}
}

// Remove Stops and deletes the load balancer's tables (agent exit with --cleanup-on-exit).
func (r *Runtime) Remove(ctx context.Context) error {
	r.Stop()
	m, err := r.NewManager()
	if err != nil {
		return err
	}
	defer m.Close()
	_, err = m.Remove(ctx)
	return err
}

// APIError says why the API, or its TCP listener, did not serve at the last sync (nil: it
// did, or there is none): the agent reports it as degraded (/healthz, hostaccel_healthy),
// where before it was only logged.
func (r *Runtime) APIError() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.apiErr
}

// flush deletes the conntrack entries of NAT backends that just left (down, failed, removed
// from their service, or with it), where the service asks for it: under the service's VIPs
// and ports, and those of the services whose internal clients it serves. All of a sync's at
// once (one reading of the conntrack table).
func (r *Runtime) flush(prev, cur *Desired) {
	if prev == nil {
		return
	}
	flushes := func(ss *ServiceState) bool {
		return ss.Service.FlushConntrack && (ss.Topology == SNAT || ss.Topology == DNAT)
	}
	// was, now: whether each backend (service and backend key) is in the maps, before and
	// after; built on first use: most syncs change no such service
	var was, now map[string]bool
	index := func(d *Desired) map[string]bool {
		m := map[string]bool{}
		for _, ss := range d.Services {
			for _, b := range ss.Backends {
				m[HealthKey(ss.Service.Name, b.Key)] = b.Known
			}
		}
		return m
	}
	var batch []ConntrackFlush
	var logged [][]any // what each flush is, for the log
	// the services whose internal clients a service serves, by its name, of prev and cur;
	// built on first use
	internal := map[*Desired]map[string][]*ServiceState{}
	// stays reports whether the service of name keeps b in cur (built on first use)
	var curByName map[string]*ServiceState
	stays := func(name string, b *BackendState) bool {
		if curByName == nil {
			curByName = make(map[string]*ServiceState, len(cur.Services))
			for _, o := range cur.Services {
				curByName[o.Service.Name] = o
			}
		}
		o := curByName[name]
		return o != nil && slices.ContainsFunc(o.Backends, func(k *BackendState) bool { return k.Known && k.Addr == b.Addr && k.Port == b.Port })
	}
	add := func(ss *ServiceState, b *BackendState, d *Desired) {
		if !ss.Service.InternalOnly { // (its VIPs are another service's, which may keep b)
			batch = append(batch, ConntrackFlush{ss.VIPs, ss.Ports, ss.Protocol, b.Addr, b.Port})
			logged = append(logged, []any{"service", ss.Service.Name, "backend", b.Key})
		}
		if internal[d] == nil {
			internal[d] = map[string][]*ServiceState{}
			for _, o := range d.Services {
				if in := o.Service.Internal; in != nil {
					internal[d][in.Service] = append(internal[d][in.Service], o)
				}
			}
		}
		for _, o := range internal[d][ss.Service.Name] {
			if stays(o.Service.Name, b) {
				// its outside clients' connections to b, under the same VIPs, stay (kube-proxy
				// keeps every entry whose reply source still serves the Service)
				continue
			}
			batch = append(batch, ConntrackFlush{o.VIPs, o.Ports, o.Protocol, b.Addr, b.Port})
			logged = append(logged, []any{"service", o.Service.Name, "internal clients of", ss.Service.Name, "backend", b.Key})
		}
	}
	for i, ss := range cur.Services {
		if !flushes(ss) || i < len(prev.Services) && prev.Services[i] == ss { // unchanged (Resolver)
			continue
		}
		if was == nil {
			was = index(prev)
		}
		for _, b := range ss.Backends {
			if was[HealthKey(ss.Service.Name, b.Key)] && !b.Known {
				add(ss, b, cur)
			}
		}
	}
	// backends gone from the config, with their service or alone: flushed under the VIPs
	// they had (a down one was flushed when it went down)
	for i, ps := range prev.Services {
		if !flushes(ps) || i < len(cur.Services) && cur.Services[i] == ps {
			continue
		}
		if now == nil {
			now = index(cur)
		}
		for _, b := range ps.Backends {
			if _, there := now[HealthKey(ps.Service.Name, b.Key)]; b.Known && !there {
				add(ps, b, prev)
			}
		}
	}
	if len(batch) == 0 {
		return
	}
	start := time.Now()
	err := r.FlushConntrack(batch)
	for _, l := range logged {
		r.Log.Info("flushed the conntrack entries of a backend that left", append(l, "err", err)...)
	}
	if len(batch) > 1 {
		r.Log.Info("flushed the conntrack entries of backends that left", "flushes", len(batch), "took", time.Since(start).Round(time.Millisecond), "err", err)
	}
}

// neighbours returns env with, for each dsr backend of svcs whose neighbour entry is gone,
// the MAC its entry last had (r.mgrMu held). DSR forwarding does not use the kernel's entry:
// it goes stale, and where the neighbour table is above gc_thresh1 the kernel's garbage
// collection deletes it. Taken out of the maps until solicit brought the entry back, the
// backend's flows (no conntrack) moved to other backends and broke. It keeps its MAC while
// solicit asks again; only a FAILED entry (the kernel asked, the host did not answer) or
// another MAC changes it. The MACs of backends no longer configured are forgotten. env is not
// changed: its neighbour maps are copied where a MAC is added.
func (r *Runtime) neighbours(svcs []Service, env Env) Env {
	was := r.macs
	r.macs = nil
	var held map[string]map[netip.Addr]net.HardwareAddr // what env lacks, from was
	for _, s := range svcs {
		if s.topology() != DSR {
			continue
		}
		dev := s.backendInterface()
		for _, b := range s.Backends {
			a, err := netip.ParseAddr(b.Address)
			if b.MAC != "" || err != nil || env.Failed[dev][a] {
				continue
			}
			mac, ok := env.Neighbors[dev][a]
			if !ok {
				if mac, ok = was[dev][a]; !ok {
					continue
				}
				held = putNeighbor(held, dev, a, mac)
			}
			r.macs = putNeighbor(r.macs, dev, a, mac)
		}
	}
	return withNeighbors(env, held)
}

// withNeighbors returns env with the neighbours of held added: env's maps are not changed
// (held's are).
func withNeighbors(env Env, held map[string]map[netip.Addr]net.HardwareAddr) Env {
	if held == nil {
		return env
	}
	out := env
	out.Neighbors = make(map[string]map[netip.Addr]net.HardwareAddr, len(env.Neighbors)+len(held))
	maps.Copy(out.Neighbors, env.Neighbors)
	for dev, m := range held {
		maps.Copy(m, env.Neighbors[dev])
		out.Neighbors[dev] = m
	}
	return out
}

// installedMACs is Runtime.neighbours for a one-shot apply, which remembers nothing of the
// last: it returns env with, for each dsr backend of d whose neighbour entry is gone (not
// FAILED), the MAC the kernel's map holds for it (the last apply's), and whether there was
// any. The map of a service is read only where one of its backends lacks its entry.
func (m *Manager) installedMACs(ctx context.Context, d *Desired, env Env) (Env, bool) {
	var held map[string]map[netip.Addr]net.HardwareAddr
	var tables map[TableRef]bool // our tables in the kernel, read on first need
	for _, ss := range d.Services {
		if ss.Topology != DSR || ss.Skipped != "" {
			continue
		}
		dev := ss.Service.backendInterface()
		var installed map[string]string // backend id -> MAC, read on first need
		for _, b := range ss.Backends {
			if b.MAC != nil || env.Failed[dev][b.Addr] || b.State == StateDown { // (down: not in the map)
				continue
			}
			if installed == nil {
				// (one listing of the tables, not a failing one of a map per service where
				// they are not there: an agent's first sync after a boot)
				if tables == nil {
					tables = map[TableRef]bool{}
					if all, err := m.Tables(ctx); err == nil {
						for _, t := range all {
							tables[t] = true
						}
					}
				}
				ref := TableRef{knftables.NetDevFamily, IngressTable(ss.Service.Interface)}
				name := setName(ss.Service.Name, "macs")
				if !tables[ref] {
					break
				}
				kt, err := m.list(ctx, ref, "map", name)
				if err != nil || kt.Maps[name] == nil {
					break // not installed
				}
				installed = kt.Maps[name].Elems
			}
			if mac, err := net.ParseMAC(installed[idMAC(b)]); err == nil {
				held = putNeighbor(held, dev, b.Addr, mac)
			}
		}
	}
	return withNeighbors(env, held), held != nil
}

// putNeighbor sets m[dev][a] to mac, making the maps it needs.
func putNeighbor(m map[string]map[netip.Addr]net.HardwareAddr, dev string, a netip.Addr, mac net.HardwareAddr) map[string]map[netip.Addr]net.HardwareAddr {
	if m == nil {
		m = map[string]map[netip.Addr]net.HardwareAddr{}
	}
	if m[dev] == nil {
		m[dev] = map[netip.Addr]net.HardwareAddr{}
	}
	m[dev][a] = mac
	return m
}

// solicit makes the kernel resolve the dsr backends' MAC addresses that its neighbour table
// (env) lacks, whether or not neighbours kept one (one empty datagram each), and asks for a
// sync a second later.
func (r *Runtime) solicit(d *Desired, env Env) {
	missing := unresolved(d, env)
	if len(missing) == 0 || time.Since(r.solicited) < time.Second {
		return
	}
	r.solicited = time.Now()
	r.Solicit(missing)
	time.AfterFunc(time.Second, r.Trigger)
}

// unresolved are the addresses of d's dsr backends (not down, of a service installed, without
// a configured MAC) that env's neighbour table lacks, whether or not their MAC is known
// otherwise.
func unresolved(d *Desired, env Env) []netip.Addr {
	var out []netip.Addr
	for _, n := range unanswered(d, env, false) {
		out = append(out, n.addr)
	}
	return out
}

// devAddr is a neighbour: an address on a device.
type devAddr struct {
	dev  string
	addr netip.Addr
}

// unanswered are the neighbours (device and address) of unresolved's backends; with
// failedAnswers, those the kernel has marked FAILED count as answered and are left out.
func unanswered(d *Desired, env Env, failedAnswers bool) []devAddr {
	var out []devAddr
	for _, ss := range d.Services {
		if ss.Topology != DSR || ss.Skipped != "" {
			continue
		}
		dev := ss.Service.backendInterface()
		for _, b := range ss.Backends {
			if b.Backend.MAC == "" && env.Neighbors[dev][b.Addr] == nil && b.State != StateDown && !(failedAnswers && env.Failed[dev][b.Addr]) {
				out = append(out, devAddr{dev, b.Addr})
			}
		}
	}
	return out
}

// NATVIPs returns the VIPs of the snat and dnat services: connections to them are
// conntrack'd and DNAT-ed, so the fastpath can offload them (node.loadBalancerIPs, for the
// external-to-loadbalancer class).
func NATVIPs(svcs []Service) []netip.Addr {
	var out []netip.Addr
	seen := map[netip.Addr]bool{} // thousands of VIPs: not a scan of out each
	for _, s := range svcs {
		if t := s.topology(); t == SNAT || t == DNAT {
			for _, v := range s.dispatched() {
				if a, err := netip.ParseAddr(v); err == nil && !seen[a] {
					seen[a] = true
					out = append(out, a)
				}
			}
		}
	}
	return out
}

func interfaces(svcs []Service) []string {
	var devs []string
	for _, s := range svcs {
		if s.Interface != "" {
			devs = append(devs, s.Interface, s.backendInterface())
		}
	}
	slices.Sort(devs)
	return slices.Compact(devs)
}

// Apply installs cfg's load balancer once (`hostaccel apply`): the config's services with
// the state file's changes, every backend taken as healthy, in one transaction; an empty
// section removes the load balancer's tables. It returns a line for the user. cfg has passed
// Validate (config.Load checks it).
func (o *OneShot) Apply(ctx context.Context, cfg Config) (string, error) {
	m, err := NewManager()
	if err != nil {
		return "", err
	}
	defer m.Close()
	m.KnownDir = DefaultKnownDir
	if !cfg.InUse() {
		refs, err := m.Remove(ctx)
		if err != nil || len(refs) == 0 {
			return "", err
		}
		return fmt.Sprintf("removed the load balancer's tables: %v", refs), nil
	}
	m.Prefetch(ctx) // the generation and the cache file, read while the services are resolved
	svcs, err := o.effective(cfg)
	if err != nil {
		return "", err
	}
	env, err := HostEnv(interfaces(svcs))
	if err != nil {
		return "", err
	}
	d := Resolve(svcs, nil, env)
	if len(unanswered(d, env, true)) > 0 {
		// (a dsr backend without a neighbour entry: resolved now, where the agent would
		// solicit it and sync again; a MAC the last apply installed is kept below only for
		// one the kernel is still resolving, not for one it has FAILED, or an apply at every
		// neighbour garbage collection would keep a dead backend for good)
		if env, err = awaitNeighbours(ctx, d, env, interfaces(svcs), neighbourWait); err != nil {
			return "", err
		}
		d = Resolve(svcs, nil, env)
	}
	if kept, ok := m.installedMACs(ctx, d, env); ok {
		d = Resolve(svcs, nil, kept)
	}
	var notes []string
	for _, ss := range d.Services {
		if ss.Skipped != "" {
			return "", fmt.Errorf("services[%s]: %s", ss.Service.Name, ss.Skipped)
		}
		for _, b := range ss.Backends {
			if !b.Known && b.State != StateDown {
				notes = append(notes, fmt.Sprintf("services[%s] backend %s: %s", ss.Service.Name, b.Key, b.Reason))
			}
		}
	}
	res, err := m.Apply(ctx, Render(d))
	if err != nil {
		return "", err
	}
	solicitNeighbours(unresolved(d, env)) // for the next apply
	what, how := "no change", ""
	if res.Changed() {
		what = fmt.Sprintf("%d operations", res.Operations)
	}
	if res.Netlink {
		how = " over netlink"
	}
	msg := fmt.Sprintf("applied the load balancer%s (%s): %d services", how, what, len(svcs))
	for _, n := range notes {
		msg += "\n  note: " + n
	}
	return strings.TrimSpace(msg), nil
}
