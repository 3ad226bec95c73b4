package bench

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/hostaccel/hostaccel/internal/model"
	"github.com/hostaccel/hostaccel/internal/probe"
)

// kernelWith is a probe result with exactly these features available (Has is false for the
// features it does not list).
func kernelWith(features ...string) probe.Result {
	fs := make([]probe.Feature, len(features))
	for i, name := range features {
		fs[i] = probe.Feature{Name: name, Available: true, Detail: "test"}
	}
	return probe.Result{Features: fs}
}

func TestAutoVariantIsDefaultWithEveryClass(t *testing.T) {
	if !slices.Contains(DefaultNames(), VariantAuto) {
		t.Fatalf("default variants %v lack %s", DefaultNames(), VariantAuto)
	}
	n := &Node{NodeSpec: PktgenPlan(0).Nodes[0]}
	s := flowtableState(n, model.DatapathAuto)
	if s.Datapath != model.DatapathAuto || !slices.Equal(s.Classes, flowtableState(n, model.DatapathFlowtable).Classes) {
		t.Errorf("auto state: datapath %q classes %v, want auto with the flowtable variant's classes", s.Datapath, s.Classes)
	}
	for _, c := range []model.Class{model.PodToPod, model.PodToService, model.ExternalToNodePort} {
		if !s.Enabled(c) {
			t.Errorf("auto state lacks class %s", c)
		}
	}
}

func TestAutoVariantRuleset(t *testing.T) {
	auto, _ := Lookup(VariantAuto)
	spec := PktgenPlan(0).Nodes[0]
	full := kernelWith(probe.All...)
	noFT := kernelWith(probe.NFTables, probe.TCX, probe.ClsBPF, probe.RedirectNeigh)
	bare := kernelWith(probe.NFTables)

	text, err := auto.Ruleset(&Node{NodeSpec: spec, Caps: full})
	if err != nil {
		t.Fatal(err)
	}
	// Whatever auto chooses, its flowtable part is rendered when it has one.
	if !strings.HasPrefix(text, "datapath auto chooses here: ") || !strings.Contains(text, "add flowtable inet hostaccel fastpath") {
		t.Errorf("full kernel:\n%s", text)
	}
	text, err = auto.Ruleset(&Node{NodeSpec: spec, Caps: noFT})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(text, "the rest takes the normal path: ") || strings.Contains(text, "add flowtable") {
		t.Errorf("kernel without the flowtable:\n%s", text)
	}
	text, err = auto.Ruleset(&Node{NodeSpec: spec, Caps: bare})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(text, "datapath auto chooses here: no fastpath") {
		t.Errorf("kernel without either:\n%s", text)
	}
}

func TestApplyPlanNothingToApply(t *testing.T) {
	// Nothing to apply never touches the node (no namespace here): auto measures the normal
	// path, tc fails with the reason.
	n := &Node{NodeSpec: PktgenPlan(0).Nodes[0], Caps: kernelWith(probe.NFTables)}
	if _, err := applyPlan(context.Background(), n, flowtableState(n, model.DatapathAuto)); err != nil {
		t.Errorf("auto with nothing to apply: %v", err)
	}
	if _, err := applyPlan(context.Background(), n, tcState(n)); err == nil || !strings.Contains(err.Error(), "no datapath for tc") {
		t.Errorf("tc on a kernel without it: %v", err)
	}
}

func TestOptionsDirectionsAndVMOnly(t *testing.T) {
	o := Defaults()
	o.PktgenDirections = nil
	if err := o.Validate(); err != nil || !slices.Equal(o.PktgenDirections, Directions) {
		t.Errorf("empty directions: %v %v, want both", o.PktgenDirections, err)
	}
	o.PktgenDirections = []Direction{"sideways"}
	if err := o.Validate(); err == nil || !strings.Contains(err.Error(), `pktgen-directions: unknown direction "sideways"`) {
		t.Errorf("bad direction: %v", err)
	}
	o = Defaults()
	o.VM = VMOnly
	if err := o.Validate(); err != nil || o.measureHere() {
		t.Errorf("--vm only: %v, measures here %v", err, o.measureHere())
	}
	o.Here = true // the guest's own run
	if !o.measureHere() {
		t.Error("--here must measure here")
	}
	o = Defaults()
	o.PktgenDirections = []Direction{RemoteToPod}
	o.VMDuration, o.PktgenDuration = 2*time.Second, 500*time.Millisecond
	args := strings.Join(GuestArgs(o, []string{VariantDefault, VariantAuto}, "/dev/ttyS1"), " ")
	for _, want := range []string{"--variants default,hostaccel-auto", "--pktgen-directions remote-to-pod", "--pktgen-duration 500ms", "--duration 2s", "--here", "--phase-spread 1s"} {
		if !strings.Contains(args, want) {
			t.Errorf("guest args %q lack %q", args, want)
		}
	}
	one, both := o, Defaults()
	both.VMTimeout, one.VMTimeout = 0, 0
	one.PktgenDuration, one.VMDuration = both.PktgenDuration, both.VMDuration
	if vmTimeout(one, 3) >= vmTimeout(both, 3) {
		t.Errorf("timeout: one direction %s, both %s: want more time for both", vmTimeout(one, 3), vmTimeout(both, 3))
	}
}

// Repetitions start at evenly spaced phases of the period, the first at once.
func TestPhaseDelay(t *testing.T) {
	var got []time.Duration
	for rep := 1; rep <= 5; rep++ {
		got = append(got, phaseDelay(time.Second, rep, 5))
	}
	if want := []time.Duration{0, 200 * time.Millisecond, 400 * time.Millisecond, 600 * time.Millisecond, 800 * time.Millisecond}; !slices.Equal(got, want) {
		t.Errorf("delays %v, want %v", got, want)
	}
	if phaseDelay(0, 3, 5) != 0 || phaseDelay(time.Second, 1, 1) != 0 {
		t.Error("no spread must not wait")
	}
	o := Defaults()
	o.VMICount = false
	if o.vmPhaseSpread() != 0 {
		t.Error("a VM without icount got a phase spread")
	}
	o.PhaseSpread = 3 * time.Second
	if o.vmPhaseSpread() != 3*time.Second {
		t.Error("--phase-spread not passed to the VM")
	}
}

func TestCommandLine(t *testing.T) {
	got := CommandLine([]string{"hostaccel", "bench", "--tests", "", "--out", "/tmp/a b", "--x", "it's"})
	if want := `hostaccel bench --tests '' --out '/tmp/a b' --x 'it'\''s'`; got != want {
		t.Errorf("got %s, want %s", got, want)
	}
}

// pktgen runs on the cluster bed, where a same-node variant (sockmap, loopback) installs
// nothing: it gets no pktgen rounds (its rows were the default path's numbers under its name,
// with a target verdict). The cluster's netperf cells leave out the pktgen-only ones too.
func TestSameNodeVariantsRunNoPktgen(t *testing.T) {
	var vs []Variant
	for _, n := range []string{VariantDefault, VariantDirect, VariantSockmap, VariantLoopback, VariantFloor} {
		v, ok := Lookup(n)
		if !ok {
			t.Fatalf("no variant %s", n)
		}
		vs = append(vs, v)
	}
	names := func(vs []Variant) (s []string) {
		for _, v := range vs {
			s = append(s, v.Name)
		}
		return s
	}
	np, pg := splitVariants(vs)
	if got := strings.Join(names(np), ","); got != "default,direct" {
		t.Errorf("netperf on the cluster bed: %s", got)
	}
	if got := strings.Join(names(pg), ","); got != "default,direct,tc-floor" {
		t.Errorf("pktgen: %s", got)
	}
}
