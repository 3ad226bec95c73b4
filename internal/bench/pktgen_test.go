package bench

import (
	"os"
	"strings"
	"testing"
)

func TestParsePktgen(t *testing.T) {
	out, err := os.ReadFile("testdata/pktgen-eth0.txt")
	if err != nil {
		t.Fatal(err)
	}
	r, err := ParsePktgen(string(out))
	if err != nil {
		t.Fatal(err)
	}
	want := PktgenResult{Sent: 200000, Errors: 0, USec: 842915, PPS: 237271, Size: 64}
	if r != want {
		t.Errorf("got %+v, want %+v", r, want)
	}
	// Sent comes from pkts-sofar, errors too.
	r, err = ParsePktgen(strings.Replace(string(out), "pkts-sofar: 200000  errors: 0", "pkts-sofar: 199990  errors: 10", 1))
	if err != nil || r.Sent != 199990 || r.Errors != 10 {
		t.Errorf("with errors: %+v %v", r, err)
	}
	// The rate is read after the result: a device named like a rate is no rate.
	r, err = ParsePktgen(strings.ReplaceAll(string(out), "eth0", "v7pps"))
	if err != nil || r.PPS != 237271 {
		t.Errorf("device v7pps: %+v %v", r, err)
	}
	if _, err := ParsePktgen("Params: count 1\nResult: Idle\n"); err == nil || !strings.Contains(err.Error(), "Idle") {
		t.Errorf("idle result: %v", err)
	}
	if _, err := ParsePktgen(""); err == nil {
		t.Error("empty accepted")
	}
}
