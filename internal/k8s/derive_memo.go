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
//
// What is kept, from the API objects down:
//   - per Service object, the fronts balance made of it (frontMemo), while its EndpointSlices
//     are the same objects and this node's name and IPs and the service policy are the same;
//   - with each such front, the memo of its load balancer service (svcMemo): the service,
//     its check alone, its VIP keys, its JSON and the service read back. A front kept from
//     the last derivation is not converted, checked or written again: after one EndpointSlice
//     change only that Service's are (TestDeriverKeepsUnchangedServices);
//   - the Services in balance's order, while they are the same objects;
//   - memos by service name, for a front made again that gives the same service (and for
//     the base config's services).
//
// Every Service is still visited once per derivation (the config handed out is whole), at
// the cost of a map lookup and a few comparisons each.
type deriver struct {
	// memos: load balancer services by name, each with the number of the last derivation
	// that had it (used); endDerivation drops those that no derivation had for a while.
	memos map[string]*svcMemo
	// gen counts derivations.
	gen uint64
	// names, nextNames: lbName of a front's name.
	names, nextNames map[string]string
	// fronts, nextFronts: balance's fronts of a Service (see frontsOf).
	fronts, nextFronts map[*corev1.Service]*frontMemo
	// refs: where each front balance gave in this derivation is kept (its frontMemo and its
	// index there), for the memo of its load balancer service (frontService).
	refs []frontRef
	// sorted: the last derivation's Services in balance's order, and the set of them.
	sorted      []*corev1.Service
	sortedSet   map[*corev1.Service]uint64 // (each with the last sortedStamp that saw it)
	sortedStamp uint64
	// was: the services of the last config derived the cheap way, which passed validation
	// (the memos' own copies, never handed out): the next is checked against them with
	// lb.ValidateChange.
	was []lb.Service
	// slow derives the way it always was (tests compare the two).
	slow bool
	// spare: the array of services the derivation before the last one validated against (a
	// dr.was no longer read), filled by the next finish instead of a new one.
	spare []lb.Service
	// svcScratch: lbServices' array of services, reused by each derivation.
	svcScratch []lb.Service
	// usedKeys, usedNames, slicesOf: scratch maps of lbServices and balance, emptied by each
	// derivation instead of made anew.
	usedKeys  map[svcKey]string
	usedNames map[string]*lb.Service
	slicesOf  map[nsName][]*discoveryv1.EndpointSlice
}

// svcMemo is what a derivation found for one load balancer service.
type svcMemo struct {
	src       lb.Service // as lbServices made it (the memo's own copy)
	used      uint64     // the last derivation (deriver.gen) that had it
	alone     []error    // lb.ValidateServices of it alone
	aloneDone bool
	keys      []svcKey // its VIP keys (lbServices' duplicate check)
	keysDone  bool
	json      []byte     // as marshalConfig writes it in loadBalancer.services
	parsed    lb.Service // json read back (the memo's own copy)
}

// memo returns the memo of s: the one kept under its name when its service is the same, else
// a new one.
func (dr *deriver) memo(s *lb.Service) *svcMemo {
	if dr.memos == nil {
		dr.memos = make(map[string]*svcMemo)
	}
	m := dr.memos[s.Name]
	if m == nil || !sameService(&m.src, s) {
		m = &svcMemo{src: s.Clone()}
		dr.memos[s.Name] = m
	}
	m.used = dr.gen
	return m
}

// aloneErrs is lb.ValidateServices of the memo's service alone (lbServices asks it of every
// front).
func (m *svcMemo) aloneErrs() []error {
	if !m.aloneDone {
		m.alone, m.aloneDone = lb.ValidateService(&m.src, "service"), true
	}
	return m.alone
}

// vipKeys are the memo's service's VIP keys.
func (m *svcMemo) vipKeys() []svcKey {
	if !m.keysDone {
		m.keys, m.keysDone = vipKeys(&m.src), true
	}
	return m.keys
}

// frontRef is where a front is kept: the frontMemo of its Service and its index there.
type frontRef struct {
	m *frontMemo
	i int
}

// frontService returns the memo of the load balancer service made of this derivation's front
// i (f), kept with the front: a front that is the same as last time gives the same service.
func (dr *deriver) frontService(i int, f *LBFront) *svcMemo {
	var r frontRef
	if i < len(dr.refs) {
		r = dr.refs[i]
	}
	if r.m != nil {
		if m := r.m.svcs[r.i]; m != nil {
			m.used = dr.gen
			return m
		}
	}
	s := frontService(f)
	m := dr.memo(&s)
	if r.m != nil {
		r.m.svcs[r.i] = m
	}
	return m
}

// frontMemo is what balance made of one Service.
type frontMemo struct {
	slices []*discoveryv1.EndpointSlice
	self   thisNode
	policy ServicePolicy
	proxy  string
	fronts []LBFront
	warned []string
	// svcs: the memo of each front's load balancer service, once lbServices asked for it.
	svcs []*svcMemo
}

// frontsOf returns the fronts (and says the warnings) that balance made of s last time, when
// its inputs are the same: the same objects (an informer's cache replaces an object that
// changes, and never changes one in place), this node's name and IPs, the service policy.
// The fronts' lists are the memo's: read, never changed (balance's caller copies the fronts
// it changes; Summary.Balanced shares them).
func (dr *deriver) frontsOf(s *corev1.Service, eps []*discoveryv1.EndpointSlice, self thisNode, p Params, warn func(string, ...any)) ([]LBFront, bool) {
	m := dr.fronts[s]
	if m == nil || !m.self.same(self) || m.policy != p.Services || m.proxy != p.ProxyName || !slices.Equal(m.slices, eps) {
		return nil, false
	}
	if dr.nextFronts == nil {
		dr.nextFronts = make(map[*corev1.Service]*frontMemo, len(dr.fronts))
	}
	dr.nextFronts[s] = m
	for _, w := range m.warned {
		warn("%s", w)
	}
	for i := range m.fronts {
		dr.refs = append(dr.refs, frontRef{m, i})
	}
	return m.fronts, true
}

// keepFronts remembers what balance made of s (a copy), or that s is not balanced (no fronts).
func (dr *deriver) keepFronts(s *corev1.Service, eps []*discoveryv1.EndpointSlice, self thisNode, p Params, fronts []LBFront, warned []string) {
	if dr.nextFronts == nil {
		dr.nextFronts = make(map[*corev1.Service]*frontMemo, len(dr.fronts))
	}
	m := &frontMemo{slices: slices.Clone(eps), self: self.clone(),
		policy: p.Services, proxy: p.ProxyName, fronts: cloneFronts(fronts), warned: warned,
		svcs: make([]*svcMemo, len(fronts))}
	dr.nextFronts[s] = m
	for i := range fronts {
		dr.refs = append(dr.refs, frontRef{m, i})
	}
}

func (dr *deriver) rotateFronts() { dr.fronts, dr.nextFronts = dr.nextFronts, nil }

// cloneFronts copies fronts deep enough that changing the copy changes nothing of them.
func cloneFronts(fronts []LBFront) []LBFront {
	out := slices.Clone(fronts)
	for i := range out {
		out[i].VIPs, out[i].Backends = slices.Clone(out[i].VIPs), slices.Clone(out[i].Backends)
		out[i].InternalSources, out[i].MasqueradeExcept = slices.Clone(out[i].InternalSources), slices.Clone(out[i].MasqueradeExcept)
	}
	return out
}

// sortedServices is svcs in balance's order (namespace, name), kept from the last derivation
// while the Services are the same objects.
func (dr *deriver) sortedServices(svcs []*corev1.Service) []*corev1.Service {
	dr.sortedStamp++
	same := len(svcs) == len(dr.sorted)
	for i := 0; same && i < len(svcs); i++ {
		stamp, ok := dr.sortedSet[svcs[i]]
		same = ok && stamp != dr.sortedStamp // (not there twice)
		dr.sortedSet[svcs[i]] = dr.sortedStamp
	}
	if same {
		return dr.sorted
	}
	dr.sorted = sortServices(svcs)
	dr.sortedSet = make(map[*corev1.Service]uint64, len(svcs))
	for _, s := range svcs {
		dr.sortedSet[s] = 0
	}
	return dr.sorted
}

// endDerivation keeps this derivation's lbNames for the next, and drops the memos of services
// that no derivation had for the last few, once they are as many as those in use.
func (dr *deriver) endDerivation(inUse int) {
	dr.names, dr.nextNames = dr.nextNames, nil
	if len(dr.memos) <= 2*inUse+64 {
		return
	}
	for name, m := range dr.memos {
		if m.used+2 < dr.gen {
			delete(dr.memos, name)
		}
	}
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
// derived are the memos of c's last services (lbServices'); the others (the base's) are looked
// up by name.
func (dr *deriver) finish(c *config.Config, derived []*svcMemo) (*config.Config, []byte, bool) {
	svcs := c.LoadBalancer.Services
	static := len(svcs) - len(derived)
	raw := make([][]byte, len(svcs))
	// (the array of two derivations ago, no longer read: dr.was is the last one's)
	parsed := dr.spare[:0]
	if cap(parsed) < len(svcs) {
		parsed = make([]lb.Service, len(svcs))
	}
	parsed = parsed[:len(svcs)]
	for i := range svcs {
		var m *svcMemo
		if i < static {
			m = dr.memo(&svcs[i])
		} else {
			m = derived[i-static]
		}
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
	v = pruneConfig(v)
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
	if parsed == nil {
		parsed = []lb.Service{} // (nil would ask the next check for a full validation)
	}
	dr.spare, dr.was = dr.was, parsed
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
		a.FlushConntrack != b.FlushConntrack || a.Hairpin != b.Hairpin || a.NoBackend != b.NoBackend || !sameSlice(a.VIPs, b.VIPs) || !sameSlice(a.Ports, b.Ports) ||
		!sameSlice(a.SNATAddresses, b.SNATAddresses) || !sameSlice(a.HashFields, b.HashFields) ||
		!sameSlice(a.SourceRanges, b.SourceRanges) || !lb.SameInternal(a.Internal, b.Internal) || a.InternalOnly != b.InternalOnly || !sameSlice(a.MasqueradeExcept, b.MasqueradeExcept) || !samePtr(a.Persistence, b.Persistence) || !samePtr(a.FlowTimeout, b.FlowTimeout) || a.FlowTableSize != b.FlowTableSize ||
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
