package report

import (
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/quota-lease/quota-lease/bound"
	"github.com/quota-lease/quota-lease/sim"
)

// WriteTable writes r as the table printed after a run.
func WriteTable(w io.Writer, r *sim.Result) error {
	fmt.Fprintf(w, "scenario %s (%s, seed %d, %d regions, window %s)\n",
		r.Scenario, r.Duration, r.Seed, len(r.Regions), r.Window)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "mode\trequests\tadmitted\tutilization\trejected while "+
		"free\tmax/window\tlimit\tovershoot\tbound\twithin\tlease msgs\t")
	for _, m := range r.Modes {
		within := "yes"
		if !m.WithinBound {
			within = "NO"
		}
		msgs := "-"
		if m.LeaseMessages > 0 {
			msgs = fmt.Sprint(m.LeaseMessages)
		}
		fmt.Fprintf(tw, "%s\t%d\t%d\t%.1f%%\t%d\t%.4g\t%.4g\t%.4g\t%.4g\t%s\t%s\t\n", m.Mode, m.Requests, m.Admitted,
			100*m.Utilization, m.RejectedWhileFree, m.MaxWindow, m.Limit, m.MaxOvershoot, m.Bound, within, msgs)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if l := r.Mode("leased"); l != nil {
		fmt.Fprintf(w, "leased bound terms:")
		for _, k := range termNames(l.BoundTerms) {
			fmt.Fprintf(w, " %s=%.4g", k, l.BoundTerms[k])
		}
		fmt.Fprintln(w)
	}
	if len(r.Modes) > 0 && r.Modes[0].Conversations != nil {
		if err := writeConversations(w, r.Modes); err != nil {
			return err
		}
	}
	if r.Edge != nil {
		writeEdge(w, r.Edge)
	}
	return nil
}

// termNames are the names of a bound's terms in m, in the order the
// bound is derived.
func termNames(m map[string]float64) []string {
	keys := make([]string, 0, len(m))
	for _, k := range []string{
		bound.TermReference,
		bound.TermBurst,
		bound.TermLeaseTransition,
		bound.TermDrift,
		bound.TermDegraded,
		bound.TermFallback,
		bound.TermEdge,
		bound.TermPostHoc,
		bound.TermIndependent,
	} {
		if _, ok := m[k]; ok {
			keys = append(keys, k)
		}
	}
	return keys
}

// writeConversations writes the conversations' table: per mode, the
// tokens charged (what it admitted), those no counter counted, the
// arrivals the gateway turned away and the most charged to one identity
// in one of the policy's periods.
func writeConversations(w io.Writer, modes []*sim.ModeResult) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "conversations\tcharges\ttokens\tuncounted\tin-flight refused\tmax/period\t")
	for _, m := range modes {
		c := m.Conversations
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d\t%.4g\t\n",
			m.Mode, c.Charges, c.Tokens, c.UncountedTokens, c.InFlightRefused, c.MaxPeriod)
	}
	return tw.Flush()
}

// writeEdge writes the edge's lines of the table.
func writeEdge(w io.Writer, r *sim.EdgeResult) {
	fmt.Fprintf(w, "edge: %d Envoy instances per region; admitted %d of %d at the edge (utilization %.1f%%), "+
		"%d of %d direct; %d reports (%d dropped), %d assignments, %d abandons; edge term %.4g\n",
		r.Instances, r.Admitted, r.Requests, 100*r.Utilization,
		r.DirectAdmitted, r.DirectRequests, r.Reports, r.ReportsDropped, r.Assignments, r.Abandons, r.EdgeTerm)
	var worst *sim.EdgeWindow
	for i := range r.Windows {
		if worst == nil || r.Windows[i].Total/r.Windows[i].Bound > worst.Total/worst.Bound {
			worst = &r.Windows[i]
		}
	}
	if worst != nil {
		fmt.Fprintf(w, "  fullest window: %s at %s admitted %.4g (edge %.4g, direct %.4g) of a bound of %.4g\n",
			worst.Identity, time.Duration(worst.StartMs)*time.Millisecond, worst.Total, worst.Edge, worst.Direct, worst.Bound)
	}
	for _, f := range r.Follow {
		fmt.Fprintf(w, "  %s moved (%s) in %s at %s: 90%% of %.4g/s assigned after %s, admitted after %s\n",
			f.Group, f.Kind, f.Region, time.Duration(f.AtMs)*time.Millisecond,
			f.Target, followTime(f.Assigned90Ms), followTime(f.Admitted90Ms))
	}
}

func followTime(ms int64) string {
	if ms < 0 {
		return "never"
	}
	return (time.Duration(ms) * time.Millisecond).String()
}
