package bench

import (
	"bytes"
	"encoding/json"
	"image/png"
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
	md := rep.Markdown()
	for _, want := range []string{
		"# hostaccel bench, 2025-11-22 (abc1234)",
		"    hostaccel bench --reps 3",
		"| Variant | Traffic Type | TCP_STREAM (Mbit/s) | TCP_RR (trans/s) | TCP_CRR (trans/s) |",
		// seed 000's row, with the best of each column bold and the spread
		"| hostaccel flowtable | Pod-to-Pod | **20986.28** (+31%) ±2.0% | **21133.65** (+16%) ±2.0% | 7691.50 (+6%) ±2.0% |",
		"| Antrea ruleset | Pod-to-Pod | 17968.28 (+12%) ±2.0% | 20589.19 (+13%) ±2.0% | **10269.33** (+41%) ±2.0% [1 failed] |",
		"| Default | Pod-to-Pod | 16049.15 ±2.0% |",
		"| Direct link (limit) | no hop | 30000.00 (+87%) ±2.0% |",
		"Kindnet ruleset: this kernel lacks flowtable",
		"pinned: client and server on CPU 1",
		"| hostaccel flowtable | **180000** ±0.00% | 0.70 | 9.00 |",
		"hostaccel flowtable reaches 0.70 of the direct link: it does not meet the target of 0.90",
		"| hostaccel flowtable | Pod-to-Pod | 1.0% | 1.0% | 1.0% |",
		"| Direct link (limit) | no hop | 0 packets |",
		"Wall time 40m0s",
	} {
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
