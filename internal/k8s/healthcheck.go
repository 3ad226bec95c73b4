package k8s

import (
	"encoding/json"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
)

// A Service of type LoadBalancer with externalTrafficPolicy Local has a healthCheckNodePort:
// the cloud's load balancer asks every node on it whether the node has endpoints of the
// Service, and sends traffic only to those that answer 200. kube-proxy answers it; where
// hostaccel balances the Service (in place of kube-proxy, or for the Services labeled to it)
// hostaccel must, or every node looks unhealthy and the Service gets no traffic at all.

// HealthCheckPort is a Service's healthCheckNodePort and the number of this node's endpoints
// that take new connections.
type HealthCheckPort struct {
	Namespace      string `json:"namespace"`
	Name           string `json:"name"`
	Port           int32  `json:"port"`
	LocalEndpoints int    `json:"localEndpoints"`
}

// healthChecks are the health check ports of the balanced Services among svcs (balanced:
// the derivation's fronts), with this node's endpoints counted from the fronts that take
// external traffic (their backends are this node's with the Local policy): those that are up.
// It runs at every derivation: only the Services that have a port (few, where thousands are
// balanced) are looked up in the fronts.
func healthChecks(svcs []*corev1.Service, balanced []LBFront) []HealthCheckPort {
	type key struct{ ns, name string }
	local := map[key]map[string]bool{} // the Services with a port -> their local endpoints up
	for _, s := range svcs {
		if s.Spec.Type == corev1.ServiceTypeLoadBalancer && s.Spec.HealthCheckNodePort > 0 &&
			s.Spec.ExternalTrafficPolicy == corev1.ServiceExternalTrafficPolicyLocal {
			local[key{s.Namespace, s.Name}] = nil
		}
	}
	if len(local) == 0 {
		return nil
	}
	for _, f := range balanced {
		k := key{f.Namespace, f.Service}
		eps, ok := local[k]
		if !ok {
			continue
		}
		if eps == nil {
			eps = map[string]bool{}
			local[k] = eps // balanced
		}
		if f.Front == FrontCluster || f.InternalOnly || f.Skipped != "" { // (the short-circuit's: every node's)
			continue
		}
		for _, b := range f.Backends {
			// ready ones only: a node whose local endpoints all terminate fails the check,
			// so that the cloud load balancer drains it while they still serve (KEP-1669)
			if b.State == StateUp && !b.serving {
				eps[b.Address] = true
			}
		}
	}
	var out []HealthCheckPort
	for _, s := range svcs {
		if eps := local[key{s.Namespace, s.Name}]; eps != nil {
			out = append(out, HealthCheckPort{Namespace: s.Namespace, Name: s.Name, Port: s.Spec.HealthCheckNodePort, LocalEndpoints: len(eps)})
		}
	}
	slices.SortFunc(out, func(a, b HealthCheckPort) int { return int(a.Port) - int(b.Port) })
	return out
}

// DefaultProxyHealthTimeout is how long a derived change may wait for the agent to put it in
// the kernel before the health check ports answer 503 (Options.ProxyHealthTimeout): kube-proxy's
// default, twice its 30 s sync period.
const DefaultProxyHealthTimeout = time.Minute

// proxyHealth is kube-proxy's serviceProxyHealthy: whether the agent keeps the kernel up to date
// with what the Source derives. It is not once a change has waited longer than timeout for a
// sync that succeeds (a change derived, or a sync that failed, starts the wait; a sync that
// succeeds ends it), nor once derivations have been rejected for longer than timeout (a broken
// base config: the last good config stays in the kernel, and the API's changes cannot reach
// it, whatever the syncs; a derivation that succeeds ends that wait). Then every health check
// port answers 503, also with local endpoints, so that the cloud's load balancer leaves a
// node whose rules are stale.
type proxyHealth struct {
	mu       sync.Mutex
	lastOK   time.Time // the last sync that succeeded (zero: none yet)
	waiting  time.Time // since when a change waits for a sync (zero: none)
	rejected time.Time // since when derivations are rejected (zero: the last one succeeded)
	timeout  time.Duration
	now      func() time.Time
}

func newProxyHealth(timeout time.Duration, now func() time.Time) *proxyHealth {
	// the first config waits for the agent's first sync
	return &proxyHealth{timeout: timeout, now: now, waiting: now()}
}

// changed says that a derived change waits for a sync.
func (p *proxyHealth) changed() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.waiting.IsZero() {
		p.waiting = p.now()
	}
}

// derived records a derivation's outcome (err: rejected).
func (p *proxyHealth) derived(err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	switch {
	case err == nil:
		p.rejected = time.Time{}
	case p.rejected.IsZero():
		p.rejected = p.now()
	}
}

// synced records a sync's outcome.
func (p *proxyHealth) synced(err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	switch {
	case err == nil:
		p.waiting, p.lastOK = time.Time{}, p.now()
	case p.waiting.IsZero():
		p.waiting = p.now()
	}
}

// lastSync is when the last sync that succeeded ended (zero: none yet).
func (p *proxyHealth) lastSync() time.Time {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.lastOK
}

// healthy reports whether no change has waited longer than the timeout, and since when one
// waits (zero: none): a change for a sync, or the API's changes for a derivation that succeeds.
func (p *proxyHealth) healthy() (bool, time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	since := p.waiting
	if since.IsZero() || !p.rejected.IsZero() && p.rejected.Before(since) {
		since = p.rejected
	}
	return since.IsZero() || p.now().Sub(since) < p.timeout, since
}

// healthServer answers the health check ports as kube-proxy does: HTTP on every path, 200
// while the Service has local endpoints and the agent is healthy (proxyHealth), else 503, with
// a JSON body naming the Service and the count. Sync opens and closes the ports as Services
// come and go; a port it cannot listen on (taken) is logged and tried again by Retry (every
// ProbeInterval) and at the next Sync.
type healthServer struct {
	addr  string // the address to listen on ("" all)
	log   *slog.Logger
	proxy *proxyHealth // nil: healthy

	mu    sync.Mutex
	ports map[int32]*healthPort
	want  []HealthCheckPort // the last Sync's
}

type healthPort struct {
	srv   *http.Server
	proxy *proxyHealth
	mu    sync.Mutex
	hc    HealthCheckPort
}

func (p *healthPort) ServeHTTP(w http.ResponseWriter, _ *http.Request) {
	p.mu.Lock()
	hc := p.hc
	p.mu.Unlock()
	healthy := true
	if p.proxy != nil {
		healthy, _ = p.proxy.healthy()
	}
	body, _ := json.Marshal(map[string]any{
		"service":             map[string]string{"namespace": hc.Namespace, "name": hc.Name},
		"localEndpoints":      hc.LocalEndpoints,
		"serviceProxyHealthy": healthy,
	})
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.Header().Set("X-Load-Balancing-Endpoint-Weight", strconv.Itoa(hc.LocalEndpoints))
	if hc.LocalEndpoints == 0 || !healthy {
		w.WriteHeader(http.StatusServiceUnavailable)
	}
	_, _ = w.Write(body)
}

// Sync serves exactly the ports of hcs.
func (h *healthServer) Sync(hcs []HealthCheckPort) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.sync(hcs)
}

// Retry listens on the ports of the last Sync that could not be (taken then).
func (h *healthServer) Retry() {
	h.mu.Lock()
	defer h.mu.Unlock()
	if slices.ContainsFunc(h.want, func(hc HealthCheckPort) bool { return h.ports[hc.Port] == nil }) {
		h.sync(h.want)
	}
}

// sync is Sync with h.mu held.
func (h *healthServer) sync(hcs []HealthCheckPort) {
	h.want = hcs
	if h.ports == nil {
		h.ports = map[int32]*healthPort{}
	}
	want := map[int32]bool{}
	for _, hc := range hcs {
		want[hc.Port] = true
		if p := h.ports[hc.Port]; p != nil {
			p.mu.Lock()
			p.hc = hc
			p.mu.Unlock()
			continue
		}
		p := &healthPort{hc: hc, proxy: h.proxy}
		ln, err := net.Listen("tcp", net.JoinHostPort(h.addr, strconv.Itoa(int(hc.Port))))
		if err != nil {
			h.log.Warn("cannot serve a Service's health check port", "service", hc.Namespace+"/"+hc.Name, "port", hc.Port, "err", err)
			continue
		}
		p.srv = &http.Server{Handler: p, ReadHeaderTimeout: 5 * time.Second}
		go func() {
			if err := p.srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
				h.log.Warn("health check port stopped", "port", hc.Port, "err", err)
			}
		}()
		h.ports[hc.Port] = p
	}
	for port, p := range h.ports {
		if !want[port] {
			_ = p.srv.Close()
			delete(h.ports, port)
		}
	}
}

// Close closes every port.
func (h *healthServer) Close() {
	h.Sync(nil)
}

// Serving lists the ports served, for status.
func (h *healthServer) Serving() []HealthCheckPort {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []HealthCheckPort
	for _, p := range h.ports {
		p.mu.Lock()
		out = append(out, p.hc)
		p.mu.Unlock()
	}
	slices.SortFunc(out, func(a, b HealthCheckPort) int { return int(a.Port) - int(b.Port) })
	return out
}
