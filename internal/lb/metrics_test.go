package lb

import (
	"context"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/hostaccel/hostaccel/internal/metrics/monotonic"
)

// A dual-stack service's packets are its chains' counters summed, one per family: the v6 VIP
// removed (its chain and counter deleted) keeps the v6 packets, and does not count the v4
// ones again (the sum, made monotonic as one, fell from 1500 to 1000: a reset, 2510 for
// 1510). A scrape whose reading of the counters failed exports no packets.
func TestServicePacketsSumTheFamilies(t *testing.T) {
	parts := map[string]uint64{"inet hostaccel-lb web-v4": 1000, "inet hostaccel-lb web-v6": 500}
	failed := false
	reg := prometheus.NewRegistry()
	reg.MustRegister(NewCollector(func(context.Context) Status {
		var sum uint64
		for _, n := range parts {
			sum += n
		}
		return Status{Services: []ServiceStatus{{Name: "web", Packets: sum, packetParts: parts}}, countersFailed: failed}
	}))
	want := func(v string) {
		t.Helper()
		exp := `
# HELP hostaccel_lb_service_packets_total Packets the service's chains counted: new connections (snat, dnat) or every packet (dsr, stateless-dnat).
# TYPE hostaccel_lb_service_packets_total counter
`
		if v != "" {
			exp += `hostaccel_lb_service_packets_total{service="web"} ` + v + "\n"
		}
		if err := testutil.GatherAndCompare(reg, strings.NewReader(exp), "hostaccel_lb_service_packets_total"); err != nil {
			t.Error(err)
		}
	}
	want("1500")
	parts = map[string]uint64{"inet hostaccel-lb web-v4": 1000}
	want("1500")
	parts = map[string]uint64{"inet hostaccel-lb web-v4": 1010}
	want("1510")
	failed, parts = true, nil
	want("")
	failed, parts = false, map[string]uint64{"inet hostaccel-lb web-v4": 1020}
	want("1520")
}

// A chain rewritten (its counter back at 0) is carried over; scrapes whose reading of the
// counters failed export nothing and forget nothing: the carried-over packets stay (they were
// forgotten after Forget such scrapes, and the counter fell).
func TestFailedReadsKeepWhatWasCarriedOver(t *testing.T) {
	parts := map[string]uint64{"inet hostaccel-lb web-v4": 1000}
	failed := false
	reg := prometheus.NewRegistry()
	reg.MustRegister(NewCollector(func(context.Context) Status {
		return Status{Services: []ServiceStatus{{Name: "web", packetParts: parts}}, countersFailed: failed}
	}))
	want := func(v string) {
		t.Helper()
		exp := "# HELP hostaccel_lb_service_packets_total Packets the service's chains counted: new connections (snat, dnat) or every packet (dsr, stateless-dnat).\n# TYPE hostaccel_lb_service_packets_total counter\n"
		if v != "" {
			exp += `hostaccel_lb_service_packets_total{service="web"} ` + v + "\n"
		}
		if err := testutil.GatherAndCompare(reg, strings.NewReader(exp), "hostaccel_lb_service_packets_total"); err != nil {
			t.Error(err)
		}
	}
	want("1000")
	parts = map[string]uint64{"inet hostaccel-lb web-v4": 10} // chain rewritten: 1010
	want("1010")
	failed = true
	for range monotonic.Forget + 1 {
		want("")
	}
	failed, parts = false, map[string]uint64{"inet hostaccel-lb web-v4": 20}
	want("1020")
}
