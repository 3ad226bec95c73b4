// Package metrics exports the agent's Prometheus metrics.
package metrics

import (
	"context"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/hostaccel/hostaccel/internal/agent"
	"github.com/hostaccel/hostaccel/internal/metrics/monotonic"
)

// Metrics holds the agent's metrics on its own registry.
type Metrics struct {
	Registry   *prometheus.Registry
	syncs      prometheus.Counter
	syncErrors prometheus.Counter
	duration   prometheus.Histogram
	devices    prometheus.Gauge
	healthy    prometheus.Gauge
	drift      *prometheus.CounterVec
	driftSeen  map[string]int // agent.State.DriftRepairs as last observed
}

// New registers the metrics; gather reads the kernel's view at scrape time.
func New(gather func(context.Context) agent.Status) *Metrics {
	m := &Metrics{
		Registry:   prometheus.NewRegistry(),
		syncs:      prometheus.NewCounter(prometheus.CounterOpts{Name: "hostaccel_syncs_total", Help: "Reconciliations run."}),
		syncErrors: prometheus.NewCounter(prometheus.CounterOpts{Name: "hostaccel_sync_errors_total", Help: "Reconciliations that failed."}),
		duration: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "hostaccel_sync_duration_seconds",
			Help: "Time one reconciliation took.", Buckets: prometheus.ExponentialBuckets(0.005, 2, 12)}),
		devices: prometheus.NewGauge(prometheus.GaugeOpts{Name: "hostaccel_devices", Help: "Gateway and transport devices the fastpath serves."}),
		healthy: prometheus.NewGauge(prometheus.GaugeOpts{Name: "hostaccel_healthy",
			Help: "1 when the last sync succeeded and nothing is degraded, else 0."}),
		drift: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "hostaccel_drift_repairs_total",
			Help: "Syncs that found a datapath's kernel state changed outside hostaccel (rules, programs, maps) and repaired it."}, []string{"datapath"}),
		driftSeen: map[string]int{},
	}
	for _, d := range agent.DriftDatapaths {
		m.drift.WithLabelValues(d)
	}
	m.Registry.MustRegister(m.syncs, m.syncErrors, m.duration, m.devices, m.healthy, m.drift,
		&kernelCollector{gather: gather},
		// The agent's own health under churn: go_goroutines, go_memstats_*, process_resident_memory_bytes, process_open_fds.
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

// ObserveSync records one sync (agent.Options.OnSync).
func (m *Metrics) ObserveSync(d time.Duration, st agent.State, err error) {
	m.syncs.Inc()
	if err != nil {
		m.syncErrors.Inc()
	}
	m.duration.Observe(d.Seconds())
	m.devices.Set(float64(len(st.Devices)))
	for d, n := range st.DriftRepairs {
		if n > m.driftSeen[d] {
			m.drift.WithLabelValues(d).Add(float64(n - m.driftSeen[d]))
			m.driftSeen[d] = n
		}
	}
	if st.Healthy {
		m.healthy.Set(1)
	} else {
		m.healthy.Set(0)
	}
}

// Handler serves /metrics.
func (m *Metrics) Handler() http.Handler {
	return promhttp.HandlerFor(m.Registry, promhttp.HandlerOpts{})
}

var (
	classPackets = prometheus.NewDesc("hostaccel_class_packets_total",
		"Packets of a traffic class that took the normal path through the forward chain (offloaded packets skip it).", []string{"class"}, nil)
	classBytes = prometheus.NewDesc("hostaccel_class_bytes_total",
		"Bytes of a traffic class that took the normal path through the forward chain.", []string{"class"}, nil)
	offloaded = prometheus.NewDesc("hostaccel_offloaded_flows",
		"Conntrack entries offloaded to the flowtable right now.", nil, nil)
	installed  = prometheus.NewDesc("hostaccel_table_installed", "1 when table inet hostaccel exists (absent when nft could not be read: hostaccel_status_read_errors).", nil, nil)
	readErrors = prometheus.NewDesc("hostaccel_status_read_errors",
		"1 when the scrape could not read a part of the kernel's state (source: nftables, conntrack, tc, sockmap); that part's metrics are left out of the scrape.", []string{"source"}, nil)
	tcPackets = prometheus.NewDesc("hostaccel_tc_redirected_packets_total",
		"Packets the tc datapath redirected past the host stack.", []string{"class", "family"}, nil)
	tcBytes = prometheus.NewDesc("hostaccel_tc_redirected_bytes_total",
		"Bytes the tc datapath redirected past the host stack.", []string{"class", "family"}, nil)
	tcPassed = prometheus.NewDesc("hostaccel_tc_passed_packets_total",
		"Packets the tc datapath handed to the normal stack, by reason.", []string{"reason"}, nil)
	tcVia = prometheus.NewDesc("hostaccel_tc_redirected_via_packets_total",
		"Packets the tc datapath redirected another way than to the FIB's next hop as it is: peer (into a Pod's namespace), neigh (next hop resolved by the neighbour code), forwarding-off (the agent's route), nat-carried (translated as conntrack says: a NAT-ed flow the flowtable offloaded, in no class), express (by an express lane: a CPU's slot for the pair or the carried flow).", []string{"via"}, nil)
	tcHandedMarked = prometheus.NewDesc("hostaccel_tc_handed_marked",
		"Client ends handed to the stack that the tc program has marked now (replies to them take the handed lookup and, if NAT-ed, the stack), of 262,144 marks; aged once more than 1/16 are set.", nil, nil)
	tcHandedAgings = prometheus.NewDesc("hostaccel_tc_handed_agings_total",
		"Agings of the tc program's handed marks: the marks of client ends whose NAT-ed connections were gone were voided.", nil, nil)
	smSockets = prometheus.NewDesc("hostaccel_sockmap_sockets",
		"Sockets in the sockmap datapath's map now (both ends of each local-pod-to-pod connection).", nil, nil)
	smDraining = prometheus.NewDesc("hostaccel_sockmap_draining_sockets",
		"Sockets still in the maps of removed or replaced sockmap program sets (their messages take TCP).", nil, nil)
	smEntered = prometheus.NewDesc("hostaccel_sockmap_entered_sockets_total",
		"Sockets the sockmap datapath entered into its map, by family.", []string{"family"}, nil)
	smEnterFailed = prometheus.NewDesc("hostaccel_sockmap_enter_failed_total",
		"Sockets that qualified for the sockmap datapath but could not be entered (map full, or another sockmap user's socket).", nil, nil)
	smMessages = prometheus.NewDesc("hostaccel_sockmap_messages_total",
		"Messages (sendmsg, sendfile) of sockets in the map: redirected socket to socket, or passed to TCP.", []string{"result"}, nil)
	smBytes = prometheus.NewDesc("hostaccel_sockmap_bytes_total",
		"Bytes of those messages.", []string{"result"}, nil)
	smBounded = prometheus.NewDesc("hostaccel_sockmap_bounded_total",
		"Connection directions the sockmap datapath turned to TCP because the receiver held its bound (maxQueued) unread.", nil, nil)
)

// kernelCollector turns rule counters into monotonic counters: a rebuilt table starts its
// counters at zero again, so the value before the reset is carried over.
type kernelCollector struct {
	gather   func(context.Context) agent.Status
	counters monotonic.Counters
}

func (c *kernelCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{readErrors, classPackets, classBytes, offloaded, installed, tcPackets, tcBytes, tcPassed, tcVia, tcHandedMarked, tcHandedAgings, smSockets, smDraining, smEntered, smEnterFailed, smMessages, smBytes, smBounded} {
		ch <- d
	}
}

// readSources are the parts of the kernel's state a scrape reads (agent.Status.Errors' keys).
var readSources = []string{"nftables", "conntrack", "tc", "sockmap"}

// Collect reads the kernel and exports it. A part that could not be read exports nothing of
// what it would have said (a sockmap status read half way had zero counters, taken for a
// reset and counted again at the next reading; a table that could not be listed was "not
// installed"), and hostaccel_status_read_errors says which part failed.
func (c *kernelCollector) Collect(ch chan<- prometheus.Metric) {
	c.counters.Scrape(func(sc *monotonic.Scrape) {
		// (the deadline counts from the turn: a scrape that waited for another keeps its 5 s)
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		st := c.gather(ctx)
		failed := func(source string) bool { _, bad := st.Errors[source]; return bad }
		if len(st.Errors) > 0 {
			sc.Partial()
		}
		counter := func(desc *prometheus.Desc, v uint64, labels ...string) { ch <- sc.Metric(desc, v, labels...) }
		gauge := func(desc *prometheus.Desc, v float64, labels ...string) {
			ch <- prometheus.MustNewConstMetric(desc, prometheus.GaugeValue, v, labels...)
		}
		for _, src := range readSources {
			gauge(readErrors, b2f(failed(src)), src)
		}
		if !failed("nftables") {
			for _, cs := range st.Classes {
				counter(classPackets, cs.Packets, string(cs.Class))
				counter(classBytes, cs.Bytes, string(cs.Class))
			}
			gauge(installed, b2f(st.Table != nil))
		}
		if t := st.TC; t != nil && !failed("tc") {
			for _, cs := range t.Classes {
				counter(tcPackets, cs.Packets, string(cs.Class), cs.Family)
				counter(tcBytes, cs.Bytes, string(cs.Class), cs.Family)
			}
			for reason, n := range t.Passed {
				counter(tcPassed, n.Packets, reason)
			}
			for via, n := range t.Via {
				counter(tcVia, n.Packets, via)
			}
			if h := t.Handed; h != nil {
				gauge(tcHandedMarked, float64(h.Marked))
				counter(tcHandedAgings, uint64(h.Epoch-1))
			}
		}
		if sm := st.Sockmap; sm != nil && !failed("sockmap") {
			gauge(smSockets, float64(sm.Sockets))
			gauge(smDraining, float64(sm.Draining))
			for fam, n := range sm.Entered {
				counter(smEntered, n, fam)
			}
			counter(smEnterFailed, sm.EnterFailed)
			counter(smMessages, sm.Redirected.Count, "redirected")
			counter(smMessages, sm.Passed.Count, "passed")
			counter(smBytes, sm.Redirected.Bytes, "redirected")
			counter(smBytes, sm.Passed.Bytes, "passed")
			counter(smBounded, sm.Bounded.Count)
		}
		if !failed("conntrack") {
			gauge(offloaded, float64(len(st.Offloaded)))
		}
	})
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
