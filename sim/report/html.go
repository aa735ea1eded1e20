package report

import (
	"fmt"
	"html"
	"io"
	"strings"
	"time"

	"github.com/quota-lease/quota-lease/sim"
	"github.com/quota-lease/quota-lease/sim/scenario"
)

// writeReport writes one page a planner can open: what the scenario is,
// the table, the bound's terms, and the two plots beside it.
func writeReport(w io.Writer, s *scenario.Scenario, res *sim.Result, table string) error {
	var terms strings.Builder
	for _, m := range res.Modes {
		fmt.Fprintf(&terms, "<tr><td>%s</td><td>%.4g</td><td>", html.EscapeString(m.Mode), m.Bound)
		for i, k := range termNames(m.BoundTerms) {
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
img{max-width:100%%;border:1px solid #ddd;margin:.5em 0}`+
		`td,th{padding:.2em .8em;text-align:left;vertical-align:top}</style></head>
<body>
<h1>%[1]s</h1>
<p>%[2]s</p>
<p>%[3]s of virtual time, seed %[4]d, regions %[5]s; windows of %[6]s. `+
		`Every request was decided by quota-lease and by three
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
		html.EscapeString(strings.Join(s.Regions, ", ")), html.EscapeString(res.Window), html.EscapeString(table),
		terms.String(), edgeReport(res.Edge))
	return err
}

// edgeReport is the report's edge section: per window, the identity with
// the most admitted at the edge and directly against the leased bound;
// per move of demand, how fast the edge followed.
func edgeReport(x *sim.EdgeResult) string {
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
		b.WriteString("<table><tr><th>at</th><th>group</th><th>moved</th><th>region</th>" +
			"<th>target/s</th><th>assigned</th><th>admitted</th></tr>\n")
		for _, f := range x.Follow {
			fmt.Fprintf(&b, "<tr><td>%s</td><td>%s</td><td>%s</td><td>%s</td><td>%.4g</td><td>%s</td><td>%s</td></tr>\n",
				time.Duration(f.AtMs)*time.Millisecond, html.EscapeString(f.Group), f.Kind, html.EscapeString(f.Region),
				f.Target, followTime(f.Assigned90Ms), followTime(f.Admitted90Ms))
		}
		b.WriteString("</table>\n")
	}
	return b.String()
}
