// Package monotonic exports counters that restart at zero (nft rule counters when their table
// or chain is rebuilt, tc program counters when the program is replaced) as Prometheus
// counters that never fall.
package monotonic

import (
	"strings"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
)

// Forget is how many scrapes in a row that read everything may miss a series before it is
// forgotten (a Service deleted, a class turned off): Counters stays the size of what exists.
// A scrape that could not read a part (Scrape.Partial) ages nothing: what the part's series
// carried over must not go while it is unread.
const Forget = 3

// Counters remembers, for each series, the last value seen and what resets have taken away.
// The zero value is ready; it is safe for concurrent scrapes.
type Counters struct {
	mu     sync.Mutex
	series map[series]*state
	scrape uint64 // scrapes that read everything
}

type series struct {
	desc   *prometheus.Desc
	labels string
}

type state struct {
	base  float64            // what parts counted before they fell or went away
	parts map[string]float64 // each part's last value
	seen  uint64             // the last scrape that read the series
}

// Scrape runs read, which reads the kernel and records what it read with the Scrape it is
// given, under the counters' lock: scrapes at once take turns, so that a reading older than
// one already recorded is never taken for a reset (a scrape that read 100 and recorded it
// after another's 110 carried 110 over for good). A series that Forget scrapes in a row did
// not record is dropped afterwards.
func (c *Counters) Scrape(read func(*Scrape)) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.series == nil {
		c.series = map[series]*state{}
	}
	c.scrape++
	sc := &Scrape{c: c}
	read(sc)
	if sc.partial {
		c.scrape-- // as if it had not been: it proves no series gone
		for _, s := range c.series {
			s.seen = min(s.seen, c.scrape)
		}
		return
	}
	for k, s := range c.series {
		if c.scrape-s.seen >= Forget {
			delete(c.series, k)
		}
	}
}

// Scrape records the readings of one scrape (Counters.Scrape).
type Scrape struct {
	c       *Counters
	partial bool
}

// Partial says that this scrape could not read a part of what it exports: no series is
// forgotten for being missed by it.
func (s *Scrape) Partial() { s.partial = true }

// Value is v as the counter of desc with labels exports it: when v falls below the last value
// seen (the kernel's counter restarted at zero), that value is carried over into this and
// every later one.
func (s *Scrape) Value(desc *prometheus.Desc, v uint64, labels ...string) float64 {
	return s.Sum(desc, map[string]uint64{"": v}, labels...)
}

// Sum is Value for a counter that adds up parts (the kernel's counters by name: a service's
// chain per family), each of which restarts at zero, or goes away, apart: what a part had
// counted when it fell or went away is carried over. (Made monotonic as one, the sum fell
// when one part went away, and the parts left were counted again.)
func (s *Scrape) Sum(desc *prometheus.Desc, parts map[string]uint64, labels ...string) float64 {
	k := series{desc, strings.Join(labels, "\x00")}
	st := s.c.series[k]
	if st == nil {
		st = &state{parts: map[string]float64{}}
		s.c.series[k] = st
	}
	for name, last := range st.parts {
		if v, ok := parts[name]; !ok || float64(v) < last {
			st.base += last
			delete(st.parts, name)
		}
	}
	total := st.base
	for name, v := range parts {
		st.parts[name] = float64(v)
		total += float64(v)
	}
	st.seen = s.c.scrape
	return total
}

// Metric is Value as a counter metric of desc with labels.
func (s *Scrape) Metric(desc *prometheus.Desc, v uint64, labels ...string) prometheus.Metric {
	return prometheus.MustNewConstMetric(desc, prometheus.CounterValue, s.Value(desc, v, labels...), labels...)
}
