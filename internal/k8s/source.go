// Package k8s is hostaccel's Kubernetes source: client-go informers on Nodes, Services and
// EndpointSlices turn what the API says into the same config (and so the same desired state)
// that a YAML file gives, for the same reconciler to apply.
//
// One agent runs per node (a DaemonSet) and acts only on its own kernel; there is no leader.
// The source only reads the API (get, list, watch). When it loses the API server it keeps the
// last config it derived, so the node keeps its rules, and says so (Notes, Status, metrics);
// the informers re-list when the server is back and the config follows again.
package k8s

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"slices"
	"strconv"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	corelisters "k8s.io/client-go/listers/core/v1"
	discoverylisters "k8s.io/client-go/listers/discovery/v1"
	"k8s.io/client-go/tools/cache"

	"github.com/hostaccel/hostaccel/internal/config"
)

// Options configure a Source.
type Options struct {
	// NodeName is this node's Node object (see NodeName).
	NodeName string
	// BaseConfigPath is the agent config the API's facts are added to (the ConfigMap, mounted).
	// It is watched; "" starts from an empty config.
	BaseConfigPath string
	Peers          PeerPolicy
	// PeerSubnets for PeersSameSubnet; when empty they are found with LocalSubnets.
	PeerSubnets []netip.Prefix
	Services    ServicePolicy
	ProxyName   string

	// Debounce is the least time between two derivations (default 100ms): the first event
	// after a quiet spell is derived at once, a burst's events together.
	Debounce time.Duration
	// ProbeInterval is how often the API server is asked for this Node to tell whether it is
	// reachable (default 5s).
	ProbeInterval time.Duration
	// FilePollInterval is how often BaseConfigPath is checked for changes (default 1s).
	FilePollInterval time.Duration
	Log              *slog.Logger
	// LocalSubnets finds the local prefixes that hold the given node IPs (default: the
	// addresses of this network namespace's interfaces). Replaceable in tests.
	LocalSubnets func(nodeIPs []netip.Addr) ([]netip.Prefix, error)
	// HealthChecks: answer the healthCheckNodePort of every balanced Service that has one
	// (type LoadBalancer, externalTrafficPolicy Local) on HealthCheckAddress ("" every
	// address), as kube-proxy does (healthcheck.go). The agent's; `k8s render` serves none.
	HealthChecks       bool
	HealthCheckAddress string
	// ProxyHealthTimeout: once a derived change has waited this long for a sync that succeeds
	// (Synced), the health check ports answer 503 (DefaultProxyHealthTimeout).
	ProxyHealthTimeout time.Duration
	// NodeHealthAddress: answer kube-proxy's node health check (/healthz, /livez) there
	// (nodehealth.go); "" none. The agent's, where it serves every Service in place of
	// kube-proxy (DefaultNodeHealthAddress).
	NodeHealthAddress string
}

// Source derives hostaccel's config from the Kubernetes API. Create it with New, run it with
// Run, wait for WaitReady, then read Config whenever Changed fires.
type Source struct {
	client kubernetes.Interface
	opts   Options
	log    *slog.Logger

	factory     informers.SharedInformerFactory
	nodes       corelisters.NodeLister
	nodesSynced cache.InformerSynced // the Node informer's HasSynced
	services    corelisters.ServiceLister
	endpoints   discoverylisters.EndpointSliceLister // nil when no Service is balanced
	synced      []cache.InformerSynced

	dirty   chan struct{} // the inputs changed; derive again
	probe   chan struct{} // ask the API server now
	changed chan struct{} // Config or Notes changed
	ready   chan struct{} // closed at the first good derivation

	mu        sync.Mutex
	st        Status
	last      *Derived
	baseHash  [32]byte
	base      *config.Config
	readyOnce sync.Once
	// sumJSON is the JSON of sumOf's Summary (Report).
	sumJSON []byte
	sumOf   *Derived
	// dr keeps what the last derivations found (derive runs in Run's goroutine only).
	dr deriver
	// subnets are the transport subnets the last derivation found here (same-subnet peers).
	subnets []netip.Prefix
	// health answers the Services' health check ports (Options.HealthChecks).
	health *healthServer
	// hc holds the health check ports of the last derivation until the agent has put its
	// config in the kernel (a port answers for rules that are there, as kube-proxy's).
	hc struct {
		sync.Mutex                   // serializes health.Sync; taken before mu
		pending    []HealthCheckPort // the ports of pendingFor's derivation
		pendingFor *config.Config    // nil: none waits
		synced     *config.Config    // the config of the last sync that succeeded
	}
	// proxy is whether the agent keeps up (Synced), for the health check ports.
	proxy *proxyHealth
}

// Status is the source's view of itself and of the API, for `hostaccel status` and metrics.
type Status struct {
	NodeName  string `json:"nodeName"`
	APIServer string `json:"apiServer,omitempty"`
	// Connected is true while the API server answers; the derived config is then current.
	Connected bool `json:"connected"`
	// LastContact is the last time the API server answered.
	LastContact time.Time `json:"lastContact,omitzero"`
	// DisconnectedSince is set while the API server does not answer.
	DisconnectedSince time.Time `json:"disconnectedSince,omitzero"`
	LastAPIError      string    `json:"lastAPIError,omitempty"`
	WatchErrors       int       `json:"watchErrors"`
	// LastWatchError is the informers' latest list or watch failure (a missing permission
	// shows here while the informers cannot sync).
	LastWatchError string `json:"lastWatchError,omitempty"`
	// Synced is true once every informer has listed its objects.
	Synced bool `json:"synced"`
	// Derivations counts derivations; Changes those that changed the config.
	Derivations int       `json:"derivations"`
	Changes     int       `json:"changes"`
	LastChange  time.Time `json:"lastChange,omitzero"`
	// DeriveError is why the latest derivation was rejected (the last good config stays).
	DeriveError string `json:"deriveError,omitempty"`
	// HealthChecks are the Services' health check ports answered here.
	HealthChecks []HealthCheckPort `json:"healthChecks,omitempty"`
	// ServiceProxyHealthy is false while a derived change has waited longer than
	// Options.ProxyHealthTimeout for the agent's sync, or derivations have been rejected that
	// long (since ChangeWaitingSince): the health check ports then answer 503, as kube-proxy's
	// do.
	ServiceProxyHealthy bool      `json:"serviceProxyHealthy"`
	ChangeWaitingSince  time.Time `json:"changeWaitingSince,omitzero"`
	// Summary explains the config in use (the last field: Report writes it).
	Summary *Summary `json:"summary,omitempty"`
}

// New builds a Source; nothing runs until Run.
func New(client kubernetes.Interface, opts Options) (*Source, error) {
	if opts.NodeName == "" {
		return nil, errors.New("kubernetes: the node name is required (--node-name, or NODE_NAME from the downward API)")
	}
	if opts.Peers == "" {
		opts.Peers = PeersAll
	}
	if opts.Peers != PeersAll && opts.Peers != PeersSameSubnet {
		return nil, fmt.Errorf("kubernetes: peer policy %q is not one of all, same-subnet", opts.Peers)
	}
	if opts.Services == "" {
		opts.Services = ServicesLabeled
	}
	switch opts.Services {
	case ServicesNone, ServicesLabeled, ServicesAll:
	default:
		return nil, fmt.Errorf("kubernetes: service policy %q is not one of none, labeled, all", opts.Services)
	}
	if opts.ProxyName == "" {
		opts.ProxyName = DefaultProxyName
	}
	if opts.Debounce <= 0 {
		opts.Debounce = 100 * time.Millisecond
	}
	if opts.ProbeInterval <= 0 {
		opts.ProbeInterval = 5 * time.Second
	}
	if opts.FilePollInterval <= 0 {
		opts.FilePollInterval = time.Second
	}
	if opts.Log == nil {
		opts.Log = slog.Default()
	}
	if opts.LocalSubnets == nil {
		opts.LocalSubnets = LocalSubnets
	}
	s := &Source{
		client:  client,
		opts:    opts,
		log:     opts.Log.With("source", "kubernetes"),
		dirty:   make(chan struct{}, 1),
		probe:   make(chan struct{}, 1),
		changed: make(chan struct{}, 1),
		ready:   make(chan struct{}),
		st:      Status{NodeName: opts.NodeName},
	}
	if opts.ProxyHealthTimeout <= 0 {
		opts.ProxyHealthTimeout = DefaultProxyHealthTimeout
	}
	s.proxy = newProxyHealth(opts.ProxyHealthTimeout, time.Now)
	if opts.HealthChecks {
		s.health = &healthServer{addr: opts.HealthCheckAddress, log: s.log, proxy: s.proxy}
	}
	s.factory = informers.NewSharedInformerFactoryWithOptions(client, 0, informers.WithTransform(stripManagedFields))
	add := func(inf cache.SharedIndexInformer, h cache.ResourceEventHandler) {
		_, _ = inf.AddEventHandler(h)
		_ = inf.SetWatchErrorHandlerWithContext(s.watchError)
		s.synced = append(s.synced, inf.HasSynced)
	}
	nodes := s.factory.Core().V1().Nodes()
	add(nodes.Informer(), cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { s.markDirty() },
		UpdateFunc: func(o, n any) { s.nodeUpdated(o, n) },
		DeleteFunc: func(any) { s.markDirty() },
	})
	s.nodes, s.nodesSynced = nodes.Lister(), nodes.Informer().HasSynced
	services := s.factory.Core().V1().Services()
	all := cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { s.markDirty() },
		UpdateFunc: func(any, any) { s.markDirty() },
		DeleteFunc: func(any) { s.markDirty() },
	}
	add(services.Informer(), all)
	s.services = services.Lister()
	if opts.Services != ServicesNone {
		es := s.factory.Discovery().V1().EndpointSlices()
		add(es.Informer(), all)
		s.endpoints = es.Lister()
	}
	return s, nil
}

// Host sets the API server's address shown in status (informational).
func (s *Source) Host(h string) {
	s.mu.Lock()
	s.st.APIServer = h
	s.mu.Unlock()
}

// Run runs the informers, the API probe and the derivations until ctx ends.
func (s *Source) Run(ctx context.Context) {
	s.factory.Start(ctx.Done())
	defer s.factory.Shutdown()
	if s.health != nil {
		defer s.health.Close()
	}
	var wg sync.WaitGroup
	defer wg.Wait()
	wg.Go(func() { s.runProbe(ctx) })
	if s.health != nil {
		wg.Go(func() { s.retryHealthChecks(ctx) })
	}
	if a := s.opts.NodeHealthAddress; a != "" {
		h := &nodeHealth{proxy: s.proxy, node: func() (*corev1.Node, error) { return s.nodes.Get(s.opts.NodeName) }, synced: s.nodesSynced, now: time.Now}
		wg.Go(func() { s.serveNodeHealth(ctx, h, a) })
	}
	if s.opts.Peers == PeersSameSubnet && len(s.opts.PeerSubnets) == 0 {
		wg.Go(func() { s.watchSubnets(ctx) })
	}
	if s.opts.BaseConfigPath != "" {
		// The watch's first look comes before the first derivation reads the file: an edit
		// in between would otherwise be the watch's baseline, never noticed.
		looked := make(chan struct{})
		wg.Go(func() { s.watchBase(ctx, func() { close(looked) }) })
		select {
		case <-looked:
		case <-ctx.Done():
			return
		}
	}
	if cache.WaitForCacheSync(ctx.Done(), s.synced...) {
		s.mu.Lock()
		s.st.Synced = true
		s.mu.Unlock()
		s.log.Info("informers synced", "node", s.opts.NodeName)
	}
	s.markDirty()
	var last time.Time
	for {
		select {
		case <-ctx.Done():
			return
		case <-s.dirty:
		}
		// At most one derivation per Debounce: an event after a quiet spell is served at
		// once (an EndpointSlice change reaches the agent without waiting), the events of a
		// burst by one derivation when the spell is over.
		if wait := s.opts.Debounce - time.Since(last); wait > 0 {
			select {
			case <-ctx.Done():
				return
			case <-time.After(wait):
			}
			select {
			case <-s.dirty:
			default:
			}
		}
		last = time.Now()
		s.derive(ctx)
	}
}

// WaitReady blocks until the first config has been derived, logging why not every 10s.
func (s *Source) WaitReady(ctx context.Context) error {
	t := time.NewTicker(10 * time.Second)
	defer t.Stop()
	for {
		select {
		case <-s.ready:
			return nil
		case <-ctx.Done():
			st := s.Status()
			return fmt.Errorf("kubernetes: no config derived yet (synced %v, connected %v): %w; %s", st.Synced, st.Connected, ctx.Err(), st.why())
		case <-t.C:
			st := s.Status()
			s.log.Warn("waiting for a first config from the API", "synced", st.Synced, "connected", st.Connected, "why", st.why())
		}
	}
}

func (st Status) why() string {
	switch {
	case st.DeriveError != "":
		return st.DeriveError
	case st.LastAPIError != "":
		return st.LastAPIError
	case !st.Synced && st.LastWatchError != "":
		return "informers not synced: " + st.LastWatchError
	case !st.Synced:
		return "informers not synced"
	}
	return ""
}

// Config returns the last good derived config. It stays in place while the API server is
// unreachable or a derivation is rejected.
func (s *Source) Config() (*config.Config, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.last == nil {
		return nil, fmt.Errorf("kubernetes: no config derived yet: %s", s.st.why())
	}
	return s.last.Config, nil
}

// Derived returns the last good derivation (nil before the first).
func (s *Source) Derived() *Derived {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.last
}

// Changed receives a value whenever Config, Notes or Status changed in a way the agent acts on.
// Values coalesce.
func (s *Source) Changed() <-chan struct{} { return s.changed }

// Notes say why the applied state may not be what the API says now; the agent reports them as
// degraded. Empty when all is well.
func (s *Source) Notes() []string {
	st := s.Status()
	var out []string
	if !st.DisconnectedSince.IsZero() {
		out = append(out, fmt.Sprintf("kubernetes: API server unreachable since %s (%s); keeping the last applied state",
			st.DisconnectedSince.Format(time.RFC3339), st.LastAPIError))
	}
	if st.DeriveError != "" {
		out = append(out, "kubernetes: keeping the last good config: "+st.DeriveError)
	}
	return out
}

// Report is Status for the agent's published state (agent.Source): json.Marshal(Status()),
// with the summary written once per derivation, not at every sync (~2 MB of JSON at 5,000
// Services; issue 13).
func (s *Source) Report() any {
	s.mu.Lock()
	st, last := s.st, s.last
	sum, ok := s.sumJSON, s.sumOf == last
	s.mu.Unlock()
	st.ServiceProxyHealthy, st.ChangeWaitingSince = s.proxy.healthy()
	b, err := json.Marshal(st)
	if err != nil || last == nil || len(b) < 2 || b[len(b)-1] != '}' {
		return s.Status()
	}
	if !ok {
		if sum, err = json.Marshal(&last.Summary); err != nil {
			return s.Status()
		}
		s.mu.Lock()
		s.sumJSON, s.sumOf = sum, last
		s.mu.Unlock()
	}
	// Summary is Status's last field: it goes where json.Marshal would have put it.
	out := make([]byte, 0, len(b)+len(sum)+16)
	out = append(out, b[:len(b)-1]...)
	if len(b) > 2 {
		out = append(out, ',')
	}
	out = append(out, `"summary":`...)
	out = append(out, sum...)
	return json.RawMessage(append(out, '}'))
}

// Status returns a copy of the source's status.
func (s *Source) Status() Status {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.st
	if s.last != nil {
		sum := s.last.Summary
		st.Summary = &sum
	}
	st.ServiceProxyHealthy, st.ChangeWaitingSince = s.proxy.healthy()
	return st
}

// Synced is told each sync's outcome by the agent, and the config it put in the kernel: a change
// waits from a failed sync (or its derivation) until a sync succeeds, and the health check
// ports answer 503 once it has waited longer than Options.ProxyHealthTimeout (kube-proxy's
// serviceProxyHealthy). The ports follow a derivation once a sync of its config succeeds.
func (s *Source) Synced(cfg *config.Config, err error) {
	s.proxy.synced(err)
	if s.health == nil || err != nil {
		return
	}
	s.hc.Lock()
	defer s.hc.Unlock()
	s.hc.synced = cfg
	if s.hc.pendingFor == cfg && cfg != nil {
		s.serveHealthChecks(s.hc.pending)
	}
}

// healthChecksFor answers the health check ports hcs of the derivation of cfg: now if the
// kernel has cfg, else at the sync that puts it there (Synced). Before, a node answered 200
// for a new local endpoint as soon as it was derived, up to a sync (~1 s) before its rules
// sent traffic there.
func (s *Source) healthChecksFor(cfg *config.Config, hcs []HealthCheckPort) {
	s.hc.Lock()
	defer s.hc.Unlock()
	if cfg == s.hc.synced {
		s.serveHealthChecks(hcs)
		return
	}
	s.hc.pending, s.hc.pendingFor = hcs, cfg
}

// serveHealthChecks syncs the ports (s.hc held).
func (s *Source) serveHealthChecks(hcs []HealthCheckPort) {
	s.hc.pending, s.hc.pendingFor = nil, nil
	s.health.Sync(hcs)
	serving := s.health.Serving()
	s.mu.Lock()
	s.st.HealthChecks = serving
	s.mu.Unlock()
}

func (s *Source) markDirty() {
	select {
	case s.dirty <- struct{}{}:
	default:
	}
}

func (s *Source) signal() {
	select {
	case s.changed <- struct{}{}:
	default:
	}
}

// nodeUpdated ignores the Node updates that change nothing derived (heartbeats, conditions):
// derivations read Pod CIDRs, addresses and the zone label (topology-aware routing).
func (s *Source) nodeUpdated(o, n any) {
	a, ok1 := o.(*corev1.Node)
	b, ok2 := n.(*corev1.Node)
	if ok1 && ok2 && slices.Equal(a.Spec.PodCIDRs, b.Spec.PodCIDRs) && a.Spec.PodCIDR == b.Spec.PodCIDR &&
		slices.Equal(a.Status.Addresses, b.Status.Addresses) && a.Labels[corev1.LabelTopologyZone] == b.Labels[corev1.LabelTopologyZone] {
		return
	}
	s.markDirty()
}

// derive runs one derivation from the informers' caches and publishes it if it changed.
func (s *Source) derive(ctx context.Context) {
	snap, err := s.snapshot()
	var d *Derived
	if err == nil {
		p := Params{NodeName: s.opts.NodeName, Peers: s.opts.Peers, PeerSubnets: s.opts.PeerSubnets,
			Services: s.opts.Services, ProxyName: s.opts.ProxyName}
		if p.Peers == PeersSameSubnet && len(p.PeerSubnets) == 0 {
			// recorded whether or not the derivation succeeds: watchSubnets compares with it
			var serr error
			if p.PeerSubnets, serr = s.localSubnets(snap.Nodes); serr != nil {
				s.log.Warn("cannot find this node's transport subnets; no peer is accelerated under same-subnet", "err", serr)
			}
			s.mu.Lock()
			s.subnets = p.PeerSubnets
			s.mu.Unlock()
		}
		var base *config.Config
		if base, err = s.loadBase(); err == nil {
			d, err = s.dr.derive(base, snap, p)
		}
	}
	s.proxy.derived(err)
	s.mu.Lock()
	s.st.Derivations++
	prevErr := s.st.DeriveError
	if err != nil {
		s.st.DeriveError = err.Error()
		s.mu.Unlock()
		if prevErr != err.Error() {
			s.log.Error("derived config rejected; keeping the last good one", "err", err)
			s.signal()
		}
		return
	}
	s.st.DeriveError = ""
	changed := s.last == nil || !bytes.Equal(s.last.JSON, d.JSON)
	// (The summary is compared only when the config is the same: ~2 MB of JSON at 5,000
	// Services, to no use when the config changed.)
	summaryChanged := changed || !summaryEqual(s.last.Summary, d.Summary)
	if changed {
		s.st.Changes++
		s.st.LastChange = time.Now()
		s.proxy.changed()
	}
	if !changed && s.last != nil {
		// The same config: the agent knows it by its pointer (agent.Source).
		d.Config, d.JSON = s.last.Config, s.last.JSON
	}
	if changed || summaryChanged {
		s.last = d
	}
	s.mu.Unlock()
	if s.health != nil {
		s.healthChecksFor(d.Config, healthChecks(snap.Services, d.Summary.Balanced))
	}
	if changed {
		s.log.Info("config derived from the API", "localPodCIDRs", d.Config.Node.LocalPodCIDRs,
			"peerPodCIDRs", fewOrCount(d.Config.Node.PeerPodCIDRs), "loadBalancerIPs", fewOrCount(d.Config.Node.LoadBalancerIPs),
			"balanced", len(d.Summary.Balanced))
	}
	s.readyOnce.Do(func() { close(s.ready) })
	if changed || summaryChanged || prevErr != "" {
		s.signal()
	}
}

// fewOrCount is a list for a log line: the list while it is short, else how many (a cluster's
// 5,000 peer CIDRs made every change's line 80 KB; status and `hostaccel k8s render` list them).
func fewOrCount(l []string) any {
	if len(l) <= 16 {
		return l
	}
	return strconv.Itoa(len(l)) + " entries"
}

func summaryEqual(a, b Summary) bool {
	x, _ := json.Marshal(a)
	y, _ := json.Marshal(b)
	return bytes.Equal(x, y)
}

func (s *Source) snapshot() (Snapshot, error) {
	var snap Snapshot
	var err error
	if snap.Nodes, err = s.nodes.List(labels.Everything()); err != nil {
		return snap, err
	}
	if snap.Services, err = s.services.List(labels.Everything()); err != nil {
		return snap, err
	}
	if s.endpoints != nil {
		if snap.EndpointSlices, err = s.endpoints.List(labels.Everything()); err != nil {
			return snap, err
		}
	}
	return snap, nil
}

// loadBase reads the base config when it changed; a bad file keeps the last good one out of
// use (the derivation is rejected, so the agent keeps the last good derived config).
func (s *Source) loadBase() (*config.Config, error) {
	if s.opts.BaseConfigPath == "" {
		c := config.Defaults()
		return &c, nil
	}
	b, err := config.ReadFile(s.opts.BaseConfigPath)
	if err != nil {
		return nil, err
	}
	h := sha256.Sum256(b)
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.base != nil && h == s.baseHash {
		return s.base, nil
	}
	c, err := ParseBase(b)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", s.opts.BaseConfigPath, err)
	}
	s.base, s.baseHash = c, h
	return c, nil
}

// localSubnets are this node's transport subnets: the local prefixes that hold its
// InternalIPs (of nodes, the Node objects).
func (s *Source) localSubnets(nodes []*corev1.Node) ([]netip.Prefix, error) {
	var ips []netip.Addr
	for _, n := range nodes {
		if n.Name != s.opts.NodeName {
			continue
		}
		for _, a := range addressesOf(n, corev1.NodeInternalIP) {
			ips = append(ips, netip.MustParseAddr(a))
		}
	}
	return s.opts.LocalSubnets(ips)
}

// watchSubnets derives again, every ProbeInterval, when this node's transport subnets are no
// longer those the last derivation found (same-subnet peers): an address that came late at
// boot, or a renumbering. Derivations otherwise follow the API's events, which a quiet cluster
// may not send for hours.
func (s *Source) watchSubnets(ctx context.Context) {
	s.everyProbe(ctx, func() {
		nodes, err := s.nodes.List(labels.Everything())
		if err != nil {
			return
		}
		now, _ := s.localSubnets(nodes)
		s.mu.Lock()
		was := s.subnets
		s.mu.Unlock()
		if !slices.Equal(now, was) {
			s.log.Info("this node's transport subnets changed", "subnets", now, "were", was)
			s.markDirty()
		}
	})
}

// retryHealthChecks listens, every ProbeInterval, on the health check ports that were taken
// when their Services came (another process, kube-proxy before it was removed): derivations
// follow API events only, and a quiet cluster may have none for hours.
func (s *Source) retryHealthChecks(ctx context.Context) { s.everyProbe(ctx, s.health.Retry) }

// everyProbe runs fn every ProbeInterval until ctx ends.
func (s *Source) everyProbe(ctx context.Context, fn func()) {
	t := time.NewTicker(s.opts.ProbeInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			fn()
		}
	}
}

// watchBase polls the base config file (a ConfigMap volume is updated by swapping a symlink,
// which polling sees and inotify on the file does not).
func (s *Source) watchBase(ctx context.Context, started func()) {
	config.WatchFrom(ctx, s.opts.BaseConfigPath, s.opts.FilePollInterval, func() {
		s.log.Info("base config changed", "path", s.opts.BaseConfigPath)
		s.markDirty()
	}, started)
}

// runProbe asks the API server for this Node every ProbeInterval, and at once after a watch
// error, to tell connected from disconnected.
func (s *Source) runProbe(ctx context.Context) {
	t := time.NewTicker(s.opts.ProbeInterval)
	defer t.Stop()
	for {
		s.probeOnce(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-s.probe:
		}
	}
}

func (s *Source) probeOnce(ctx context.Context) {
	pctx, cancel := context.WithTimeout(ctx, min(s.opts.ProbeInterval, 5*time.Second))
	_, err := s.client.CoreV1().Nodes().Get(pctx, s.opts.NodeName, metav1.GetOptions{})
	cancel()
	if ctx.Err() != nil {
		return
	}
	reachable := err == nil || apiAnswered(err)
	now := time.Now()
	s.mu.Lock()
	was := s.st.Connected
	wasDown := !s.st.DisconnectedSince.IsZero()
	if reachable {
		s.st.Connected, s.st.LastContact, s.st.DisconnectedSince, s.st.LastAPIError = true, now, time.Time{}, ""
		if err != nil {
			s.st.LastAPIError = err.Error()
		}
	} else {
		s.st.Connected = false
		s.st.LastAPIError = err.Error()
		if s.st.DisconnectedSince.IsZero() {
			s.st.DisconnectedSince = now
		}
	}
	s.mu.Unlock()
	switch {
	case reachable && wasDown:
		s.log.Info("API server reachable again; resyncing")
		s.markDirty()
		s.signal()
	case !reachable && (was || !wasDown):
		s.log.Warn("API server unreachable; keeping the last applied state", "err", err)
		s.signal()
	}
}

// apiAnswered tells an answer from the API server (an error status such as NotFound or
// Forbidden) from no answer at all.
func apiAnswered(err error) bool {
	var st interface{ Status() metav1.Status }
	return errors.As(err, &st) && st.Status().Code != 0 && st.Status().Code < 500
}

func (s *Source) watchError(_ context.Context, r *cache.Reflector, err error) {
	s.mu.Lock()
	s.st.WatchErrors++
	s.st.LastWatchError = err.Error()
	s.mu.Unlock()
	s.log.Debug("watch failed", "reflector", r.Name(), "err", err)
	select {
	case s.probe <- struct{}{}:
	default:
	}
}

// stripManagedFields drops what hostaccel never reads before objects enter the caches.
func stripManagedFields(obj any) (any, error) {
	if a, err := meta.Accessor(obj); err == nil {
		a.SetManagedFields(nil)
		if ann := a.GetAnnotations(); ann != nil {
			delete(ann, corev1.LastAppliedConfigAnnotation)
		}
	}
	return obj, nil
}
