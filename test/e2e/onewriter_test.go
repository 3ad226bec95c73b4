package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hostaccel/hostaccel/internal/agent"
	"github.com/hostaccel/hostaccel/internal/lb"
	"github.com/hostaccel/hostaccel/internal/testbed"
)

// lbSection is a load balancer with one service (no health check), its state file and
// API socket in dir ("" socket: API off).
func lbSection(dir, socket string) string {
	api := "{disabled: true}"
	if socket != "" {
		api = fmt.Sprintf("{socket: %s}", socket)
	}
	return fmt.Sprintf(`loadBalancer:
  stateFile: %s
  api: %s
  services:
  - name: web
    vips: [10.100.0.10]
    port: 80
    healthCheck: {type: none}
    backends: [{address: 10.244.2.2}, {address: 10.244.2.3}]
`, filepath.Join(dir, "lb-services.yaml"), api)
}

func readState(path string) (st agent.State) {
	b, _ := os.ReadFile(path)
	json.Unmarshal(b, &st)
	return st
}

// One writer per node: a second agent exits at once, naming the first's PID, before it
// touches the kernel, the API socket or the state file; apply and cleanup are refused while
// the agent runs; status is not (it takes no lock). An agent killed with SIGKILL leaves the
// lock file behind but not the lock: a new agent starts.
func TestOneWriter(t *testing.T) {
	slow := 20 * time.Second
	if os.Getenv("HOSTACCEL_IN_VM") == "1" {
		slow = 90 * time.Second // TCG
	}
	tp := testbed.NewTopoT(t, testbed.TopoOptions{})
	dir := t.TempDir()
	lockPath, socket := filepath.Join(dir, "hostaccel.lock"), filepath.Join(dir, "lb.sock")
	cfg := writeConfig(t, "datapath: none\nagent: {resyncPeriod: 2s, minSyncInterval: 100ms}\n"+lbSection(dir, socket))
	api := lb.NewClient(socket, "", "")
	apiWorks := func() error {
		ctx, cancel := context.WithTimeout(context.Background(), slow/6)
		defer cancel()
		var st lb.Status // (in the VM without services: its nft cannot install them)
		return api.Do(ctx, http.MethodGet, "/v1/status", nil, &st)
	}
	stateA := filepath.Join(dir, "a.json")
	a := startAgent(t, tp.Node, "-f", cfg, "--state-file", stateA, "--lock-file", lockPath)
	waitFor(t, "agent A's API", slow, func() bool { return apiWorks() == nil && readState(stateA).Syncs > 0 })
	before := ruleset(t, tp.Node)
	sockInfo, err := os.Stat(socket)
	if err != nil {
		t.Fatal(err)
	}
	holds := fmt.Sprintf("another hostaccel (pid %d) holds %s: stop it, or change the config through it", a.Process.Pid, lockPath)

	// Agent B: same config, same lock.
	stateB := filepath.Join(dir, "b.json")
	ctx, cancel := context.WithTimeout(context.Background(), slow)
	defer cancel()
	start := time.Now()
	out, err := exec.CommandContext(ctx, "ip", "netns", "exec", tp.Node.Name, hostaccel, "agent", "-f", cfg,
		"--state-file", stateB, "--lock-file", lockPath).CombinedOutput()
	if err == nil || !strings.Contains(string(out), holds) {
		t.Errorf("second agent: %v (after %s), want a failure saying %q:\n%s", err, time.Since(start), holds, out)
	}
	if _, err := os.Stat(stateB); err == nil {
		t.Error("the second agent wrote its state file")
	}
	if info, err := os.Stat(socket); err != nil || !os.SameFile(info, sockInfo) {
		t.Errorf("the second agent replaced A's socket: %v", err)
	}
	if err := apiWorks(); err != nil {
		t.Errorf("A's API after the second agent: %v", err)
	}

	// The one-shot writers are refused; the readers are not.
	for _, args := range [][]string{{"apply", "-f", cfg, "--lock-file", lockPath}, {"cleanup", "--lock-file", lockPath}} {
		if out, err := ha(tp.Node.Name, args...); err == nil || !strings.Contains(out, holds) {
			t.Errorf("%s while the agent runs: %v\n%s", args[0], err, out)
		}
	}
	if after := ruleset(t, tp.Node); after != before {
		t.Errorf("the refused commands changed the kernel:\n%s\nwas\n%s", after, before)
	}
	if out := mustHA(t, tp.Node.Name, "status", "--state-file", stateA); !strings.Contains(out, fmt.Sprintf("agent: pid %d", a.Process.Pid)) {
		t.Errorf("status while the agent runs:\n%s", out)
	}
	if out, err := ha(tp.Node.Name, "probe"); err != nil {
		t.Errorf("probe while the agent runs: %v\n%s", err, out)
	}

	// A is killed outright: the lock goes with it, and the next agent starts cleanly.
	a.Process.Signal(syscall.SIGKILL)
	a.Wait()
	stateC := filepath.Join(dir, "c.json")
	c := startAgent(t, tp.Node, "-f", cfg, "--state-file", stateC, "--lock-file", lockPath)
	waitFor(t, "agent C's API", slow, func() bool { return apiWorks() == nil && readState(stateC).Syncs > 0 })
	if b, _ := os.ReadFile(lockPath); strings.TrimSpace(string(b)) != fmt.Sprint(c.Process.Pid) {
		t.Errorf("lock file holds %q, want agent C's pid %d", b, c.Process.Pid)
	}
	if st, stA := readState(stateC), readState(stateA); st.LastError != stA.LastError {
		t.Errorf("agent C's last error %q, A's was %q", st.LastError, stA.LastError)
	}
}
