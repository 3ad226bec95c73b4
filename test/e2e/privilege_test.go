package e2e

import (
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netlink"

	"github.com/hostaccel/hostaccel/internal/testbed"
)

// setpriv runs hostaccel in ns as root with only the capabilities caps ("+net_admin,...").
func setpriv(t *testing.T, ns string, caps string, args ...string) (string, error) {
	t.Helper()
	full := append([]string{"netns", "exec", ns, "setpriv", "--inh-caps=-all", "--ambient-caps=-all",
		"--bounding-set=-all" + caps, "--", hostaccel}, withLock(args)...)
	out, err := exec.Command("ip", full...).CombinedOutput()
	return string(out), err
}

// Errors caused by missing capabilities name the capability and the part that needs it,
// not the kernel; the least capabilities of docs/deploy.md work: the load balancer with
// CAP_NET_ADMIN alone, the tc datapath with CAP_NET_ADMIN and CAP_SYS_ADMIN (CAP_BPF and
// CAP_PERFMON instead of CAP_SYS_ADMIN do not).
func TestMissingCapabilitiesNamed(t *testing.T) {
	needTC(t)
	if out, err := exec.Command("setpriv", "--inh-caps=-all", "--ambient-caps=-all", "--bounding-set=-all,+net_admin", "--", "true").CombinedOutput(); err != nil {
		t.Skipf("no util-linux setpriv (the VM has busybox's): %v %s", err, out)
	}
	tp := testbed.NewTopoT(t, testbed.TopoOptions{})
	tcCfg := writeConfig(t, nodeConfig(tp, "datapath: tc\nclasses: {pod-to-pod: true}\nagent: {resyncPeriod: 1s, minSyncInterval: 100ms}\n"))
	lbCfg := writeConfig(t, "datapath: none\n"+lbSection(t.TempDir(), ""))
	const lacksSysAdmin = "the tc datapath needs CAP_NET_ADMIN and CAP_SYS_ADMIN; this process lacks CAP_SYS_ADMIN"
	before := ruleset(t, tp.Node)
	for _, caps := range []string{",+net_admin", ",+net_admin,+bpf", ",+net_admin,+bpf,+perfmon"} {
		out, err := setpriv(t, tp.Node.Name, caps, "apply", "-f", tcCfg)
		if err == nil || !strings.Contains(out, lacksSysAdmin) || strings.Contains(out, "this kernel cannot") {
			t.Errorf("apply of tc with %s: %v\n%s", caps, err, out)
		}
	}
	if st := status(t, tp.Node); st.TC != nil {
		t.Errorf("a refused apply attached the tc datapath: %+v", st.TC)
	}
	for _, caps := range []string{"", ",+sys_admin"} {
		out, err := setpriv(t, tp.Node.Name, caps, "apply", "-f", lbCfg)
		if err == nil || !strings.Contains(out, "needs CAP_NET_ADMIN; this process lacks CAP_NET_ADMIN") {
			t.Errorf("apply of the load balancer with %q: %v\n%s", caps, err, out)
		}
	}
	if ruleset(t, tp.Node) != before {
		t.Error("a refused apply changed the kernel")
	}
	out, err := setpriv(t, tp.Node.Name, ",+net_admin", "probe")
	if err != nil || !strings.Contains(out, "this process lacks CAP_SYS_ADMIN") {
		t.Errorf("probe without CAP_SYS_ADMIN: %v\n%s", err, out)
	}

	// The agent says the same, in its state and status.
	statePath := filepath.Join(t.TempDir(), "agent.json")
	cmd := exec.Command("ip", "netns", "exec", tp.Node.Name, "setpriv", "--inh-caps=-all", "--ambient-caps=-all",
		"--bounding-set=-all,+net_admin,+bpf,+perfmon", "--", hostaccel, "agent", "-f", tcCfg, "--state-file", statePath, "--lock-file", lockFile)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { cmd.Process.Kill(); cmd.Wait() }()
	waitFor(t, "the agent's first sync", 60*time.Second, func() bool { return readState(statePath).Syncs > 0 })
	if st := readState(statePath); st.Healthy || !strings.Contains(st.LastError, lacksSysAdmin) {
		t.Errorf("agent without CAP_SYS_ADMIN: %+v", st)
	}
	cmd.Process.Kill()
	cmd.Wait()

	// The least capabilities that work.
	if out, err := setpriv(t, tp.Node.Name, ",+net_admin", "apply", "-f", lbCfg); err != nil || !strings.Contains(out, "applied the load balancer") {
		t.Errorf("the load balancer with CAP_NET_ADMIN: %v\n%s", err, out)
	}
	if out, err := setpriv(t, tp.Node.Name, ",+net_admin,+sys_admin", "apply", "-f", tcCfg); err != nil || !strings.Contains(out, "applied tc datapath") {
		t.Errorf("tc with CAP_NET_ADMIN and CAP_SYS_ADMIN: %v\n%s", err, out)
	}
	if out, err := setpriv(t, tp.Node.Name, ",+net_admin,+sys_admin", "status", "--state-file", ""); err != nil || !strings.Contains(out, "tc datapath:") {
		t.Errorf("status of tc with CAP_NET_ADMIN and CAP_SYS_ADMIN: %v\n%s", err, out)
	}
	if out, err := setpriv(t, tp.Node.Name, ",+net_admin,+sys_admin", "cleanup"); err != nil {
		t.Errorf("cleanup with CAP_NET_ADMIN and CAP_SYS_ADMIN: %v\n%s", err, out)
	}
	if st := status(t, tp.Node); st.TC != nil {
		t.Errorf("cleanup left the tc datapath: %+v", st.TC)
	}
}

// With CAP_NET_ADMIN alone (the load balancer, the flowtable), another agent's tcx program
// attached without a link (as `bpftool net attach tcx_ingress` does) on a device of the node
// changes nothing: an apply without tc succeeds, and status reads no error of tc. Before,
// every sync looked the program up by its ID to tell whether it was hostaccel's, which needs
// CAP_SYS_ADMIN: "get program by id: operation not permitted", the apply failed (exit 1,
// "the load balancer part was applied") and the agent was unhealthy at every sync.
func TestForeignTCXProgramWithoutSysAdmin(t *testing.T) {
	if out, err := exec.Command("setpriv", "--inh-caps=-all", "--ambient-caps=-all", "--bounding-set=-all,+net_admin", "--", "true").CombinedOutput(); err != nil {
		t.Skipf("no util-linux setpriv (the VM has busybox's): %v %s", err, out)
	}
	tp := testbed.NewTopoT(t, testbed.TopoOptions{})
	err := tp.Node.Do(func() error {
		l, err := netlink.LinkByName(tp.GatewayName)
		if err != nil {
			return err
		}
		prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{Name: "other_agent", Type: ebpf.SchedCLS, License: "GPL",
			Instructions: asm.Instructions{asm.Mov.Imm(asm.R0, -1), asm.Return()}}) // TC_ACT_UNSPEC: on to the stack
		if err != nil {
			return err
		}
		defer prog.Close() // (the attachment holds it: the namespace's end takes it off)
		return link.RawAttachProgram(link.RawAttachProgramOptions{Target: l.Attrs().Index, Program: prog, Attach: ebpf.AttachTCXIngress})
	})
	if err != nil {
		t.Skipf("no tcx here: %v", err)
	}
	lbCfg := writeConfig(t, "datapath: none\n"+lbSection(t.TempDir(), ""))
	if out, err := setpriv(t, tp.Node.Name, ",+net_admin", "apply", "-f", lbCfg); err != nil || !strings.Contains(out, "applied the load balancer") {
		t.Errorf("the load balancer with CAP_NET_ADMIN beside another's tcx program: %v\n%s", err, out)
	}
	if out, err := setpriv(t, tp.Node.Name, ",+net_admin", "status", "--state-file", ""); err != nil || strings.Contains(out, "error reading") {
		t.Errorf("status with CAP_NET_ADMIN beside another's tcx program: %v\n%s", err, out)
	}
}
