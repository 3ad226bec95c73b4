// Package monotonic exports counters that restart at zero (nft rule counters when their table
// or chain is rebuilt, tc program counters when the program is replaced) as Prometheus
// counters that never fall.
package monotonic

import (
	"strings"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
)

// Counters remembers, for each series, the last value seen and what resets have taken away.
// The zero value is ready; it is safe for concurrent scrapes.
type Counters struct {
	mu         sync.Mutex
	base, last map[series]float64
}

type series struct {
	desc   *prometheus.Desc
	labels string
}

// Metric is v as a counter of desc with labels: when v falls below the last value seen (the
// kernel's counter restarted at zero), that value is carried over into this and every later one.
func (c *Counters) Metric(desc *prometheus.Desc, v uint64, labels ...string) prometheus.Metric {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.base == nil {
		c.base, c.last = map[series]float64{}, map[series]float64{}
	}
	k := series{desc, strings.Join(labels, "\x00")}
	f := float64(v)
	if f < c.last[k] {
		c.base[k] += c.last[k]
	}
	c.last[k] = f
	return prometheus.MustNewConstMetric(desc, prometheus.CounterValue, c.base[k]+f, labels...)
}
