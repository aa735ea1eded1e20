package report

import (
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/quota-lease/quota-lease/sim"
)

// line is one polyline of a chart.
type line struct {
	name   string
	color  string
	values []float64
	dash   string  // SVG stroke-dasharray, "" for solid
	width  float64 // stroke width; 0 is 1.3
}

var palette = []string{"#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#7f7f7f"}

// WritePlots writes the two SVG charts: plot.svg (the hot identity's
// admissions per region and in total under leasing, against the limit
// and the bound) and modes.svg (its total per mode against the limit).
func WritePlots(r *sim.Result, perRegion, perMode io.Writer) error {
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
	// The last bin only covers the end of the run (or nothing): plotted, it
	// would read as traffic stopping. It is left out.
	n := max(1, len(s.PerMode[0])-1)
	trim := func(v []float64) []float64 { return v[:min(len(v), n)] }
	var lines []line
	for i, name := range s.Regions {
		lines = append(lines, line{
			name:   "leased, " + name,
			color:  palette[(i+3)%len(palette)],
			values: trim(floats(s.PerRegion[i])),
		})
	}
	limit := line{
		name:   fmt.Sprintf("limit: %.4g (one ideal limiter)", s.Limit),
		color:  "#000000",
		values: flat(s.Limit, n),
		dash:   "8,4",
	}
	boundName := fmt.Sprintf("bound: %.4g (worst case)", s.Bound)
	if s.Bound <= s.Limit*1.001 {
		boundName = fmt.Sprintf("bound: %.4g (= limit)", s.Bound)
	}
	lines = append(lines, line{name: "leased, total", color: palette[0], values: trim(floats(s.PerMode[0]))}, limit,
		line{name: boundName, color: "#d62728", values: flat(s.Bound, n), dash: "2,5", width: 2.5})
	yLabel := fmt.Sprintf("admitted per %s (units)", formatSpan(bin))
	title := fmt.Sprintf("%s: the hottest identity, by region (quota-lease)", r.Scenario)
	if err := chart(perRegion, title, yLabel, bin, lines); err != nil {
		return err
	}
	lines = nil
	for i, m := range r.Modes {
		if m.Mode != sim.Ideal {
			lines = append(lines, line{name: m.Mode, color: palette[i%len(palette)], values: trim(floats(s.PerMode[i]))})
		}
	}
	lines = append(lines, limit)
	return chart(perMode, fmt.Sprintf("%s: the hottest identity, by way of limiting", r.Scenario), yLabel, bin, lines)
}

// formatSpan writes d the way a person reads a time: 90s, 5m, 1.5h.
func formatSpan(d time.Duration) string {
	switch {
	case d >= 2*time.Hour:
		return strconv.FormatFloat(d.Hours(), 'f', -1, 64) + "h"
	case d >= 2*time.Minute:
		return strconv.FormatFloat(d.Minutes(), 'f', -1, 64) + "m"
	default:
		return strconv.FormatFloat(d.Seconds(), 'f', -1, 64) + "s"
	}
}

// niceStep is a round tick step (1, 2 or 5 times a power of ten) giving
// about want ticks up to max.
func niceStep(max float64, want int) float64 {
	raw := max / float64(want)
	p := math.Pow(10, math.Floor(math.Log10(raw)))
	for _, m := range []float64{1, 2, 5, 10} {
		if m*p >= raw {
			return m * p
		}
	}
	return 10 * p
}

func chart(w io.Writer, title, yLabel string, bin time.Duration, lines []line) error {
	const W, H, left, right, top, bottom = 1000.0, 460.0, 80.0, 230.0, 40.0, 50.0
	maxY := 1.0
	n := 0
	for _, l := range lines {
		n = max(n, len(l.values))
		for _, v := range l.values {
			maxY = math.Max(maxY, v)
		}
	}
	step := niceStep(maxY*1.05, 5)
	maxY = step * math.Ceil(maxY*1.05/step)
	x := func(i int) float64 { return left + (W-left-right)*float64(i)/float64(max(1, n-1)) }
	y := func(v float64) float64 { return top + (H-top-bottom)*(1-v/maxY) }
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%.0f" height="%.0f" `+
		`font-family="sans-serif" font-size="12">`+"\n", W, H)
	fmt.Fprintf(&b, `<rect width="100%%" height="100%%" fill="white"/>`+
		`<text x="%.0f" y="22" font-size="15">%s</text>`+"\n", left, escapeXML(title))
	fmt.Fprintf(&b, `<line x1="%.0f" y1="%.0f" x2="%.0f" y2="%.0f" stroke="#444"/>`+
		`<line x1="%.0f" y1="%.0f" x2="%.0f" y2="%.0f" stroke="#444"/>`+"\n",
		left, H-bottom, W-right, H-bottom, left, top, left, H-bottom)
	for v := 0.0; v <= maxY+step/2; v += step {
		fmt.Fprintf(&b, `<line x1="%.0f" y1="%.1f" x2="%.0f" y2="%.1f" stroke="#eee"/>`+
			`<text x="%.0f" y="%.1f" text-anchor="end">%s</text>`+"\n",
			left, y(v), W-right, y(v), left-6, y(v)+4, strconv.FormatFloat(v, 'f', -1, 64))
	}
	fmt.Fprintf(&b, `<text transform="translate(18 %.0f) rotate(-90)" text-anchor="middle">%s</text>`+"\n",
		top+(H-top-bottom)/2, escapeXML(yLabel))
	span := time.Duration(max(1, n-1)) * bin
	tick, unit := timeTicks(span)
	for t := time.Duration(0); t <= span; t += tick {
		i := float64(t) / float64(bin)
		fmt.Fprintf(&b, `<text x="%.1f" y="%.0f" text-anchor="middle">%s</text>`+"\n",
			left+(W-left-right)*i/float64(max(1, n-1)), H-bottom+18, formatIn(t, unit))
	}
	fmt.Fprintf(&b, `<text x="%.0f" y="%.0f" text-anchor="middle">virtual time since the start</text>`+"\n",
		left+(W-left-right)/2, H-12)
	for li, l := range lines {
		var pts strings.Builder
		for i, v := range l.values {
			fmt.Fprintf(&pts, "%.1f,%.1f ", x(i), y(v))
		}
		dash := ""
		if l.dash != "" {
			dash = ` stroke-dasharray="` + l.dash + `"`
		}
		width := l.width
		if width == 0 {
			width = 1.3
		}
		fmt.Fprintf(&b, `<polyline fill="none" stroke="%s" stroke-width="%.1f"%s points="%s"/>`+"\n",
			l.color, width, dash, strings.TrimSpace(pts.String()))
		ly := top + 18*float64(li)
		fmt.Fprintf(&b, `<line x1="%.0f" y1="%.0f" x2="%.0f" y2="%.0f" stroke="%s" stroke-width="2.5"%s/>`+
			`<text x="%.0f" y="%.0f">%s</text>`+"\n",
			W-right+12, ly, W-right+36, ly, l.color, dash, W-right+42, ly+4, escapeXML(l.name))
	}
	b.WriteString("</svg>\n")
	_, err := io.WriteString(w, b.String())
	return err
}

// timeTicks picks a round step for a time axis of span (at most about six
// ticks) and the unit its labels are written in.
func timeTicks(span time.Duration) (step, unit time.Duration) {
	unit = time.Second
	if span >= 2*time.Hour {
		unit = time.Hour
	} else if span >= 2*time.Minute {
		unit = time.Minute
	}
	for _, m := range []time.Duration{1, 2, 3, 5, 6, 10, 12, 15, 20, 30, 60, 120, 240, 480} {
		if step = m * unit; step*6 >= span {
			break
		}
	}
	return step, unit
}

// formatIn writes t as a number of unit: 0h, 6h, 12h.
func formatIn(t, unit time.Duration) string {
	suffix := map[time.Duration]string{time.Second: "s", time.Minute: "m", time.Hour: "h"}[unit]
	return strconv.FormatFloat(float64(t)/float64(unit), 'f', -1, 64) + suffix
}

func escapeXML(s string) string {
	return strings.NewReplacer("&", "&amp;", "<", "&lt;", ">", "&gt;", `"`, "&quot;").Replace(s)
}
