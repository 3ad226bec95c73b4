package monotonic

import (
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

var d = prometheus.NewDesc("x_total", "x", []string{"k"}, nil)

// value records one reading in a scrape of its own.
func value(c *Counters, v uint64, label string) (f float64) {
	c.Scrape(func(s *Scrape) { f = s.Value(d, v, label) })
	return f
}

// A counter that restarts at zero keeps rising; each series (labels) is its own.
func TestCountersCarryOverResets(t *testing.T) {
	var c Counters
	for i, step := range []struct {
		a, b         uint64
		wantA, wantB float64
	}{{5, 2, 5, 2}, {7, 2, 7, 2}, {3, 2, 10, 2}, {1, 1, 11, 3}, {4, 1, 14, 3}} {
		var a, b float64
		c.Scrape(func(s *Scrape) { a, b = s.Value(d, step.a, "a"), s.Value(d, step.b, "b") })
		if a != step.wantA || b != step.wantB {
			t.Errorf("step %d: a %d, b %d exported as %v, %v, want %v, %v", i, step.a, step.b, a, b, step.wantA, step.wantB)
		}
	}
}

// Two scrapes at once: the one that read the kernel first (100) takes its turn before the
// one that read it later (110). Recorded the other way round, 100 after 110 was a reset and
// 110 was carried over for good (230 for a counter of 120).
func TestConcurrentScrapesTakeTurns(t *testing.T) {
	var c Counters
	var kernel sync.Mutex
	pk := uint64(90)
	read := func() uint64 { kernel.Lock(); defer kernel.Unlock(); pk += 10; return pk }
	started := make(chan struct{})
	release := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		c.Scrape(func(s *Scrape) {
			v := read() // 100
			close(started)
			<-release
			s.Value(d, v, "a")
		})
	}()
	<-started
	done, bRead := make(chan struct{}), make(chan struct{})
	go func() {
		c.Scrape(func(s *Scrape) { v := read(); close(bRead); s.Value(d, v, "a") })
		close(done)
	}()
	// The second scrape reads now if nothing holds it back (it did), else after the first.
	select {
	case <-bRead:
	case <-time.After(100 * time.Millisecond):
	}
	close(release)
	wg.Wait()
	<-done
	if got := value(&c, read(), "a"); got != 120 {
		t.Errorf("after two scrapes at once, 120 is exported as %v", got)
	}
}

// A series no scrape reads is forgotten after Forget scrapes (a Service deleted): the map
// stays the size of what exists, and a series that comes back starts afresh.
func TestUnreadSeriesForgotten(t *testing.T) {
	var c Counters
	for i := range 1000 {
		value(&c, 5, string(rune('a'+i%26))+string(rune(i)))
	}
	value(&c, 7, "kept")
	value(&c, 8, "kept")
	if n := len(c.series); n > Forget {
		t.Errorf("%d series remembered, want at most %d", n, Forget)
	}
	if got := value(&c, 9, "kept"); got != 9 {
		t.Errorf("a series read every scrape: %v, want 9", got)
	}
}

// A sum of parts that restart or go away apart (a service's chains per family): the v6 chain
// deleted (1500 = 1000 + 500 -> 1000) keeps its 500, the v4 chain rewritten (its counter back
// at 0) keeps its 1010. Made monotonic as one, the first fall counted the v4 packets again.
func TestSumOfPartsCarriesEachOver(t *testing.T) {
	var c Counters
	for i, step := range []struct {
		parts map[string]uint64
		want  float64
	}{
		{map[string]uint64{"v4": 1000, "v6": 500}, 1500},
		{map[string]uint64{"v4": 1000}, 1500},
		{map[string]uint64{"v4": 1010}, 1510},
		{map[string]uint64{"v4": 3, "v6": 2}, 1515},
		{nil, 1515},
	} {
		var got float64
		c.Scrape(func(s *Scrape) { got = s.Sum(d, step.parts, "web") })
		if got != step.want {
			t.Errorf("step %d: %v exported as %v, want %v", i, step.parts, got, step.want)
		}
	}
}
