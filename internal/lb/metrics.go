package lb

import (
	"context"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/hostaccel/hostaccel/internal/metrics/monotonic"
)

var (
	descHealth = prometheus.NewDesc("hostaccel_lb_backend_health",
		"1 for the backend's current health state (up, down, unknown: not checked yet or no check).", []string{"service", "backend", "state"}, nil)
	descActive = backendDesc("hostaccel_lb_backend_active",
		"1 when the backend is in the maps that pick backends for new connections.")
	descTransitions = backendDesc("hostaccel_lb_backend_transitions_total",
		"Health transitions (up <-> down) of the backend.")
	descChecks = backendDesc("hostaccel_lb_backend_checks_total",
		"Health checks run against the backend.")
	descFailures = backendDesc("hostaccel_lb_backend_check_failures_total",
		"Health checks of the backend that failed.")
	descLastCheck = backendDesc("hostaccel_lb_backend_last_check_timestamp_seconds",
		"When the backend was last checked (Unix time).")
	descPackets = prometheus.NewDesc("hostaccel_lb_service_packets_total",
		"Packets the service's chains counted: new connections (snat, dnat) or every packet (dsr, stateless-dnat).", []string{"service"}, nil)
	descTableFull = prometheus.NewDesc("hostaccel_lb_service_flow_table_full_packets_total",
		"Packets (dsr, stateless-dnat) and new connections (snat, dnat with persistence) sent by a hash of their flow or client, not recorded, because the service's flow table was full (flowTableSize).", []string{"service"}, nil)
	descReads = prometheus.NewDesc("hostaccel_lb_kernel_reads_total",
		"Readings of the load balancer's tables back from the kernel (nft loads the whole ruleset for each, seconds of CPU at thousands of services): "+
			"full (diffed against the tables read whole), full_skipped (due, but no one committed since our last apply), "+
			"chain_listed (a rewritten chain read from the kernel), chain_rehearsed (rendered by nft in a namespace of its own instead).", []string{"kind"}, nil)
)

func backendDesc(name, help string) *prometheus.Desc {
	return prometheus.NewDesc(name, help, []string{"service", "backend"}, nil)
}

// NewCollector exports the load balancer's state at scrape time; status is usually
// Runtime.Status with counters. Rule counters restart at zero when a chain is rewritten, so
// the exported counters carry the value from before over.
func NewCollector(status func(context.Context) Status) prometheus.Collector {
	return &collector{status: status}
}

type collector struct {
	status   func(context.Context) Status
	counters monotonic.Counters
}

func (c *collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descHealth, descActive, descTransitions, descChecks, descFailures, descLastCheck, descPackets, descTableFull, descReads} {
		ch <- d
	}
}

// Collect exports the status. A service's packets are the sum of its chains' counters (one
// per family), each of which restarts at zero apart: each is made monotonic before the sum (a
// family's chain deleted was a reset of the sum, and the other family's packets were counted
// again), and none is exported by a scrape whose reading of them failed.
func (c *collector) Collect(ch chan<- prometheus.Metric) {
	c.counters.Scrape(func(sc *monotonic.Scrape) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second) // from the turn
		defer cancel()
		st := c.status(ctx)
		if st.countersFailed {
			sc.Partial()
		}
		gauge := func(d *prometheus.Desc, v float64, l ...string) {
			ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, l...)
		}
		counter := func(d *prometheus.Desc, v float64, l ...string) {
			ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, v, l...)
		}
		for _, s := range st.Services {
			for _, b := range s.Backends {
				for _, state := range []HealthState{HealthUp, HealthDown, HealthUnknown} {
					gauge(descHealth, b2f(b.Health.State == state), s.Name, b.Key, string(state))
				}
				gauge(descActive, b2f(b.Active), s.Name, b.Key)
				counter(descTransitions, float64(b.Health.Transitions), s.Name, b.Key)
				counter(descChecks, float64(b.Health.Checks), s.Name, b.Key)
				counter(descFailures, float64(b.Health.Failures), s.Name, b.Key)
				if !b.Health.LastCheck.IsZero() {
					gauge(descLastCheck, float64(b.Health.LastCheck.UnixNano())/1e9, s.Name, b.Key)
				}
			}
			if st.countersFailed {
				continue
			}
			counter(descPackets, sc.Sum(descPackets, s.packetParts, s.Name), s.Name)
			if s.Topology == DSR || s.Topology == StatelessDNAT || s.Service.Persistence != nil {
				counter(descTableFull, sc.Sum(descTableFull, s.fullParts, s.Name), s.Name)
			}
		}
		for kind, n := range map[string]uint64{"full": st.Reads.Full, "full_skipped": st.Reads.FullSkipped,
			"chain_listed": st.Reads.ChainsListed, "chain_rehearsed": st.Reads.ChainsRehearsed} {
			counter(descReads, float64(n), kind)
		}
	})
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
