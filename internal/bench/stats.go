package bench

import (
	"math"
	"slices"
)

// Stats summarise the samples of one cell.
type Stats struct {
	N      int     `json:"n"`
	Median float64 `json:"median"`
	Min    float64 `json:"min"`
	Max    float64 `json:"max"`
	Q1     float64 `json:"q1"` // lower quartile
	Q3     float64 `json:"q3"` // upper quartile
	// Spread is the largest distance of a sample from the median, relative to the median:
	// every sample lies within median × (1 ± Spread).
	Spread float64 `json:"spread"`
}

// Summarize computes the statistics of xs; NaNs are ignored. N is 0 for no samples.
func Summarize(xs []float64) Stats {
	v := make([]float64, 0, len(xs))
	for _, x := range xs {
		if !math.IsNaN(x) {
			v = append(v, x)
		}
	}
	if len(v) == 0 {
		return Stats{}
	}
	slices.Sort(v)
	s := Stats{N: len(v), Min: v[0], Max: v[len(v)-1], Median: quantile(v, 0.5), Q1: quantile(v, 0.25), Q3: quantile(v, 0.75)}
	if s.Median != 0 {
		s.Spread = math.Max(s.Max-s.Median, s.Median-s.Min) / math.Abs(s.Median)
	}
	return s
}

// quantile interpolates linearly between the closest ranks of sorted v (type 7, as R and
// NumPy do by default).
func quantile(v []float64, q float64) float64 {
	if len(v) == 1 {
		return v[0]
	}
	h := q * float64(len(v)-1)
	lo := math.Floor(h)
	i := int(lo)
	if i+1 >= len(v) {
		return v[len(v)-1]
	}
	return v[i] + (h-lo)*(v[i+1]-v[i])
}

// Change is (x - base) / base; NaN when base is 0.
func Change(x, base float64) float64 {
	if base == 0 {
		return math.NaN()
	}
	return (x - base) / base
}
