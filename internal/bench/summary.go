package bench

import (
	"math"
	"slices"
)

// summarize computes the cells from the samples, in report order.
func (r *Run) summarize() {
	r.Cells = nil
	for _, vi := range r.Variants {
		if !vi.Ran {
			continue
		}
		for _, t := range append(slices.Clone(Traffics), DirectLink) {
			for _, test := range Tests {
				var vals, shares []float64
				errs, n := 0, 0
				for _, s := range r.Samples {
					if s.Variant != vi.Name || s.Traffic != t || s.Test != test {
						continue
					}
					n++
					if s.Error != "" {
						errs++
						continue
					}
					vals = append(vals, s.Value)
					shares = append(shares, s.Path.SlowShare())
				}
				if n == 0 {
					continue
				}
				c := Cell{Variant: vi.Name, Traffic: t, Test: test, Unit: Unit(test), Stats: Summarize(vals), Errors: errs, SlowShare: Summarize(shares).Median}
				if Summarize(shares).N == 0 {
					c.SlowShare = -1
				}
				r.Cells = append(r.Cells, c)
			}
		}
	}
	r.PktgenCells = nil
	for _, dir := range PktgenDirs {
		for _, vi := range r.Variants {
			var vals []float64
			discarded, n := 0, 0
			for _, s := range r.Pktgen {
				if s.Variant != vi.Name || s.Direction != dir {
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
				r.PktgenCells = append(r.PktgenCells, PktgenCell{Variant: vi.Name, Direction: dir, Stats: Summarize(vals), Discarded: discarded})
			}
		}
	}
	for i := range r.PktgenCells {
		c := &r.PktgenCells[i]
		direct, def := r.PktgenCellIn(VariantDirect, c.Direction), r.PktgenCellIn(VariantDefault, c.Direction)
		c.VsDirect, c.VsDefault = -1, -1
		if direct != nil && direct.Stats.N > 0 && c.Stats.N > 0 {
			c.VsDirect = c.Stats.Median / direct.Stats.Median
		}
		if def != nil && def.Stats.N > 0 && c.Stats.N > 0 {
			c.VsDefault = c.Stats.Median / def.Stats.Median
		}
	}
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

// PktgenCell returns the pktgen cell of a variant in the DirOut direction (nil if absent).
func (r *Run) PktgenCell(variant string) *PktgenCell { return r.PktgenCellIn(variant, DirOut) }

// PktgenCellIn returns the pktgen cell of a variant in a direction (nil if absent).
func (r *Run) PktgenCellIn(variant, dir string) *PktgenCell {
	for i := range r.PktgenCells {
		if r.PktgenCells[i].Variant == variant && r.PktgenCells[i].Direction == dir {
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
