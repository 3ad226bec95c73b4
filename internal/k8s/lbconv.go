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
// Kubernetes readiness as the backends' admin state (no health check of its own). A front
// without endpoints refuses its clients (kube-proxy rejects them). A front the load
// balancer would reject (a port or address it cannot serve, a name, VIP and port that the
// base config's services or another front already have): its Skipped says why, and a warning.
// One Service must not break the whole derived config, which would keep this node's last good
// config in force (peers and all) until someone fixes the Service.
//
// It returns the services and their memos (dr.frontService: a front that is the same as last
// time is not converted or checked alone again).
func (dr *deriver) lbServices(static []lb.Service, fronts []LBFront, warn func(string, ...any)) ([]lb.Service, []*svcMemo) {
	// (the deriver's maps, emptied: made anew they were ~0.8 MB of garbage per change at
	// 5,000 Services)
	if dr.usedKeys == nil {
		dr.usedKeys, dr.usedNames = make(map[svcKey]string, len(static)+len(fronts)), make(map[string]*lb.Service, len(static)+len(fronts))
	}
	used, names := dr.usedKeys, dr.usedNames
	clear(used)
	clear(names)
	for i := range static {
		s := &static[i]
		names[s.Name] = s
		for _, k := range vipKeys(s) {
			used[k] = s.Name
		}
	}
	// (out in the deriver's array, reused: the config it goes into is read by this derivation
	// only, and handed out as finish's copies)
	out, memos := dr.svcScratch[:0], make([]*svcMemo, 0, len(fronts))
	if cap(out) < len(fronts) {
		out = make([]lb.Service, 0, len(fronts))
	}
	defer func() { dr.svcScratch = out[:0] }()
	// Cluster and node port fronts claim their VIPs and ports first, then the external ones:
	// an externalIP (or ingress IP) that is another Service's ClusterIP, which the API lets
	// anyone set (CVE-2020-8554), must not take that Service's front away (namespace order
	// decided before).
	// The services keep the fronts' order.
	taken := make([]*svcMemo, len(fronts))
	for pass := range 2 {
		for i := range fronts {
			if (fronts[i].Front == FrontExternal || fronts[i].Front == FrontExternalIP) != (pass == 1) {
				continue
			}
			taken[i] = dr.claim(i, &fronts[i], used, names, warn)
		}
	}
	for _, m := range taken {
		if m != nil {
			// (The memo's lists, shared: the config they go into is read, and handed out
			// only as finish's copies.)
			out, memos = append(out, m.src), append(memos, m)
		}
	}
	if len(out) == 0 {
		return nil, nil // (as before the capacity)
	}
	return out, memos
}

// claim gives front f (the i-th) to the load balancer, returning its memo, unless it is
// skipped already, the load balancer rejects it alone, or its name or all of its VIP keys are
// taken (then Skipped says so, with a warning, and it returns nil). VIPs another service has
// are left out of it (LeftOut says why), and so are its internal clients when the cluster
// front that would serve them was not claimed.
func (dr *deriver) claim(i int, f *LBFront, used map[svcKey]string, names map[string]*lb.Service, warn func(string, ...any)) *svcMemo {
	if f.Skipped != "" {
		return nil
	}
	m := dr.frontService(i, f)
	reduced := false
	if errs := m.aloneErrs(); len(errs) > 0 {
		f.Skipped = "the load balancer rejects it: " + errs[0].Error()
	} else if names[m.src.Name] != nil {
		f.Skipped = fmt.Sprintf("the name %s is already used", m.src.Name)
	} else {
		reduced = f.leaveOut(takenVIPs(f.VIPs, m.vipKeys(), used), warn)
		// (the cluster front that would serve its internal clients not claimed, or another
		// service under its name: two ports of one name, which the API does not allow)
		if t := names[f.Internal]; f.Skipped == "" && f.Internal != "" && (t == nil || !lb.ServesInternal(&m.src, t)) {
			f.Internal, f.InternalSources, reduced = "", nil, true
		}
	}
	if f.Skipped != "" {
		warn("%s: not balanced: %s", f.Name, f.Skipped)
		return nil
	}
	if reduced {
		// (the memo of the reduced service is not kept with the front: when the other
		// service goes, the front gets its whole service back)
		s := frontService(f)
		m = dr.memo(&s)
	}
	names[m.src.Name] = &m.src
	for _, k := range m.vipKeys() {
		used[k] = m.src.Name
	}
	return m
}

// leaveOut takes the VIPs another service has (taken, each with why) out of f, with a
// warning each, and reports whether it took any; when that is all of them, f is skipped.
// (Before, one external IP that another Service claimed took all of a front's away.)
func (f *LBFront) leaveOut(taken map[string]string, warn func(string, ...any)) bool {
	if len(taken) == 0 {
		return false
	}
	left := f.VIPs[:0:0]
	for _, v := range f.VIPs {
		if why, ok := taken[v]; !ok {
			left = append(left, v)
		} else {
			f.LeftOut = append(f.LeftOut, why)
		}
	}
	if len(left) == 0 {
		f.Skipped, f.LeftOut = taken[f.VIPs[0]], nil
		return true
	}
	for _, why := range f.LeftOut {
		warn("%s: one VIP left out, the others balanced: %s", f.Name, why)
	}
	f.VIPs = left
	return true
}

// takenVIPs are those of vips (as a front writes them) with a key that used has, each with why.
func takenVIPs(vips []string, keys []svcKey, used map[svcKey]string) map[string]string {
	var byAddr map[netip.Addr]string
	for _, k := range keys {
		if other, dup := used[k]; dup {
			if byAddr == nil {
				byAddr = map[netip.Addr]string{}
			}
			if _, seen := byAddr[k.vip]; !seen {
				byAddr[k.vip] = fmt.Sprintf("%s %s/%d is already served by %s", k.vip, k.proto, k.port, other)
			}
		}
	}
	if byAddr == nil {
		return nil
	}
	taken := map[string]string{}
	for _, v := range vips {
		if a, err := netip.ParseAddr(v); err == nil && byAddr[a] != "" {
			taken[v] = byAddr[a]
		}
	}
	return taken
}

// frontService is the load balancer service of a front.
func frontService(f *LBFront) lb.Service {
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
		SourceRanges:   f.SourceRanges,
		// (shared with the front, as SourceRanges: the config they go into is read only)
		MasqueradeExcept: f.MasqueradeExcept,
		NoBackend:        f.NoBackend,
		// a Pod connecting to its own Service, picked itself: masqueraded, as kube-proxy does
		// (the short-circuit's: by the front whose internal clients it serves)
		Hairpin:      f.Topology == lb.DNAT && !f.InternalOnly,
		InternalOnly: f.InternalOnly,
	}
	if f.Internal != "" {
		s.Internal = &lb.Internal{Service: f.Internal, Sources: f.InternalSources, LocalHost: true}
	}
	if f.Persistence > 0 {
		s.Persistence = lb.D(f.Persistence)
	}
	for _, b := range f.Backends {
		s.Backends = append(s.Backends, lb.Backend{Address: b.Address, Port: int(b.Port), State: b.State})
	}
	return s
}

// svcKey is what no two load balancer services may share: a VIP, protocol and port.
type svcKey struct {
	vip   netip.Addr
	proto string
	port  int
}

// vipKeys are s's VIP keys: none of an internalOnly service (another may have them).
func vipKeys(s *lb.Service) []svcKey {
	if s.InternalOnly {
		return nil
	}
	ports := s.Ports
	if s.Port != 0 {
		ports = []int{s.Port}
	}
	var ks []svcKey
	for _, v := range s.VIPs {
		if a, err := netip.ParseAddr(v); err == nil {
			for _, p := range ports {
				ks = append(ks, svcKey{a, cmp.Or(s.Protocol, "tcp"), p})
			}
		}
	}
	return ks
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
