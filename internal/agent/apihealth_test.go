package agent

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/hostaccel/hostaccel/internal/config"
	"github.com/hostaccel/hostaccel/internal/datapath"
	"github.com/hostaccel/hostaccel/internal/flowtable"
	"github.com/hostaccel/hostaccel/internal/lb"
)

// An API that does not serve (here loadBalancer.api.socket is a regular file) makes the agent
// degraded, naming the field: /healthz and hostaccel_healthy say so. Before, the error was only
// logged and the agent reported healthy while `hostaccel lb` failed (found by a helper's
// review). When the file goes, the next sync serves and the agent is healthy again.
func TestAPIErrorIsDegraded(t *testing.T) {
	dir := t.TempDir()
	sock := filepath.Join(dir, "lb.sock")
	if err := os.WriteFile(sock, []byte("not a socket"), 0o644); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "c.yaml")
	cfg := cfgText + "loadBalancer:\n  stateFile: " + filepath.Join(dir, "lbstate.json") + "\n  api: {socket: " + sock + "}\n"
	if err := os.WriteFile(path, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	links := []config.Link{{Name: "gw", Up: true}, {Name: "eth0", Up: true}, {Name: "eth1", Up: true}}
	ft, _ := flowtable.NewFakeManager()
	a, err := New(Options{ConfigPath: path, Probe: caps(true),
		Links: func() ([]config.Link, error) { return links, nil }}, &datapath.Managers{Flowtable: ft})
	if err != nil {
		t.Fatal(err)
	}
	rt := a.LB()
	m, _ := lb.NewFakeManager()
	rt.NewManager = func() (*lb.Manager, error) { return m, nil }
	rt.Env = func([]string) (lb.Env, error) { return lb.Env{}, nil }
	defer rt.Stop()
	if err := a.Sync(context.Background()); err != nil {
		t.Fatal(err)
	}
	st := a.State()
	if st.Healthy || !slices.ContainsFunc(st.Degraded, func(d string) bool { return strings.Contains(d, "loadBalancer.api.socket") }) {
		t.Errorf("the API does not serve: healthy %v, degraded %q; want degraded, naming loadBalancer.api.socket", st.Healthy, st.Degraded)
	}
	os.Remove(sock)
	if err := a.Sync(context.Background()); err != nil {
		t.Fatal(err)
	}
	if st := a.State(); !st.Healthy {
		t.Errorf("the API serves again: healthy %v, degraded %q", st.Healthy, st.Degraded)
	}
}
