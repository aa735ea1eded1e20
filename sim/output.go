package sim

import (
	"bytes"
	"fmt"
	"html"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// RunToDir simulates s and writes dir/summary.json, dir/plot.svg,
// dir/modes.svg and, with decisions, dir/decisions.jsonl (one line per
// request: a day of traffic is some 100 MB); it prints the table to table
// when not nil.
func RunToDir(s *Scenario, dir string, decisions bool, table io.Writer) (*Result, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("output dir: %w", err)
	}
	create := func(name string) (*os.File, error) {
		f, err := os.Create(filepath.Join(dir, name))
		if err != nil {
			return nil, fmt.Errorf("create %s: %w", name, err)
		}
		return f, nil
	}
	var res *Result
	var err error
	if decisions {
		dec, cerr := create("decisions.jsonl")
		if cerr != nil {
			return nil, cerr
		}
		res, err = Run(s, dec)
		if cerr := dec.Close(); err == nil {
			err = cerr
		}
	} else {
		if err := os.Remove(filepath.Join(dir, "decisions.jsonl")); err != nil && !os.IsNotExist(err) {
			return nil, fmt.Errorf("remove the previous decisions.jsonl: %w", err)
		}
		res, err = Run(s, nil)
	}
	if err != nil {
		return nil, err
	}
	write := func(name string, fn func(io.Writer) error) error {
		f, err := create(name)
		if err != nil {
			return err
		}
		if err := fn(f); err != nil {
			f.Close()
			return fmt.Errorf("write %s: %w", name, err)
		}
		return f.Close()
	}
	if err := write("summary.json", res.WriteSummary); err != nil {
		return nil, err
	}
	var modes []byte
	if err := write("plot.svg", func(w io.Writer) error {
		var mb bytes.Buffer
		err := res.WritePlots(w, &mb)
		modes = mb.Bytes()
		return err
	}); err != nil {
		return nil, err
	}
	if err := write("modes.svg", func(w io.Writer) error { _, err := w.Write(modes); return err }); err != nil {
		return nil, err
	}
	var tb bytes.Buffer
	if err := res.WriteTable(&tb); err != nil {
		return nil, err
	}
	if err := write("report.html", func(w io.Writer) error { return writeReport(w, s, res, tb.String()) }); err != nil {
		return nil, err
	}
	if table != nil {
		if _, err := table.Write(tb.Bytes()); err != nil {
			return nil, err
		}
	}
	return res, nil
}

// writeReport writes one page a planner can open: what the scenario is,
// the table, the bound's terms, and the two plots beside it.
func writeReport(w io.Writer, s *Scenario, res *Result, table string) error {
	var terms strings.Builder
	for _, m := range res.Modes {
		fmt.Fprintf(&terms, "<tr><td>%s</td><td>%.4g</td><td>", html.EscapeString(m.Mode), m.Bound)
		for i, k := range sortedTerms(m.BoundTerms) {
			if i > 0 {
				terms.WriteString(", ")
			}
			fmt.Fprintf(&terms, "%s %.4g", html.EscapeString(k), m.BoundTerms[k])
		}
		terms.WriteString("</td></tr>\n")
	}
	_, err := fmt.Fprintf(w, `<!doctype html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1">
<title>%[1]s: quota-lease simulation</title>
<style>body{font-family:sans-serif;margin:1.5em;max-width:1100px}pre{overflow-x:auto;background:#f6f6f6;padding:.8em}
img{max-width:100%%;border:1px solid #ddd;margin:.5em 0}td,th{padding:.2em .8em;text-align:left;vertical-align:top}</style></head>
<body>
<h1>%[1]s</h1>
<p>%[2]s</p>
<p>%[3]s of virtual time, seed %[4]d, regions %[5]s; windows of %[6]s. Every request was decided by quota-lease and by three
baselines: independent regional limits, a static split, and a central counter.</p>
<h2>Summary</h2>
<pre>%[7]s</pre>
<h2>The bound and its terms</h2>
<p>The most each way of limiting may admit for one identity in any window (docs/bound.md derives each term).</p>
<table><tr><th>mode</th><th>bound</th><th>terms</th></tr>
%[8]s</table>
<h2>The hottest identity over time</h2>
<img src="plot.svg" alt="admitted per region under quota-lease, against the limit and the bound">
<img src="modes.svg" alt="admitted by each way of limiting, against the limit">
%[9]s</body></html>
`, html.EscapeString(s.Name), html.EscapeString(s.Description), html.EscapeString(res.Duration), s.Seed,
		html.EscapeString(strings.Join(s.Regions, ", ")), html.EscapeString(res.Window), html.EscapeString(table), terms.String(), edgeReport(res.Edge))
	return err
}

// edgeReport is the report's edge section: per window, the identity with
// the most admitted at the edge and directly against the leased bound;
// per move of demand, how fast the edge followed.
func edgeReport(x *EdgeResult) string {
	if x == nil {
		return ""
	}
	var b strings.Builder
	b.WriteString("<h2>The edge</h2>\n<p>Per window, the identity with the most admitted under quota-lease, " +
		"by its Envoy instances and by direct checks, against the leased bound (its edge term included).</p>\n")
	b.WriteString("<table><tr><th>window " +
		"from</th><th>identity</th><th>edge</th><th>direct</th><th>total</th><th>bound</th></tr>\n")
	for _, w := range x.Windows {
		fmt.Fprintf(&b, "<tr><td>%s</td><td>%s</td><td>%.4g</td><td>%.4g</td><td>%.4g</td><td>%.4g</td></tr>\n",
			time.Duration(w.StartMs)*time.Millisecond, html.EscapeString(w.Identity), w.Edge, w.Direct, w.Total, w.Bound)
	}
	b.WriteString("</table>\n")
	if len(x.Follow) > 0 {
		b.WriteString("<p>Per move of a group's demand: when the token buckets where it went first refilled at " +
			"90% of the target (assigned), and first admitted that much in a second (admitted), for the slowest " +
			"tenant.</p>\n")
		b.WriteString("<table><tr><th>at</th><th>group</th><th>moved</th><th>region</th><th>target/s</th><th>assigned</th><th>admitted</th></tr>\n")
		for _, f := range x.Follow {
			fmt.Fprintf(&b, "<tr><td>%s</td><td>%s</td><td>%s</td><td>%s</td><td>%.4g</td><td>%s</td><td>%s</td></tr>\n",
				time.Duration(f.AtMs)*time.Millisecond, html.EscapeString(f.Group), f.Kind, html.EscapeString(f.Region), f.Target, followTime(f.Assigned90Ms), followTime(f.Admitted90Ms))
		}
		b.WriteString("</table>\n")
	}
	return b.String()
}
