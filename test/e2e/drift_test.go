package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netlink"

	"github.com/hostaccel/hostaccel/internal/lb"
	"github.com/hostaccel/hostaccel/internal/testbed"
)

// detachTC takes hostaccel's program off dev's tc ingress, as another tool would.
func detachTC(ns *testbed.NS, dev string) error {
	return ns.Do(func() error {
		l, err := netlink.LinkByName(dev)
		if err != nil {
			return err
		}
		idx := l.Attrs().Index
		if q, err := link.QueryPrograms(link.QueryOptions{Target: idx, Attach: ebpf.AttachTCXIngress}); err == nil && len(q.Programs) > 0 {
			for _, p := range q.Programs {
				prog, err := ebpf.NewProgramFromID(p.ID)
				if err != nil {
					return err
				}
				err = link.RawDetachProgram(link.RawDetachProgramOptions{Target: idx, Program: prog, Attach: ebpf.AttachTCXIngress})
				prog.Close()
				if err != nil {
					return err
				}
			}
			return nil
		}
		fs, err := netlink.FilterList(l, netlink.HANDLE_MIN_INGRESS)
		if err != nil {
			return err
		}
		for _, f := range fs {
			if err := netlink.FilterDel(f); err != nil {
				return err
			}
		}
		if len(fs) == 0 {
			return fmt.Errorf("%s: nothing attached", dev)
		}
		return nil
	})
}

// The agent's periodic resync repairs what someone changed behind its back (the tc program
// detached, a load-balancer map emptied, nft flush ruleset) within its period, logs a WARN
// saying what, and counts it in hostaccel_drift_repairs_total; quiet periods count nothing.
func TestDriftRepairVisible(t *testing.T) {
	needTC(t)
	tp := testbed.NewTopoT(t, testbed.TopoOptions{})
	const period = 2 * time.Second
	// margin is the time a sync itself may take: on the host well under a second; in the VM
	// (TCG) the load balancer's apply alone takes several seconds.
	margin := 3 * time.Second
	if os.Getenv("HOSTACCEL_IN_VM") == "1" {
		margin = 30 * time.Second
	}
	cfg := writeConfig(t, nodeConfig(tp, "datapath: tc\nclasses: {pod-to-pod: true}\nagent: {resyncPeriod: 2s, minSyncInterval: 100ms}\n")+
		lbSection(t.TempDir(), ""))
	statePath := filepath.Join(t.TempDir(), "agent.json")
	cmd := startAgent(t, tp.Node, "-f", cfg, "--state-file", statePath, "--metrics-address", "127.0.0.1:9468")
	log := func() string { return cmd.Stderr.(*testbed.SyncBuffer).String() }
	attached := func(dev string) bool {
		st := status(t, tp.Node)
		if st.TC == nil {
			return false
		}
		for _, d := range st.TC.Devices {
			if d.Name == dev {
				return true
			}
		}
		return false
	}
	backends := func() int {
		out, _ := tp.Node.Exec("nft", "list", "map", "inet", lb.NATTable, "web-backends-v4")
		return strings.Count(out, "10.244.2.")
	}
	waitFor(t, "the agent's first sync", 60*time.Second+margin, func() bool {
		st := readState(statePath)
		return st.Syncs > 0 && st.Healthy && attached("gw") && attached("eth0") && backends() > 0
	})
	s0 := readState(statePath).Syncs
	waitFor(t, "two periodic syncs", 4*period+2*margin, func() bool { return readState(statePath).Syncs >= s0+2 })
	metric := func(dp string) string {
		_, body := httpGet(t, tp.Node, "127.0.0.1:9468", "/metrics")
		for _, l := range strings.Split(body, "\n") {
			if v, ok := strings.CutPrefix(l, `hostaccel_drift_repairs_total{datapath="`+dp+`"} `); ok {
				return v
			}
		}
		return "missing"
	}
	for _, dp := range []string{"flowtable", "tc", "lb"} {
		if v := metric(dp); v != "0" {
			t.Errorf("quiet periods: hostaccel_drift_repairs_total{datapath=%q} = %s, want 0", dp, v)
		}
	}
	if strings.Contains(log(), "drift") {
		t.Errorf("quiet periods logged drift:\n%s", log())
	}

	// within waits for cond up to one period and a margin (the sync itself, scheduling).
	within := func(what string, cond func() bool) {
		t.Helper()
		start := time.Now()
		waitFor(t, what, period+margin, cond)
		t.Logf("%s after %s", what, time.Since(start).Round(10*time.Millisecond))
	}
	wantLog := func(line string) {
		t.Helper()
		waitFor(t, "the log line "+line, 2*time.Second+margin, func() bool { return strings.Contains(log(), line) })
	}
	// wantMetric waits for the drift counter (it may be updated a moment after the log line).
	wantMetric := func(dp, want, what string) {
		t.Helper()
		var v string
		testbed.WaitFor(t, what+": hostaccel_drift_repairs_total{datapath=\""+dp+"\"} = "+want, 2*time.Second+margin, 200*time.Millisecond, func() bool {
			v = metric(dp)
			return v == want
		})
	}
	const warn = `level=WARN msg="drift repaired: changed outside hostaccel, restored" `

	if err := detachTC(tp.Node, tp.GatewayName); err != nil {
		t.Fatal(err)
	}
	within("the program back on gw", func() bool { return attached("gw") })
	wantLog(warn + `datapath=tc drift="[program detached from gw]"`)
	wantMetric("tc", "1", "after the program was detached")

	if out, err := tp.Node.Exec("nft", "flush", "map", "inet", lb.NATTable, "web-backends-v4"); err != nil {
		t.Fatal(err, out)
	}
	within("the backends back in the map", func() bool { return backends() > 0 })
	wantLog(warn + `datapath=lb drift="[inet hostaccel-lb: map web-backends-v4: 2 elements removed or changed, 0 added]"`)
	wantMetric("lb", "1", "after the map was emptied")

	if out, err := tp.Node.Exec("nft", "flush", "ruleset"); err != nil {
		t.Fatal(err, out)
	}
	within("the load balancer's table back", func() bool { return backends() > 0 })
	wantLog(warn + `datapath=lb drift="[inet hostaccel-lb: table missing]"`)
	wantMetric("lb", "2", "after nft flush ruleset")
	if v := metric("flowtable"); v != "0" {
		t.Errorf("flowtable repairs %s without a flowtable", v)
	}
	if out := mustHA(t, tp.Node.Name, "status", "--state-file", statePath); !strings.Contains(out, "drift repairs (changed outside hostaccel, restored): lb 2, tc 1") {
		t.Errorf("status:\n%s", out)
	}
}
