package sim

import (
	"fmt"
	"io"
	"math"
	"strings"
	"time"
)

// line is one polyline of a chart.
type line struct {
	name   string
	color  string
	values []float64
	dash   string // SVG stroke-dasharray, "" for solid
}

var palette = []string{"#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#7f7f7f"}

// WritePlots writes the two SVG charts: plot.svg (the hot identity's
// admissions per region and in total under leasing, against the limit
// and the bound) and modes.svg (its total per mode against the limit).
func (r *Result) WritePlots(perRegion, perMode io.Writer) error {
	s := r.Series
	bin := time.Duration(s.BinMs) * time.Millisecond
	flat := func(v float64, n int) []float64 {
		out := make([]float64, n)
		for i := range out {
			out[i] = v
		}
		return out
	}
	floats := func(v []int64) []float64 {
		out := make([]float64, len(v))
		for i, x := range v {
			out[i] = float64(x)
		}
		return out
	}
	n := len(s.PerMode[0])
	var lines []line
	for i, name := range s.Regions {
		lines = append(lines, line{name: "leased, " + name, color: palette[(i+3)%len(palette)], values: floats(s.PerRegion[i])})
	}
	lines = append(lines, line{name: "leased, total", color: palette[0], values: floats(s.PerMode[0])},
		line{name: "limit", color: "#000000", values: flat(s.Limit, n), dash: "8,4"},
		line{name: "bound", color: "#d62728", values: flat(s.Bound, n), dash: "2,3"})
	title := fmt.Sprintf("%s: hot identity admitted per %s, by region (leased)", r.Scenario, bin)
	if err := chart(perRegion, title, bin, lines); err != nil {
		return err
	}
	lines = nil
	for i, m := range systems {
		lines = append(lines, line{name: string(m), color: palette[i%len(palette)], values: floats(s.PerMode[i])})
	}
	lines = append(lines, line{name: "limit", color: "#000000", values: flat(s.Limit, n), dash: "8,4"})
	return chart(perMode, fmt.Sprintf("%s: hot identity admitted per %s, by mode", r.Scenario, bin), bin, lines)
}

func chart(w io.Writer, title string, bin time.Duration, lines []line) error {
	const W, H, left, right, top, bottom = 1000.0, 460.0, 70.0, 190.0, 40.0, 50.0
	maxY := 1.0
	n := 0
	for _, l := range lines {
		n = max(n, len(l.values))
		for _, v := range l.values {
			maxY = math.Max(maxY, v)
		}
	}
	maxY *= 1.1
	x := func(i int) float64 { return left + (W-left-right)*float64(i)/float64(max(1, n-1)) }
	y := func(v float64) float64 { return top + (H-top-bottom)*(1-v/maxY) }
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%.0f" height="%.0f" font-family="sans-serif" font-size="12">`+"\n", W, H)
	fmt.Fprintf(&b, `<rect width="100%%" height="100%%" fill="white"/><text x="%.0f" y="22" font-size="15">%s</text>`+"\n", left, escapeXML(title))
	fmt.Fprintf(&b, `<line x1="%.0f" y1="%.0f" x2="%.0f" y2="%.0f" stroke="#444"/><line x1="%.0f" y1="%.0f" x2="%.0f" y2="%.0f" stroke="#444"/>`+"\n",
		left, H-bottom, W-right, H-bottom, left, top, left, H-bottom)
	for k := 0; k <= 5; k++ {
		v := maxY * float64(k) / 5
		fmt.Fprintf(&b, `<line x1="%.0f" y1="%.1f" x2="%.0f" y2="%.1f" stroke="#eee"/><text x="%.0f" y="%.1f" text-anchor="end">%.4g</text>`+"\n",
			left, y(v), W-right, y(v), left-6, y(v)+4, v)
	}
	for k := 0; k <= 6; k++ {
		i := (n - 1) * k / 6
		t := time.Duration(i) * bin
		fmt.Fprintf(&b, `<text x="%.1f" y="%.0f" text-anchor="middle">%s</text>`+"\n", x(i), H-bottom+18, t.Round(time.Second))
	}
	fmt.Fprintf(&b, `<text x="%.0f" y="%.0f" text-anchor="middle">virtual time</text>`+"\n", left+(W-left-right)/2, H-12)
	for li, l := range lines {
		var pts strings.Builder
		for i, v := range l.values {
			fmt.Fprintf(&pts, "%.1f,%.1f ", x(i), y(v))
		}
		dash := ""
		if l.dash != "" {
			dash = ` stroke-dasharray="` + l.dash + `"`
		}
		fmt.Fprintf(&b, `<polyline fill="none" stroke="%s" stroke-width="1.3"%s points="%s"/>`+"\n", l.color, dash, strings.TrimSpace(pts.String()))
		ly := top + 16*float64(li)
		fmt.Fprintf(&b, `<line x1="%.0f" y1="%.0f" x2="%.0f" y2="%.0f" stroke="%s" stroke-width="2"%s/><text x="%.0f" y="%.0f">%s</text>`+"\n",
			W-right+12, ly, W-right+32, ly, l.color, dash, W-right+38, ly+4, escapeXML(l.name))
	}
	b.WriteString("</svg>\n")
	_, err := io.WriteString(w, b.String())
	return err
}

func escapeXML(s string) string {
	return strings.NewReplacer("&", "&amp;", "<", "&lt;", ">", "&gt;", `"`, "&quot;").Replace(s)
}
