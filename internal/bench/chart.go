package bench

import (
	"bytes"
	"fmt"
	"image"
	"image/color"
	"image/draw"
	"image/png"
	"math"

	"golang.org/x/image/font"
	"golang.org/x/image/font/basicfont"
	"golang.org/x/image/math/fixed"
)

// Chart geometry.
const (
	panelW, panelH = 440, 300
	marginL        = 46
	marginB        = 44
	marginT        = 30
	headerH        = 40
	legendH        = 24
)

// shortTraffic labels the groups (the full names do not fit under the bars).
var shortTraffic = map[Traffic]string{PodToPod: "pod-pod", PodToService: "pod-svc", ExternalToNodePort: "ext-nodeport", ExternalToLoadBalancer: "ext-lb", DirectLink: "no hop",
	LocalPodToPod64: "local 64B", LocalPodToPod64K: "local 64K"}

// shortDirection labels the pktgen groups.
var shortDirection = map[Direction]string{PodToRemote: "pod -> remote", RemoteToPod: "remote -> pod"}

var palette = []color.RGBA{
	{0x4c, 0x4c, 0x4c, 0xff}, // default: grey
	{0x1f, 0x77, 0xb4, 0xff},
	{0xd6, 0x27, 0x28, 0xff},
	{0x2c, 0xa0, 0x2c, 0xff},
	{0xff, 0x7f, 0x0e, 0xff},
	{0x94, 0x67, 0xbd, 0xff},
	{0x8c, 0x56, 0x4b, 0xff},
	{0x17, 0xbe, 0xcf, 0xff},
}

type bar struct {
	label         string
	value, lo, hi float64
	color         color.RGBA
}

type group struct {
	label string
	bars  []bar
}

type panel struct {
	title  string
	groups []group
	line   float64 // horizontal reference (1.0: Default; 0.9: target)
	line2  float64
	ylabel string
}

// Chart draws the report as a PNG: one row per kernel, one panel per netperf test with bars
// per variant and traffic type as a ratio to Default (whiskers: min and max), and a panel per
// pktgen run with packets/s as a ratio to the direct link and the target line.
func (rep *Report) Chart() ([]byte, error) {
	colors := map[string]color.RGBA{}
	var legend []string
	for _, r := range rep.Runs {
		for _, v := range ran(r) {
			if _, ok := colors[v.Name]; !ok {
				colors[v.Name] = palette[len(colors)%len(palette)]
				legend = append(legend, v.Name)
			}
		}
	}
	var rows [][]panel
	var rowTitles []string
	for _, r := range rep.Runs {
		var row []panel
		for _, test := range Tests {
			p := panel{title: test + " vs Default", line: 1, ylabel: "x Default"}
			for _, t := range append(allTraffics(), DirectLink) {
				g := group{label: shortTraffic[t]}
				baseT := t
				if t == DirectLink {
					baseT = PodToPod
				}
				def := r.Cell(VariantDefault, baseT, test)
				for _, v := range ran(r) {
					c := r.Cell(v.Name, t, test)
					if c != nil && c.Stats.N == 0 && c.Errors > 0 {
						// The variant broke this path: a red cross on the axis.
						g.bars = append(g.bars, bar{label: v.Name, value: -1, color: colors[v.Name]})
						continue
					}
					if c == nil || c.Stats.N == 0 || def == nil || def.Stats.N == 0 {
						continue
					}
					d := def.Stats.Median
					g.bars = append(g.bars, bar{label: v.Name, value: c.Stats.Median / d, lo: c.Stats.Min / d, hi: c.Stats.Max / d, color: colors[v.Name]})
				}
				if len(g.bars) > 0 {
					p.groups = append(p.groups, g)
				}
			}
			if len(p.groups) > 0 {
				row = append(row, p)
			}
		}
		p := panel{title: fmt.Sprintf("pktgen %dB: pps vs direct link", r.PktgenSize), line: 1, line2: rep.Target, ylabel: "x direct"}
		for _, dir := range r.PktgenDirections() {
			d := r.PktgenCell(VariantDirect, dir)
			if d == nil || d.Stats.N == 0 {
				continue
			}
			g := group{label: shortDirection[dir]}
			for _, c := range r.PktgenCells {
				if c.Stats.N == 0 || c.Direction.norm() != dir {
					continue
				}
				m := d.Stats.Median
				g.bars = append(g.bars, bar{label: c.Variant, value: c.Stats.Median / m, lo: c.Stats.Min / m, hi: c.Stats.Max / m, color: colors[c.Variant]})
			}
			p.groups = append(p.groups, g)
		}
		if len(p.groups) > 0 {
			row = append(row, p)
		}
		if len(row) > 0 {
			rows = append(rows, row)
			rowTitles = append(rowTitles, r.Label)
		}
	}
	cols := 1
	for _, row := range rows {
		cols = max(cols, len(row))
	}
	title := "hostaccel bench " + rep.Started.Format("2006-01-02") + ": medians, whiskers min..max; red x: the variant broke that path"
	// Wide enough for the title and the legend, also with one panel (a per-packet-only run).
	W := max(cols*panelW, 20+7*len(title))
	lw := 10
	for _, name := range legend {
		lw += 16 + 7*len(name) + 18
	}
	W = max(W, lw)
	H := headerH + legendH + len(rows)*(panelH+20) + 10
	img := image.NewRGBA(image.Rect(0, 0, W, H))
	draw.Draw(img, img.Bounds(), image.White, image.Point{}, draw.Src)
	text(img, 10, 18, title, color.Black)
	x := 10
	for _, name := range legend {
		fill(img, image.Rect(x, headerH-8, x+12, headerH+4), colors[name])
		text(img, x+16, headerH+3, name, color.Black)
		x += 16 + 7*len(name) + 18
	}
	for i, row := range rows {
		y0 := headerH + legendH + i*(panelH+20)
		text(img, 10, y0+12, rowTitles[i], color.RGBA{0x33, 0x33, 0x99, 0xff})
		for j, p := range row {
			drawPanel(img, image.Rect(j*panelW, y0+14, (j+1)*panelW, y0+14+panelH), p)
		}
	}
	var buf bytes.Buffer
	if err := png.Encode(&buf, img); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

func drawPanel(img *image.RGBA, r image.Rectangle, p panel) {
	plot := image.Rect(r.Min.X+marginL, r.Min.Y+marginT, r.Max.X-12, r.Max.Y-marginB)
	text(img, r.Min.X+marginL, r.Min.Y+18, p.title, color.Black)
	top := math.Max(p.line, p.line2)
	for _, g := range p.groups {
		for _, b := range g.bars {
			top = math.Max(top, math.Max(b.hi, b.value))
		}
	}
	top = niceCeil(top * 1.05)
	yOf := func(v float64) int {
		return plot.Max.Y - int(math.Round(v/top*float64(plot.Dy())))
	}
	grey := color.RGBA{0xdd, 0xdd, 0xdd, 0xff}
	step := niceStep(top)
	for v := 0.0; v <= top+1e-9; v += step {
		y := yOf(v)
		hline(img, plot.Min.X, plot.Max.X, y, grey)
		label := fmt.Sprintf("%.1f", v)
		if step < 0.1 {
			label = fmt.Sprintf("%.2f", v)
		}
		text(img, plot.Min.X-7*len(label)-4, y+4, label, color.Black)
	}
	vline(img, plot.Min.X, plot.Min.Y, plot.Max.Y, color.Black)
	hline(img, plot.Min.X, plot.Max.X, plot.Max.Y, color.Black)
	dashed(img, plot.Min.X, plot.Max.X, yOf(p.line), color.Black)
	if p.line2 > 0 {
		dashed(img, plot.Min.X, plot.Max.X, yOf(p.line2), color.RGBA{0xd6, 0x27, 0x28, 0xff})
		text(img, plot.Max.X-70, yOf(p.line2)-3, fmt.Sprintf("target %.2f", p.line2), color.RGBA{0xd6, 0x27, 0x28, 0xff})
	}
	if len(p.groups) == 0 {
		return
	}
	gw := plot.Dx() / len(p.groups)
	for gi, g := range p.groups {
		gx := plot.Min.X + gi*gw
		bw := min((gw-10)/max(len(g.bars), 1), 40)
		start := gx + (gw-bw*len(g.bars))/2
		for bi, b := range g.bars {
			x0 := start + bi*bw
			if b.value < 0 {
				red := color.RGBA{0xd6, 0x27, 0x28, 0xff}
				for d := -4; d <= 4; d++ {
					img.Set(x0+bw/2+d, plot.Max.Y-6+d, red)
					img.Set(x0+bw/2+d, plot.Max.Y-6-d, red)
				}
				continue
			}
			fill(img, image.Rect(x0+1, yOf(b.value), x0+bw-1, plot.Max.Y), b.color)
			cx := x0 + bw/2
			vline(img, cx, yOf(b.hi), yOf(b.lo), color.Black)
			hline(img, cx-3, cx+3, yOf(b.hi), color.Black)
			hline(img, cx-3, cx+3, yOf(b.lo), color.Black)
		}
		lx := gx + gw/2 - 7*len(g.label)/2
		text(img, lx, plot.Max.Y+16, g.label, color.Black)
	}
	text(img, r.Min.X+4, plot.Max.Y+34, p.ylabel, color.RGBA{0x66, 0x66, 0x66, 0xff})
}

func niceCeil(x float64) float64 {
	if x <= 0 {
		return 1
	}
	s := niceStep(x)
	return math.Ceil(x/s) * s
}

// niceStep picks a grid step giving 4-10 lines up to x.
func niceStep(x float64) float64 {
	p := math.Pow(10, math.Floor(math.Log10(x)))
	for _, m := range []float64{0.1, 0.2, 0.25, 0.5, 1, 2, 5} {
		if x/(m*p) <= 10 {
			return m * p
		}
	}
	return p
}

func fill(img *image.RGBA, r image.Rectangle, c color.Color) {
	draw.Draw(img, r.Canon(), &image.Uniform{C: c}, image.Point{}, draw.Src)
}

func hline(img *image.RGBA, x0, x1, y int, c color.Color) {
	for x := x0; x <= x1; x++ {
		img.Set(x, y, c)
	}
}

func vline(img *image.RGBA, x, y0, y1 int, c color.Color) {
	if y0 > y1 {
		y0, y1 = y1, y0
	}
	for y := y0; y <= y1; y++ {
		img.Set(x, y, c)
	}
}

func dashed(img *image.RGBA, x0, x1, y int, c color.Color) {
	for x := x0; x <= x1; x++ {
		if (x/4)%2 == 0 {
			img.Set(x, y, c)
		}
	}
}

func text(img *image.RGBA, x, y int, s string, c color.Color) {
	d := font.Drawer{Dst: img, Src: image.NewUniform(c), Face: basicfont.Face7x13, Dot: fixed.P(x, y)}
	d.DrawString(s)
}
