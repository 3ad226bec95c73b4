package reliability

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"

	"github.com/hostaccel/hostaccel/internal/lb"
)

const redirected4 = `hostaccel_tc_redirected_packets_total{class="pod-to-pod",family="ipv4"}`

// The transport deleted and re-created (new ifindex, addresses, routes) 100 times under
// traffic: the agent never dies, attaches the program to every new device, its load-balancer
// backends (health-checked across that transport) come back, and its goroutines and memory
// stay flat.
func TestTransportChurn(t *testing.T) {
	const cycles = 100
	n := newNode(t)
	a := n.startAgent(t)
	n.ready(t, a.pid(), 30*time.Second)
	s := startStream(t, n.Pod, netip.AddrPortFrom(n.V4.RemotePod, uint16(bePort)))

	var g0, m0 float64
	var worst, total time.Duration
	for i := range cycles {
		old := n.attached(t)[n.TransportName]
		if out, err := n.Node.Exec("ip", "link", "del", n.TransportName); err != nil {
			t.Fatal(err, out)
		}
		if err := n.RecreateTransport(); err != nil {
			t.Fatal(err)
		}
		d := waitFor(t, fmt.Sprintf("cycle %d: tc on the re-created transport", i), 20*time.Second, func() bool {
			idx := n.attached(t)[n.TransportName]
			return idx != 0 && idx != old
		})
		worst, total = max(worst, d), total+d
		if !a.alive() {
			t.Fatalf("cycle %d: the agent died", i)
		}
		if i == 9 { // warmed up: the baseline for leaks
			g0, m0 = n.metric(t, "go_goroutines"), float64(rss(a.pid()))
		}
	}
	n.ready(t, a.pid(), 30*time.Second)
	r0 := n.metric(t, redirected4)
	for fam := range 2 {
		if err := n.podWorks(fam); err != nil {
			t.Errorf("family %d: Pod -> remote Pod after churn: %v", fam, err)
		}
	}
	if r1 := n.metric(t, redirected4); r1 <= r0 {
		t.Errorf("the program on the new devices redirects nothing (%v -> %v packets)", r0, r1)
	}
	time.Sleep(2 * time.Second) // a resync period: transient goroutines (checks, syncs) end
	g1, m1 := n.metric(t, "go_goroutines"), float64(rss(a.pid()))
	st := n.readState()
	serr, stall := s.close()
	figure(t, "cycles", cycles, "crashes", 0, "sync_errors", st.SyncErrors, "syncs", st.Syncs,
		"reattach_mean_ms", total.Milliseconds()/cycles, "reattach_worst_ms", worst.Milliseconds(),
		"goroutines", fmt.Sprintf("%.0f->%.0f", g0, g1), "rss_mib", fmt.Sprintf("%.1f->%.1f", m0/(1<<20), m1/(1<<20)),
		"stream_survived", serr == nil, "stream_longest_stall_ms", stall.Milliseconds())
	if g0 <= 0 || g1 > g0+10 {
		t.Errorf("goroutines grew: %.0f after 10 cycles, %.0f after %d", g0, g1, cycles)
	}
	if m1 > m0*1.3+16<<20 {
		t.Errorf("resident memory grew: %.1f MiB after 10 cycles, %.1f MiB after %d", m0/(1<<20), m1/(1<<20), cycles)
	}
	if st.SyncErrors > cycles {
		t.Errorf("%d sync errors in %d cycles: more than one per device change", st.SyncErrors, cycles)
	}
	if !st.Healthy {
		t.Errorf("the agent is not healthy after churn: %+v", st)
	}
}

// kernelView is what a restarted agent must leave exactly as it was: every table with its
// rule handles (a rebuilt table has new ones), without counters, and the tc program.
func (n *node) kernelView(t *testing.T) string {
	t.Helper()
	rules, err := n.Node.Exec("nft", "-a", "-s", "list", "ruleset")
	if err != nil {
		t.Fatal(err, rules)
	}
	st := n.status(t)
	if st.TC == nil {
		t.Fatalf("status shows no tc datapath: %+v", st)
	}
	return fmt.Sprintf("%s\ntc program %d on %v", rules, st.TC.ProgramID, st.TC.Devices)
}

// The agent killed with SIGKILL and restarted 20 times during two transfers (one redirected
// by tc, one through the load balancer's VIP): both transfers survive, and a restart with
// nothing to change changes nothing in the kernel.
func TestKillRestart(t *testing.T) {
	const restarts = 20
	n := newNode(t)
	a := n.startAgent(t)
	n.ready(t, a.pid(), 30*time.Second)
	before := n.kernelView(t)
	pod := startStream(t, n.Pod, netip.AddrPortFrom(n.V4.RemotePod, uint16(bePort)))
	svc := startStream(t, n.Pod, netip.AddrPortFrom(vip[1], uint16(vipPort)))
	changed := 0
	var worst time.Duration
	for i := range restarts {
		a.kill()
		time.Sleep(100 * time.Millisecond) // traffic without an agent
		a = n.startAgent(t)
		d := waitFor(t, fmt.Sprintf("restart %d: the new agent's first sync", i), 30*time.Second, func() bool {
			st := n.readState()
			return st.PID == a.pid() && st.Syncs > 0
		})
		worst = max(worst, d)
		if st := n.readState(); st.LastResult.Changed() || !st.Healthy {
			changed++
			t.Errorf("restart %d: the first sync changed the kernel or is unhealthy: %+v", i, st)
		}
	}
	if after := n.kernelView(t); after != before {
		t.Errorf("restarts changed the kernel:\nbefore:\n%s\nafter:\n%s", before, after)
	}
	perr, pstall := pod.close()
	serr, sstall := svc.close()
	lost := 0
	for _, err := range []error{perr, serr} {
		if err != nil {
			lost++
			t.Errorf("a transfer broke: %v", err)
		}
	}
	figure(t, "restarts", restarts, "connections_lost", lost, "first_sync_worst_ms", worst.Milliseconds(),
		"restarts_that_changed_the_kernel", changed, "tc_stream_longest_stall_ms", pstall.Milliseconds(),
		"vip_stream_longest_stall_ms", sstall.Milliseconds())
	for _, s := range []time.Duration{pstall, sstall} {
		if s > 2*time.Second {
			t.Errorf("a transfer stalled for %s", s)
		}
	}
}

// 100 SIGHUPs and 100 rewrites of the config (plain truncating writes: the agent sees half
// written files too) within about a second: the agent survives, coalesces them into a few
// syncs, and the last config wins.
func TestReloadStorm(t *testing.T) {
	const storm = 100
	n := newNode(t)
	a := n.startAgent(t)
	n.ready(t, a.pid(), 30*time.Second)
	syncs0 := n.readState().Syncs
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for range storm {
			a.cmd.Process.Signal(syscall.SIGHUP)
			time.Sleep(10 * time.Millisecond)
		}
	}()
	const final = 81
	start := time.Now()
	for i := range storm {
		port := 1000 + i
		if i == storm-1 {
			port = final
		}
		n.writeConfig(t, n.config(port, ""))
		time.Sleep(10 * time.Millisecond)
	}
	wg.Wait()
	stormTime := time.Since(start)
	works := func(port int) bool {
		return exchange(n.Pod, netip.AddrPortFrom(vip[0], uint16(port)), 1<<10) == nil
	}
	converge := waitFor(t, "the last config's port to answer", 20*time.Second, func() bool { return works(final) })
	if !a.alive() {
		t.Fatal("the agent died in the storm")
	}
	out, err := n.Node.Exec("nft", "list", "map", "inet", lb.NATTable, "services-v4")
	if err != nil {
		t.Fatal(err, out)
	}
	if !strings.Contains(out, fmt.Sprintf(" . %d : goto", final)) || strings.Contains(out, " . 10") {
		t.Errorf("the kernel's VIP map is not the last config's:\n%s", out)
	}
	if works(1000 + storm - 2) {
		t.Error("an earlier config's port still answers")
	}
	time.Sleep(time.Second)
	st := n.readState()
	figure(t, "sighups", storm, "rewrites", storm, "storm_ms", stormTime.Milliseconds(), "syncs", st.Syncs-syncs0,
		"sync_errors", st.SyncErrors, "last_config_after_ms", converge.Milliseconds())
	if d := st.Syncs - syncs0; d > 60 {
		t.Errorf("%d syncs for %d events in %s: not coalesced", d, 2*storm, stormTime)
	}
	if !st.Healthy {
		t.Errorf("unhealthy after the storm: %+v", st)
	}
}

// detachTC takes the program off dev behind the agent's back, as another tool would.
func (n *node) detachTC(t *testing.T, dev string) {
	t.Helper()
	err := n.Node.Do(func() error {
		l, err := net.InterfaceByName(dev)
		if err != nil {
			return err
		}
		res, err := link.QueryPrograms(link.QueryOptions{Target: l.Index, Attach: ebpf.AttachTCXIngress})
		if err != nil { // no tcx: cls_bpf
			out, err := n.Node.Exec("tc", "filter", "del", "dev", dev, "ingress")
			if err != nil {
				return fmt.Errorf("%v: %s", err, out)
			}
			return nil
		}
		for _, p := range res.Programs {
			prog, err := ebpf.NewProgramFromID(p.ID)
			if err != nil {
				return err
			}
			err = link.RawDetachProgram(link.RawDetachProgramOptions{Target: l.Index, Program: prog, Attach: ebpf.AttachTCXIngress})
			prog.Close()
			if err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// Everything flushed behind the agent's back is repaired within one resync period (2s here):
// the whole ruleset flushed, the load balancer's backend map emptied, the tc program detached.
func TestFlushRepair(t *testing.T) {
	const period = 2 * time.Second
	n := newNode(t)
	a := n.startAgent(t)
	n.ready(t, a.pid(), 30*time.Second)
	vipUp := func() bool { return n.vipWorks(0) == nil }
	nft := func(args ...string) func() {
		return func() {
			if out, err := n.Node.Exec(append([]string{"nft"}, args...)...); err != nil {
				t.Fatal(err, out)
			}
		}
	}
	var figs []any
	drift := func(dp string) float64 {
		return n.metric(t, `hostaccel_drift_repairs_total{datapath="`+dp+`"}`)
	}
	for _, c := range []struct {
		name, datapath string
		do             func()
		repaired       func() bool
	}{
		{"ruleset_flushed", "lb", nft("flush", "ruleset"), vipUp},
		{"lb_map_emptied", "lb", nft("flush", "map", "inet", lb.NATTable, "web-backends-v4"), vipUp},
		{"tc_detached", "tc", func() { n.detachTC(t, n.GatewayName) }, func() bool { return n.attached(t)[n.GatewayName] != 0 }},
	} {
		before := drift(c.datapath)
		logs := strings.Count(a.log.String(), "drift repaired")
		c.do()
		start := time.Now()
		if c.repaired() {
			out, _ := n.Node.Exec("nft", "list", "table", "inet", lb.NATTable)
			t.Fatalf("%s: nothing broken; the test is wrong\n%s", c.name, out)
		}
		// The repair's time is when the agent counts it (polled every 50 ms); whether traffic
		// flows again is checked after, with connection attempts of up to a second each, too
		// coarse to time it.
		waitFor(t, c.name+": counted in hostaccel_drift_repairs_total{datapath=\""+c.datapath+"\"}", 3*period,
			func() bool { return drift(c.datapath) > before })
		d := time.Since(start)
		waitFor(t, c.name+" repaired", 3*period, c.repaired)
		figs = append(figs, c.name+"_repaired_ms", d.Milliseconds())
		if strings.Count(a.log.String(), "drift repaired") <= logs {
			t.Errorf("%s: no log line says the drift was repaired", c.name)
		}
		// One period from the last sync, which may have ended just before the fault, plus the
		// sync's own time and the poll's.
		if d > period+time.Second {
			t.Errorf("%s: repaired after %s, more than one resync period (%s)", c.name, d, period)
		}
	}
	figure(t, figs...)
}

// The API under abuse: 16 clients change one backend 10 times each at once, then malformed,
// unknown-field and oversized bodies: every answer is a 2xx or a 4xx with a message, the state
// file and the kernel agree with the API at the end, and the socket stays 0600.
func TestAPIAbuse(t *testing.T) {
	n := newNode(t)
	a := n.startAgent(t)
	n.ready(t, a.pid(), 30*time.Second)
	c := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "unix", n.socket)
		}}}
	do := func(method, path string, body []byte) (int, string) {
		req, _ := http.NewRequest(method, "http://lb"+path, bytes.NewReader(body))
		resp, err := c.Do(req)
		if err != nil {
			return 0, err.Error()
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	be := "/v1/services/web/backends/" + netip.AddrPortFrom(n.V4.RemotePod, uint16(bePort)).String()
	var wg sync.WaitGroup
	var mu sync.Mutex
	codes := map[int]int{}
	for i := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := range 10 {
				state := []string{"drain", "up"}[(i+j)%2]
				code, body := do("PATCH", be, []byte(`{"state":"`+state+`"}`))
				mu.Lock()
				codes[code]++
				mu.Unlock()
				if code != http.StatusOK {
					t.Errorf("concurrent PATCH: %d %s", code, body)
				}
			}
		}()
	}
	wg.Wait()
	if code, body := do("PATCH", be, []byte(`{"state":"drain"}`)); code != http.StatusOK {
		t.Fatalf("final PATCH: %d %s", code, body)
	}
	backends := func() string {
		out, _ := n.Node.Exec("nft", "list", "map", "inet", lb.NATTable, "web-backends-v4")
		return out
	}
	waitFor(t, "the drained backend to leave the kernel's map", 10*time.Second, func() bool {
		return !strings.Contains(backends(), n.V4.RemotePod.String())
	})
	_, body := do("GET", "/v1/services/web", nil)
	if !strings.Contains(body, `"drain"`) {
		t.Errorf("the API does not show the drain: %s", body)
	}
	if b, err := os.ReadFile(n.dir + "/lb-state.yaml"); err != nil || !strings.Contains(string(b), "drain") {
		t.Errorf("the state file does not keep the drain: %v\n%s", err, b)
	}

	for _, c := range []struct {
		name, body string
		want       int
		msg        string
	}{
		{"malformed", `{"state":`, 400, "unexpected"},
		{"unknown field", `{"stat":"up"}`, 400, "stat"},
		{"bad value", `{"state":"sideways"}`, 400, "sideways"},
		{"oversized", `{"state":"up","x":"` + strings.Repeat("a", 2<<20) + `"}`, 413, "larger than 1 MiB"},
	} {
		code, body := do("PATCH", be, []byte(c.body))
		if code != c.want || !strings.Contains(body, c.msg) {
			t.Errorf("%s body: %d %.200s (want %d with %q)", c.name, code, body, c.want, c.msg)
		}
		codes[code]++
	}
	if strings.Contains(backends(), n.V4.RemotePod.String()) {
		t.Error("a rejected request changed the kernel")
	}
	if fi, err := os.Stat(n.socket); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("API socket: %v %v", fi.Mode(), err)
	}
	if code, body := do("PATCH", be, []byte(`{"state":"up"}`)); code != http.StatusOK {
		t.Fatalf("PATCH up: %d %s", code, body)
	}
	waitFor(t, "the backend back in the kernel's map", 10*time.Second, func() bool {
		return strings.Contains(backends(), n.V4.RemotePod.String())
	})
	figure(t, "concurrent_changes", 160, "answers", answers(codes), "agent_alive", a.alive())
}

// answers formats HTTP status counts as 200x160,400x3 (sorted).
func answers(codes map[int]int) string {
	var out []string
	for _, c := range slices.Sorted(maps.Keys(codes)) {
		out = append(out, fmt.Sprintf("%dx%d", c, codes[c]))
	}
	return strings.Join(out, ",")
}

// A second agent on the node refuses at once, naming the first one's pid, and changes nothing:
// the first keeps its API socket, and the kernel keeps its rules.
func TestTwoAgents(t *testing.T) {
	n := newNode(t)
	a := n.startAgent(t)
	n.ready(t, a.pid(), 30*time.Second)
	before := n.kernelView(t)
	b := exec.Command("ip", "netns", "exec", n.Node.Name, hostaccel, "agent", "-f", n.cfg, "--state-file", n.state+".b",
		"--metrics-address", "", "--lock-file", n.lock)
	start := time.Now()
	out, err := b.CombinedOutput()
	refused := time.Since(start)
	if err == nil || !strings.Contains(string(out), fmt.Sprintf("pid %d", a.pid())) {
		t.Errorf("second agent: %v\n%s", err, out)
	}
	if after := n.kernelView(t); after != before {
		t.Errorf("the second agent changed the kernel")
	}
	if code, body := apiGet(n, "/v1/services/web"); code != http.StatusOK {
		t.Errorf("the first agent's API after the second tried: %d %s", code, body)
	}
	if !a.alive() {
		t.Error("the first agent died")
	}
	figure(t, "second_agent_refused", err != nil, "refused_in_ms", refused.Milliseconds())
}

// apiGet asks the agent's API over its unix socket.
func apiGet(n *node, path string) (int, string) {
	c := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "unix", n.socket)
		}}}
	resp, err := c.Get("http://lb" + path)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}
