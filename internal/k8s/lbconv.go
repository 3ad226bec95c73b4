package k8s

import (
	"cmp"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net/netip"
	"strings"

	"github.com/hostaccel/hostaccel/internal/lb"
)

// lbServices turns the derived fronts into the load balancer's services: one per front, with
// Kubernetes readiness as the backends' admin state (no health check of its own). Fronts
// without endpoints are left out: the load balancer needs a backend. So is a front the load
// balancer would reject (a port or address it cannot serve, a name, VIP and port that the
// base config's services or another front already have): its Skipped says why, and a warning.
// One Service must not break the whole derived config, which would keep this node's last good
// config in force (peers and all) until someone fixes the Service.
//
// alone is lb.ValidateServices of one service (nil: that function).
func lbServices(static []lb.Service, fronts []LBFront, warn func(string, ...any), alone func(lb.Service) []error) []lb.Service {
	if alone == nil {
		alone = func(s lb.Service) []error {
			return lb.ValidateServices([]lb.Service{s}, func(int) string { return "service" })
		}
	}
	type key struct {
		vip   netip.Addr
		proto string
		port  int
	}
	used, names := make(map[key]string, len(static)+len(fronts)), make(map[string]bool, len(static)+len(fronts))
	keys := func(s lb.Service) []key {
		ports := s.Ports
		if s.Port != 0 {
			ports = []int{s.Port}
		}
		var ks []key
		for _, v := range s.VIPs {
			if a, err := netip.ParseAddr(v); err == nil {
				for _, p := range ports {
					ks = append(ks, key{a, cmp.Or(s.Protocol, "tcp"), p})
				}
			}
		}
		return ks
	}
	for _, s := range static {
		names[s.Name] = true
		for _, k := range keys(s) {
			used[k] = s.Name
		}
	}
	out := make([]lb.Service, 0, len(fronts))
	for i := range fronts {
		f := &fronts[i]
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
		if errs := alone(s); len(errs) > 0 {
			f.Skipped = "the load balancer rejects it: " + errs[0].Error()
		} else if names[s.Name] {
			f.Skipped = fmt.Sprintf("the name %s is already used", s.Name)
		} else {
			for _, k := range keys(s) {
				if other, dup := used[k]; dup {
					f.Skipped = fmt.Sprintf("%s %s/%d is already served by %s", k.vip, k.proto, k.port, other)
					break
				}
			}
		}
		if f.Skipped != "" {
			warn("%s: not balanced: %s", f.Name, f.Skipped)
			continue
		}
		names[s.Name] = true
		for _, k := range keys(s) {
			used[k] = s.Name
		}
		out = append(out, s)
	}
	if len(out) == 0 {
		return nil // (as before the capacity)
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

// LBName is the load balancer service name of a Service port's front (FrontCluster, ...) for
// IPv4: the name its kernel objects carry (`svc-NAME-v4`, `NAME-backends-v4`).
func LBName(namespace, service, port, front string) string {
	return lbName(namespace + "/" + service + ":" + port + "/" + front)
}
