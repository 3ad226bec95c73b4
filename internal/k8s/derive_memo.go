package k8s

import (
	"bytes"
	"encoding/json"
	"slices"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"

	"github.com/hostaccel/hostaccel/internal/config"
	"github.com/hostaccel/hostaccel/internal/lb"
)

// A derivation writes its config as JSON (marshalConfig) and reads it back with the config
// file's parser (config.ParseJSON). Per load balancer service, what that gives (its JSON, the
// service as read back, whether the load balancer takes it alone) depends on the service as
// lbServices made it and on nothing else; at 5,000 Services writing, reading and checking all
// of them cost each EndpointSlice change ~100 ms of CPU (issue 13). A deriver (the Source's)
// keeps it per service from one derivation to the next, and works out again only what belongs
// to the services that are not the same as last time. The config's other fields (node lists,
// the base's settings: a few, or one per Node) are written and read back as before. Whatever
// fails the cheap way is derived again the way it always was, for the same result and errors.
type deriver struct {
	// memos: the last derivation's services by name; next: this one's.
	memos, next map[string]*svcMemo
	// names, nextNames: lbName of a front's name.
	names, nextNames map[string]string
	// fronts, nextFronts: balance's fronts of a Service (see frontsOf).
	fronts, nextFronts map[*corev1.Service]*frontMemo
	// was: the services of the last config derived the cheap way, which passed validation
	// (the memos' own copies, never handed out): the next is checked against them with
	// lb.ValidateChange.
	was []lb.Service
	// slow derives the way it always was (tests compare the two).
	slow bool
}

// svcMemo is what a derivation found for one load balancer service.
type svcMemo struct {
	src       lb.Service // as lbServices made it (the memo's own copy)
	alone     []error    // lb.ValidateServices of it alone
	aloneDone bool
	json      []byte     // as marshalConfig writes it in loadBalancer.services
	parsed    lb.Service // json read back (the memo's own copy)
}

// memo returns the memo of s: this derivation's or the last's when their service is the same,
// else a new one.
func (dr *deriver) memo(s *lb.Service) *svcMemo {
	if dr.next == nil {
		dr.next = make(map[string]*svcMemo, len(dr.memos))
	}
	for _, m := range []*svcMemo{dr.next[s.Name], dr.memos[s.Name]} {
		if m != nil && sameService(&m.src, s) {
			dr.next[s.Name] = m
			return m
		}
	}
	m := &svcMemo{src: s.Clone()}
	dr.next[s.Name] = m
	return m
}

// validateAlone is lb.ValidateServices of s alone (lbServices asks it of every front).
func (dr *deriver) validateAlone(s lb.Service) []error {
	m := dr.memo(&s)
	if !m.aloneDone {
		m.alone, m.aloneDone = lb.ValidateServices([]lb.Service{s}, func(int) string { return "service" }), true
	}
	return m.alone
}

// frontMemo is what balance made of one Service.
type frontMemo struct {
	slices   []*discoveryv1.EndpointSlice
	selfName string
	nodeIPs  []string
	fronts   []LBFront
	warned   []string
}

// frontsOf returns the fronts (and says the warnings) that balance made of s last time, when
// its inputs are the same: the same objects (an informer's cache replaces an object that
// changes, and never changes one in place), this node's name and IPs.
func (dr *deriver) frontsOf(s *corev1.Service, eps []*discoveryv1.EndpointSlice, selfName string, nodeIPs []string, warn func(string, ...any)) ([]LBFront, bool) {
	m := dr.fronts[s]
	if m == nil || m.selfName != selfName || !slices.Equal(m.slices, eps) || !slices.Equal(m.nodeIPs, nodeIPs) {
		return nil, false
	}
	if dr.nextFronts == nil {
		dr.nextFronts = make(map[*corev1.Service]*frontMemo, len(dr.fronts))
	}
	dr.nextFronts[s] = m
	for _, w := range m.warned {
		warn("%s", w)
	}
	return cloneFronts(m.fronts), true
}

// keepFronts remembers what balance made of s (a copy).
func (dr *deriver) keepFronts(s *corev1.Service, eps []*discoveryv1.EndpointSlice, selfName string, nodeIPs []string, fronts []LBFront, warned []string) {
	if dr.nextFronts == nil {
		dr.nextFronts = make(map[*corev1.Service]*frontMemo, len(dr.fronts))
	}
	dr.nextFronts[s] = &frontMemo{slices: slices.Clone(eps), selfName: selfName, nodeIPs: slices.Clone(nodeIPs),
		fronts: cloneFronts(fronts), warned: warned}
}

func (dr *deriver) rotateFronts() { dr.fronts, dr.nextFronts = dr.nextFronts, nil }

// cloneFronts copies fronts deep enough that changing the copy changes nothing of them.
func cloneFronts(fronts []LBFront) []LBFront {
	out := slices.Clone(fronts)
	for i := range out {
		out[i].VIPs, out[i].Backends = slices.Clone(out[i].VIPs), slices.Clone(out[i].Backends)
	}
	return out
}

// lbName is lbName(full), kept from the last derivation.
func (dr *deriver) lbName(full string) string {
	if dr.nextNames == nil {
		dr.nextNames = make(map[string]string, len(dr.names))
	}
	n, ok := dr.nextNames[full]
	if !ok {
		if n, ok = dr.names[full]; !ok {
			n = lbName(full)
		}
		dr.nextNames[full] = n
	}
	return n
}

// finish is marshalConfig(c) and config.ParseJSON of it, with the load balancer's services
// taken from the memos; false when something fails (the caller then does it the usual way).
func (dr *deriver) finish(c *config.Config) (*config.Config, []byte, bool) {
	defer func() {
		dr.memos, dr.next = dr.next, nil
		dr.names, dr.nextNames = dr.nextNames, nil
	}()
	svcs := c.LoadBalancer.Services
	raw := make([][]byte, len(svcs))
	parsed := make([]lb.Service, len(svcs))
	for i := range svcs {
		m := dr.memo(&svcs[i])
		if m.json == nil {
			b, err := json.Marshal(&m.src)
			if err != nil {
				return nil, nil, false
			}
			j := dropNulls(b)
			var ps lb.Service
			dec := json.NewDecoder(bytes.NewReader(j))
			dec.DisallowUnknownFields()
			if dec.Decode(&ps) != nil || dec.More() {
				return nil, nil, false
			}
			m.json, m.parsed = j, ps
		}
		raw[i], parsed[i] = m.json, m.parsed
	}
	rest := *c
	rest.LoadBalancer.Services = nil
	b, err := json.Marshal(&rest)
	if err != nil {
		return nil, nil, false
	}
	var v any
	if json.Unmarshal(b, &v) != nil {
		return nil, nil, false
	}
	v, _ = prune(v)
	top, ok := v.(map[string]any)
	if !ok {
		return nil, nil, false
	}
	restJSON, err := json.Marshal(top)
	if err != nil {
		return nil, nil, false
	}
	handed := make([]lb.Service, len(parsed))
	for i := range parsed {
		handed[i] = parsed[i].Clone()
	}
	if len(handed) == 0 {
		handed = nil
	}
	cfg, err := config.ParseJSONServices(restJSON, handed, dr.was)
	if err != nil {
		dr.was = nil
		return nil, nil, false
	}
	if len(raw) > 0 {
		lbm, _ := top["loadBalancer"].(map[string]any)
		if lbm == nil {
			lbm = map[string]any{}
			top["loadBalancer"] = lbm
		}
		lbm["services"] = rawList(raw)
	}
	var out bytes.Buffer
	size := len(restJSON) + 64
	for _, r := range raw {
		size += len(r) + 1
	}
	out.Grow(size)
	if writeObject(&out, top) != nil {
		dr.was = nil
		return nil, nil, false
	}
	dr.was = parsed
	if dr.was == nil {
		dr.was = []lb.Service{}
	}
	return cfg, out.Bytes(), true
}

// rawList is a JSON array of values written already (compact).
type rawList [][]byte

// writeObject writes m as json.Marshal does (keys sorted, HTML escaped), with rawLists as they
// are.
func writeObject(out *bytes.Buffer, m map[string]any) error {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	out.WriteByte('{')
	for i, k := range keys {
		if i > 0 {
			out.WriteByte(',')
		}
		kb, err := json.Marshal(k)
		if err != nil {
			return err
		}
		out.Write(kb)
		out.WriteByte(':')
		switch v := m[k].(type) {
		case map[string]any:
			if err := writeObject(out, v); err != nil {
				return err
			}
		case rawList:
			out.WriteByte('[')
			for j, r := range v {
				if j > 0 {
					out.WriteByte(',')
				}
				out.Write(r)
			}
			out.WriteByte(']')
		default:
			b, err := json.Marshal(v)
			if err != nil {
				return err
			}
			out.Write(b)
		}
	}
	out.WriteByte('}')
	return nil
}

// sameService reports whether a and b are the same, field by field (nil and empty apart):
// reflect.DeepEqual, without its cost (a third of a derivation at 5,000 Services).
// TestSameServiceFields keeps it in step with lb.Service.
func sameService(a, b *lb.Service) bool {
	if a.Name != b.Name || a.Port != b.Port || a.Protocol != b.Protocol || a.Topology != b.Topology ||
		a.Interface != b.Interface || a.BackendInterface != b.BackendInterface || a.Scheduler != b.Scheduler ||
		a.FlushConntrack != b.FlushConntrack || !sameSlice(a.VIPs, b.VIPs) || !sameSlice(a.Ports, b.Ports) ||
		!sameSlice(a.SNATAddresses, b.SNATAddresses) || !sameSlice(a.HashFields, b.HashFields) ||
		!samePtr(a.Persistence, b.Persistence) || !samePtr(a.FlowTimeout, b.FlowTimeout) ||
		!sameHealthCheck(a.HealthCheck, b.HealthCheck) || (a.Backends == nil) != (b.Backends == nil) ||
		len(a.Backends) != len(b.Backends) {
		return false
	}
	for i := range a.Backends {
		if !lb.SameBackend(&a.Backends[i], &b.Backends[i]) {
			return false
		}
	}
	return true
}

func sameHealthCheck(a, b *lb.HealthCheck) bool {
	if a == nil || b == nil {
		return a == b
	}
	return a.Type == b.Type && a.Port == b.Port && a.Path == b.Path && a.Host == b.Host &&
		a.ExpectStatus == b.ExpectStatus && a.Send == b.Send && a.Expect == b.Expect && a.Query == b.Query &&
		sameSlice(a.Command, b.Command) && a.Interval == b.Interval && a.Timeout == b.Timeout &&
		a.Rise == b.Rise && a.Fall == b.Fall
}

func sameSlice[T comparable](a, b []T) bool {
	return (a == nil) == (b == nil) && slices.Equal(a, b)
}

func samePtr[T comparable](a, b *T) bool {
	if a == nil || b == nil {
		return a == b
	}
	return *a == *b
}
