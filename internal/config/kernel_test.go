package config_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/vishvananda/netlink"

	"github.com/hostaccel/hostaccel/internal/config"
	"github.com/hostaccel/hostaccel/internal/config/configtest"
	"github.com/hostaccel/hostaccel/internal/flowtable"
	"github.com/hostaccel/hostaccel/internal/golden"
	"github.com/hostaccel/hostaccel/internal/lb"
	"github.com/hostaccel/hostaccel/internal/probe"
	"github.com/hostaccel/hostaccel/internal/testbed"
)

// corpusEntry is one fuzz corpus input that validation accepted, rendered.
type corpusEntry struct {
	name  string
	links []string // interfaces it names
	ft    *flowtable.Ruleset
	lb    *lb.Ruleset
}

// TestFuzzCorpusKernelAccepts: what validation accepts, the kernel accepts. Every accepted
// config of config's FuzzParse corpus and every valid service of lb's FuzzDecodeService corpus
// (the committed entries, and a sample of those the fuzzer added to the Go build cache:
// HOSTACCEL_FUZZ_KERNEL_SAMPLE per target, default 40) is rendered and applied with the real
// managers in a fresh network namespace that has a veth for every interface it names; a
// second apply must find nothing to change (the kernel holds what was rendered). The
// flowtable part needs a kernel with the flowtable (scripts/test.sh runs this test in the VM
// too, where HOSTACCEL_REQUIRE_FLOWTABLE=1); the load balancer part runs on both kernels (the
// VM's 6.1 rejected 22 of the corpus's load balancer shapes with EINVAL while dsr,
// stateless-dnat and persistence looked their maps up for membership, `ip saddr !=
// @web-persist-v4`; they read them for data now).
func TestFuzzCorpusKernelAccepts(t *testing.T) {
	testbed.RequireRoot(t)
	entries := acceptedCorpus(t)
	if len(entries) < 20 {
		t.Fatalf("only %d accepted corpus entries", len(entries))
	}
	probeNS, err := testbed.NewNS("probe")
	if err != nil {
		t.Fatal(err)
	}
	var caps probe.Result
	probeNS.Do(func() error { caps = probe.Run(context.Background()); return nil })
	probeNS.Close()
	haveFlowtable := caps.Has(probe.Flowtable)
	if !haveFlowtable && (os.Getenv("HOSTACCEL_REQUIRE_FLOWTABLE") == "1" || os.Getenv("HOSTACCEL_IN_VM") == "1") {
		t.Fatalf("this kernel has no flowtable: %s", caps.Get(probe.Flowtable).Detail)
	}
	applied, skipped := 0, 0
	for _, e := range entries {
		t.Run(e.name, func(t *testing.T) {
			ns, err := testbed.NewNS("fz")
			if err != nil {
				t.Fatal(err)
			}
			defer ns.Close()
			h, err := ns.Handle()
			if err != nil {
				t.Fatal(err)
			}
			for i, name := range e.links {
				v := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: name}, PeerName: fmt.Sprintf("fzpeer%d", i)}
				if err := h.LinkAdd(v); err != nil {
					t.Fatalf("interface %q, which validation accepted, cannot be created: %v", name, err)
				}
			}
			ft, lbr := e.ft, e.lb
			if ft != nil && !haveFlowtable {
				ft = nil
				skipped++
			}
			err = ns.Do(func() error {
				ctx := context.Background()
				if ft != nil {
					m := flowtable.NewManager()
					if _, err := m.Apply(ctx, ft); err != nil {
						return fmt.Errorf("flowtable: %w", err)
					}
					if res, err := m.Apply(ctx, ft); err != nil || res.Operations != 0 {
						return fmt.Errorf("flowtable: a second apply changed something: %+v %v", res, err)
					}
				}
				if lbr != nil {
					m, err := lb.NewManager()
					if err != nil {
						return err
					}
					defer m.Close()
					if _, err := m.Apply(ctx, lbr); err != nil {
						return fmt.Errorf("lb: %w", err)
					}
					m.FullEvery = 0 // read the tables back whole
					if res, err := m.Apply(ctx, lbr); err != nil || res.Changed() {
						return fmt.Errorf("lb: a second apply changed something: %+v %v", res, err)
					}
				}
				return nil
			})
			if err != nil {
				t.Fatalf("the kernel rejects what validation accepted: %v", err)
			}
			applied++
		})
	}
	t.Logf("%d accepted corpus entries applied (%d without their flowtable part: this kernel has none)", applied, skipped)
}

// acceptedCorpus reads the corpora and keeps what validation accepts, rendered.
func acceptedCorpus(t *testing.T) []corpusEntry {
	var out []corpusEntry
	for _, in := range corpusInputs(t, "internal/config", "FuzzParse") {
		c, err := config.Parse(in.b)
		if err != nil {
			continue
		}
		r, err := configtest.Render(c)
		if err != nil {
			t.Errorf("%s: accepted but does not render: %v", in.name, err)
			continue
		}
		links := r.State.Devices()
		for _, s := range c.LoadBalancer.Services {
			links = append(links, s.Interface, s.BackendInterface)
		}
		out = append(out, corpusEntry{name: "config/" + in.name, links: compactNames(links), ft: r.Flowtable, lb: r.LB})
	}
	for _, in := range corpusInputs(t, "internal/lb", "FuzzDecodeService") {
		s, err := lb.DecodeService(in.b)
		if err != nil || len(lb.ValidateServices([]lb.Service{s}, func(int) string { return "s" })) > 0 {
			continue
		}
		svcs := []lb.Service{s}
		out = append(out, corpusEntry{name: "lb/" + in.name, links: compactNames([]string{s.Interface, s.BackendInterface}),
			lb: lb.Render(lb.Resolve(svcs, nil, lb.OfflineEnv(svcs, lb.Env{})))})
	}
	return out
}

func compactNames(names []string) []string {
	names = slices.DeleteFunc(names, func(n string) bool { return n == "" })
	slices.Sort(names)
	return slices.Compact(names)
}

type corpusInput struct {
	name string
	b    []byte
}

// corpusInputs reads target's committed corpus (pkg's testdata/fuzz, from this package's
// directory) and a sample of what the fuzzer added to the Go build cache, if any.
func corpusInputs(t *testing.T, pkg, target string) []corpusInput {
	dirs := []string{filepath.Join("../..", pkg, "testdata/fuzz", target)}
	committed, _ := filepath.Glob(filepath.Join(dirs[0], "*"))
	if len(committed) == 0 {
		t.Fatalf("no corpus in %s", dirs[0])
	}
	files := committed
	if cache := goCache(); cache != "" {
		n := 40
		if v, err := strconv.Atoi(os.Getenv("HOSTACCEL_FUZZ_KERNEL_SAMPLE")); err == nil {
			n = v
		}
		cached, _ := filepath.Glob(filepath.Join(cache, "fuzz/github.com/hostaccel/hostaccel", pkg, target, "*"))
		if step := len(cached)/max(n, 1) + 1; n > 0 {
			for i := 0; i < len(cached); i += step {
				files = append(files, cached[i])
			}
		}
	}
	var out []corpusInput
	for _, f := range files {
		v, err := golden.ReadFuzz(f)
		if err != nil {
			t.Fatal(err)
		}
		b, ok := v[0].([]byte)
		if len(v) != 1 || !ok {
			t.Fatalf("%s: not one []byte", f)
		}
		name := filepath.Base(f)
		if !slices.Contains(committed, f) {
			name = "cache-" + name
		}
		out = append(out, corpusInput{name, b})
	}
	return out
}

// goCache is the Go build cache (where `go test -fuzz` keeps what it found), "" where there
// is no go command (the VM).
func goCache() string {
	if c := os.Getenv("GOCACHE"); c != "" {
		return c
	}
	out, err := exec.Command("go", "env", "GOCACHE").Output()
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(out))
}
