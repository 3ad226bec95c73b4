package lb

import (
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/hostaccel/hostaccel/internal/golden"
)

func mac(s string) net.HardwareAddr {
	m, err := net.ParseMAC(s)
	if err != nil {
		panic(err)
	}
	return m
}

// testEnv: eth0 faces the clients, eth1 the backends; the backends' MACs are known.
var testEnv = Env{
	Links: map[string]net.HardwareAddr{"eth0": mac("02:00:00:00:00:e0"), "eth1": mac("02:00:00:00:00:e1")},
	Neighbors: map[string]map[netip.Addr]net.HardwareAddr{"eth1": {
		netip.MustParseAddr("10.1.0.11"): mac("02:00:00:00:01:11"),
		netip.MustParseAddr("10.1.0.12"): mac("02:00:00:00:01:12"),
		netip.MustParseAddr("10.1.0.13"): mac("02:00:00:00:01:13"),
	}},
	Local: []netip.Addr{netip.MustParseAddr("10.1.0.1"), netip.MustParseAddr("fd00:b::1")},
}

// fixture is one service of a topology and scheduler: two VIPs (IPv4, IPv6), port 80, three
// backends per family weighted 1:2:3 (dsr: three, reached by MAC).
func fixture(topo, sched string) Service {
	s := Service{Name: "web", VIPs: []string{"192.0.2.10", "2001:db8::10"}, Port: 80, Topology: topo, Scheduler: sched}
	if sched == Hash {
		s.HashFields = []string{"src-ip", "src-port"}
	}
	for fam, addrs := range [][]string{{"10.1.0.11", "10.1.0.12", "10.1.0.13"}, {"fd00:b::11", "fd00:b::12", "fd00:b::13"}} {
		for i, a := range addrs {
			if topo == DSR && fam == 1 {
				continue
			}
			b := Backend{Address: a, Weight: new(i + 1)}
			if topo != DSR {
				b.Port = 8080
			}
			s.Backends = append(s.Backends, b)
		}
	}
	switch topo {
	case DSR:
		s.Interface = "eth1"
	case StatelessDNAT:
		s.Interface, s.BackendInterface = "eth0", "eth1"
	}
	return s
}

// checkRender validates and renders svcs and compares the ruleset with testdata/<name>.nft.
func checkRender(t *testing.T, name string, svcs []Service, health map[string]Health) {
	t.Helper()
	if errs := ValidateServices(svcs, fieldByName(svcs)); len(errs) > 0 {
		t.Fatal(errs)
	}
	got, err := Render(Resolve(svcs, health, testEnv)).Dump()
	if err != nil {
		t.Fatal(err)
	}
	golden.Check(t, filepath.Join("testdata", name+".nft"), got)
}

// Every scheduler with every topology.
func TestRenderGolden(t *testing.T) {
	for _, topo := range topologies {
		for _, sched := range schedulers {
			t.Run(topo+"-"+sched, func(t *testing.T) {
				checkRender(t, topo+"-"+sched, []Service{fixture(topo, sched)}, nil)
			})
		}
	}
}

func TestRenderVariants(t *testing.T) {
	for name, svcs := range renderVariants() {
		t.Run(name, func(t *testing.T) {
			h := map[string]Health(nil)
			if name == "states-backup" {
				h = variantHealth
			}
			checkRender(t, name, svcs, h)
		})
	}
}

// variantHealth is the health the "states-backup" variant renders with.
var variantHealth = map[string]Health{HealthKey("web", "[fd00:b::12]:8080"): {State: HealthDown, LastError: "connection refused"}}

// renderVariants are rulesets of features beside the topologies and schedulers, by golden
// file name.
func renderVariants() map[string][]Service {
	persist := func(topo string) Service {
		s := fixture(topo, RoundRobin)
		s.Persistence = D(10 * time.Minute)
		return s
	}
	multi := fixture(DNAT, Weighted)
	multi.Protocol, multi.Port, multi.Ports = "udp", 0, []int{53, 5353}
	for i := range multi.Backends {
		multi.Backends[i].Port = 0
	}
	snat := fixture(SNAT, RoundRobin)
	snat.SNATAddresses = []string{"203.0.113.1"} // IPv6 stays masqueraded
	states := fixture(DNAT, RoundRobin)
	states.Backends[0].State = StateDrain
	states.Backends[1].State = StateDown
	states.Backends[3].Priority = 1 // a backup: unused while fd00:b::12 or ::13 is up
	allDown := fixture(StatelessDNAT, Hash)
	dsrDown := rename(fixture(DSR, Weighted), "dsr", "192.0.2.11")
	for i := range allDown.Backends {
		allDown.Backends[i].State = StateDown
	}
	for i := range dsrDown.Backends {
		dsrDown.Backends[i].State = StateDrain
	}
	multiPersist := multi
	multiPersist.Persistence = D(time.Minute)
	var persistDown []Service
	for _, s := range []Service{persist(SNAT), rename(persist(StatelessDNAT), "sl", "192.0.2.12", "2001:db8::12"), rename(persist(DSR), "dsr", "192.0.2.11")} {
		for i := range s.Backends {
			s.Backends[i].State = StateDown
		}
		s.Backends[0].State = StateDrain // its persistent clients stay, no new ones
		if s.Topology == SNAT {
			s.NoBackend = NoBackendDrop // new clients' packets are dropped, not refused
		}
		persistDown = append(persistDown, s)
	}
	// externalTrafficPolicy Local in Kubernetes: the node port (local endpoints only, here
	// none) sends this node's Pods and the host to the cluster front.
	local := rename(fixture(DNAT, RoundRobin), "local", "192.0.2.20", "2001:db8::20")
	local.Backends, local.Hairpin = nil, true
	local.NoBackend = NoBackendDrop // the Service has endpoints on other nodes: kube-proxy drops
	local.Internal = &Internal{Service: "web", Sources: []string{"10.244.0.0/24", "10.244.0.128/25", "fd00:244::/64"}, LocalHost: true}
	// both traffic policies Local in Kubernetes: the ClusterIP (web) has this node's endpoint
	// only; the node port's internal clients go to every endpoint, in an internalOnly service
	// of the same VIPs and port (no element of its own in services-*)
	webLocal := fixture(DNAT, RoundRobin)
	webLocal.Backends = []Backend{webLocal.Backends[0], webLocal.Backends[3]}
	every := rename(fixture(DNAT, RoundRobin), "every", webLocal.VIPs...)
	every.InternalOnly = true
	localBoth := local
	localBoth.Internal = &Internal{Service: "every", Sources: []string{"10.244.0.0/24", "fd00:244::/64"}, LocalHost: true}
	// a ClusterIP in Kubernetes: clients other than this node's Pods are masqueraded (IPv6
	// has no range here: every client of it is)
	offCluster := fixture(DNAT, RoundRobin)
	offCluster.MasqueradeExcept = []string{"10.244.0.0/24", "10.244.0.0/25"}
	// flow tables of a size of their own (their maps' comments change: a new size replaces
	// them); the default's keep theirs
	sized := fixture(DSR, Weighted)
	sized.FlowTableSize = 1 << 20
	sizedPersist := rename(persist(DNAT), "sticky", "192.0.2.13", "2001:db8::13")
	sizedPersist.FlowTableSize = 4096
	return map[string][]Service{
		"flow-table-size":         {sized, sizedPersist},
		"internal-clients":        {fixture(DNAT, RoundRobin), local},
		"internal-only":           {webLocal, every, localBoth},
		"masquerade-off-cluster":  {offCluster},
		"persistence-snat":        {persist(SNAT)},
		"persistence-dnat-ports":  {multiPersist},
		"persistence-none-up":     persistDown,
		"persistence-dsr":         {persist(DSR)},
		"persistence-stateless":   {persist(StatelessDNAT)},
		"multiport-udp":           {multi},
		"snat-address":            {snat},
		"states-backup":           {states},
		"no-backend-up":           {allDown, dsrDown},
		"all-topologies-together": {fixture(SNAT, RoundRobin), rename(fixture(DSR, Hash), "dsr", "192.0.2.11", "2001:db8::11"), rename(fixture(StatelessDNAT, SymHash), "sl", "192.0.2.12", "2001:db8::12")},
	}
}

func rename(s Service, name string, vips ...string) Service {
	s.Name, s.VIPs = name, vips
	for i := range s.Backends {
		if s.Topology == StatelessDNAT {
			s.Backends[i].Port = 9090
		}
	}
	return s
}

// Render is deterministic and every rule, map and set carries a comment.
// Dump leaves the ruleset as it was: the knftables Fake used to give the named counters a
// handle, and a dumped ruleset then failed in the kernel ("cannot specify Handle in add
// operation"; found by TestFuzzCorpusKernelAccepts).
func TestDumpKeepsRuleset(t *testing.T) {
	r := Render(Resolve([]Service{fixture(SNAT, Weighted)}, nil, testEnv))
	if _, err := r.Dump(); err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, tab := range r.Tables {
		for _, c := range tab.Counters {
			n++
			if c.Handle != nil {
				t.Errorf("counter %s has handle %d after Dump", c.Name, *c.Handle)
			}
		}
	}
	if n == 0 {
		t.Error("no named counters to check")
	}
}

func TestRenderComments(t *testing.T) {
	r := Render(Resolve([]Service{fixture(SNAT, Hash), rename(fixture(DSR, RoundRobin), "dsr", "192.0.2.11")}, nil, testEnv))
	for _, tab := range r.Tables {
		for _, rl := range tab.Rules {
			if rl.Comment == nil || !strings.HasSuffix(*rl.Comment, "]") {
				t.Errorf("rule without a hashed comment: %s", rl.Rule)
			}
		}
		for _, m := range tab.Maps {
			if m.Comment == nil || len(*m.Comment) > 128 {
				t.Errorf("map %s comment: %v", m.Name, m.Comment)
			}
		}
	}
	a, _ := r.Dump()
	b, _ := Render(Resolve([]Service{fixture(SNAT, Hash), rename(fixture(DSR, RoundRobin), "dsr", "192.0.2.11")}, nil, testEnv)).Dump()
	if diff := golden.Diff(a, b); diff != "" {
		t.Errorf("render is not deterministic:\n%s", diff)
	}
}

// Linux 6.1 refuses a lookup in a map that only asks whether the key is there (`key @map`,
// `key != @map`: its nft_lookup reads a map only for its data), and the whole transaction
// with it; the load balancer then did not install dsr, stateless-dnat or persistence there.
// No golden may name a map but to read its data (map, vmap) or write it (update, delete).
func TestRenderReadsMapsOnlyForTheirData(t *testing.T) {
	files, _ := filepath.Glob("testdata/*.nft")
	if len(files) < 20 {
		t.Fatalf("%d golden files", len(files))
	}
	mapName := regexp.MustCompile(`^add map \S+ \S+ (\S+) `)
	ref := regexp.MustCompile(`(\S+) @(\S+)`)
	for _, file := range files {
		text, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		maps := map[string]bool{}
		lines := strings.Split(string(text), "\n")
		for _, l := range lines {
			if m := mapName.FindStringSubmatch(l); m != nil {
				maps[m[1]] = true
			}
		}
		for _, l := range lines {
			if !strings.HasPrefix(l, "add rule ") {
				continue
			}
			for _, m := range ref.FindAllStringSubmatch(l, -1) {
				if maps[m[2]] && !slices.Contains([]string{"map", "vmap", "update", "delete"}, m[1]) {
					t.Errorf("%s: map %s looked up for membership (%q): %s", file, m[2], m[1]+" @"+m[2], l)
				}
			}
		}
	}
}

// Persistence is race-free when every chain that remembers a choice records it before it
// sends the packet on, and sends it where the map says: a new key is scheduled into a
// backend id, `update` inserts it unless another packet's (another CPU's) is there already,
// the id is read back from the map, and only that id is translated to the backend. A known
// key follows the map; one whose backend is gone is forgotten before the key is scheduled
// anew. The id travels in a header field the chain rewrites anyway: no rule touches a mark.
func TestRenderRecordsBeforeSending(t *testing.T) {
	for _, c := range []struct {
		topo    string
		persist bool
	}{{SNAT, true}, {DNAT, true}, {DSR, true}, {StatelessDNAT, true}, {DSR, false}, {StatelessDNAT, false}} {
		topo := c.topo
		s := fixture(topo, RoundRobin)
		if c.persist { // (the clients' table; without, dsr's and stateless-dnat's flow table)
			s.Persistence = D(10 * time.Minute)
		}
		for _, sched := range []string{RoundRobin, SymHash} {
			s.Scheduler = sched
			r := Render(Resolve([]Service{s}, nil, testEnv))
			chains := 0
			for _, tab := range r.Tables {
				byChain := map[string][]string{}
				for _, rl := range tab.Rules {
					if strings.Contains(rl.Rule, "mark") {
						t.Errorf("%s: a rule uses a mark: %s", topo, rl.Rule)
					}
					byChain[rl.Chain] = append(byChain[rl.Chain], rl.Rule)
				}
				for chain, rules := range byChain {
					if !strings.Contains(chain, "web-v") || strings.HasPrefix(chain, "post-") || strings.HasPrefix(chain, "rev-") {
						continue
					}
					chains++
					checkRecordOrder(t, topo+" "+sched+" "+chain, rules)
				}
			}
			if chains != 2 {
				t.Errorf("%s: %d service chains, want 2", topo, chains)
			}
		}
	}
}

// checkRecordOrder checks one service chain: known key (read back, refreshed, sent) < forget
// (read back, deleted if its id is not alive) < new key (scheduled, recorded, read back,
// sent) < table full (sent by a hash, the one rule that sends what it did not read back);
// every rule that sends translates the stash through an id map.
func checkRecordOrder(t *testing.T, what string, rules []string) {
	t.Helper()
	re := regexp.MustCompile(`^(.+) set (.+) map @(\S+) update @(\S+) \{ (.+) : (.+) \} `)
	known := -1
	var dyn, key, stash string
	for i, rl := range rules {
		if m := re.FindStringSubmatch(rl); m != nil && known < 0 {
			known, stash, key, dyn = i, m[1], m[2], m[3]
			if m[4] != dyn || m[5] != key || m[6] != stash {
				t.Errorf("%s: the known-key rule does not refresh what it read: %s", what, rl)
			}
		}
	}
	if known < 0 {
		t.Fatalf("%s: no rule reads the choice back and refreshes it:\n%s", what, strings.Join(rules, "\n"))
	}
	readBack := stash + " set " + key + " map @" + dyn
	record := "update @" + dyn + " { " + key + " : " + stash + " }"
	// (only an id whose backend is gone: a key absent for the known-key rule may have been
	// recorded by another CPU since, and its entry must stay)
	forget := slices.IndexFunc(rules, func(r string) bool {
		rest, ok := strings.CutPrefix(r, readBack+" "+stash+" != @")
		_, del, _ := strings.Cut(rest, " ")
		return ok && strings.HasPrefix(del, "delete @"+dyn+" { "+key+" : "+stash+" }")
	})
	sched := slices.IndexFunc(rules, func(r string) bool {
		return strings.HasPrefix(r, stash+" set ") && strings.Contains(r, "-slots-") && strings.Contains(r, record)
	})
	full := slices.IndexFunc(rules, func(r string) bool { return strings.Contains(r, `counter name "full-`) })
	if !(0 < known && known < forget && forget < sched && sched < full) {
		t.Errorf("%s: known %d, forget %d, schedule %d, table full %d: not in that order:\n%s", what, known, forget, sched, full, strings.Join(rules, "\n"))
	}
	// (dsr's stash is the destination MAC, which no scheduler reads; the others' is the
	// destination address, which symhash does)
	if forget > 0 && stash != "ether daddr" && !strings.Contains(rules[forget][len(readBack):], " "+stash+" set ") {
		t.Errorf("%s: the forget rule does not restore %s before the key is scheduled anew: %s", what, stash, rules[forget])
	}
	sends := 0
	for i, rl := range rules {
		if !strings.Contains(rl, "dnat ip") && !strings.Contains(rl, "fwd to") && !strings.HasSuffix(rl, " accept") {
			continue
		}
		sends++
		rb, slot := strings.LastIndex(rl, readBack), strings.LastIndex(rl, "-slots-")
		switch {
		case i == full:
			if rb >= 0 || slot < 0 {
				t.Errorf("%s: the table-full rule does not send by a hash over the slots: %s", what, rl)
			}
		case rb < 0 || slot > rb:
			t.Errorf("%s: a rule sends what it did not read back from the map: %s", what, rl)
		case slot >= 0 && !strings.Contains(rl[slot:rb], record):
			t.Errorf("%s: a rule sends a new choice it did not record: %s", what, rl)
		}
		if !strings.Contains(rl[max(rb, 0):], stash+" map @") && !strings.Contains(rl[max(rb, 0):], "daddr map @") {
			t.Errorf("%s: the packet is not sent where the id says: %s", what, rl)
		}
	}
	if sends != 3 {
		t.Errorf("%s: %d rules send the packet, want 3 (known, new, table full):\n%s", what, sends, strings.Join(rules, "\n"))
	}
}

// Failback is graceful: once the primaries are eligible again, a healthy backup takes no new
// connections (out of the slots), but the clients the failover gave it keep it, as a draining
// backend's (in targets, its persistent clients allowed); a backup that is down keeps nothing.
// docs/lb.md said a backup was in the maps only while no primary was eligible (a review).
func TestBackupKeepsItsClientsAfterFailback(t *testing.T) {
	p := rename(fixture(DNAT, RoundRobin), "sticky", "192.0.2.20")
	p.Persistence = D(time.Minute)
	p.Backends = p.Backends[:3]
	p.Backends[2].Priority = 1
	for _, state := range []string{StateUp, StateDown} {
		p.Backends[2].State = state
		d := Resolve([]Service{p}, nil, testEnv)
		b := d.Services[0].Backends[2]
		id := idAddr(b, fam(false))
		var inSlots, inTargets, allowed bool
		for _, tb := range Render(d).Tables {
			for _, e := range tb.Elements {
				switch {
				case e.Map == "sticky-slots-v4" && len(e.Value) > 0 && e.Value[0] == id:
					inSlots = true
				case e.Map == "sticky-targets-v4" && e.Key[0] == id:
					inTargets = true
				}
			}
			allowed = allowed || tb.Dynamic["sticky-persist-v4"][id]
		}
		want := state == StateUp
		if inSlots || inTargets != want || allowed != want {
			t.Errorf("backup %s, %s, primaries up (active %v, %q): in slots %v, in targets %v, persistent clients kept %v; want false, %v, %v",
				b.Key, state, b.Active, b.Reason, inSlots, inTargets, allowed, want, want)
		}
	}
}
