package cluster

import (
	"context"
	"fmt"
	"io"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/quota-lease/quota-lease/bound"
	"github.com/quota-lease/quota-lease/policy"
)

// DemoPolicies are the two policies the demo loads.
const DemoPolicies = `name: api-global
identity: [api]
limit: 60
period: 1s
burst: 60
failure: {mode: static-share, static_fraction: 0.1}
---
name: per-tenant
identity: [tenant]
limit: 10
period: 1s
burst: 30
failure: {mode: last-lease, static_fraction: 0.05, decay: 10s}
`

// RunDemo starts a cluster in dir, drives region-shifting traffic through
// the agents' real gRPC APIs for dur while it kills the coordinator leader
// and partitions a region, prints progress and then a table per policy,
// region and total against the limit and the bound, and stops everything.
func RunDemo(ctx context.Context, bins Binaries, dir string, dur time.Duration, out io.Writer) error {
	fmt.Fprintf(out, "starting: etcd, 2 coordinator replicas, 3 regions (us, eu, ap) each with a redis-server and an agent (data and logs in %s)\n", dir)
	c, err := Start(ctx, bins, dir, Options{CoordinatorArgs: []string{"--console-sample", "1s", "--console-refresh", "2s"}})
	if err != nil {
		return err
	}
	defer func() { fmt.Fprintln(out, "stopping everything"); c.Stop() }()
	if err := c.SetPolicies(ctx, DemoPolicies); err != nil {
		return err
	}
	fmt.Fprintln(out, "policies: api-global (60/s shared by all), per-tenant (10/s per tenant, 40 tenants, one hot)")
	if console, stop, err := c.ConsoleProxy(); err != nil {
		fmt.Fprintf(out, "no web console: %v\n", err)
	} else {
		defer stop()
		fmt.Fprintf(out, "web console (the leader's, opened as a viewer; open it in a browser on this machine): %s/\n", console)
	}
	fmt.Fprintln(out, "each progress line: per region, its lease on api-global (active, renewing, shrinking, degraded) and the share of the 60/s it holds; then what each region admitted so far")
	phase := func(el time.Duration) int { return int(4 * el / dur) } // 0..3
	heavy := []string{"us", "eu", "eu", "ap"}
	global := Load{Policy: "api-global", Attribute: "api", Identities: 1, Rate: func(region string, el time.Duration) float64 {
		if heavy[min(phase(el), 3)] == region {
			return 60
		}
		return 12
	}}
	tenant := Load{Policy: "per-tenant", Attribute: "tenant", Identities: 40, Hot: 0.5, Rate: func(region string, el time.Duration) float64 {
		if heavy[min(phase(el), 3)] == region {
			return 25
		}
		return 5
	}}
	d := NewDriver(c)
	done := make(chan struct{})
	go func() { d.Run(ctx, dur, global, tenant); close(done) }()

	start := time.Now()
	events := []struct {
		at   time.Duration
		what string
		do   func()
	}{
		{dur / 4, "traffic shifts from us to eu", func() {}},
		{dur * 2 / 5, "killing the coordinator leader (SIGKILL)", func() {
			l, err := c.WaitLeader(ctx, 10*time.Second)
			if err != nil {
				fmt.Fprintf(out, "  no leader to kill: %v\n", err)
				return
			}
			l.Kill()
			fmt.Fprintf(out, "  killed %s; the follower takes over after the session TTL (%s)\n", l.Name, c.Opts.SessionTTL)
		}},
		{dur * 11 / 20, "cutting ap off from the coordinators", func() { c.Agents[2].Partition(true) }},
		{dur * 3 / 4, "healing ap's partition; traffic shifts to ap", func() { c.Agents[2].Partition(false) }},
	}
	shares := map[string][]float64{} // policy/region -> samples, % of the limit
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	next, lastProgress := 0, time.Duration(0)
	for running := true; running; {
		select {
		case <-done:
			running = false
		case <-tick.C:
		}
		el := time.Since(start)
		for next < len(events) && el >= events[next].at {
			fmt.Fprintf(out, "t=%2.0fs  %s\n", el.Seconds(), events[next].what)
			events[next].do()
			next++
		}
		if running && el-lastProgress < 5*time.Second {
			continue
		}
		lastProgress = el
		progress(ctx, out, c, d, el, shares)
	}
	return report(out, c, d, shares)
}

// progress prints one line: every region's lease on api-global (state and
// share of the limit) and what it admitted so far.
func progress(ctx context.Context, out io.Writer, c *Cluster, d *Driver, el time.Duration, shares map[string][]float64) {
	line := []string{fmt.Sprintf("t=%2.0fs ", el.Seconds())}
	lctx, cancel := context.WithTimeout(ctx, time.Second)
	leases, err := c.Leases(lctx)
	cancel()
	if err != nil {
		line = append(line, "(no leader right now)")
	}
	sort.Slice(leases, func(i, j int) bool { return leases[i].Region < leases[j].Region })
	for _, l := range leases {
		if l.Quota != "api-global" {
			continue
		}
		pct := 100 * float64(l.Rate) / float64(max(1, l.Limit))
		shares[l.Quota+"/"+l.Region] = append(shares[l.Quota+"/"+l.Region], pct)
		line = append(line, fmt.Sprintf("%s %s %.0f%%", l.Region, l.State, pct))
	}
	st := d.Stats("api-global")
	var adm []string
	for _, a := range c.Agents {
		adm = append(adm, fmt.Sprintf("%s %d", a.Region, st[a.Region].Admitted))
	}
	fmt.Fprintf(out, "%s | api-global admitted so far: %s\n", strings.Join(line, "  "), strings.Join(adm, ", "))
}

func report(out io.Writer, c *Cluster, d *Driver, shares map[string][]float64) error {
	ps, err := policy.ParsePolicies([]byte(DemoPolicies))
	if err != nil {
		return err
	}
	dep := bound.Deployment{Regions: len(c.Agents), Instances: 1, LeaseDuration: c.Opts.LeaseDuration, Drift: 1e-4}
	const w = 5 * time.Second
	for _, p := range ps {
		b, err := bound.Compute(p, dep, bound.Leased, w+200*time.Millisecond)
		if err != nil {
			return err
		}
		fmt.Fprintf(out, "\npolicy %s\n", p.Name)
		fmt.Fprintln(out, "sent, admitted, rejected: checks; leased, degraded, fallback, unleased: checks decided in that mode; share: of the limit, over the progress lines")
		tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintln(tw, "region\tsent\tadmitted\trejected\tleased\tdegraded\tfallback\tunleased\tshare min/avg/max\t")
		var total Stats
		for _, a := range c.Agents {
			s := d.Stats(p.Name)[a.Region]
			total.Sent, total.Admitted, total.Rejected = total.Sent+s.Sent, total.Admitted+s.Admitted, total.Rejected+s.Rejected
			fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%s\t\n", a.Region, s.Sent, s.Admitted, s.Rejected,
				s.Modes["leased"], s.Modes["degraded"], s.Modes["local-fallback"], s.Modes["unleased"], shareRange(shares[p.Name+"/"+a.Region]))
		}
		fmt.Fprintf(tw, "total\t%d\t%d\t%d\t\t\t\t\t\t\n", total.Sent, total.Admitted, total.Rejected)
		tw.Flush()
		got, id, _ := d.MaxWindow(p.Name, w)
		verdict := "within the bound"
		if float64(got) > b.WorstCase {
			verdict = "OVER THE BOUND"
		}
		fmt.Fprintf(out, "most admitted for one identity (%s) in any %s window: %d; one ideal global limiter admits at most %.0f (%s); bound %.0f: %s\n",
			id, w, got, bound.Reference(p, w), referenceOf(p, w), b.WorstCase, verdict)
	}
	return nil
}

// referenceOf says how bound.Reference adds up for p over w, so that a
// 60/s policy's 360 in 5 s reads as what it is.
func referenceOf(p *policy.Policy, w time.Duration) string {
	perSecond := p.Limit / time.Duration(p.Period).Seconds()
	if p.Algorithm == policy.TokenBucket {
		return fmt.Sprintf("burst %g + %g/s x %s", p.Burst, perSecond, w)
	}
	return fmt.Sprintf("%g per %s window, a window boundary inside %s counting one more", p.Limit, time.Duration(p.Period), w)
}

func shareRange(v []float64) string {
	if len(v) == 0 {
		return "-"
	}
	lo, hi, sum := v[0], v[0], 0.0
	for _, x := range v {
		lo, hi, sum = min(lo, x), max(hi, x), sum+x
	}
	return fmt.Sprintf("%.0f%%/%.0f%%/%.0f%%", lo, sum/float64(len(v)), hi)
}
