package bench

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/hostaccel/hostaccel/internal/testbed"
)

// healthCheckYAML is the check every service of lb-health has.
const healthCheckYAML = "    healthCheck: {type: tcp, interval: 1s, timeout: 500ms, fall: 2, rise: 1}\n"

// lbHealth runs the agent with n backends (services of 100) under a TCP health check every
// second each. One listener behind a local route for the whole backend range answers them
// all. It measures the agent's start until every backend is checked up, the CPU the agent
// spends per second of checking, how long a backend refused with RST takes to leave its
// service's map and, accepted again, to come back, and the agent's goroutines, open files and
// threads before and after (a leak would show as growth).
func (r *cpRun) lbHealth(ctx context.Context) error {
	ns, err := testbed.NewNS("cph")
	if err != nil {
		return err
	}
	defer ns.Close()
	r.ns = ns.Name
	if _, err := r.sh(ctx, true, "", "ip", "route", "add", "local", "172.16.0.0/12", "dev", "lo"); err != nil {
		return err
	}
	var ln net.Listener
	if err := ns.Do(func() (err error) { ln, err = net.Listen("tcp4", ":8080"); return err }); err != nil {
		return err
	}
	defer ln.Close()
	testbed.CloseAccepted(ln)

	services, per := max(r.n/100, 1), min(r.n, 100)
	cfg := strings.ReplaceAll(lbConfig(services, per, false), "    scheduler: rr\n", "    scheduler: rr\n"+healthCheckYAML)
	p, err := r.write("lb-health.yaml", cfg)
	if err != nil {
		return err
	}
	const metricsAddr = "127.0.0.1:9464"
	start := time.Now()
	agent, err := r.startFileAgent(ctx, p, "--metrics-address", metricsAddr)
	if err != nil {
		return err
	}
	defer agent.stop()
	client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
		DialContext: func(ctx context.Context, network, addr string) (c net.Conn, err error) {
			err = ns.Do(func() (derr error) { c, derr = (&net.Dialer{}).DialContext(ctx, network, addr); return derr })
			return c, err
		},
	}}
	defer client.CloseIdleConnections()

	up := r.rep.cell(r.part, r.n, "agent start until every backend is checked up")
	var first agentMetrics
	for {
		m, err := scrapeAgent(ctx, client, "http://"+metricsAddr+"/metrics")
		if err == nil && m.up == r.n {
			first = m
			break
		}
		if time.Since(start) > r.o.Timeout || agent.cmd.ProcessState != nil {
			up.Seconds = append(up.Seconds, math.NaN())
			up.Errors = append(up.Errors, fmt.Sprintf("%d of %d backends up (%v): %s", m.up, r.n, err, firstLines(agent.log.String(), 2)))
			return errors.New("agent start: timed out")
		}
		time.Sleep(200 * time.Millisecond)
	}
	up.Seconds = append(up.Seconds, time.Since(start).Seconds())

	pid := agent.cmd.Process.Pid // ip netns exec execs the agent: the same process
	const window = 10 * time.Second
	cpu0, err := cpuSeconds(pid)
	if err != nil {
		return err
	}
	time.Sleep(window)
	cpu1, err := cpuSeconds(pid)
	if err != nil {
		return err
	}
	cpu := r.rep.cell(r.part, r.n, "agent CPU per second of checking")
	cpu.Seconds = append(cpu.Seconds, (cpu1-cpu0)/window.Seconds())

	if _, err := r.sh(ctx, true, "table inet hacp-fail {\n chain in {\n  type filter hook input priority 0;\n }\n}\n", "nft", "-f", "-"); err != nil {
		return err
	}
	down := r.rep.cell(r.part, r.n, "backend refused until out of its map")
	back := r.rep.cell(r.part, r.n, "backend accepted again until back in its map")
	for k := range 3 {
		b := (k*7919 + 13) % r.n
		addr := backendAddr(b).String()
		m := fmt.Sprintf("s%d-backends-v4", b/per)
		if _, err := r.sh(ctx, true, "", "nft", "add", "rule", "inet", "hacp-fail", "in", "ip", "daddr", addr, "tcp", "dport", "8080", "reject", "with", "tcp", "reset"); err != nil {
			return err
		}
		down.Seconds = append(down.Seconds, r.untilMap(ctx, m, addr, false))
		if _, err := r.sh(ctx, true, "", "nft", "flush", "chain", "inet", "hacp-fail", "in"); err != nil {
			return err
		}
		back.Seconds = append(back.Seconds, r.untilMap(ctx, m, addr, true))
	}
	last, err := scrapeAgent(ctx, client, "http://"+metricsAddr+"/metrics")
	if err != nil {
		return err
	}
	cpu.Output = fmt.Sprintf("goroutines %d -> %d, open fds %d -> %d, threads %d -> %d, resident %.0f -> %.0f MiB",
		first.goroutines, last.goroutines, first.fds, last.fds, first.threads, last.threads, first.rssMiB, last.rssMiB)
	r.said = append(r.said, fmt.Sprintf("up %.1fs, CPU %.2f, down %v, back %v, %s", up.Seconds[len(up.Seconds)-1],
		cpu.Seconds[len(cpu.Seconds)-1], down.Seconds[len(down.Seconds)-3:], back.Seconds[len(back.Seconds)-3:], cpu.Output))
	return nil
}

// untilMap polls the service's map until addr is in it (present) or not, and returns the
// seconds that took (NaN after 30 s): until the listing that saw it began, not until it
// returned (a listing of a large ruleset is 0.2-1 s).
func (r *cpRun) untilMap(ctx context.Context, m, addr string, present bool) float64 {
	t0 := time.Now()
	for time.Since(t0) < 30*time.Second && ctx.Err() == nil {
		asked := time.Now()
		out, err := r.sh(ctx, true, "", "nft", "list", "map", "inet", "hostaccel-lb", m)
		if err == nil && strings.Contains(out, addr+" . ") == present {
			return asked.Sub(t0).Seconds()
		}
		time.Sleep(50 * time.Millisecond)
	}
	return math.NaN()
}

type agentMetrics struct {
	up, goroutines, fds, threads int
	rssMiB                       float64
}

// scrapeAgent reads the agent's /metrics: backends up, goroutines, open fds, OS threads and
// resident memory.
func scrapeAgent(ctx context.Context, c *http.Client, url string) (agentMetrics, error) {
	var m agentMetrics
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return m, err
	}
	resp, err := c.Do(req)
	if err != nil {
		return m, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return m, fmt.Errorf("%s: %s", url, resp.Status)
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		name, value, ok := strings.Cut(line, " ")
		if !ok || strings.HasPrefix(line, "#") {
			continue
		}
		v, _ := strconv.ParseFloat(value, 64)
		switch {
		case strings.HasPrefix(name, "hostaccel_lb_backend_health{") && strings.Contains(name, `state="up"`) && v == 1:
			m.up++
		case name == "go_goroutines":
			m.goroutines = int(v)
		case name == "process_open_fds":
			m.fds = int(v)
		case name == "go_threads":
			m.threads = int(v)
		case name == "process_resident_memory_bytes":
			m.rssMiB = v / (1 << 20)
		}
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	return m, sc.Err()
}

// cpuSeconds is the user and system CPU time process pid has used.
func cpuSeconds(pid int) (float64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// The fields after the command name (which may hold spaces) in parentheses.
	_, rest, ok := strings.Cut(string(b), ") ")
	f := strings.Fields(rest)
	if !ok || len(f) < 13 {
		return 0, fmt.Errorf("/proc/%d/stat: unexpected %q", pid, b)
	}
	utime, err1 := strconv.ParseFloat(f[11], 64)
	stime, err2 := strconv.ParseFloat(f[12], 64)
	if err := errors.Join(err1, err2); err != nil {
		return 0, err
	}
	return (utime + stime) / 100, nil // USER_HZ is 100 on Linux
}
