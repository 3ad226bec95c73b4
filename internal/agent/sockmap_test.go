package agent

import (
	"context"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"

	"github.com/hostaccel/hostaccel/internal/config"
	"github.com/hostaccel/hostaccel/internal/datapath"
	"github.com/hostaccel/hostaccel/internal/probe"
	"github.com/hostaccel/hostaccel/internal/sockmap"
	"github.com/hostaccel/hostaccel/internal/testbed"
)

// The agent repairs the sockmap datapath when its sock_ops program is taken off the cgroup
// behind its back, and counts it. (Root: the programs go on this host's cgroup v2 root, for
// Pod CIDRs no other test uses.)
func TestSockmapDriftRepaired(t *testing.T) {
	testbed.RequireRoot(t)
	pins := t.TempDir()
	if err := unix.Mount("bpf", pins, "bpf", 0, "mode=0700"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Unmount(pins, unix.MNT_DETACH) })
	path := filepath.Join(t.TempDir(), "c.yaml")
	cfg := "datapath: sockmap\nnode:\n  gateways: [gw]\n  transports: [eth0]\n  localPodCIDRs: [10.213.1.0/24]\nclasses: {local-pod-to-pod: true}\n"
	if err := os.WriteFile(path, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	m := &sockmap.Manager{PinDir: pins}
	t.Cleanup(func() { m.Remove(context.Background()) })
	a, err := New(Options{
		ConfigPath: path, Log: slog.New(slog.NewTextHandler(io.Discard, nil)),
		Probe: func(context.Context) probe.Result {
			return probe.Result{Features: []probe.Feature{{Name: probe.SockMap, Available: true}, {Name: probe.SockMapFIONREAD, Available: true}}}
		},
		Links: func() ([]config.Link, error) {
			return []config.Link{{Name: "gw", Up: true}, {Name: "eth0", Up: true}}, nil
		},
	}, &datapath.Managers{Sockmap: m})
	if err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if err := a.Sync(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	st, err := m.Status(context.Background())
	if err != nil || st == nil || a.State().DriftRepairs != nil {
		t.Fatalf("after two syncs: status %+v %v, drift %v", st, err, a.State().DriftRepairs)
	}
	cg, _ := sockmap.CgroupRoot()
	f, err := os.Open(cg)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	prog, err := ebpf.NewProgramFromID(st.ProgramID)
	if err != nil {
		t.Fatal(err)
	}
	defer prog.Close()
	if err := link.RawDetachProgram(link.RawDetachProgramOptions{Target: int(f.Fd()), Program: prog, Attach: ebpf.AttachCGroupSockOps}); err != nil {
		t.Fatal(err)
	}
	if err := a.Sync(context.Background()); err != nil {
		t.Fatal(err)
	}
	st, err = m.Status(context.Background())
	if err != nil || st == nil || st.ProgramID == 0 || a.State().DriftRepairs["sockmap"] != 1 {
		t.Errorf("after the sock_ops program was detached: status %+v %v, drift %v", st, err, a.State().DriftRepairs)
	}
}
