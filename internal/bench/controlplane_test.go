package bench

import (
	"context"
	"encoding/json"
	"io"
	"maps"
	"math"
	"strings"
	"testing"

	"github.com/hostaccel/hostaccel/internal/testbed"
)

// A failed sample is no JSON number (null) and reads as failed in the table; medians and
// spreads come from the others.
func TestControlPlaneReport(t *testing.T) {
	rep := &CPReport{Command: "hostaccel bench control-plane", Cells: []*CPCell{
		{Part: "tc", Objects: 100, Step: "full apply", Seconds: []float64{0.2, 0.3, 0.4}, MaxRSSMiB: []float64{30, 31, 32}},
		{Part: "tc", Objects: 10000, Step: "full apply", Seconds: []float64{1.5, math.NaN()}, Errors: []string{"timed out after 2m0s"}, Output: "elements +10003 ~0 -0"},
	}}
	js, err := rep.JSON()
	if err != nil {
		t.Fatal(err)
	}
	var back struct {
		Cells []struct {
			Seconds []*float64 `json:"seconds"`
		} `json:"cells"`
	}
	if err := json.Unmarshal(js, &back); err != nil {
		t.Fatal(err)
	}
	if s := back.Cells[1].Seconds; len(s) != 2 || s[0] == nil || *s[0] != 1.5 || s[1] != nil {
		t.Errorf("seconds of the failed cell: %v", s)
	}
	md := rep.Markdown()
	for _, want := range []string{
		"| step | 100 | 10000 |",
		"| full apply | 300 ms ±33% | 1.50 s ±0% [1 failed: timed out after 2m0s] |",
		"| ↳ MiB | 31 | |",
		"- full apply, 10000: `elements +10003 ~0 -0`",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("markdown lacks %q:\n%s", want, md)
		}
	}
}

// Peer CIDRs and backend addresses are distinct up to the largest size.
func TestControlPlaneObjectsAreDistinct(t *testing.T) {
	cidrs, addrs := map[string]bool{}, map[string]bool{}
	for i := range 50001 {
		cidrs[peerCIDR(i).String()] = true
		addrs[backendAddr(i).String()] = true
	}
	if len(cidrs) != 50001 || len(addrs) != 50001 {
		t.Errorf("%d distinct CIDRs, %d distinct addresses of 50,001", len(cidrs), len(addrs))
	}
}

func TestParseAPIRequests(t *testing.T) {
	body := `# HELP apiserver_request_total [STABLE] Counter of apiserver requests
apiserver_request_total{code="200",component="apiserver",dry_run="",group="",resource="nodes",scope="cluster",subresource="",verb="LIST",version="v1"} 2
apiserver_request_total{code="200",component="apiserver",dry_run="",group="",resource="nodes",scope="cluster",subresource="",verb="LIST",version="v1"} 1
apiserver_request_total{code="0",component="apiserver",dry_run="",group="discovery.k8s.io",resource="endpointslices",scope="cluster",subresource="",verb="WATCH",version="v1"} 3
apiserver_request_total{code="201",component="apiserver",dry_run="",group="",resource="services",scope="namespace",subresource="",verb="POST",version="v1"} 5000
apiserver_request_total{code="200",component="apiserver",dry_run="",group="",resource="pods",scope="cluster",subresource="",verb="LIST",version="v1"} 7
apiserver_longrunning_requests{component="apiserver",group="",resource="services",scope="cluster",subresource="",verb="WATCH",version="v1"} 2
apiserver_longrunning_requests_other 9
`
	got := parseAPIRequests(body)
	want := map[string]int{"LIST nodes": 3, "WATCH endpointslices": 3, "open WATCH services": 2}
	if !maps.Equal(got, want) {
		t.Errorf("got %v, want %v", got, want)
	}
}

// The load balancer's parts build services of 100 backends: a size above 100 that is no
// multiple of 100 is refused (it was 300 backends in lb for 250, and lb-health timed out).
func TestCPSizesFitTheServices(t *testing.T) {
	for _, tc := range []struct {
		parts []string
		sizes []int
		ok    bool
	}{
		{[]string{"lb"}, []int{100, 1000, 50}, true},
		{[]string{"lb-health"}, []int{250}, false},
		{[]string{"tc", "lb"}, []int{1050}, false},
		{[]string{"tc", "flowtable"}, []int{250}, true},
		{[]string{"tc"}, []int{0}, false},
	} {
		if err := (CPOptions{Parts: tc.parts, Sizes: tc.sizes}).Check(); (err == nil) != tc.ok {
			t.Errorf("parts %v sizes %v: %v", tc.parts, tc.sizes, err)
		}
	}
}

// A run that fails makes ControlPlane's error (the command exited 0 with the failure only in
// the report's cells).
func TestControlPlaneSaysARunFailed(t *testing.T) {
	testbed.RequireRoot(t)
	rep, err := ControlPlane(context.Background(), CPOptions{Parts: []string{"no-such-part"}, Sizes: []int{1}, Reps: 1}, &Progress{W: io.Discard})
	if err == nil || !strings.Contains(err.Error(), `1 of 1 runs failed: no-such-part at 1 (rep 1): unknown part "no-such-part"`) || rep == nil {
		t.Errorf("ControlPlane of a part that fails: %v", err)
	}
}
