package bench

import (
	"math"
	"testing"
)

func TestSummarize(t *testing.T) {
	s := Summarize([]float64{5, 1, 4, 2, 3})
	want := Stats{N: 5, Median: 3, Min: 1, Max: 5, Q1: 2, Q3: 4, Spread: 2.0 / 3}
	if s != want {
		t.Errorf("odd: %+v, want %+v", s, want)
	}
	s = Summarize([]float64{10, 20, 30, 40})
	if s.Median != 25 || s.Q1 != 17.5 || s.Q3 != 32.5 || s.Spread != 0.6 {
		t.Errorf("even: %+v", s)
	}
	s = Summarize([]float64{7})
	if s.N != 1 || s.Median != 7 || s.Spread != 0 || s.Q1 != 7 {
		t.Errorf("one: %+v", s)
	}
	if s := Summarize(nil); s.N != 0 {
		t.Errorf("none: %+v", s)
	}
	if s := Summarize([]float64{math.NaN(), 2, 4}); s.N != 2 || s.Median != 3 {
		t.Errorf("NaN not ignored: %+v", s)
	}
	// Asymmetric: the spread is the farther side.
	if s := Summarize([]float64{100, 101, 110}); math.Abs(s.Spread-9.0/101) > 1e-12 {
		t.Errorf("spread %v, want %v", s.Spread, 9.0/101)
	}
}

func TestChange(t *testing.T) {
	if c := Change(131, 100); math.Abs(c-0.31) > 1e-12 {
		t.Errorf("Change = %v", c)
	}
	if !math.IsNaN(Change(1, 0)) {
		t.Error("Change against 0 is not NaN")
	}
	if got := fmtPct(Change(6837.70, 7315.98)); got != "-7%" {
		t.Errorf("seed 000 NodePort CRR: %s, want -7%%", got)
	}
	if got := fmtPct(Change(20986.28, 16049.15)); got != "+31%" {
		t.Errorf("seed 000 Pod-to-Pod STREAM: %s, want +31%%", got)
	}
}
