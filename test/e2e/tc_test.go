package e2e

import (
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"

	"github.com/hostaccel/hostaccel/internal/agent"
	"github.com/hostaccel/hostaccel/internal/model"
	"github.com/hostaccel/hostaccel/internal/probe"
	"github.com/hostaccel/hostaccel/internal/tc"
	"github.com/hostaccel/hostaccel/internal/testbed"
)

func needTC(t *testing.T) {
	t.Helper()
	if !(caps.Has(probe.TCX) || caps.Has(probe.ClsBPF)) || !caps.Has(probe.RedirectNeigh) {
		testbed.Skip(t, testbed.RequireTC, "this kernel cannot run the tc datapath")
	}
}

// deleteRemotePodCIDR deletes IPv4 prefix p from the prefix map of tc program id, as
// someone else might (its key: the length, then the address; bpf/fastpath.c struct lpm4).
func deleteRemotePodCIDR(t *testing.T, id ebpf.ProgramID, p netip.Prefix) {
	t.Helper()
	m, err := tc.OpenAddrTrie(id, p)
	if m == nil || err != nil {
		t.Fatalf("program %d: %v", id, err)
	}
	defer m.Close()
	if err := m.Delete(tc.AddrKey(p)); err != nil {
		t.Fatalf("deleting %s: %v", p, err)
	}
}

// forwardingOff stops the node's stack from forwarding, so that traffic between the Pod and the
// remote Pod can only flow through the tc redirect.
func forwardingOff(t *testing.T, tp *testbed.Topo) {
	t.Helper()
	for _, k := range []string{"net.ipv4.ip_forward", "net.ipv6.conf.all.forwarding"} {
		if err := tp.Node.Sysctl(k, "0"); err != nil {
			t.Fatal(err)
		}
	}
}

// reachable moves 256 KiB over TCP pod -> remote pod and reports whether it got through.
func reachable(tp *testbed.Topo, a testbed.Addrs, port int) error {
	srv, err := tp.Remote.ListenTCP(hostport(a.RemotePod, port))
	if err != nil {
		return err
	}
	defer srv.Close()
	c, err := tp.Pod.DialTCP("", srv.Addr().String())
	if err != nil {
		return err
	}
	defer c.Close()
	return testbed.Transfer(c, 256<<10, 16<<10)
}

// tcDevices lists, in status order, the devices the tc datapath is attached to in ns that keep
// accepts ("" while it is attached nowhere).
func tcDevices(t *testing.T, ns *testbed.NS, keep func(tc.Device) bool) string {
	st := status(t, ns)
	if st.TC == nil {
		return ""
	}
	var ds []string
	for _, d := range st.TC.Devices {
		if keep(d) {
			ds = append(ds, d.Name)
		}
	}
	return strings.Join(ds, ",")
}

func tcStatus(t *testing.T, ns *testbed.NS) agent.Status {
	st := status(t, ns)
	if st.TC == nil {
		t.Fatalf("status shows no tc datapath")
	}
	return st
}

// datapath: tc end to end through the binary: with the node's forwarding off, traffic flows
// only because of the redirect; status and cleanup; a class tc cannot serve is refused.
func TestTCDatapathApply(t *testing.T) {
	needTC(t)
	tp := testbed.NewTopoT(t, testbed.TopoOptions{})
	forwardingOff(t, tp)
	old := testbed.IOTimeout
	testbed.IOTimeout = 2 * time.Second
	t.Cleanup(func() { testbed.IOTimeout = old })

	bad := nodeConfig(tp, "datapath: tc\nclasses: {pod-to-pod: true, pod-to-service: true}\n")
	if out, err := ha(tp.Node.Name, "apply", "-f", writeConfig(t, bad)); err == nil ||
		!strings.Contains(out, "classes.pod-to-service: datapath tc cannot serve it") {
		t.Errorf("tc with a NAT class: %v %s", err, out)
	}
	if st := status(t, tp.Node); st.TC != nil {
		t.Errorf("a rejected config attached the tc datapath: %+v", st.TC)
	}
	for _, v6 := range []bool{false, true} {
		if err := reachable(tp, tp.Addrs(v6), 5100); err == nil {
			t.Fatalf("v6=%v: traffic crossed a node with forwarding off before apply", v6)
		}
	}

	cfg := writeConfig(t, nodeConfig(tp, "datapath: tc\nclasses: {pod-to-pod: true, node-to-remote-pod: true}\n"))
	out := mustHA(t, tp.Node.Name, "apply", "-f", cfg)
	if !strings.Contains(out, "applied tc datapath") {
		t.Errorf("apply: %s", out)
	}
	for _, v6 := range []bool{false, true} {
		if err := reachable(tp, tp.Addrs(v6), 5101); err != nil {
			t.Errorf("v6=%v: no traffic through the tc redirect: %v", v6, err)
		}
	}
	udpExchange(t, tp.Pod, tp.Remote, tp.V4.RemotePod, 5102, 50)
	st := tcStatus(t, tp.Node)
	var p4, p6 uint64
	for _, c := range st.TC.Classes {
		if c.Class == model.PodToPod && c.Family == "ipv4" {
			p4 = c.Packets
		}
		if c.Class == model.PodToPod && c.Family == "ipv6" {
			p6 = c.Packets
		}
	}
	if p4 < 100 || p6 < 10 {
		t.Errorf("tc counters: v4 %d, v6 %d packets", p4, p6)
	}
	if txt := mustHA(t, tp.Node.Name, "status"); !strings.Contains(txt, "tc datapath:") || !strings.Contains(txt, "pod-to-pod") {
		t.Errorf("status text:\n%s", txt)
	}
	if out := mustHA(t, tp.Node.Name, "apply", "-f", cfg); !strings.Contains(out, "attached [], missing [], elements +0 ~0 -0") {
		t.Errorf("second apply changed something: %s", out)
	}
	// An entry deleted behind its back: the next apply (which reads the kernel while it
	// probes it) finds it missing and puts it back, and nothing else.
	deleteRemotePodCIDR(t, st.TC.ProgramID, tp.V4.RemotePodCIDR)
	if out := mustHA(t, tp.Node.Name, "apply", "-f", cfg); !strings.Contains(out, "attached [], missing [], elements +1 ~0 -0") {
		t.Errorf("apply after an entry was deleted behind its back: %s", out)
	}
	if err := reachable(tp, tp.V4, 5104); err != nil {
		t.Errorf("no traffic after the entry was put back: %v", err)
	}

	if out := mustHA(t, tp.Node.Name, "cleanup"); !strings.Contains(out, "the tc datapath") {
		t.Errorf("cleanup says %q", out)
	}
	if st := status(t, tp.Node); st.TC != nil {
		t.Errorf("cleanup left the tc datapath: %+v", st.TC)
	}
	if out, _ := tp.Node.Exec("tc", "filter", "show", "dev", "eth0", "ingress"); strings.Contains(out, "hostaccel") {
		t.Errorf("cleanup left a filter: %s", out)
	}
	if err := reachable(tp, tp.V4, 5103); err == nil {
		t.Error("traffic still crosses the node after cleanup")
	}
}

// The agent with datapath auto on this kernel: tc serves pod-to-pod; the transport deleted
// and re-created gets the program again (link event), and metrics count redirects.
func TestTCDatapathAgent(t *testing.T) {
	needTC(t)
	tp := testbed.NewTopoT(t, testbed.TopoOptions{})
	forwardingOff(t, tp)
	cfg := writeConfig(t, nodeConfig(tp, "datapath: auto\nclasses: {pod-to-pod: true}\nagent: {resyncPeriod: 2s, minSyncInterval: 200ms}\n"))
	statePath := t.TempDir() + "/agent.json"
	startAgent(t, tp.Node, "-f", cfg, "--state-file", statePath, "--metrics-address", "127.0.0.1:9467")
	attached := func() string { return tcDevices(t, tp.Node, func(tc.Device) bool { return true }) }
	waitFor(t, "tc attached by the agent", 60*time.Second, func() bool { return attached() == "eth0,gw" || attached() == "gw,eth0" })
	if err := reachable(tp, tp.V4, 5110); err != nil {
		t.Fatal(err)
	}
	b, _ := os.ReadFile(statePath)
	var st agent.State
	json.Unmarshal(b, &st)
	if !strings.HasPrefix(st.Plan, "tc: [pod-to-pod]") {
		t.Errorf("plan: %q", st.Plan)
	}

	if out, err := tp.Node.Exec("ip", "link", "del", tp.TransportName); err != nil {
		t.Fatal(err, out)
	}
	if err := tp.RecreateTransport(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "traffic over the re-created transport", 60*time.Second, func() bool { return reachable(tp, tp.V4, 5111) == nil })

	_, body := httpGet(t, tp.Node, "127.0.0.1:9467", "/metrics")
	if !strings.Contains(body, `hostaccel_tc_redirected_packets_total{class="pod-to-pod",family="ipv4"}`) {
		t.Errorf("metrics lack tc counters:\n%s", body)
	}
	_ = netip.Addr{}
	_ = fmt.Sprint()
}

// datapath: tc with the local-pod-to-pod class and the gateways named by a pattern ("gw*"), as
// for a CNI's per-Pod veths: the agent attaches to every Pod's veth, also to one created
// while it runs (the link event's sync), and the traffic between two Pods of the node, to
// the new one too, is moved from veth to Pod by the program (its counters, IPv4 and IPv6).
func TestTCLocalPodToPodAgent(t *testing.T) {
	needTC(t)
	p := testbed.NewLocalPodsInT(t, testbed.TCBlock)
	cfg := writeConfig(t, `node:
  gateways: ["gw*"]
  transports: auto
  localPodCIDRs: [10.214.0.0/16, "fd00:214::/32"]
datapath: tc
classes: {local-pod-to-pod: true}
agent: {resyncPeriod: 2s, minSyncInterval: 200ms}
`)
	startAgent(t, p.Node, "-f", cfg, "--state-file", t.TempDir()+"/agent.json")
	attached := func() string {
		return tcDevices(t, p.Node, func(d tc.Device) bool { return d.Role == tc.RoleGateway && d.Peer })
	}
	waitFor(t, "tc on both Pods' veths", 60*time.Second, func() bool { return attached() == "gwa,gwb" })
	redirected := func(v6 bool) uint64 {
		for _, c := range tcStatus(t, p.Node).TC.Classes {
			if c.Class == model.LocalPodToPod && c.Family == map[bool]string{false: "ipv4", true: "ipv6"}[v6] {
				return c.Bytes
			}
		}
		return 0
	}
	moves := func(to *testbed.NS, addrs map[bool]netip.Addr, port int) {
		t.Helper()
		for _, v6 := range []bool{false, true} {
			before := redirected(v6)
			tcpConn(t, p.A, p.Addr(false, v6), to, addrs[v6], port, 1<<20)
			if got := redirected(v6) - before; got < 2<<20 {
				t.Errorf("to %s: %d bytes redirected as local-pod-to-pod, want >= %d (1 MiB each way)", addrs[v6], got, 2<<20)
			}
		}
	}
	moves(p.B, map[bool]netip.Addr{false: p.B4, true: p.B6}, 5120)

	c, c4, c6, err := p.AddPod()
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, "tc on the new Pod's veth", 60*time.Second, func() bool { return attached() == "gwa,gwb,gwc" })
	moves(c, map[bool]netip.Addr{false: c4, true: c6}, 5121)
}
