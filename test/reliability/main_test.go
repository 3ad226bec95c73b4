// Package reliability runs the hostaccel agent binary under sustained faults on this host's
// kernel, in network namespaces (internal/testbed), with traffic through the node the whole
// time: transport churn, SIGKILL restarts, reload storms, state flushed behind its back, two
// agents, API abuse. Every test prints FIGURE lines, the numbers docs/reliability.md reports.
//
//	Pod eth0 ── gw  Node (agent: tc for pod-to-pod, a dnat load-balancer service)  eth0 ── eth0 Remote (lo: RemotePod)
package reliability

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/hostaccel/hostaccel/internal/agent"
	"github.com/hostaccel/hostaccel/internal/probe"
	"github.com/hostaccel/hostaccel/internal/testbed"
)

var (
	hostaccel string
	caps      probe.Result
)

func TestMain(m *testing.M) { os.Exit(run(m)) }

func run(m *testing.M) int {
	if code, ok := testbed.MainRequireRoot("reliability tests"); !ok {
		return code
	}
	caps = probe.Run(context.Background())
	bin, cleanup, ok := testbed.MainBinary()
	if !ok {
		return 1
	}
	defer cleanup()
	hostaccel = bin
	return m.Run()
}

// figure prints one line of figures for docs/reliability.md: FIGURE <test> key=value ...
func figure(t *testing.T, kv ...any) {
	var b strings.Builder
	fmt.Fprintf(&b, "FIGURE %s", t.Name())
	for i := 0; i+1 < len(kv); i += 2 {
		fmt.Fprintf(&b, " %v=%v", kv[i], kv[i+1])
	}
	t.Log(b.String())
	fmt.Println(b.String())
}

// The load-balancer service: a dnat VIP in front of the remote Pod, health-checked over TCP.
var (
	vip     = [2]netip.Addr{netip.MustParseAddr("10.96.0.10"), netip.MustParseAddr("fd00:96::10")}
	vipPort = 80
	bePort  = 8080
)

// node is the testbed topology with the agent's config and paths.
type node struct {
	*testbed.Topo
	dir, cfg, state, socket string
	lock                    string // the agent's --lock-file
	metrics                 string // host:port of /metrics in the Node's namespace
	agent                   *proc
}

// nodeConfig is the agent's config: tc serves pod-to-pod and node-to-remote-pod (the NAT check
// hands the VIP's replies to the stack), the load balancer serves the VIP on port lbPort.
func (n *node) config(lbPort int, extra string) string {
	return fmt.Sprintf(`datapath: tc
classes: {pod-to-pod: true, node-to-remote-pod: true}
node:
  gateways: [%s]
  transports: [%s]
  localPodCIDRs: [%s, "%s"]
  peerPodCIDRs: [%s, "%s"]
  nodeIPs: [%s, "%s"]
  peerNodeIPs: [%s, "%s"]
agent: {resyncPeriod: 2s, minSyncInterval: 200ms}
loadBalancer:
  api: {socket: %s}
  stateFile: %s
  services:
  - name: web
    vips: [%s, "%s"]
    port: %d
    topology: dnat
    healthCheck: {type: tcp, interval: 300ms, timeout: 250ms, rise: 1, fall: 2}
    backends:
    - {address: %s, port: %d}
    - {address: "%s", port: %d}
%s`, n.GatewayName, n.TransportName, n.V4.PodCIDR, n.V6.PodCIDR, n.V4.RemotePodCIDR, n.V6.RemotePodCIDR,
		n.V4.Node, n.V6.Node, n.V4.Remote, n.V6.Remote, n.socket, filepath.Join(n.dir, "lb-state.yaml"),
		vip[0], vip[1], lbPort, n.V4.RemotePod, bePort, n.V6.RemotePod, bePort, extra)
}

var metricsPort atomic.Int32

// newNode builds the topology, the backends' echo servers (port bePort on the remote Pod's
// addresses) and the config file; the agent is not started.
func newNode(t *testing.T) *node {
	t.Helper()
	if os.Getenv("HOSTACCEL_IN_VM") == "1" {
		t.Skip("runs on the host (scripts/test.sh); the VM runs the flowtable's churn only")
	}
	if !(caps.Has(probe.TCX) || caps.Has(probe.ClsBPF)) || !caps.Has(probe.RedirectNeigh) {
		testbed.Skip(t, testbed.RequireTC, "this kernel cannot run the tc datapath")
	}
	return setupNode(t)
}

// setupNode builds what newNode describes, for any datapath.
func setupNode(t *testing.T) *node {
	t.Helper()
	n := &node{Topo: testbed.NewTopoT(t, testbed.TopoOptions{}), dir: t.TempDir()}
	n.cfg, n.state, n.socket = filepath.Join(n.dir, "hostaccel.yaml"), filepath.Join(n.dir, "agent.json"), filepath.Join(n.dir, "lb.sock")
	n.lock = filepath.Join(n.dir, "hostaccel.lock")
	n.metrics = fmt.Sprintf("127.0.0.1:%d", 9500+metricsPort.Add(1))
	for _, a := range []netip.Addr{n.V4.RemotePod, n.V6.RemotePod} {
		if _, err := n.Remote.ListenTCP(netip.AddrPortFrom(a, uint16(bePort)).String()); err != nil {
			t.Fatal(err)
		}
	}
	n.writeConfig(t, n.config(vipPort, ""))
	return n
}

func (n *node) writeConfig(t *testing.T, body string) {
	t.Helper()
	if err := os.WriteFile(n.cfg, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
}

// proc is a running agent with its log.
type proc struct {
	cmd  *exec.Cmd
	log  *testbed.SyncBuffer
	done chan struct{}
}

func (p *proc) alive() bool {
	select {
	case <-p.done:
		return false
	default:
		return true
	}
}

// startAgent runs `hostaccel agent` in the Node's namespace; the test's cleanup kills it and
// shows its log if the test failed.
func (n *node) startAgent(t *testing.T, args ...string) *proc {
	t.Helper()
	p := &proc{log: &testbed.SyncBuffer{}, done: make(chan struct{})}
	p.cmd = exec.Command("ip", append([]string{"netns", "exec", n.Node.Name, hostaccel, "agent", "-f", n.cfg,
		"--state-file", n.state, "--metrics-address", n.metrics, "--lock-file", n.lock}, args...)...)
	p.cmd.Stdout, p.cmd.Stderr = p.log, p.log
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { p.cmd.Wait(); close(p.done) }()
	t.Cleanup(func() {
		if p.alive() {
			p.cmd.Process.Kill()
			<-p.done
		}
		if t.Failed() {
			t.Logf("agent (pid %d) log:\n%s", p.cmd.Process.Pid, p.log.Tail(60))
		}
	})
	n.agent = p
	return p
}

// readState reads the agent's state file (zero State if absent or half written).
func (n *node) readState() agent.State {
	var st agent.State
	b, _ := os.ReadFile(n.state)
	json.Unmarshal(b, &st)
	return st
}

// ready waits until the agent with pid has synced healthy, tc is on both devices and the VIP
// answers.
func (n *node) ready(t *testing.T, pid int, timeout time.Duration) {
	t.Helper()
	waitFor(t, "the agent to sync healthy", timeout, func() bool {
		st := n.readState()
		return st.PID == pid && st.Syncs > 0 && st.Healthy
	})
	waitFor(t, "tc on gw and eth0", timeout, func() bool { return len(n.attached(t)) == 2 })
	waitFor(t, "the VIP to answer", timeout, func() bool { return n.vipWorks(0) == nil && n.vipWorks(1) == nil })
}

// status is `hostaccel status -o json` in the Node's namespace (the kernel's view).
func (n *node) status(t *testing.T) agent.Status {
	t.Helper()
	out, err := ha(n.Node, "status", "-o", "json", "--state-file", "")
	if err != nil {
		t.Fatalf("status: %v\n%s", err, out)
	}
	var st agent.Status
	if err := json.Unmarshal([]byte(out), &st); err != nil {
		t.Fatalf("status json: %v\n%s", err, out)
	}
	return st
}

// attached returns the devices the tc program is attached to, name -> ifindex.
func (n *node) attached(t *testing.T) map[string]int {
	t.Helper()
	st := n.status(t)
	devs := map[string]int{}
	if st.TC != nil {
		for _, d := range st.TC.Devices {
			devs[d.Name] = d.Index
		}
	}
	return devs
}

// vipWorks makes one connection from the Pod to the VIP of family fam and exchanges 4 KiB.
func (n *node) vipWorks(fam int) error {
	return exchange(n.Pod, netip.AddrPortFrom(vip[fam], uint16(vipPort)), 4<<10)
}

// podWorks makes one connection from the Pod to the remote Pod's echo server.
func (n *node) podWorks(fam int) error {
	return exchange(n.Pod, netip.AddrPortFrom(n.Addrs(fam == 1).RemotePod, uint16(bePort)), 4<<10)
}

// exchange makes one connection (given up after a second: a SYN lost to a broken rule must
// not be retried into a success later) and exchanges size bytes.
func exchange(from *testbed.NS, to netip.AddrPort, size int) error {
	var c net.Conn
	err := from.Do(func() (err error) {
		c, err = net.DialTimeout("tcp", to.String(), time.Second)
		return err
	})
	if err != nil {
		return err
	}
	defer c.Close()
	return testbed.Transfer(c, size, 1<<10)
}

// metric returns the value of the first sample of name (with labels, if given, as in the
// exposition format) on the agent's /metrics, or -1.
func (n *node) metric(t *testing.T, name string) float64 {
	t.Helper()
	_, body, err := n.Node.HTTPGet(n.metrics, "/metrics")
	if err != nil {
		return -1
	}
	re := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(name) + ` (\S+)$`)
	m := re.FindStringSubmatch(body)
	if m == nil {
		return -1
	}
	v, _ := strconv.ParseFloat(m[1], 64)
	return v
}

// ha runs the hostaccel binary in ns.
func ha(ns *testbed.NS, args ...string) (string, error) {
	out, err := exec.Command("ip", append([]string{"netns", "exec", ns.Name, hostaccel}, args...)...).CombinedOutput()
	return string(out), err
}

// waitFor polls cond every 50 ms: the repair and re-attach times it returns are the figures.
func waitFor(t *testing.T, what string, timeout time.Duration, cond func() bool) time.Duration {
	t.Helper()
	return testbed.WaitFor(t, what, timeout, 50*time.Millisecond, cond)
}

// rss is a process's resident memory in bytes (0 if it is gone).
func rss(pid int) int64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(l); len(f) >= 2 && f[0] == "VmRSS:" {
			kb, _ := strconv.ParseInt(f[1], 10, 64)
			return kb << 10
		}
	}
	return 0
}

// agentPID is the pid of the hostaccel process under `ip netns exec` (which execs it: same pid).
func (p *proc) pid() int { return p.cmd.Process.Pid }

func (p *proc) kill() {
	p.cmd.Process.Signal(syscall.SIGKILL)
	<-p.done
}

// stream sends data from a client namespace to an echo server for as long as it runs, at a
// bounded rate (the machine is shared), and records the longest time without progress.
type stream struct {
	conn     net.Conn
	received atomic.Int64
	stop     chan struct{}
	done     chan error
	mu       sync.Mutex
	last     time.Time
	stall    time.Duration
	once     sync.Once
	err      error
}

func startStream(t *testing.T, from *testbed.NS, to netip.AddrPort) *stream {
	t.Helper()
	c, err := from.DialTCP("", to.String())
	if err != nil {
		t.Fatal(err)
	}
	s := &stream{conn: c, stop: make(chan struct{}), done: make(chan error, 2), last: time.Now()}
	go func() { // writer: 32 KiB every 2 ms (~130 Mbit/s at most)
		buf := make([]byte, 32<<10)
		tick := time.NewTicker(2 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-s.stop:
				s.done <- nil
				return
			case <-tick.C:
			}
			c.SetWriteDeadline(time.Now().Add(20 * time.Second))
			if _, err := c.Write(buf); err != nil {
				s.done <- fmt.Errorf("write after %d bytes: %w", s.received.Load(), err)
				return
			}
		}
	}()
	go func() { // reader: the echo
		buf := make([]byte, 64<<10)
		for {
			c.SetReadDeadline(time.Now().Add(20 * time.Second))
			k, err := c.Read(buf)
			if k > 0 {
				s.received.Add(int64(k))
				s.mu.Lock()
				if gap := time.Since(s.last); gap > s.stall {
					s.stall = gap
				}
				s.last = time.Now()
				s.mu.Unlock()
			}
			if err != nil {
				select {
				case <-s.stop:
					s.done <- nil
				default:
					s.done <- fmt.Errorf("read after %d bytes: %w", s.received.Load(), err)
				}
				return
			}
		}
	}()
	t.Cleanup(func() { s.close() })
	return s
}

// close stops the stream; it returns the first error either side saw and the longest time
// without progress (including the time since the last progress).
func (s *stream) close() (error, time.Duration) {
	s.once.Do(func() {
		s.mu.Lock()
		s.stall = max(s.stall, time.Since(s.last))
		s.mu.Unlock()
		close(s.stop)
		s.err = <-s.done
		s.conn.Close()
		<-s.done
	})
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.err, s.stall
}

// exchangeOn moves 64 KiB over an open connection and reads the echo.
func exchangeOn(c net.Conn) error { return testbed.Transfer(c, 64<<10, 16<<10) }
