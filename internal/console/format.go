package console

import (
	"html/template"
	"math"
	"strconv"
	"time"
)

// How the pages show numbers and times: the templates' functions.

func num(v float64) string { return strconv.FormatFloat(v, 'f', -1, 64) }

var funcs = template.FuncMap{
	"num": num,
	// amount shows a quantity to a reader: three decimals at most (the
	// page's data-v attributes keep the exact value).
	"amount":  func(v float64) string { return num(math.Round(v*1000) / 1000) },
	"g4":      func(v float64) string { return strconv.FormatFloat(v, 'g', 4, 64) },
	"pct":     func(v float64) string { return strconv.FormatFloat(v, 'f', 1, 64) + "%" },
	"seconds": func(s float64) string { return time.Duration(s * float64(time.Second)).String() },
	"dur":     func(d time.Duration) string { return d.Round(100 * time.Millisecond).String() },
	"clock": func(t time.Time) string {
		return t.UTC().Format("15:04:05 UTC")
	},
	"ago": func(now, t time.Time) string {
		return now.Sub(t).Round(time.Second).String()
	},
	"ms":     func(t time.Time) int64 { return t.UnixMilli() },
	"mul100": func(v float64) float64 { return 100 * v },
}
