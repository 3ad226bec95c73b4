package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hostaccel/hostaccel/internal/agent"
	"github.com/hostaccel/hostaccel/internal/config"
	"github.com/hostaccel/hostaccel/internal/flowtable"
	"github.com/hostaccel/hostaccel/internal/probe"
	"github.com/hostaccel/hostaccel/internal/testbed"
)

func ruleset(t *testing.T, ns *testbed.NS) string {
	t.Helper()
	out, err := ns.Exec("nft", "list", "ruleset")
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// What render prints is what apply installs: same rules in the same order, same elements.
// A second apply changes nothing; bad input changes nothing; cleanup removes our table and
// leaves a foreign one in the same namespace exactly as it was.
func TestApplyRenderStatusCleanup(t *testing.T) {
	needFlowtable(t)
	tp := testbed.NewTopoT(t, testbed.TopoOptions{})
	foreign := writeConfig(t, `table inet foreign {
	chain filter_fwd {
		type filter hook forward priority 0; policy accept;
		counter
	}
}
table ip nat {
	chain post {
		type nat hook postrouting priority 100;
		ip saddr 10.99.0.0/16 masquerade
	}
}
`)
	if out, err := tp.Node.Exec("nft", "-f", foreign); err != nil {
		t.Fatal(err, out)
	}
	pristine := ruleset(t, tp.Node)
	cfg := writeConfig(t, nodeConfig(tp, "classes: {pod-to-pod: true, pod-to-service: true, node-to-remote-pod: true}\nexclude: [10.244.1.99]\n"))

	rendered := mustHA(t, tp.Node.Name, "render", "-f", cfg)
	out := mustHA(t, tp.Node.Name, "apply", "-f", cfg)
	if !strings.Contains(out, "table missing") {
		t.Errorf("first apply: %s", out)
	}
	st := status(t, tp.Node)
	var wantComments, gotComments []string
	for _, m := range regexp.MustCompile(`(?m)^add rule inet hostaccel `+flowtable.ChainName+` .* comment "([^"]*)"$`).FindAllStringSubmatch(rendered, -1) {
		wantComments = append(wantComments, m[1])
	}
	if off := st.Table.Chains[flowtable.OffloadChain]; off == nil || len(off.Rules) != 1 {
		t.Errorf("chain %s in the kernel: %+v, want its one flow add rule", flowtable.OffloadChain, off)
	}
	for _, r := range st.Table.Chains[flowtable.ChainName].Rules {
		gotComments = append(gotComments, r.Comment)
	}
	if !slices.Equal(wantComments, gotComments) || len(gotComments) < 10 {
		t.Errorf("kernel rules differ from render:\n got %q\nwant %q", gotComments, wantComments)
	}
	for _, m := range regexp.MustCompile(`(?m)^add element inet hostaccel (\S+) \{ "?([^" ]+)"? \}$`).FindAllStringSubmatch(rendered, -1) {
		els := st.Table.Sets[m[1]].Elements
		if !slices.Contains(els, m[2]) && !slices.Contains(els, strings.TrimSuffix(strings.TrimSuffix(m[2], "/32"), "/128")) {
			t.Errorf("set %s: kernel has %v, render has %s", m[1], els, m[2])
		}
	}

	if out := mustHA(t, tp.Node.Name, "apply", "-f", cfg); !strings.Contains(out, "no change") {
		t.Errorf("second apply was not a no-op: %s", out)
	}

	// A rule edited in place, its comment kept: the next `apply` (a new process) repairs it
	// (it used to compare the comments only and keep the rule).
	r0 := status(t, tp.Node).Table.Chains[flowtable.ChainName].Rules[0]
	if out, err := tp.Node.Exec("nft", "replace", "rule", "inet", "hostaccel", flowtable.ChainName, "handle", fmt.Sprint(r0.Handle),
		"meta", "l4proto", "udp", "accept", "comment", `"`+r0.Comment+`"`); err != nil {
		t.Fatal(err, out)
	}
	if out := mustHA(t, tp.Node.Name, "apply", "-f", cfg); !strings.Contains(out, "drift: table changed outside hostaccel") {
		t.Errorf("apply after a rule edited in place: %s", out)
	}
	if rs := ruleset(t, tp.Node); strings.Contains(rs, "udp accept") {
		t.Errorf("the edited rule is still there after the repair:\n%s", rs)
	}
	if out := mustHA(t, tp.Node.Name, "apply", "-f", cfg); !strings.Contains(out, "no change") {
		t.Errorf("apply after the repair was not a no-op: %s", out)
	}

	applied := ruleset(t, tp.Node)
	for _, bad := range []struct{ yaml, want string }{
		{nodeConfig(tp, "classes: {pod-to-moon: true}\n"), `unknown class "pod-to-moon"`},
		{nodeConfig(tp, "packetThreshold: -3\n"), "packetThreshold: -3"},
		{strings.Replace(nodeConfig(tp, podToPod), "transports: [eth0]", "transports: [eth7]", 1), `node.transports[0]: interface "eth7" does not exist`},
		{strings.Replace(nodeConfig(tp, podToPod), "10.244.2.0/24", "10.244.1.128/25", 1), "overlaps"},
	} {
		out, err := ha(tp.Node.Name, "apply", "-f", writeConfig(t, bad.yaml))
		if err == nil || !strings.Contains(out, bad.want) {
			t.Errorf("bad config accepted or unclear error (want %q): %v %s", bad.want, err, out)
		}
		if now := ruleset(t, tp.Node); now != applied {
			t.Errorf("rejected config changed the kernel:\n%s", now)
		}
	}

	if out := mustHA(t, tp.Node.Name, "cleanup"); out != "removed table inet hostaccel\n" {
		t.Errorf("cleanup says %q", out)
	}
	if now := ruleset(t, tp.Node); now != pristine {
		t.Errorf("cleanup did not restore the foreign rules exactly:\n got %s\nwant %s", now, pristine)
	}
}

// A transaction that the kernel rejects (here: a device vanishes between resolution and
// commit, the known flowtable trap) leaves the previous state untouched.
func TestFailedTransactionKeepsPreviousState(t *testing.T) {
	needFlowtable(t)
	tp := testbed.NewTopoT(t, testbed.TopoOptions{})
	cfgText := strings.Replace(nodeConfig(tp, podToPod), "transports: [eth0]", "transports: auto", 1)
	mustHA(t, tp.Node.Name, "apply", "-f", writeConfig(t, cfgText))
	before := ruleset(t, tp.Node)
	c, err := config.Parse([]byte(cfgText))
	if err != nil {
		t.Fatal(err)
	}
	if out, err := tp.Node.Exec("ip", "link", "add", "vanish0", "type", "veth", "peer", "name", "vanish1"); err != nil {
		t.Fatal(err, out)
	}
	tp.Node.Exec("ip", "link", "set", "vanish0", "up")
	tp.Node.Exec("ip", "link", "set", "vanish1", "up")
	err = tp.Node.Do(func() error {
		links := []config.Link{{Name: "gw", Up: true}, {Name: "eth0", Up: true}, {Name: "vanish0", Up: true}, {Name: "vanish1", Up: true}}
		s, _, err := c.State(links, true)
		if err != nil {
			return err
		}
		m := flowtable.NewManager()
		if out, err := exec.Command("ip", "link", "del", "vanish0").CombinedOutput(); err != nil {
			return fmt.Errorf("%v: %s", err, out)
		}
		_, err = m.Apply(context.Background(), flowtable.Render(s, flowtable.Options{FlowtableCounter: true}))
		if err == nil {
			t.Error("apply with a vanished device succeeded")
		} else {
			t.Logf("rejected as expected: %v", err)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if after := ruleset(t, tp.Node); after != before {
		t.Errorf("failed transaction changed the kernel:\n%s", after)
	}
}

// httpGet fetches a URL from inside ns; an error fails the test.
func httpGet(t *testing.T, ns *testbed.NS, addr, path string) (int, string) {
	t.Helper()
	code, body, err := ns.HTTPGet(addr, path)
	if err != nil {
		t.Fatal(err)
	}
	return code, body
}

// startAgent runs `hostaccel agent` in ns until the test ends; its log is shown on failure.
func startAgent(t *testing.T, ns *testbed.NS, args ...string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command("ip", append([]string{"netns", "exec", ns.Name, hostaccel}, withLock(append([]string{"agent"}, args...))...)...)
	cmd.Stderr = &testbed.SyncBuffer{}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			cmd.Process.Kill()
			cmd.Wait()
		}
		if t.Failed() {
			t.Logf("agent log:\n%s", cmd.Stderr.(*testbed.SyncBuffer).String())
		}
	})
	return cmd
}

// On a kernel without the flowtable, apply fails with a message that says so and what to
// do, and changes nothing; the agent reports degraded status and keeps retrying.
func TestNoFlowtableFailsLoudly(t *testing.T) {
	if caps.Has(probe.Flowtable) {
		t.Skip("this kernel has the flowtable")
	}
	tp := testbed.NewTopoT(t, testbed.TopoOptions{})
	cfg := writeConfig(t, nodeConfig(tp, podToPod)+"agent: {resyncPeriod: 1s, minSyncInterval: 100ms}\n")
	before := ruleset(t, tp.Node)
	out, err := ha(tp.Node.Name, "apply", "-f", cfg)
	if err == nil || !strings.Contains(out, "no nftables flowtable") || !strings.Contains(out, "hostaccel probe") {
		t.Errorf("apply without flowtable: %v %s", err, out)
	}
	if ruleset(t, tp.Node) != before {
		t.Error("failed apply changed the kernel")
	}

	statePath := t.TempDir() + "/agent.json"
	startAgent(t, tp.Node, "-f", cfg, "--state-file", statePath, "--metrics-address", "127.0.0.1:9465")
	var st agent.State
	waitFor(t, "the agent to retry at least 3 times", 20*time.Second, func() bool {
		b, _ := os.ReadFile(statePath)
		return json.Unmarshal(b, &st) == nil && st.SyncErrors >= 3
	})
	if st.Healthy || !strings.Contains(st.LastError, "no nftables flowtable") {
		t.Errorf("agent state: %+v", st)
	}
	out = mustHA(t, tp.Node.Name, "status", "--state-file", statePath)
	if !strings.Contains(out, "DEGRADED") || !strings.Contains(out, "no nftables flowtable") {
		t.Errorf("status does not say degraded:\n%s", out)
	}
	if code, body := httpGet(t, tp.Node, "127.0.0.1:9465", "/healthz"); code != 503 || !strings.Contains(body, "flowtable") {
		t.Errorf("/healthz: %d %s", code, body)
	}
	if code, body := httpGet(t, tp.Node, "127.0.0.1:9465", "/livez"); code != 200 || body != "ok\n" {
		t.Errorf("/livez (liveness: a restart would not help): %d %s", code, body)
	}
	if _, body := httpGet(t, tp.Node, "127.0.0.1:9465", "/metrics"); !strings.Contains(body, "hostaccel_healthy 0") ||
		!strings.Contains(body, "hostaccel_table_installed 0") {
		t.Errorf("metrics do not show the degraded agent:\n%s", body)
	}
}

// waitFor polls cond every 200 ms (each poll may run the binary, slow under TCG).
func waitFor(t *testing.T, what string, timeout time.Duration, cond func() bool) {
	t.Helper()
	testbed.WaitFor(t, what, timeout, 200*time.Millisecond, cond)
}

func devices(t *testing.T, ns *testbed.NS) string {
	st := status(t, ns)
	if st.Table == nil || st.Table.Flowtables[flowtable.FlowtableName] == nil {
		return ""
	}
	return strings.Join(st.Table.Flowtables[flowtable.FlowtableName].Devices, ",")
}

// The agent: applies at start, repairs drift within a period, follows device churn (pruning
// vanished devices), reloads its config on change, serves metrics, and leaves the rules in
// place on exit unless told to clean up.
func TestAgent(t *testing.T) {
	needFlowtable(t)
	tp := testbed.NewTopoT(t, testbed.TopoOptions{})
	cfgText := strings.Replace(nodeConfig(tp, podToPod), "transports: [eth0]", "transports: auto", 1) +
		"agent: {resyncPeriod: 2s, minSyncInterval: 200ms}\n"
	cfg := writeConfig(t, cfgText)
	statePath := t.TempDir() + "/agent.json"
	cmd := startAgent(t, tp.Node, "-f", cfg, "--state-file", statePath, "--metrics-address", "127.0.0.1:9464")
	const slow = 20 * time.Second // TCG emulation is slow; the period is 2s
	waitFor(t, "the agent's first apply", slow, func() bool { return devices(t, tp.Node) == "eth0,gw" })

	// Quiet periods change nothing (no rebuild, counters keep counting).
	readState := func() (st agent.State) {
		b, _ := os.ReadFile(statePath)
		json.Unmarshal(b, &st)
		return st
	}
	s0 := readState()
	waitFor(t, "two more periodic syncs", slow, func() bool { return readState().Syncs >= s0.Syncs+2 })
	if st := readState(); st.LastResult.Flowtable.Operations != 0 || !st.Healthy {
		t.Errorf("a periodic sync with nothing to do changed the kernel or is unhealthy: %+v", st)
	}

	// Drift: the table deleted, a rule added by someone else.
	tp.Node.Exec("nft", "delete", "table", "inet", "hostaccel")
	waitFor(t, "the deleted table to come back", slow, func() bool { return devices(t, tp.Node) == "eth0,gw" })
	nRules := len(status(t, tp.Node).Table.Chains[flowtable.ChainName].Rules)
	if out, err := tp.Node.Exec("nft", "add", "rule", "inet", "hostaccel", "forward", "counter", "drop"); err != nil {
		t.Fatal(err, out)
	}
	waitFor(t, "the foreign rule to be removed", slow, func() bool {
		return len(status(t, tp.Node).Table.Chains[flowtable.ChainName].Rules) == nRules
	})
	// Both repairs are logged and counted (hostaccel_drift_repairs_total, below).
	const warn = `level=WARN msg="drift repaired: changed outside hostaccel, restored" datapath=flowtable drift=`
	waitFor(t, "the repairs logged", slow, func() bool {
		log := cmd.Stderr.(*testbed.SyncBuffer).String()
		return strings.Contains(log, warn+`"[table missing]"`) && strings.Contains(log, warn+`"[drift: `) // "table changed outside hostaccel" or "chain or flowtable differs", by what the sync read
	})

	// Device churn: links come and go; the flowtable follows and the agent stays healthy.
	for i := 0; i < 3; i++ {
		tp.Node.Exec("ip", "link", "add", "churn0", "type", "veth", "peer", "name", "churn1")
		tp.Node.Exec("ip", "link", "set", "churn0", "up")
		tp.Node.Exec("ip", "link", "set", "churn1", "up")
		waitFor(t, "churn devices added", slow, func() bool { return devices(t, tp.Node) == "churn0,churn1,eth0,gw" })
		tp.Node.Exec("ip", "link", "del", "churn0")
		waitFor(t, "churn devices pruned", slow, func() bool { return devices(t, tp.Node) == "eth0,gw" })
	}

	// Config change: picked up from the file.
	if err := os.WriteFile(cfg, []byte(strings.Replace(cfgText, "{pod-to-pod: true}", "{pod-to-pod: true, pod-to-service: true}", 1)), 0o644); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the new class after a config change", slow, func() bool {
		for _, c := range status(t, tp.Node).Classes {
			if c.Class == "pod-to-service" {
				return true
			}
		}
		return false
	})

	// Metrics and the agent's own status.
	tcpConn(t, tp.Pod, tp.V4.Pod, tp.Remote, tp.V4.RemotePod, 5007, 1<<20)
	_, body := httpGet(t, tp.Node, "127.0.0.1:9464", "/metrics")
	for _, want := range []string{"hostaccel_syncs_total", "hostaccel_sync_errors_total", "hostaccel_sync_duration_seconds_bucket",
		"hostaccel_devices 2", `hostaccel_class_packets_total{class="pod-to-pod"}`, "hostaccel_offloaded_flows 1", "hostaccel_healthy 1",
		// the two repairs above; devices that vanished with their link are no drift
		`hostaccel_drift_repairs_total{datapath="flowtable"} 2`} {
		if !strings.Contains(body, want) {
			t.Errorf("metrics lack %q", want)
		}
	}
	out := mustHA(t, tp.Node.Name, "status", "--state-file", statePath)
	if !strings.Contains(out, "healthy") || !strings.Contains(out, "[OFFLOAD]") {
		t.Errorf("status:\n%s", out)
	}

	// Exit leaves rules in place.
	cmd.Process.Signal(syscall.SIGTERM)
	if err := cmd.Wait(); err != nil {
		t.Errorf("agent exit: %v", err)
	}
	if devices(t, tp.Node) != "eth0,gw" {
		t.Error("rules removed on exit without --cleanup-on-exit")
	}
}
