package bench

import (
	"context"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/hostaccel/hostaccel/internal/probe"
	"github.com/hostaccel/hostaccel/internal/testbed"
)

// TestSmoke runs the whole bench once, with 1 s runs and one repetition, for every variant
// this kernel supports (on the host: default and direct; in the VM: all of them), and checks
// the plumbing, never the speed: every cell has a number, and the counters show that the
// traffic took the intended path.
func TestSmoke(t *testing.T) {
	testbed.RequireRoot(t)
	for _, bin := range []string{"netperf", "netserver", "nft"} {
		if _, err := exec.LookPath(bin); err != nil {
			t.Skipf("%s not installed", bin)
		}
	}
	before := testbed.RootLinks(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	caps := probe.Run(ctx)
	var variants []string
	for _, name := range Names() {
		if v, _ := Lookup(name); len(v.Missing(caps)) == 0 {
			variants = append(variants, name)
		}
	}
	o := Defaults()
	o.Variants, o.Reps, o.Duration, o.Nodes, o.Services = variants, 1, time.Second, 2, 5
	o.Traffic = allTraffics()
	o.PktgenDuration = 200 * time.Millisecond
	o.Pktgen = PktgenAvailable(ctx) == nil
	o.RaiseConntrackMax = inVM()
	t.Logf("variants %v, pktgen %v", variants, o.Pktgen)
	r, err := RunHere(ctx, o, "test", nil)
	if err != nil {
		t.Fatal(err)
	}
	checkClean(t, testbed.NamePrefix(), before)

	for _, name := range variants {
		v, _ := Lookup(name)
		var traffic []Traffic
		switch {
		case v.Direct:
			traffic = []Traffic{DirectLink}
		case !v.LocalOnly && !v.PktgenOnly:
			traffic = Traffics
		}
		if _, ok := localSetups[name]; ok {
			traffic = append(traffic, LocalTraffics...)
		}
		for _, tr := range traffic {
			for _, test := range Tests {
				c := r.Cell(name, tr, test)
				switch {
				case c == nil || c.Stats.N+c.Errors != 1:
					t.Errorf("%s %s %s: no sample: %+v", name, tr, test, c)
				case c.Stats.N == 1 && c.Stats.Median <= 0:
					t.Errorf("%s %s %s: no number: %+v", name, tr, test, c)
				}
			}
		}
	}
	for _, s := range r.Samples {
		where := s.Variant + " " + string(s.Traffic) + " " + s.Test
		if s.Error != "" {
			// The bench's plumbing must carry the default path and the direct link; a
			// datapath that breaks a path is a finding the report shows, not a plumbing
			// failure (hostaccel-tc and pod-to-service, see docs/benchmarks).
			if s.Variant == VariantDefault || s.Variant == VariantDirect || !strings.Contains(s.Error, "through this variant failed") {
				t.Errorf("%s: %s", where, s.Error)
			} else {
				t.Logf("FINDING: %s: %s", where, s.Error)
			}
			continue
		}
		p := s.Path
		if s.CPU != [2]int{r.Pin.CPU, r.Pin.CPU} {
			t.Errorf("%s: netperf/netserver bound to %v, want CPU %d", where, s.CPU, r.Pin.CPU)
		}
		if s.Traffic.local() {
			continue // no path evidence: the same-node bed has no counters table
		}
		switch {
		case s.Variant == VariantDirect:
			// The direct link moves tens of thousands of packets; the nodes may see a
			// neighbour probe or two of their own meanwhile.
			if p.NodePackets > 10 {
				t.Errorf("%s: the direct link touched the nodes (%d packets)", where, p.NodePackets)
			}
		case s.Variant == VariantDefault:
			// Every packet through the nodes took the forward hook.
			if p.NodePackets == 0 || p.SlowPathPackets < p.NodePackets*9/10 {
				t.Errorf("%s: %d of %d packets through the forward hook, want all", where, p.SlowPathPackets, p.NodePackets)
			}
		}
		if s.Variant != VariantDirect {
			wantNAT := s.Traffic != PodToPod
			if (p.ServiceConns > 0) != wantNAT {
				t.Errorf("%s: %d connections DNATed by a Service, want NAT %v", where, p.ServiceConns, wantNAT)
			}
			if s.Test == TCPCRR && wantNAT && p.ServiceConns < 100 {
				t.Errorf("%s: only %d Service connections for TCP_CRR", where, p.ServiceConns)
			}
		}
	}
	// Offload: where a ruleset accelerates a traffic type, a stream skips the forward hook.
	offloads := map[string][]Traffic{
		VariantFlowtable: Traffics,
		VariantKindnet:   Traffics,
		VariantAntrea:    {PodToPod, PodToService},
	}
	for name, ts := range offloads {
		if !strings.Contains(strings.Join(variants, ","), name) {
			continue
		}
		for _, tr := range Traffics {
			c := r.Cell(name, tr, TCPStream)
			if c == nil {
				continue
			}
			want := containsTraffic(ts, tr)
			if want && c.SlowShare > 0.1 {
				t.Errorf("%s %s TCP_STREAM: %.0f%% of packets on the normal path, want offloaded", name, tr, 100*c.SlowShare)
			}
			if !want && c.SlowShare < 0.9 {
				t.Errorf("%s %s TCP_STREAM: %.0f%% on the normal path, want all (the ruleset does not cover it)", name, tr, 100*c.SlowShare)
			}
		}
	}
	if o.Pktgen {
		for _, dir := range Directions {
			for _, name := range variants {
				c := r.PktgenCell(name, dir)
				if v, _ := Lookup(name); v.LocalOnly {
					if c != nil {
						t.Errorf("pktgen %s %s: a same-node variant measured on the cluster bed (it installs nothing there): %+v", name, dir, c)
					}
					continue
				}
				if c == nil || c.Stats.N == 0 || c.Stats.Median <= 0 {
					t.Errorf("pktgen %s %s: no kept round: %+v (%s)", name, dir, c, r.pktgenReason(name, dir))
				}
			}
			if d, def := r.PktgenCell(VariantDirect, dir), r.PktgenCell(VariantDefault, dir); d != nil && def != nil && d.Stats.Median <= def.Stats.Median {
				t.Errorf("pktgen %s: direct link %.0f pps not above the default path's %.0f", dir, d.Stats.Median, def.Stats.Median)
			}
		}
		for _, s := range r.Pktgen {
			if s.Kept && s.Variant == VariantDefault && s.SlowPathPackets < s.Received {
				t.Errorf("pktgen default %s: %d of %d packets through the forward hook", s.Direction, s.SlowPathPackets, s.Received)
			}
		}
	} else {
		t.Log("no pktgen in this kernel: per-packet rounds not tested here")
	}
	rep := &Report{Command: "test", Started: r.Started, Finished: r.Finished, Runs: []*Run{r}, Target: PerPacketTarget}
	if md := rep.Markdown(); !strings.Contains(md, "| Default | Pod-to-Pod |") {
		t.Errorf("report:\n%s", md)
	}
}

func containsTraffic(ts []Traffic, t Traffic) bool {
	for _, x := range ts {
		if x == t {
			return true
		}
	}
	return false
}

func inVM() bool {
	out, _ := exec.Command("uname", "-r").Output()
	return strings.Contains(string(out), "cloud")
}
