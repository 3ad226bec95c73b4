package bench

import (
	"bytes"
	"encoding/json"
	"image/png"
	"slices"
	"strings"
	"testing"
	"time"
)

// seedRun builds a run whose medians are seed 000's Pod-to-Pod table.
func seedRun() *Run {
	r := &Run{Env: "host", Label: "host (kernel test)", Reps: 3, Duration: 5, Rules: 100, Nodes: 3,
		Pin: Pinning{Enabled: true, CPU: 1, How: "taskset -c 1"}, PktgenSize: 64}
	for _, v := range []string{VariantDefault, VariantFlowtable, VariantAntrea, VariantDirect} {
		vv, _ := Lookup(v)
		r.Variants = append(r.Variants, VariantInfo{Name: v, Title: vv.Title, Ran: true})
	}
	r.Variants = append(r.Variants, VariantInfo{Name: VariantKindnet, Title: "Kindnet ruleset", Skipped: "this kernel lacks flowtable"})
	table := map[string][3]float64{
		VariantDefault:   {16049.15, 18208.75, 7259.13},
		VariantFlowtable: {20986.28, 21133.65, 7691.5},
		VariantAntrea:    {17968.28, 20589.19, 10269.33},
		VariantDirect:    {30000, 40000, 12000},
	}
	for v, vals := range table {
		tr := PodToPod
		if v == VariantDirect {
			tr = DirectLink
		}
		for i, test := range Tests {
			for rep, f := range []float64{0.99, 1, 1.02} {
				s := Sample{Variant: v, Traffic: tr, Test: test, Rep: rep + 1, Value: vals[i] * f, Unit: Unit(test),
					Path: &PathEvidence{NodePackets: 1000, SlowPathPackets: 1000}}
				if v == VariantFlowtable {
					s.Path.SlowPathPackets = 10
				}
				if v == VariantDirect {
					s.Path.NodePackets, s.Path.SlowPathPackets = 0, 0
				}
				r.Samples = append(r.Samples, s)
			}
		}
	}
	// One failed run: counted, not averaged.
	r.Samples = append(r.Samples, Sample{Variant: VariantAntrea, Traffic: PodToPod, Test: TCPCRR, Rep: 4, Error: "netperf: boom"})
	for rep := 1; rep <= 3; rep++ {
		r.Pktgen = append(r.Pktgen,
			PktgenSample{Variant: VariantDefault, Rep: rep, Sent: 1000, Received: 1000, PPS: 20000, Kept: true},
			PktgenSample{Variant: VariantFlowtable, Rep: rep, Sent: 1000, Received: 1000, PPS: 180000, Kept: true},
			PktgenSample{Variant: VariantDirect, Rep: rep, Sent: 1000, Received: 1000, PPS: 257000, Kept: true})
	}
	r.Pktgen = append(r.Pktgen, PktgenSample{Variant: VariantFlowtable, Rep: 3, Sent: 1000, Received: 990, Reason: "sent 1000, received 990"})
	r.summarize()
	return r
}

func TestSummarizeRun(t *testing.T) {
	r := seedRun()
	c := r.Cell(VariantFlowtable, PodToPod, TCPStream)
	if c == nil || c.Stats.N != 3 || c.Stats.Median != 20986.28 || c.SlowShare != 0.01 {
		t.Fatalf("flowtable stream cell: %+v", c)
	}
	if c := r.Cell(VariantAntrea, PodToPod, TCPCRR); c.Errors != 1 || c.Stats.N != 3 {
		t.Errorf("failed sample: %+v", c)
	}
	if c := r.Cell(VariantDirect, DirectLink, TCPRR); c == nil || c.SlowShare != -1 {
		t.Errorf("direct cell: %+v", c)
	}
	p := r.PktgenCell(VariantFlowtable, PodToRemote)
	if p.Stats.N != 3 || p.Discarded != 1 || p.VsDirect != 180000.0/257000 || p.VsDefault != 9 {
		t.Errorf("pktgen cell: %+v", p)
	}
	if r.PktgenCell(VariantKindnet, PodToRemote) != nil || r.Cell(VariantKindnet, PodToPod, TCPRR) != nil {
		t.Error("cells for a skipped variant")
	}
}

func TestMarkdown(t *testing.T) {
	rep := &Report{Command: "hostaccel bench --reps 3", Commit: "abc1234", Target: PerPacketTarget,
		Started: time.Date(2025, 11, 22, 10, 0, 0, 0, time.UTC), Finished: time.Date(2025, 11, 22, 10, 40, 0, 0, time.UTC), Runs: []*Run{seedRun()}}
	containsAll(t, rep.Markdown(), []string{
		"# hostaccel bench, 2025-11-22 (abc1234)",
		"    hostaccel bench --reps 3",
		"| Variant | Traffic Type | TCP_STREAM (Mbit/s) | TCP_RR (trans/s) | TCP_CRR (trans/s) |",
		// seed 000's row, with the best of each column bold and the spread
		"| hostaccel flowtable | Pod-to-Pod | **20986.28** (+31%) ±2.0% | **21133.65** (+16%) ±2.0% | 7691.50 (+6%) ±2.0% |",
		"| Antrea ruleset | Pod-to-Pod | 17968.28 (+12%) ±2.0% | 20589.19 (+13%) ±2.0% | **10269.33** (+41%) ±2.0% [1 failed: netperf: boom] |",
		"| Default | Pod-to-Pod | 16049.15 ±2.0% |",
		"| Direct link (limit) | no hop | 30000.00 (+87%) ±2.0% |",
		"Kindnet ruleset: this kernel lacks flowtable",
		"pinned: client and server on CPU 1",
		"| hostaccel flowtable | **180000** ±0.00% | 0.70 | 9.00 |",
		"hostaccel flowtable reaches 0.70 of the direct link: it does not meet the target of 0.90",
		"| hostaccel flowtable | Pod-to-Pod | 1.0% | 1.0% | 1.0% |",
		"| Direct link (limit) | no hop | 0 packets |",
		"Wall time 40m0s",
	})
}

// containsAll fails t for each of wants that md lacks, and then shows md.
func containsAll(t *testing.T, md string, wants []string) {
	t.Helper()
	for _, want := range wants {
		if !strings.Contains(md, want) {
			t.Errorf("markdown lacks %q", want)
		}
	}
	if t.Failed() {
		t.Log(md)
	}
}

func TestReportJSONAndChart(t *testing.T) {
	rep := &Report{Command: "x", Started: time.Now(), Finished: time.Now(), Runs: []*Run{seedRun()}, Target: PerPacketTarget}
	js, err := rep.JSON()
	if err != nil {
		t.Fatal(err)
	}
	var back Report
	if err := json.Unmarshal(js, &back); err != nil {
		t.Fatal(err)
	}
	if len(back.Runs[0].Samples) != len(rep.Runs[0].Samples) || len(back.Runs[0].Pktgen) != 10 {
		t.Errorf("samples lost in JSON: %d, %d", len(back.Runs[0].Samples), len(back.Runs[0].Pktgen))
	}
	img, err := rep.Chart()
	if err != nil {
		t.Fatal(err)
	}
	m, err := png.Decode(bytes.NewReader(img))
	if err != nil {
		t.Fatal(err)
	}
	if b := m.Bounds(); b.Dx() != 4*panelW || b.Dy() < panelH {
		t.Errorf("chart %v: want 3 netperf panels and a pktgen panel in a row", b)
	}
	dir := t.TempDir()
	paths, err := rep.Write(dir)
	if err != nil || len(paths) != 3 {
		t.Fatalf("write: %v %v", paths, err)
	}
}

func TestShortenRules(t *testing.T) {
	s := DefaultRuleset(ClusterPlan(2, 0).Nodes[0], 100)
	short := shortenRules(s)
	if got := strings.Count(short, "ip saddr 10.255."); got != 4 {
		t.Errorf("%d rules left, want 3 and the last", got)
	}
	if !strings.Contains(short, "# ... 96 more rules like these ...") {
		t.Error(short)
	}
}

// twoWayRun is a VM-like per-packet run in both directions: tc above the flowtable and Antrea
// toward the Pod only, auto failing there, and a netperf cell that failed every time.
func twoWayRun() *Run {
	r := &Run{Env: "vm", Label: "VM (test)", Reps: 2, PktgenSize: 64}
	for _, v := range []string{VariantDefault, VariantDirect, VariantFlowtable, VariantTC, VariantAuto, VariantAntrea} {
		vv, _ := Lookup(v)
		r.Variants = append(r.Variants, VariantInfo{Name: v, Title: vv.Title, Ran: true})
	}
	pps := map[Direction]map[string]float64{
		PodToRemote: {VariantDefault: 40000, VariantDirect: 200000, VariantFlowtable: 140000, VariantTC: 120000, VariantAuto: 140000, VariantAntrea: 142000},
		RemoteToPod: {VariantDefault: 38000, VariantDirect: 200000, VariantFlowtable: 138000, VariantTC: 180000, VariantAntrea: 140000},
	}
	for _, d := range Directions {
		for v, x := range pps[d] {
			for rep := 1; rep <= 2; rep++ {
				r.Pktgen = append(r.Pktgen, PktgenSample{Variant: v, Direction: d, Rep: rep, Sent: 1000, Received: 1000, PPS: x, Kept: true})
			}
		}
	}
	r.Pktgen = append(r.Pktgen, PktgenSample{Variant: VariantAuto, Direction: RemoteToPod, Rep: 1,
		Reason: "failed: establish the UDP flow: reverse packet a | b not received\nmore"})
	for rep := 1; rep <= 2; rep++ {
		r.Samples = append(r.Samples,
			Sample{Variant: VariantDefault, Traffic: PodToService, Test: TCPRR, Rep: rep, Value: 8000, Path: &PathEvidence{NodePackets: 10, SlowPathPackets: 10}},
			Sample{Variant: VariantTC, Traffic: PodToService, Test: TCPRR, Rep: rep,
				Error: "connection to 10.96.0.10:12865 through this variant failed: dial tcp 10.96.0.10:12865: i/o timeout\nsecond line"})
	}
	r.summarize()
	return r
}

func TestMarkdownTwoDirections(t *testing.T) {
	r := twoWayRun()
	if c := r.PktgenCell(VariantTC, RemoteToPod); c == nil || c.VsDirect != 0.9 || c.VsDefault != 180000.0/38000 {
		t.Fatalf("tc remote -> Pod: %+v (ratios against the same direction's direct link and Default)", c)
	}
	if got := r.PktgenDirections(); !slices.Equal(got, Directions) {
		t.Errorf("directions %v", got)
	}
	rep := &Report{Command: "hostaccel bench --vm-only", Target: PerPacketTarget, Runs: []*Run{r}}
	containsAll(t, rep.Markdown(), []string{
		"| Variant | Pod -> remote: packets/s | vs direct link | vs Default | remote -> Pod: packets/s | vs direct link | vs Default | slow-path packets per round | rounds kept (discarded) |",
		"| hostaccel tc | 120000 ±0.00% | 0.60 | 3.00 | **180000** ±0.00% | 0.90 | 4.74 | 0 / 0 | 2 (0) / 2 (0) |",
		"| Antrea ruleset | **142000** ±0.00% | 0.71 | 3.55 | 140000 ±0.00% | 0.70 | 3.68 | 0 / 0 | 2 (0) / 2 (0) |",
		"| Direct link (limit) | 200000 ±0.00% | 1.00 | 5.00 | 200000 ±0.00% | 1.00 | 5.26 | n/a (no node) | 2 (0) / 2 (0) |",
		// A direction where every round failed says why, in one table-safe line.
		"| hostaccel auto | 140000 ±0.00% | 0.70 | 3.50 | no round kept: failed: establish the UDP flow: reverse packet a / b not received |  |  | 0 / - | 2 (0) / 0 (1) |",
		"Per packet (VM (test)), share of the direct link's packets/s: Pod -> remote: Default 0.20, hostaccel flowtable 0.70, hostaccel tc 0.60, hostaccel auto 0.70, Antrea ruleset 0.71; remote -> Pod: Default 0.19, hostaccel flowtable 0.69, hostaccel tc 0.90, Antrea ruleset 0.70. Target for hostaccel: 0.90.",
		"Pod -> remote: hostaccel flowtable reaches 0.70 of the direct link: it does not meet the target of 0.90; hostaccel tc reaches 0.60 of the direct link: it does not meet the target of 0.90; hostaccel auto reaches 0.70",
		"; hostaccel tc is not above hostaccel flowtable (0.70) and not above Antrea ruleset (0.71).",
		"remote -> Pod: hostaccel flowtable reaches 0.69 of the direct link: it does not meet the target of 0.90; hostaccel tc reaches 0.90 of the direct link: it meets the target of 0.90; hostaccel tc is above hostaccel flowtable (0.69) and above Antrea ruleset (0.70).",
		// An error cell says why.
		"| hostaccel tc | Pod-to-Service | error (all 2 runs failed: connection to 10.96.0.10:12865 through this variant failed: dial tcp 10.96.0.10:12865: i/o timeout) |",
	})
	img, err := rep.Chart()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := png.Decode(bytes.NewReader(img)); err != nil {
		t.Fatal(err)
	}
}

func TestMarkdownOneDirection(t *testing.T) {
	// Reports from before the reverse direction (no direction in their JSON) render as
	// Pod -> remote, alone.
	r := seedRun()
	for i := range r.Pktgen {
		if r.Pktgen[i].Direction != "" {
			t.Fatal("seed run has directions")
		}
	}
	md := (&Report{Runs: []*Run{r}, Target: PerPacketTarget}).Markdown()
	if !strings.Contains(md, "| Variant | Pod -> remote: packets/s | vs direct link | vs Default | slow-path packets per round | rounds kept (discarded) |") ||
		strings.Contains(md, "remote -> Pod:") || !strings.Contains(md, "| hostaccel flowtable | **180000** ±0.00% | 0.70 | 9.00 | 0 | 3 (1) |") {
		t.Error(md)
	}
}

func TestErrorCellPartial(t *testing.T) {
	c := &Cell{Stats: Summarize([]float64{10, 11}), Errors: 1, FirstError: "netperf TCP_RR to x: exit status 1"}
	if got := cellText(c, nil, false, 0); got != "10.50 ±4.8% [1 failed: netperf TCP_RR to x: exit status 1]" {
		t.Errorf("partial failure: %q", got)
	}
	if got := tableText("a | b\nc"); got != "a / b" {
		t.Errorf("tableText: %q", got)
	}
	if got := tableText(strings.Repeat("x", 300)); len(got) != 160 || !strings.HasSuffix(got, "...") {
		t.Errorf("tableText keeps %d characters", len(got))
	}
}

func TestRulesetPerKernel(t *testing.T) {
	// auto installs what each kernel allows: shown once per kernel; the same text once.
	host := &Run{Env: "host", Variants: []VariantInfo{{Name: VariantAuto, Title: "hostaccel auto", Ran: true, Ruleset: "datapath auto chooses here: no fastpath\n"}, {Name: VariantTC, Title: "hostaccel tc", Ran: true, Ruleset: "tc maps\n"}}}
	vm := &Run{Env: "vm", Variants: []VariantInfo{{Name: VariantAuto, Title: "hostaccel auto", Ran: true, Ruleset: "datapath auto chooses here: flowtable: [pod-to-pod]\n"}, {Name: VariantTC, Title: "hostaccel tc", Ran: true, Ruleset: "tc maps\n"}}}
	var b strings.Builder
	rulesetSection(&b, []*Run{host, vm})
	md := b.String()
	for _, want := range []string{"<summary>hostaccel auto (host): ", "<summary>hostaccel auto (vm): ", "<summary>hostaccel tc: "} {
		if !strings.Contains(md, want) {
			t.Errorf("lacks %q:\n%s", want, md)
		}
	}
	if strings.Count(md, "tc maps") != 1 {
		t.Errorf("the same ruleset twice:\n%s", md)
	}
}

// Boots of the VM pool into one run: samples numbered on and tagged, cells over all of them.
func TestPoolBoots(t *testing.T) {
	if poolBoots(nil) != nil {
		t.Error("no boots gave a run")
	}
	one := seedRun()
	if poolBoots([]*Run{one}) != one {
		t.Error("one boot was not returned as it is")
	}
	a, b := seedRun(), seedRun()
	for i := range b.Samples {
		b.Samples[i].Value *= 2
	}
	p := poolBoots([]*Run{a, b})
	if p.Reps != 6 || p.Boots != 2 || len(p.Samples) != len(a.Samples)+len(b.Samples) || len(p.Pktgen) != len(a.Pktgen)+len(b.Pktgen) {
		t.Fatalf("pooled: reps %d boots %d samples %d pktgen %d", p.Reps, p.Boots, len(p.Samples), len(p.Pktgen))
	}
	if a.Samples[0].Boot != 0 || a.Reps != 3 {
		t.Error("pooling changed its input")
	}
	last := p.Samples[len(p.Samples)-1]
	if last.Boot != 2 || last.Rep != b.Samples[len(b.Samples)-1].Rep+3 {
		t.Errorf("second boot's sample: %+v", last)
	}
	c := p.Cell(VariantFlowtable, PodToPod, TCPStream)
	if c.Stats.N != 6 || c.Stats.Min != 20986.28*0.99 || c.Stats.Max != 2*20986.28*1.02 {
		t.Errorf("pooled cell: %+v", c.Stats)
	}
	var md strings.Builder
	netperfSection(&md, p)
	if !strings.Contains(md.String(), "6 repetitions per cell (2 boots of the VM, 3 each)") {
		t.Errorf("report does not say the boots:\n%s", md.String())
	}
}

// The same-node rows never bold the loopback in one Pod: it is the limit, as the direct link.
func TestLoopbackLimitIsNeverBest(t *testing.T) {
	r := &Run{Env: "host", Label: "host", Reps: 1, Duration: 5}
	for _, n := range []string{VariantDefault, VariantSockmap, VariantLoopback} {
		v, _ := Lookup(n)
		r.Variants = append(r.Variants, VariantInfo{Name: n, Title: v.Title, Ran: true})
	}
	for n, x := range map[string]float64{VariantDefault: 100, VariantSockmap: 150, VariantLoopback: 200} {
		r.Samples = append(r.Samples, Sample{Variant: n, Traffic: LocalPodToPod64, Test: TCPRR, Rep: 1, Value: x, Unit: Unit(TCPRR)})
	}
	r.summarize()
	var b strings.Builder
	netperfSection(&b, r)
	if md := b.String(); strings.Contains(md, "**200.00**") || !strings.Contains(md, "**150.00**") {
		t.Errorf("the limit (loopback) is bold, or the best datapath (sockmap) is not:\n%s", md)
	}
}
