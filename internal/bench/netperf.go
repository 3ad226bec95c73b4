package bench

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/hostaccel/hostaccel/internal/testbed"
)

// NetperfResult is one netperf run.
type NetperfResult struct {
	Value   float64 `json:"value"` // Mbit/s for TCP_STREAM, transactions/s otherwise
	Unit    string  `json:"unit"`
	Elapsed float64 `json:"elapsedSeconds,omitempty"`
	// LocalCPU and RemoteCPU are the CPUs netperf and netserver were bound to (-1: none).
	LocalCPU  int `json:"localCPU"`
	RemoteCPU int `json:"remoteCPU"`
}

// netperfKeys are the omni output selectors asked for (netperf -- -k).
const netperfKeys = "THROUGHPUT,THROUGHPUT_UNITS,ELAPSED_TIME,PROTOCOL,DIRECTION,LOCAL_CPU_BIND,REMOTE_CPU_BIND"

// Unit returns the unit a test reports in.
func Unit(test string) string {
	if test == TCPStream {
		return "Mbit/s"
	}
	return "trans/s"
}

// ParseNetperf reads netperf's output: the key=value lines of `-- -k` (preferred), or the
// classic table netperf prints without -k.
func ParseNetperf(test, out string) (NetperfResult, error) {
	r := NetperfResult{LocalCPU: -1, RemoteCPU: -1, Unit: Unit(test)}
	kv := map[string]string{}
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		k, v, ok := strings.Cut(strings.TrimSpace(sc.Text()), "=")
		if ok && k != "" && strings.ToUpper(k) == k && !strings.ContainsAny(k, " \t") {
			kv[k] = v
		}
	}
	if t, ok := kv["THROUGHPUT"]; ok {
		v, err := strconv.ParseFloat(t, 64)
		if err != nil {
			return r, fmt.Errorf("netperf: THROUGHPUT=%q: %w", t, err)
		}
		r.Value = v
		if e, err := strconv.ParseFloat(kv["ELAPSED_TIME"], 64); err == nil {
			r.Elapsed = e
		}
		if c, err := strconv.Atoi(kv["LOCAL_CPU_BIND"]); err == nil {
			r.LocalCPU = c
		}
		if c, err := strconv.Atoi(kv["REMOTE_CPU_BIND"]); err == nil {
			r.RemoteCPU = c
		}
		units := kv["THROUGHPUT_UNITS"]
		switch {
		case test == TCPStream && units != "" && units != "10^6bits/s":
			return r, fmt.Errorf("netperf: %s throughput in %q, want 10^6bits/s", test, units)
		case test != TCPStream && units != "" && units != "Trans/s":
			return r, fmt.Errorf("netperf: %s throughput in %q, want Trans/s", test, units)
		}
		return r, nil
	}
	return parseClassic(test, out, r)
}

// parseClassic reads the table netperf prints by default: the first line made of numbers
// only is the result; the throughput is its last field for TCP_STREAM and its sixth for the
// request/response tests (socket sizes, request, response, elapsed, rate).
func parseClassic(test, out string, r NetperfResult) (NetperfResult, error) {
	for line := range strings.Lines(out) {
		f := strings.Fields(line)
		if len(f) < 5 || !allNumbers(f) {
			continue
		}
		idx, elapsed := len(f)-1, len(f)-2
		if test != TCPStream {
			if len(f) < 6 {
				continue
			}
			idx, elapsed = 5, 4
		}
		r.Value, _ = strconv.ParseFloat(f[idx], 64)
		r.Elapsed, _ = strconv.ParseFloat(f[elapsed], 64)
		return r, nil
	}
	return r, fmt.Errorf("netperf: no result in output: %s", firstLines(out, 3))
}

func allNumbers(f []string) bool {
	for _, s := range f {
		if _, err := strconv.ParseFloat(s, 64); err != nil {
			return false
		}
	}
	return true
}

func firstLines(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	if len(lines) > n {
		lines = lines[:n]
	}
	return strings.Join(lines, " | ")
}

// NetperfCmd is one netperf invocation.
type NetperfCmd struct {
	Test     string
	Host     string // server address as the client sees it (a Pod, a ClusterIP, a node IP)
	Ctrl     int    // control port
	Data     int    // data port (netserver listens on it; a Service must carry it)
	Duration time.Duration
	Pin      Pinning
	// MsgSize is the message size (-m for TCP_STREAM, -r N,N for the others); 0: netperf's.
	MsgSize int
}

// Args returns the command line (without the namespace).
func (c NetperfCmd) Args() []string {
	secs := max(int((c.Duration+time.Second/2)/time.Second), 1)
	args := append(c.Pin.prefix(), "netperf", "-H", c.Host, "-p", strconv.Itoa(c.Ctrl), "-t", c.Test,
		"-l", strconv.Itoa(secs), "-P", "0")
	if c.Pin.Enabled {
		args = append(args, "-T", fmt.Sprintf("%d,%d", c.Pin.CPU, c.Pin.CPU))
	}
	args = append(args, "--", "-P", ","+strconv.Itoa(c.Data), "-k", netperfKeys)
	if c.MsgSize > 0 && c.Test == TCPStream {
		args = append(args, "-m", strconv.Itoa(c.MsgSize))
	} else if c.MsgSize > 0 {
		args = append(args, "-r", fmt.Sprintf("%d,%d", c.MsgSize, c.MsgSize))
	}
	return args
}

// Run runs netperf in the client namespace and parses its result.
func (c NetperfCmd) Run(ctx context.Context, client *testbed.NS) (NetperfResult, string, error) {
	secs := max(int((c.Duration+time.Second/2)/time.Second), 1)
	// Generous: in the VM the guest's clock runs several times slower than the wall's.
	ctx, cancel := context.WithTimeout(ctx, time.Duration(secs)*time.Second*15+60*time.Second)
	defer cancel()
	out, err := client.Command(ctx, c.Args()...).CombinedOutput()
	if err != nil {
		if ctx.Err() != nil && !errors.Is(ctx.Err(), context.DeadlineExceeded) {
			return NetperfResult{}, string(out), ctx.Err()
		}
		return NetperfResult{}, string(out), fmt.Errorf("netperf %s to %s: %w: %s", c.Test, c.Host, err, firstLines(string(out), 3))
	}
	r, err := ParseNetperf(c.Test, string(out))
	return r, string(out), err
}

// NetserverArgs is the command line of a netserver (in the foreground, IPv4).
func NetserverArgs(pin Pinning) []string {
	return append(pin.prefix(), "netserver", "-D", "-4", "-p", strconv.Itoa(CtrlPort))
}
