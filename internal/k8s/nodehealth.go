package k8s

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
)

// kube-proxy also answers a node-level health check (its --healthz-bind-address, port 10256):
// cloud load balancers of externalTrafficPolicy Cluster Services ask it whether to send the
// node traffic (GCE; AWS with newer cloud providers), and so do operators. Where hostaccel
// serves every Service in place of kube-proxy, nothing would answer it.

// DefaultNodeHealthAddress is kube-proxy's --healthz-bind-address.
const DefaultNodeHealthAddress = "0.0.0.0:10256"

// ToBeDeletedTaint is the taint the cluster autoscaler puts on a node it is about to remove.
const ToBeDeletedTaint = "ToBeDeletedByClusterAutoscaler"

// nodeHealth answers GET /healthz and /livez as kube-proxy does (KEP-3836): /livez is 200
// while the agent keeps up (proxyHealth); /healthz also needs the node to be eligible, not
// being deleted (a deletion timestamp, or the autoscaler's taint), so that load balancers
// drain a node before it goes. The body: {"lastUpdated", "currentTime", "nodeEligible"}.
type nodeHealth struct {
	proxy *proxyHealth
	node  func() (*corev1.Node, error) // this node's object (an informer's cache)
	// synced reports whether node's cache has synced (the informer's HasSynced): before, it
	// answers NotFound for a node that exists. nil: synced.
	synced func() bool
	now    func() time.Time
}

func (h *nodeHealth) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path != "/healthz" && r.URL.Path != "/livez" {
		http.NotFound(w, r)
		return
	}
	healthy, _ := h.proxy.healthy()
	body := map[string]any{"lastUpdated": h.proxy.lastSync(), "currentTime": h.now()}
	if r.URL.Path == "/healthz" {
		eligible := h.eligible()
		body["nodeEligible"] = eligible
		healthy = healthy && eligible
	}
	b, _ := json.Marshal(body)
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	if !healthy {
		w.WriteHeader(http.StatusServiceUnavailable)
	}
	_, _ = w.Write(b)
}

// eligible reports whether this node takes traffic: not being deleted, nor tainted for
// deletion by the autoscaler. A node the cache does not hold yet (not synced: starting, or
// the API unreachable since the start) is eligible, as with kube-proxy; one a synced cache no
// longer holds was deleted.
func (h *nodeHealth) eligible() bool {
	if h.synced != nil && !h.synced() {
		return true
	}
	n, err := h.node()
	if err != nil {
		return !apierrors.IsNotFound(err)
	}
	return n.DeletionTimestamp == nil && !slices.ContainsFunc(n.Spec.Taints, func(t corev1.Taint) bool { return t.Key == ToBeDeletedTaint })
}

// serveNodeHealth serves h on addr until ctx ends; an address it cannot listen on (kube-proxy
// still there) is logged once and tried again every ProbeInterval.
func (s *Source) serveNodeHealth(ctx context.Context, h *nodeHealth, addr string) {
	logged := false
	for {
		ln, err := net.Listen("tcp", addr)
		if err == nil {
			s.log.Info("answering kube-proxy's node health check", "address", addr)
			srv := &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second}
			go func() {
				<-ctx.Done()
				_ = srv.Close()
			}()
			if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
				s.log.Warn("the node health check stopped", "address", addr, "err", err)
			}
			return
		}
		if !logged {
			s.log.Warn("cannot answer kube-proxy's node health check; trying again", "address", addr, "err", err)
			logged = true
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(s.opts.ProbeInterval):
		}
	}
}
