package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/hostaccel/hostaccel/internal/lb"
	"github.com/hostaccel/hostaccel/internal/testbed"
)

// The control-plane benchmark: how long `hostaccel apply` and `hostaccel render` take, and
// how much memory they use, at 100 to 50,000 objects (peer Pod CIDRs of each datapath, load
// balancer backends), for a first apply and for one changed object, beside raw `nft -f` of
// the same elements (the limit). It drives the binary as a user does, each repetition in a
// fresh network namespace.

// CPParts are the parts measured by default.
var CPParts = []string{"tc", "tc-agent", "flowtable", "lb", "lb-one", "lb-api", "lb-health"}

// CPPartsAll are every part there is: the defaults and k8s (it needs the binaries of
// scripts/k8s-build-test-bins.sh, and a size is Services: 5,000 Services on 1,000 Nodes).
var CPPartsAll = append(slices.Clone(CPParts), "k8s")

// CPOptions configure a control-plane run.
type CPOptions struct {
	Bin     string        // the hostaccel binary
	Sizes   []int         // objects
	Reps    int           // repetitions (parts and sizes interleaved)
	Parts   []string      // of CPParts
	Timeout time.Duration // per step; a step that takes longer is recorded as timed out
	Command string
	// AgentLogs, if set, is a directory that keeps each agent's output (the agent's own
	// "load balancer applied ... took" lines say where a step's time went).
	AgentLogs string
}

// CPCell is one step at one size: its samples.
type CPCell struct {
	Part    string    `json:"part"`
	Objects int       `json:"objects"`
	Step    string    `json:"step"`
	Seconds []float64 `json:"seconds"`
	// MaxRSSMiB is the peak resident memory of the hostaccel process, per sample.
	MaxRSSMiB []float64 `json:"maxRSSMiB,omitempty"`
	// Output is the command's last output line of the last sample (operation counts).
	Output string   `json:"output,omitempty"`
	Errors []string `json:"errors,omitempty"`
}

// CPReport is a control-plane run.
type CPReport struct {
	Command  string    `json:"command"`
	Commit   string    `json:"commit,omitempty"`
	Started  time.Time `json:"started"`
	Finished time.Time `json:"finished"`
	Machine  Machine   `json:"machine"`
	Cells    []*CPCell `json:"cells"`
}

func (rep *CPReport) cell(part string, n int, step string) *CPCell {
	for _, c := range rep.Cells {
		if c.Part == part && c.Objects == n && c.Step == step {
			return c
		}
	}
	c := &CPCell{Part: part, Objects: n, Step: step}
	rep.Cells = append(rep.Cells, c)
	return c
}

// Check says what is wrong with o's sizes: the load balancer's parts build services of 100
// backends, so that a size above 100 must be a multiple of it (250 was 300 backends in lb,
// and lb-health waited for 250 of 200 to come up until it timed out).
func (o CPOptions) Check() error {
	hundreds := slices.ContainsFunc(o.Parts, func(p string) bool { return p == "lb" || p == "lb-health" })
	for _, n := range o.Sizes {
		switch {
		case n < 1:
			return fmt.Errorf("--sizes: %d is not a number of objects", n)
		case hundreds && n > 100 && n%100 != 0:
			return fmt.Errorf("--sizes: %d is no multiple of 100 (the parts lb and lb-health build services of 100 backends)", n)
		}
	}
	return nil
}

// ControlPlane measures o. It needs root (network namespaces). A run (a part at a size) that
// failed is in the report (its cells' errors; the steps after the failure have no sample) and
// makes the error (the command then exits with it, once it wrote the report).
func ControlPlane(ctx context.Context, o CPOptions, prog *Progress) (*CPReport, error) {
	rep := &CPReport{Command: o.Command, Commit: gitCommit(), Started: time.Now(), Machine: CollectMachine()}
	dir, err := os.MkdirTemp("", "hostaccel-cp-")
	if err != nil {
		return rep, err
	}
	defer os.RemoveAll(dir)
	prog.Add(o.Reps * len(o.Sizes) * len(o.Parts))
	var failed []string
	for rep_ := 0; rep_ < o.Reps; rep_++ {
		for _, n := range o.Sizes {
			for i := range o.Parts {
				part := o.Parts[(i+rep_)%len(o.Parts)] // rotate the order every repetition
				if err := ctx.Err(); err != nil {
					rep.Finished = time.Now()
					return rep, err
				}
				prog.Status(fmt.Sprintf("rep %d/%d: %s, %d objects", rep_+1, o.Reps, part, n))
				r := &cpRun{o: o, rep: rep, dir: dir, n: n, part: part}
				err := r.run(ctx)
				res := fmt.Sprintf("rep %d/%d: %s, %d objects: %s", rep_+1, o.Reps, part, n, strings.Join(r.said, ", "))
				if err != nil {
					res += ": " + firstLines(err.Error(), 1)
					failed = append(failed, fmt.Sprintf("%s at %d (rep %d): %s", part, n, rep_+1, firstLines(err.Error(), 1)))
				}
				prog.Done(res)
			}
		}
	}
	rep.Finished = time.Now()
	if len(failed) > 0 {
		return rep, fmt.Errorf("%d of %d runs failed: %s", len(failed), o.Reps*len(o.Sizes)*len(o.Parts), strings.Join(failed, "; "))
	}
	return rep, nil
}

// agentProc is a hostaccel agent the bench runs in a namespace, its output in log.
type agentProc struct {
	cmd *exec.Cmd
	log testbed.SyncBuffer // read while the agent writes it
}

// startAgent runs `hostaccel agent args...` in network namespace ns.
func (r *cpRun) startAgent(ctx context.Context, ns string, args ...string) (*agentProc, error) {
	a := &agentProc{cmd: exec.CommandContext(ctx, "ip", append([]string{"netns", "exec", ns, r.o.Bin, "agent"}, args...)...)}
	a.cmd.Stdout, a.cmd.Stderr = &a.log, &a.log
	if err := a.cmd.Start(); err != nil {
		return nil, err
	}
	return a, nil
}

// startFileAgent runs `hostaccel agent -f cfg args...` in the run's namespace, its lock and
// state files in the run's directory.
func (r *cpRun) startFileAgent(ctx context.Context, cfg string, args ...string) (*agentProc, error) {
	return r.startAgent(ctx, r.ns, append([]string{"-f", cfg,
		"--lock-file", filepath.Join(r.dir, "lock"), "--state-file", filepath.Join(r.dir, "agent-state.json")}, args...)...)
}

// awaitAgent polls done every period until it holds, and returns when the look that saw it
// began (a look at a large ruleset, nft's listing, takes 0.2-1 s: the time it returned would
// count it). Past the run's timeout (counted from start) it records the failure in c, with
// what and the agent's first lines, and returns an error.
func (r *cpRun) awaitAgent(c *CPCell, agent *agentProc, start time.Time, every time.Duration, what string, done func() bool) (time.Time, error) {
	for {
		asked := time.Now()
		if done() {
			return asked, nil
		}
		if time.Since(start) > r.o.Timeout {
			c.Seconds = append(c.Seconds, math.NaN())
			c.Errors = append(c.Errors, what+": "+firstLines(agent.log.String(), 2))
			return asked, errors.New("agent start: timed out")
		}
		time.Sleep(every)
	}
}

// stop ends the agent (SIGTERM: it leaves the kernel's state) and waits for it.
func (a *agentProc) stop() {
	_ = a.cmd.Process.Signal(syscall.SIGTERM)
	_ = a.cmd.Wait()
}

// keepLog writes a stopped agent's output to o.AgentLogs, if set, as <part>-<n>-<time>.log.
func (r *cpRun) keepLog(a *agentProc) {
	if r.o.AgentLogs == "" {
		return
	}
	p := filepath.Join(r.o.AgentLogs, fmt.Sprintf("%s-%d-%s.log", r.part, r.n, time.Now().Format("150405")))
	if os.MkdirAll(r.o.AgentLogs, 0o755) == nil {
		_ = os.WriteFile(p, []byte(a.log.String()), 0o644)
	}
}

type cpRun struct {
	o    CPOptions
	rep  *CPReport
	dir  string
	n    int
	part string
	ns   string
	said []string
}

func (r *cpRun) run(ctx context.Context) error {
	r.ns = fmt.Sprintf("hacp-%d", os.Getpid())
	_ = exec.Command("ip", "netns", "del", r.ns).Run()
	if out, err := exec.Command("ip", "netns", "add", r.ns).CombinedOutput(); err != nil {
		return fmt.Errorf("ip netns add: %v: %s", err, out)
	}
	defer exec.Command("ip", "netns", "del", r.ns).Run()
	switch r.part {
	case "tc":
		return r.tc(ctx)
	case "tc-agent":
		return r.tcAgent(ctx)
	case "flowtable":
		return r.flowtable(ctx)
	case "lb":
		return r.lb(ctx, (r.n+99)/100, min(r.n, 100))
	case "lb-one":
		return r.lb(ctx, 1, r.n)
	case "lb-api":
		return r.lbAPI(ctx)
	case "lb-health":
		return r.lbHealth(ctx)
	case "k8s":
		return r.k8sScale(ctx)
	}
	return fmt.Errorf("unknown part %q", r.part)
}

// peerCIDR is the i-th peer Pod CIDR: /26s from 10.0.0.0/8 (local Pods: 10.255.255.0/24).
func peerCIDR(i int) netip.Prefix {
	return netip.PrefixFrom(netip.AddrFrom4([4]byte{10, byte(i >> 10), byte(i >> 2), byte(i&3) << 6}), 26)
}

// backendAddr is the i-th backend address, from 172.16.0.0/12.
func backendAddr(i int) netip.Addr {
	i++
	return netip.AddrFrom4([4]byte{172, 16 + byte(i>>16), byte(i >> 8), byte(i)})
}

// sh runs a command in the namespace (ns) or here, feeding stdin.
func (r *cpRun) sh(ctx context.Context, inNS bool, stdin string, args ...string) (string, error) {
	if inNS {
		args = append([]string{"ip", "netns", "exec", r.ns}, args...)
	}
	cmd := exec.CommandContext(ctx, args[0], args[1:]...)
	if stdin != "" {
		cmd.Stdin = strings.NewReader(stdin)
	}
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("%s: %v: %s", strings.Join(args, " "), err, firstLines(string(out), 3))
	}
	return string(out), nil
}

// timed runs one measured step and records it.
func (r *cpRun) timed(ctx context.Context, step, stdin string, args ...string) error {
	c := r.rep.cell(r.part, r.n, step)
	ctx, cancel := context.WithTimeout(ctx, r.o.Timeout)
	defer cancel()
	full := append([]string{"ip", "netns", "exec", r.ns}, args...)
	cmd := exec.CommandContext(ctx, full[0], full[1:]...)
	if stdin != "" {
		cmd.Stdin = strings.NewReader(stdin)
	}
	start := time.Now()
	out, err := cmd.CombinedOutput()
	d := time.Since(start).Seconds()
	if ctx.Err() == context.DeadlineExceeded {
		err = fmt.Errorf("timed out after %s", r.o.Timeout)
	}
	if err != nil {
		c.Seconds = append(c.Seconds, math.NaN())
		c.Errors = append(c.Errors, fmt.Sprintf("%v: %s", err, firstLines(string(out), 2)))
		r.said = append(r.said, step+" failed")
		return fmt.Errorf("%s: %w", step, err)
	}
	c.Seconds = append(c.Seconds, d)
	if ru, ok := cmd.ProcessState.SysUsage().(*syscall.Rusage); ok && filepath.Base(args[0]) == filepath.Base(r.o.Bin) {
		c.MaxRSSMiB = append(c.MaxRSSMiB, float64(ru.Maxrss)/1024)
	}
	if lines := strings.Split(strings.TrimSpace(string(out)), "\n"); args[1] == "apply" && len(lines[len(lines)-1]) < 300 {
		c.Output = lines[len(lines)-1]
	}
	r.said = append(r.said, fmt.Sprintf("%s %.3fs", step, d))
	return nil
}

func (r *cpRun) write(name, content string) (string, error) {
	p := filepath.Join(r.dir, name)
	return p, os.WriteFile(p, []byte(content), 0o644)
}

func (r *cpRun) apply(ctx context.Context, step, cfg string) error {
	p, err := r.write(fmt.Sprintf("%s-%d-%s.yaml", r.part, r.n, strings.ReplaceAll(step, " ", "-")), cfg)
	if err != nil {
		return err
	}
	return r.timed(ctx, step, "", r.o.Bin, "apply", "-f", p, "--lock-file", filepath.Join(r.dir, "lock"))
}

// nodeConfig is a node with n peer Pod CIDRs (the first one replaced by another when
// changed) on datapath dp.
func nodeConfig(dp string, n int, changed bool) string {
	var b strings.Builder
	fmt.Fprintf(&b, "datapath: %s\ntc: {natCheck: off}\nnode:\n  gateways: [gw]\n  transports: [eth0]\n  localPodCIDRs: [10.255.255.0/24]\n  peerPodCIDRs:\n", dp)
	for i := range n {
		p := peerCIDR(i)
		if changed && i == 0 {
			p = peerCIDR(n)
		}
		fmt.Fprintf(&b, "  - %s\n", p)
	}
	b.WriteString("classes:\n  pod-to-pod: true\n  node-to-remote-pod: true\n")
	return b.String()
}

// node makes the devices and one route per peer CIDR (noEncap routing, as in Kindnet).
func (r *cpRun) node(ctx context.Context, n int) error {
	var b strings.Builder
	b.WriteString("link add gw type veth peer name gw-peer\nlink add eth0 type veth peer name eth0-peer\nlink set gw up\nlink set gw-peer up\nlink set eth0 up\nlink set eth0-peer up\n")
	b.WriteString("addr add 10.255.255.1/24 dev gw\naddr add 192.168.0.1/16 dev eth0\n")
	for i := range n + 1 {
		fmt.Fprintf(&b, "route add %s via 192.168.%d.%d dev eth0\n", peerCIDR(i), 1+i/250%250, 1+i%250)
	}
	_, err := r.sh(ctx, true, b.String(), "ip", "-batch", "-")
	return err
}

func (r *cpRun) tc(ctx context.Context) error {
	if err := r.node(ctx, r.n); err != nil {
		return err
	}
	if err := r.apply(ctx, "full apply", nodeConfig("tc", r.n, false)); err != nil {
		return err
	}
	if err := r.apply(ctx, "one CIDR replaced", nodeConfig("tc", r.n, true)); err != nil {
		return err
	}
	return r.apply(ctx, "no change", nodeConfig("tc", r.n, true))
}

// flowtable measures render (the host kernel may lack the flowtable, so apply is not
// measured here) and raw nft -f of the same number of interval elements.
func (r *cpRun) flowtable(ctx context.Context) error {
	p, err := r.write(fmt.Sprintf("ft-%d.yaml", r.n), nodeConfig("flowtable", r.n, false))
	if err != nil {
		return err
	}
	if err := r.timed(ctx, "render", "", r.o.Bin, "render", "-f", p); err != nil {
		return err
	}
	return r.rawNFT(ctx, "type ipv4_addr; flags interval", func(i int) string { return peerCIDR(i).String() })
}

// rawNFT loads n elements into a fresh set of type typ with one nft -f, then one more, as
// the limit of what hostaccel's applies can do.
func (r *cpRun) rawNFT(ctx context.Context, typ string, elem func(int) string) error {
	kind := "set"
	if strings.Contains(typ, ":") {
		kind = "map"
	}
	var b strings.Builder
	fmt.Fprintf(&b, "table inet cpbench {\n %s s { %s; }\n}\nadd element inet cpbench s {", kind, typ)
	for i := range r.n {
		if i > 0 {
			b.WriteString(",")
		}
		if i%100 == 99 {
			b.WriteString("\n")
		}
		b.WriteString(elem(i))
	}
	b.WriteString("}\n")
	if err := r.timed(ctx, "raw nft -f, all", b.String(), "nft", "-f", "-"); err != nil {
		return err
	}
	return r.timed(ctx, "raw nft -f, one more", "add element inet cpbench s { "+elem(r.n)+" }\n", "nft", "-f", "-")
}

// lbConfig is services x backends (dnat, rr); drained: the first backend of the first
// service is drained; grown: services x backends were fewer.
func lbConfig(services, backends int, drained bool) string {
	return lbConfigDrained(services, backends, func(s, i int) bool { return drained && s == 0 && i == 0 })
}

// lbConfigDrained is lbConfig with backend i of service s drained where drained says so.
func lbConfigDrained(services, backends int, drained func(s, i int) bool) string {
	var b strings.Builder
	b.WriteString("datapath: none\nloadBalancer:\n  services:\n")
	k := 0
	for s := range services {
		fmt.Fprintf(&b, "  - name: s%d\n    vips: [%s]\n    port: 80\n    topology: dnat\n    scheduler: rr\n    backends:\n",
			s, netip.AddrFrom4([4]byte{198, 18, byte(s >> 8), byte(s)}))
		for i := range backends {
			state := ""
			if drained(s, i) {
				state = ", state: drain"
			}
			fmt.Fprintf(&b, "    - {address: %s, port: 8080%s}\n", backendAddr(k), state)
			k++
		}
	}
	return b.String()
}

func (r *cpRun) lb(ctx context.Context, services, backends int) error {
	if _, err := r.sh(ctx, true, "", "ip", "link", "set", "lo", "up"); err != nil {
		return err
	}
	if err := r.apply(ctx, "full apply", lbConfig(services, backends, false)); err != nil {
		return err
	}
	if err := r.apply(ctx, "one backend drained", lbConfig(services, backends, true)); err != nil {
		return err
	}
	if err := r.apply(ctx, "no change", lbConfig(services, backends, true)); err != nil {
		return err
	}
	// Growing tenfold: a fresh table of a tenth, then the full size.
	if _, err := r.sh(ctx, true, "", r.o.Bin, "cleanup", "--lock-file", filepath.Join(r.dir, "lock")); err != nil {
		return err
	}
	small := lbConfig(max(services/10, 1), backends, false)
	if services == 1 {
		small = lbConfig(1, max(backends/10, 1), false)
	}
	if p, err := r.write("lb-small.yaml", small); err != nil {
		return err
	} else if _, err := r.sh(ctx, true, "", r.o.Bin, "apply", "-f", p, "--lock-file", filepath.Join(r.dir, "lock")); err != nil {
		return err
	}
	if err := r.apply(ctx, "grown from a tenth", lbConfig(services, backends, false)); err != nil {
		return err
	}
	_, _ = r.sh(ctx, true, "", "nft", "delete", "table", "inet", "hostaccel-lb")
	return r.rawNFT(ctx, "typeof numgen inc mod 1 : ip daddr . tcp dport", func(i int) string {
		return fmt.Sprintf("%d : %s . 8080", i, backendAddr(i))
	})
}

// JSON is the report with every sample.
func (rep *CPReport) JSON() ([]byte, error) {
	// NaN is no JSON number: failed samples become null.
	cells := make([]map[string]any, 0, len(rep.Cells))
	for _, c := range rep.Cells {
		secs := make([]any, len(c.Seconds))
		for i, s := range c.Seconds {
			if !math.IsNaN(s) {
				secs[i] = s
			}
		}
		m := map[string]any{"part": c.Part, "objects": c.Objects, "step": c.Step, "seconds": secs, "stats": Summarize(c.Seconds)}
		if len(c.MaxRSSMiB) > 0 {
			m["maxRSSMiB"] = c.MaxRSSMiB
		}
		if c.Output != "" {
			m["output"] = c.Output
		}
		if len(c.Errors) > 0 {
			m["errors"] = c.Errors
		}
		cells = append(cells, m)
	}
	return json.MarshalIndent(map[string]any{
		"command": rep.Command, "commit": rep.Commit, "started": rep.Started, "finished": rep.Finished,
		"machine": rep.Machine, "cells": cells,
	}, "", "  ")
}

var cpPartTitles = map[string]string{
	"tc":        "tc datapath: peer Pod CIDRs (one route each), `hostaccel apply`",
	"tc-agent":  "tc datapath agent: peer Pod CIDRs (one route each); the config file rewritten (renamed over) with one CIDR replaced, then back, 24 a repetition 1.5 s apart (a resync period among them), until the program's map has the new CIDR (looked up every millisecond); the agent's start until the map has every CIDR; its resident memory after them",
	"flowtable": "flowtable datapath: peer Pod CIDRs, `hostaccel render` (this host has no flowtable to apply to)",
	"lb":        "load balancer: services of 100 backends (dnat, rr), `hostaccel apply`",
	"lb-one":    "load balancer: one service with all the backends, `hostaccel apply`",
	"lb-api":    "load balancer agent: services of 5 backends; a drain until the backend leaves the kernel's map, by an API request (the agent's latency) and by `hostaccel lb backend drain` (adds the CLI's start), 5 each a repetition, and by the config file rewritten (renamed over) until the kernel's transaction for that service (`nft monitor`), 5 a repetition; the agent's resident memory after them",
	"k8s":       "Kubernetes mode: the agent (datapath none, load balancer) against the real kube-apiserver of test/k8s holding N Services (ClusterIP, one port, an EndpointSlice of 2 ready endpoints each) and N/5 Nodes; an endpoint's change until the kernel's transaction for its Service (`nft monitor`), 10 each way a repetition; a Node created until the agent's state has it; the agent's memory; the API server's LIST and WATCH requests while the changes ran",
	"lb-health": "load balancer agent: services of 100 backends, a TCP health check every second on each (timeout 500ms, fall 2, rise 1); backends answered by one listener behind a local route; the agent's CPU per second of checking (a core = 1 s), a backend refused (RST) until out of its map and accepted again until back (3 a repetition)",
}

// Markdown is the report as tables: per part, a row per step, a column per size.
func (rep *CPReport) Markdown() string {
	var b strings.Builder
	w := func(f string, a ...any) { fmt.Fprintf(&b, f+"\n", a...) }
	w("# hostaccel bench control-plane, %s%s", rep.Started.Format("2006-01-02"), map[bool]string{true: " (" + rep.Commit + ")", false: ""}[rep.Commit != ""])
	w("")
	w("`%s`", rep.Command)
	w("")
	w("Seconds per step: median (± spread: every sample within median × (1 ± spread)); the peak")
	w("resident memory of the hostaccel process in MiB below each apply (the agents of tc-agent and")
	w("lb-api: their resident memory read once, after their steps). Each repetition in a fresh")
	w("network namespace; parts interleaved.")
	var sizes []int
	var parts []string
	for _, c := range rep.Cells {
		if !slices.Contains(sizes, c.Objects) {
			sizes = append(sizes, c.Objects)
		}
		if !slices.Contains(parts, c.Part) {
			parts = append(parts, c.Part)
		}
	}
	slices.Sort(sizes)
	for _, part := range parts {
		w("")
		w("## %s", cpPartTitles[part])
		w("")
		head := "| step |"
		sep := "| --- |"
		for _, n := range sizes {
			head += fmt.Sprintf(" %d |", n)
			sep += " ---: |"
		}
		w("%s", head)
		w("%s", sep)
		var steps []string
		for _, c := range rep.Cells {
			if c.Part == part && !slices.Contains(steps, c.Step) {
				steps = append(steps, c.Step)
			}
		}
		var outputs []string
		for _, step := range steps {
			row, mem := "| "+step+" |", "| ↳ MiB |"
			anyMem := false
			for _, n := range sizes {
				c := rep.find(part, n, step)
				if c == nil {
					row += " |"
					mem += " |"
					continue
				}
				row += " " + c.text() + " |"
				if len(c.MaxRSSMiB) > 0 {
					anyMem = true
					mem += fmt.Sprintf(" %.0f |", Summarize(c.MaxRSSMiB).Median)
				} else {
					mem += " |"
				}
				if c.Output != "" && n == sizes[len(sizes)-1] {
					outputs = append(outputs, fmt.Sprintf("%s, %d: `%s`", step, n, c.Output))
				}
			}
			w("%s", row)
			if anyMem {
				w("%s", mem)
			}
		}
		if len(outputs) > 0 {
			w("")
			for _, o := range outputs {
				w("- %s", o)
			}
		}
	}
	w("")
	w("## Machine")
	w("")
	m := rep.Machine
	w("%s, %d CPUs, %d MiB; kernel %s; %s; %s; %s", m.CPU, m.CPUs, m.MemoryMiB, m.Kernel, m.OS, m.Nft, m.Go)
	return b.String()
}

func (rep *CPReport) find(part string, n int, step string) *CPCell {
	for _, c := range rep.Cells {
		if c.Part == part && c.Objects == n && c.Step == step {
			return c
		}
	}
	return nil
}

func (c *CPCell) text() string {
	s := Summarize(c.Seconds)
	failed := len(c.Seconds) - s.N
	out := ""
	if s.N > 0 {
		out = fmt.Sprintf("%s ±%.0f%%", fmtSeconds(s.Median), 100*s.Spread)
	}
	if failed > 0 {
		reason := ""
		if len(c.Errors) > 0 {
			reason = ": " + strings.ReplaceAll(firstLines(c.Errors[0], 1), "|", "/")
			if len(reason) > 60 {
				reason = reason[:60] + "…"
			}
		}
		out = strings.TrimSpace(out + fmt.Sprintf(" [%d failed%s]", failed, reason))
	}
	return out
}

func fmtSeconds(s float64) string {
	if s < 1 {
		return fmt.Sprintf("%.0f ms", s*1000)
	}
	return fmt.Sprintf("%.2f s", s)
}

// Write saves the report as DIR/<date>-<commit>-control-plane.{md,json}.
func (rep *CPReport) Write(dir string) ([]string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	base := rep.Started.Format("2006-01-02")
	if rep.Commit != "" {
		base += "-" + rep.Commit
	}
	base += "-control-plane"
	js, err := rep.JSON()
	if err != nil {
		return nil, err
	}
	var paths []string
	var errs []error
	for ext, data := range map[string][]byte{".md": []byte(rep.Markdown()), ".json": js} {
		p := filepath.Join(dir, base+ext)
		errs = append(errs, os.WriteFile(p, data, 0o644))
		paths = append(paths, p)
	}
	slices.Sort(paths)
	return paths, errors.Join(errs...)
}

// warmUp drains the last service's last backend through the API and puts it back, waiting
// each time until the kernel's map shows it.
func (r *cpRun) warmUp(ctx context.Context, client *lb.Client, services int) error {
	svc := services - 1
	addr := backendAddr(svc*5 + 4).String()
	m := fmt.Sprintf("s%d-backends-v4", svc)
	for _, st := range []string{lb.StateDrain, lb.StateUp} {
		if err := client.Do(ctx, http.MethodPatch, lb.BackendPath(fmt.Sprintf("s%d", svc), addr+":8080"), map[string]any{"state": st}, nil); err != nil {
			return fmt.Errorf("warm-up %s: %w", st, err)
		}
		if math.IsNaN(r.untilMap(ctx, m, addr, st == lb.StateUp)) {
			return fmt.Errorf("warm-up %s: the map did not follow in 30s", st)
		}
	}
	return nil
}

// lbAPI runs the agent with n/5 services of 5 backends and times drains through its API:
// from the call until the backend has left the service's slot map in the kernel.
func (r *cpRun) lbAPI(ctx context.Context) error {
	if _, err := r.sh(ctx, true, "", "ip", "link", "set", "lo", "up"); err != nil {
		return err
	}
	services := max(r.n/5, 1)
	sock := filepath.Join(r.dir, "lb.sock")
	head := fmt.Sprintf("loadBalancer:\n  api: {socket: %s}\n  stateFile: %s\n", sock, filepath.Join(r.dir, "lb-state.yaml"))
	cfg := strings.Replace(lbConfig(services, 5, false), "loadBalancer:\n", head, 1)
	_ = os.Remove(filepath.Join(r.dir, "lb-state.yaml"))
	p, err := r.write("lb-api.yaml", cfg)
	if err != nil {
		return err
	}
	start := time.Now()
	agent, err := r.startFileAgent(ctx, p)
	if err != nil {
		return err
	}
	defer func() { agent.stop(); r.keepLog(agent) }()
	last := fmt.Sprintf("s%d-backends-v4", services-1)
	c := r.rep.cell(r.part, r.n, "agent start until the last service is in the kernel")
	seen, err := r.awaitAgent(c, agent, start, 50*time.Millisecond, "the agent did not install the services", func() bool {
		out, _ := r.sh(ctx, true, "", "nft", "list", "map", "inet", "hostaccel-lb", last)
		return strings.Contains(out, " : ")
	})
	if err != nil {
		return err
	}
	c.Seconds = append(c.Seconds, seen.Sub(start).Seconds())
	r.said = append(r.said, fmt.Sprintf("agent start %.2fs", seen.Sub(start).Seconds()))
	// The API answers once the change is applied; the map is then checked (and polled, if
	// need be: each nft listing costs as much as a sync at thousands of services, so polling
	// hard would slow the agent it measures).
	// Two ways in: the API request itself (the agent's latency, as another program sees it)
	// and the CLI a user types (adds starting the hostaccel process).
	api := r.rep.cell(r.part, r.n, "drain: API request until out of the map")
	cli := r.rep.cell(r.part, r.n, "drain: `hostaccel lb backend drain` until out of the map")
	client := lb.NewClient(sock, "", "")
	// Untimed first: one backend drained and put back, each until the map shows it. The first
	// change after the start waited for the agent's reading back of its first sync; it fell
	// to the API's cell in every repetition (0.8-1 s among 0.05-0.13 s at 10,000 objects).
	if err := r.warmUp(ctx, client, services); err != nil {
		return err
	}
	viaAPI := map[int]bool{}
	for k := range 10 {
		svc := (k * 7919) % services
		viaAPI[svc] = true
		addr := backendAddr(svc*5 + k%5).String()
		m := fmt.Sprintf("s%d-backends-v4", svc)
		t0 := time.Now()
		cell := api
		var err error
		if k%2 == 0 {
			err = client.Do(ctx, http.MethodPatch, lb.BackendPath(fmt.Sprintf("s%d", svc), addr+":8080"), map[string]any{"state": lb.StateDrain}, nil)
		} else {
			cell = cli
			_, err = r.sh(ctx, true, "", r.o.Bin, "lb", "backend", "drain", fmt.Sprintf("s%d", svc), addr+":8080", "--socket", sock)
		}
		if err != nil {
			cell.Seconds = append(cell.Seconds, math.NaN())
			cell.Errors = append(cell.Errors, err.Error())
			continue
		}
		answered := time.Since(t0)
		for first := true; ; first = false {
			out, err := r.sh(ctx, true, "", "nft", "list", "map", "inet", "hostaccel-lb", m)
			if err == nil && !strings.Contains(out, addr+" . ") {
				d := time.Since(t0)
				if first {
					d = answered // gone at the first look: the API answered after the change
				}
				cell.Seconds = append(cell.Seconds, d.Seconds())
				break
			}
			if time.Since(t0) > 30*time.Second {
				cell.Seconds = append(cell.Seconds, math.NaN())
				cell.Errors = append(cell.Errors, "still in the map after 30s")
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	// A third way in: the config file rewritten (renamed over, as config management does)
	// with one more backend drained: the agent's watch of the file, its parse of all of it
	// and the sync, until the kernel's transaction for that service (`nft monitor`).
	mon, err := startMonitor(ctx, r.ns)
	if err != nil {
		return err
	}
	defer mon.stop()
	file := r.rep.cell(r.part, r.n, "drain: config file rewritten until the kernel's transaction")
	drained := map[[2]int]bool{}
	for k := range 5 {
		// Not a service the API changed: its state file's entries win over the file.
		svc := (k*104729 + 3) % services
		for range services {
			if !viaAPI[svc] && !drained[[2]int{svc, 4}] {
				break
			}
			svc = (svc + 1) % services
		}
		drained[[2]int{svc, 4}] = true
		body := strings.Replace(lbConfigDrained(services, 5, func(s, i int) bool { return drained[[2]int{s, i}] }), "loadBalancer:\n", head, 1)
		tmp, err := r.write("lb-api.yaml.tmp", body)
		if err != nil {
			return err
		}
		time.Sleep(1200 * time.Millisecond) // past the agent's minSyncInterval: an event after a quiet spell
		seen := mon.expect(fmt.Sprintf("hostaccel-lb s%d-backends-v4 ", svc))
		t0 := time.Now()
		if err := os.Rename(tmp, p); err != nil {
			return err
		}
		file.await(seen, t0, fmt.Sprintf("s%d", svc))
	}
	drain := api
	r.said = append(r.said, fmt.Sprintf("drains by API %v, by CLI %v, by the file %v", api.Seconds[len(api.Seconds)-5:], cli.Seconds[len(cli.Seconds)-5:], file.Seconds))
	if rss, _ := procMemMiB(agent.cmd.Process.Pid); !math.IsNaN(rss) {
		drain.MaxRSSMiB = append(drain.MaxRSSMiB, rss)
	}
	return nil
}
