package cli

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/hostaccel/hostaccel/internal/agent"
	"github.com/hostaccel/hostaccel/internal/config"
	"github.com/hostaccel/hostaccel/internal/datapath"
	"github.com/hostaccel/hostaccel/internal/flowtable"
	"github.com/hostaccel/hostaccel/internal/probe"
)

// cobra reads a backquoted word in a flag's usage as the flag's type name (`--state-file
// hostaccel status` instead of `--state-file string`): no usage may have one.
func TestFlagUsagesHaveNoBackquotes(t *testing.T) {
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		for _, fs := range []*pflag.FlagSet{c.Flags(), c.PersistentFlags()} {
			fs.VisitAll(func(f *pflag.Flag) {
				if strings.Contains(f.Usage, "`") {
					t.Errorf("%s --%s: usage %q has a backquote", c.CommandPath(), f.Name, f.Usage)
				}
			})
		}
		for _, sub := range c.Commands() {
			walk(sub)
		}
	}
	walk(newRoot())
}

// /healthz follows hostaccel_healthy: an agent that keeps its last good config because the
// file is now invalid is unhealthy (503, with the reason); it used to answer 200.
func TestLivez(t *testing.T) {
	for _, c := range []struct {
		err  error
		code int
		body string
	}{
		{nil, http.StatusOK, "ok\n"},
		{errors.New("stuck: a sync started 3m0s ago has not returned"), http.StatusServiceUnavailable, "stuck: a sync started 3m0s ago has not returned\n"},
	} {
		rec := httptest.NewRecorder()
		livez(func() error { return c.err })(rec, httptest.NewRequest(http.MethodGet, "/livez", nil))
		if rec.Code != c.code || rec.Body.String() != c.body {
			t.Errorf("live() = %v: %d %q, want %d %q", c.err, rec.Code, rec.Body, c.code, c.body)
		}
	}
}

func TestHealthz(t *testing.T) {
	const good = "node:\n  gateways: [gw]\n  transports: [eth0]\n  localPodCIDRs: [10.244.1.0/24]\nclasses: {pod-to-pod: true}\n"
	path := filepath.Join(t.TempDir(), "c.yaml")
	os.WriteFile(path, []byte(good), 0o644)
	ft, _ := flowtable.NewFakeManager()
	a, err := agent.New(agent.Options{ConfigPath: path,
		Probe: func(context.Context) probe.Result {
			return probe.Result{Features: []probe.Feature{{Name: probe.Flowtable, Available: true}, {Name: probe.FlowtableCounter, Available: true}}}
		},
		Links: func() ([]config.Link, error) {
			return []config.Link{{Name: "gw", Up: true}, {Name: "eth0", Up: true}}, nil
		},
	}, &datapath.Managers{Flowtable: ft})
	if err != nil {
		t.Fatal(err)
	}
	get := func() (int, string) {
		rec := httptest.NewRecorder()
		healthz(a.State)(rec, httptest.NewRequest(http.MethodGet, "/healthz", nil))
		return rec.Code, rec.Body.String()
	}
	if code, body := get(); code != http.StatusServiceUnavailable || body != "not synced yet\n" {
		t.Errorf("before the first sync: %d %q", code, body)
	}
	if err := a.Sync(context.Background()); err != nil {
		t.Fatal(err)
	}
	if code, body := get(); code != http.StatusOK || body != "ok\n" {
		t.Errorf("healthy: %d %q", code, body)
	}
	os.WriteFile(path, []byte(good+"packetThreshold: -1\n"), 0o644)
	if err := a.Sync(context.Background()); err != nil {
		t.Fatal(err)
	}
	if code, body := get(); code != http.StatusServiceUnavailable || a.State().Healthy ||
		!strings.Contains(body, "degraded: config not reloaded, keeping the last good one: ") || !strings.Contains(body, "packetThreshold: -1 is negative") {
		t.Errorf("invalid config: %d %q", code, body)
	}
}

// render takes a gateway pattern for the links it matches here, or for knet0: the pattern
// itself is no device (apply would never install a flowtable device "knet*", and nft reads
// "knet*" in a rule as a wildcard).
func TestRenderExpandsGatewayPatterns(t *testing.T) {
	cfg := filepath.Join(t.TempDir(), "pat.yaml")
	if err := os.WriteFile(cfg, []byte("datapath: flowtable\nnode:\n  gateways: [\"hxtest*\"]\n  transports: [eth0]\n  localPodCIDRs: [10.244.1.0/24]\nclasses:\n  pod-to-pod: true\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	root := newRoot()
	var out strings.Builder
	root.SetOut(&out)
	root.SetArgs([]string{"render", "-f", cfg})
	if err := root.Execute(); err != nil {
		t.Fatal(err)
	}
	if s := out.String(); strings.Contains(s, "hxtest*") || !strings.Contains(s, `devices = { "eth0", "hxtest0" }`) {
		t.Errorf("render of a gateway pattern:\n%s", s)
	}
}

// A status whose nftables or conntrack reading failed says "unknown", not "not installed" or
// "0" (the error was only at the bottom, after them).
func TestStatusSaysUnknownOnReadErrors(t *testing.T) {
	var b strings.Builder
	writeStatus(&b, agent.Status{Errors: map[string]string{"nftables": "context deadline exceeded", "conntrack": "EBUSY"}})
	out := b.String()
	for _, want := range []string{"table inet hostaccel: unknown (error reading nftables: context deadline exceeded)",
		"offloaded connections (conntrack [OFFLOAD]): unknown (error reading conntrack: EBUSY)"} {
		if !strings.Contains(out, want) {
			t.Errorf("status lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "not installed") || strings.Contains(out, "[OFFLOAD]): 0") {
		t.Errorf("status states what it could not read:\n%s", out)
	}
}
