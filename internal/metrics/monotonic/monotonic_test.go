package monotonic

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// one collects a single metric.
type one struct{ m prometheus.Metric }

func (o one) Describe(ch chan<- *prometheus.Desc) { ch <- o.m.Desc() }
func (o one) Collect(ch chan<- prometheus.Metric) { ch <- o.m }

// A counter that restarts at zero keeps rising; each series (labels) is its own.
func TestCountersCarryOverResets(t *testing.T) {
	d := prometheus.NewDesc("x_total", "x", []string{"k"}, nil)
	var c Counters
	value := func(v uint64, label string) float64 { return testutil.ToFloat64(one{c.Metric(d, v, label)}) }
	for i, step := range []struct {
		v     uint64
		label string
		want  float64
	}{{5, "a", 5}, {7, "a", 7}, {2, "b", 2}, {3, "a", 10}, {1, "a", 11}, {4, "a", 14}, {1, "b", 3}} {
		if got := value(step.v, step.label); got != step.want {
			t.Errorf("step %d: %s %d exported as %v, want %v", i, step.label, step.v, got, step.want)
		}
	}
}
