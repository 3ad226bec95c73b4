package k8s

import (
	"crypto/sha256"
	"encoding/hex"
	"strings"

	"github.com/hostaccel/hostaccel/internal/lb"
)

// lbServices turns the derived fronts into the load balancer's services: one per front, with
// Kubernetes readiness as the backends' admin state (no health check of its own). Fronts
// without endpoints are left out: the load balancer needs a backend.
func lbServices(fronts []LBFront) []lb.Service {
	var out []lb.Service
	for _, f := range fronts {
		if f.Skipped != "" {
			continue
		}
		s := lb.Service{
			Name:      f.LBName,
			VIPs:      f.VIPs,
			Port:      int(f.VIPPort),
			Protocol:  f.Protocol,
			Topology:  f.Topology,
			Scheduler: f.Scheduler,
			// kube-proxy clears stale UDP conntrack entries; so does the load balancer when a
			// backend goes down.
			FlushConntrack: f.Protocol == "udp",
		}
		if f.Persistence > 0 {
			s.Persistence = lb.D(f.Persistence)
		}
		for _, b := range f.Backends {
			s.Backends = append(s.Backends, lb.Backend{Address: b.Address, Port: int(b.Port), State: b.State})
		}
		out = append(out, s)
	}
	return out
}

// lbName makes a load balancer service name (lower-case letters, digits and '-', at most 32)
// from a front's name: a readable prefix and 10 hex digits of its hash, so that names stay
// unique and stable across restarts.
func lbName(full string) string {
	const hashLen, maxLen = 10, 32
	var b strings.Builder
	dash := false
	for _, r := range strings.ToLower(full) {
		ok := r >= 'a' && r <= 'z' || r >= '0' && r <= '9'
		switch {
		case ok:
			b.WriteRune(r)
			dash = false
		case !dash && b.Len() > 0:
			b.WriteByte('-')
			dash = true
		}
	}
	prefix := b.String()
	if len(prefix) > maxLen-hashLen-1 {
		prefix = prefix[:maxLen-hashLen-1]
	}
	prefix = strings.Trim(prefix, "-")
	if prefix == "" {
		prefix = "k8s"
	}
	sum := sha256.Sum256([]byte(full))
	return prefix + "-" + hex.EncodeToString(sum[:])[:hashLen]
}
