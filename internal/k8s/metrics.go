package k8s

import (
	"github.com/prometheus/client_golang/prometheus"
)

var (
	descConnected = prometheus.NewDesc("hostaccel_kubernetes_connected",
		"1 while the Kubernetes API server answers; 0 while the agent keeps the last applied state without it.", nil, nil)
	descLastContact = prometheus.NewDesc("hostaccel_kubernetes_last_contact_timestamp_seconds",
		"When the API server last answered (Unix time).", nil, nil)
	descSynced = prometheus.NewDesc("hostaccel_kubernetes_synced",
		"1 once the Node, Service and EndpointSlice informers have listed their objects.", nil, nil)
	descWatchErrors = prometheus.NewDesc("hostaccel_kubernetes_watch_errors_total",
		"List and watch failures of the informers.", nil, nil)
	descDerivations = prometheus.NewDesc("hostaccel_kubernetes_derivations_total",
		"Configs derived from the API.", nil, nil)
	descChanges = prometheus.NewDesc("hostaccel_kubernetes_config_changes_total",
		"Derivations that changed the config.", nil, nil)
	descLastChange = prometheus.NewDesc("hostaccel_kubernetes_last_change_timestamp_seconds",
		"When the derived config last changed (Unix time).", nil, nil)
	descDeriveFailing = prometheus.NewDesc("hostaccel_kubernetes_derive_failing",
		"1 while the latest derivation is rejected and the last good config stays.", nil, nil)
	descPeers = prometheus.NewDesc("hostaccel_kubernetes_peers",
		"Other Nodes, by whether the peer policy accelerates them.", []string{"accelerated"}, nil)
	descFronts = prometheus.NewDesc("hostaccel_kubernetes_lb_fronts",
		"Load balancer fronts derived from Services (per Service port, front and IP family).", nil, nil)
	descBackends = prometheus.NewDesc("hostaccel_kubernetes_lb_backends",
		"Load balancer backends derived from EndpointSlices, by state.", []string{"state"}, nil)
)

// Describe implements prometheus.Collector: register a Source on the agent's registry.
func (s *Source) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descConnected, descLastContact, descSynced, descWatchErrors, descDerivations,
		descChanges, descLastChange, descDeriveFailing, descPeers, descFronts, descBackends} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (s *Source) Collect(ch chan<- prometheus.Metric) {
	st := s.Status()
	gauge := func(d *prometheus.Desc, v float64, lv ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, lv...)
	}
	counter := func(d *prometheus.Desc, v int) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v))
	}
	gauge(descConnected, b2f(st.Connected))
	if !st.LastContact.IsZero() {
		gauge(descLastContact, float64(st.LastContact.UnixNano())/1e9)
	}
	gauge(descSynced, b2f(st.Synced))
	counter(descWatchErrors, st.WatchErrors)
	counter(descDerivations, st.Derivations)
	counter(descChanges, st.Changes)
	if !st.LastChange.IsZero() {
		gauge(descLastChange, float64(st.LastChange.UnixNano())/1e9)
	}
	gauge(descDeriveFailing, b2f(st.DeriveError != ""))
	var accel, other, fronts float64
	backends := map[string]float64{StateUp: 0, StateDrain: 0, StateDown: 0}
	if sum := st.Summary; sum != nil {
		for _, p := range sum.Peers {
			if p.Accelerated {
				accel++
			} else {
				other++
			}
		}
		fronts = float64(len(sum.Balanced))
		for _, f := range sum.Balanced {
			for _, b := range f.Backends {
				backends[b.State]++
			}
		}
	}
	gauge(descPeers, accel, "true")
	gauge(descPeers, other, "false")
	gauge(descFronts, fronts)
	for state, n := range backends {
		gauge(descBackends, n, state)
	}
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
