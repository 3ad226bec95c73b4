package bench

import (
	"math"
	"slices"
)

// Summarize computes every run's cells again from its samples (a report read back from JSON
// written by an older version gets the current summaries).
func (rep *Report) Summarize() {
	for _, r := range rep.Runs {
		r.summarize()
	}
}

// summarize computes the cells from the samples, in report order.
func (r *Run) summarize() {
	r.Cells = nil
	for _, vi := range r.Variants {
		if !vi.Ran {
			continue
		}
		for _, t := range append(allTraffics(), DirectLink) {
			for _, test := range Tests {
				var vals, shares []float64
				errs, n, first := 0, 0, ""
				for _, s := range r.Samples {
					if s.Variant != vi.Name || s.Traffic != t || s.Test != test {
						continue
					}
					n++
					if s.Error != "" {
						if errs == 0 {
							first = tableText(s.Error)
						}
						errs++
						continue
					}
					vals = append(vals, s.Value)
					shares = append(shares, s.Path.SlowShare())
				}
				if n == 0 {
					continue
				}
				c := Cell{Variant: vi.Name, Traffic: t, Test: test, Unit: Unit(test), Stats: Summarize(vals), Errors: errs, FirstError: first, SlowShare: Summarize(shares).Median}
				if Summarize(shares).N == 0 {
					c.SlowShare = -1
				}
				r.Cells = append(r.Cells, c)
			}
		}
	}
	r.PktgenCells = nil
	for _, d := range Directions {
		for _, vi := range r.Variants {
			var vals []float64
			discarded, n := 0, 0
			for _, s := range r.Pktgen {
				if s.Variant != vi.Name || s.Direction.norm() != d {
					continue
				}
				n++
				if s.Kept {
					vals = append(vals, s.PPS)
				} else {
					discarded++
				}
			}
			if n > 0 {
				r.PktgenCells = append(r.PktgenCells, PktgenCell{Variant: vi.Name, Direction: d, Stats: Summarize(vals), Discarded: discarded})
			}
		}
	}
	for i := range r.PktgenCells {
		c := &r.PktgenCells[i]
		direct, def := r.PktgenCell(VariantDirect, c.Direction), r.PktgenCell(VariantDefault, c.Direction)
		c.VsDirect, c.VsDefault = -1, -1
		if direct != nil && direct.Stats.N > 0 && c.Stats.N > 0 {
			c.VsDirect = c.Stats.Median / direct.Stats.Median
		}
		if def != nil && def.Stats.N > 0 && c.Stats.N > 0 {
			c.VsDefault = c.Stats.Median / def.Stats.Median
		}
	}
}

// PktgenDirections lists the directions the run has per-packet cells for, in report order.
func (r *Run) PktgenDirections() []Direction {
	var out []Direction
	for _, d := range Directions {
		if slices.ContainsFunc(r.PktgenCells, func(c PktgenCell) bool { return c.Direction.norm() == d }) {
			out = append(out, d)
		}
	}
	return out
}

// pktgenReason is why a variant kept no round in a direction: the last round's reason.
func (r *Run) pktgenReason(variant string, d Direction) string {
	reason := ""
	for _, s := range r.Pktgen {
		if s.Variant == variant && s.Direction.norm() == d.norm() && !s.Kept {
			reason = s.Reason
		}
	}
	return reason
}

// Cell returns the cell of a variant, traffic and test (nil if absent).
func (r *Run) Cell(variant string, t Traffic, test string) *Cell {
	for i := range r.Cells {
		c := &r.Cells[i]
		if c.Variant == variant && c.Traffic == t && c.Test == test {
			return c
		}
	}
	return nil
}

// PktgenCell returns the pktgen cell of a variant in one direction (nil if absent).
func (r *Run) PktgenCell(variant string, d Direction) *PktgenCell {
	for i := range r.PktgenCells {
		if c := r.PktgenCells[i]; c.Variant == variant && c.Direction.norm() == d.norm() {
			return &r.PktgenCells[i]
		}
	}
	return nil
}

// finite maps NaN and ±Inf to -1, which JSON can carry.
func finite(x float64) float64 {
	if math.IsNaN(x) || math.IsInf(x, 0) {
		return -1
	}
	return x
}
