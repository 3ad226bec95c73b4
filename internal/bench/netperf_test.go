package bench

import (
	"os"
	"strings"
	"testing"
	"time"
)

func TestParseNetperf(t *testing.T) {
	cases := []struct {
		file, test string
		value      float64
		unit       string
		cpu        int
	}{
		{"netperf-stream.keyval", TCPStream, 11894.72, "Mbit/s", 1},
		{"netperf-rr.keyval", TCPRR, 67920.72, "trans/s", 1},
		{"netperf-crr.keyval", TCPCRR, 14993.41, "trans/s", 1},
		{"netperf-stream.classic", TCPStream, 5040.79, "Mbit/s", -1},
		{"netperf-rr.classic", TCPRR, 21465.95, "trans/s", -1},
		{"netperf-crr.classic", TCPCRR, 14523.50, "trans/s", -1},
	}
	for _, c := range cases {
		t.Run(c.file, func(t *testing.T) {
			out, err := os.ReadFile("testdata/" + c.file)
			if err != nil {
				t.Fatal(err)
			}
			r, err := ParseNetperf(c.test, string(out))
			if err != nil {
				t.Fatal(err)
			}
			if r.Value != c.value || r.Unit != c.unit || r.Elapsed != 1.00 {
				t.Errorf("got %+v, want value %v %s in 1.00 s", r, c.value, c.unit)
			}
			if r.LocalCPU != c.cpu || r.RemoteCPU != c.cpu {
				t.Errorf("cpu bind %d,%d, want %d", r.LocalCPU, r.RemoteCPU, c.cpu)
			}
		})
	}
}

func TestParseNetperfErrors(t *testing.T) {
	out, err := os.ReadFile("testdata/netperf-noserver.txt")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ParseNetperf(TCPRR, string(out)); err == nil || !strings.Contains(err.Error(), "no result") {
		t.Errorf("no-server output: err = %v, want no result", err)
	}
	if _, err := ParseNetperf(TCPRR, "THROUGHPUT=abc\n"); err == nil {
		t.Error("bad number accepted")
	}
	// A stream result in the wrong unit must not pass as Mbit/s.
	if _, err := ParseNetperf(TCPStream, "THROUGHPUT=12\nTHROUGHPUT_UNITS=10^3bits/s\n"); err == nil {
		t.Error("wrong unit accepted")
	}
	if _, err := ParseNetperf(TCPRR, ""); err == nil {
		t.Error("empty output accepted")
	}
}

func TestNetperfArgs(t *testing.T) {
	pin, err := ParsePin("auto", 2)
	if err != nil {
		t.Fatal(err)
	}
	c := NetperfCmd{Test: TCPRR, Host: "10.96.0.10", Ctrl: 12865, Data: 12866, Duration: 5 * time.Second, Pin: pin}
	got := strings.Join(c.Args(), " ")
	want := "taskset -c 1 netperf -H 10.96.0.10 -p 12865 -t TCP_RR -l 5 -P 0 -T 1,1 -- -P ,12866 -k " + netperfKeys
	if got != want {
		t.Errorf("args:\n got %s\nwant %s", got, want)
	}
	c.Pin, c.Duration = Pinning{}, 300*time.Millisecond
	if got := strings.Join(c.Args(), " "); !strings.HasPrefix(got, "netperf -H") || !strings.Contains(got, "-l 1 ") || strings.Contains(got, "-T") {
		t.Errorf("unpinned, short: %s", got)
	}
	if got := strings.Join(NetserverArgs(pin), " "); got != "taskset -c 1 netserver -D -4 -p 12865" {
		t.Errorf("netserver: %s", got)
	}
}

func TestParsePin(t *testing.T) {
	for _, c := range []struct {
		in      string
		ncpu    int
		enabled bool
		cpu     int
		err     bool
	}{
		{"auto", 2, true, 1, false},
		{"auto", 1, true, 0, false},
		{"none", 2, false, 0, false},
		{"0", 2, true, 0, false},
		{"2", 2, false, 0, true},
		{"x", 2, false, 0, true},
	} {
		p, err := ParsePin(c.in, c.ncpu)
		if (err != nil) != c.err || (err == nil && (p.Enabled != c.enabled || p.CPU != c.cpu)) {
			t.Errorf("ParsePin(%q, %d) = %+v, %v", c.in, c.ncpu, p, err)
		}
	}
}
