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
	"github.com/quota-lease/quota-lease/internal/testenv/rlqsenvoy"
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

// DemoEdgePolicy is the policy the demo serves at the edge: Envoy-like
// clients behind eu (DemoEdgeRegion) decide its requests themselves on
// token buckets eu's agent assigns them (Envoy's Rate Limit Quota
// Service), and deny what no assignment covers.
const DemoEdgePolicy = `name: edge-tenant
identity: [tenant]
limit: 20
period: 1s
burst: 20
failure: {mode: static-share, static_fraction: 0.1}
edge: {instances: 6, no_assignment: deny, ttl: 1s}
`

// DemoEdgeRegion is the region whose Envoy-like clients the demo runs, and
// demoEnvoys how many; DemoServiceRegion the region of its Go services
// deciding in-process with the client library (examples/limited-service),
// and demoServices how many.
const (
	DemoEdgeRegion    = "eu"
	demoEnvoys        = 6
	DemoServiceRegion = "us"
	demoServices      = 2
)

// RunDemo starts a cluster in dir, drives region-shifting traffic through
// the agents' real gRPC APIs for dur while it kills the coordinator leader
// and partitions a region, prints progress and then a table per policy,
// region and total against the limit and the bound, and stops everything.
// Beside the direct checks, Envoy-like clients behind eu and Go services
// behind us decide a per-tenant policy at the edge (DemoEdgePolicy), also
// checked directly from us and ap; the report counts what all of them
// admitted against the bound.
func RunDemo(ctx context.Context, bins Binaries, dir string, dur time.Duration, out io.Writer) error {
	fmt.Fprintf(out, "starting: etcd, 2 coordinator replicas, 3 regions (us, eu, ap) each with a "+
		"redis-server and an agent (data and logs in %s)\n", dir)
	// Leases of 4 s: an edge assignment (1 s, plus the agent's margin) is
	// sized for the end of its life, and with leases of 2 s renewed every
	// third the grant often ends sooner, leaving the edge the degraded
	// budget.
	c, err := Start(ctx, bins, dir, Options{
		CoordinatorArgs: []string{"--console-sample", "1s", "--console-refresh", "2s"},
		LeaseDuration:   4 * time.Second,
	})
	if err != nil {
		return err
	}
	defer func() { fmt.Fprintln(out, "stopping everything"); c.Stop() }()
	if err := c.SetPolicies(ctx, DemoPolicies+"---\n"+DemoEdgePolicy); err != nil {
		return err
	}
	fmt.Fprintln(out, "policies: api-global (60/s shared by all), per-tenant (10/s per tenant, 40 tenants, "+
		"one hot), edge-tenant (20/s per tenant, 20 tenants, one hot)")
	edge, err := startDemoEdge(ctx, c)
	if err != nil {
		return err
	}
	defer edge.Close()
	services, err := c.StartServices(ctx, DemoServiceRegion, "edge-tenant", demoServices, time.Second)
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "edge: %d Envoy-like clients behind %s decide edge-tenant's requests themselves, on "+
		"token buckets %s's agents assign them over Envoy's Rate Limit Quota Service, reporting every 2s; "+
		"%d Go services behind %s decide them in-process with the client library (examples/limited-service), "+
		"reporting every second; us and ap check edge-tenant directly too\n",
		demoEnvoys, DemoEdgeRegion, DemoEdgeRegion, demoServices, DemoServiceRegion)
	if console, stop, err := c.ConsoleProxy(); err != nil {
		fmt.Fprintf(out, "no web console: %v\n", err)
	} else {
		defer stop()
		fmt.Fprintf(out, "web console (the leader's, opened as a viewer; open it in a browser on this machine): "+
			"%s/\n", console)
	}
	fmt.Fprintln(out, "each progress line: per region, its lease on api-global (active, renewing, shrinking, "+
		"degraded) and the share of the 60/s it holds; then what each region admitted so far")
	global, tenant, direct := demoLoads(dur)
	d, ed, sd := NewDriver(c), NewEdgeDriver(), &ServiceDriver{Policy: "edge-tenant", Tenant: "t-0"}
	done, edgeDone, servicesDone := make(chan struct{}), make(chan struct{}), make(chan struct{})
	go func() { d.Run(ctx, dur, global, tenant, direct); close(done) }()
	go func() { ed.Run(ctx, dur, EdgeLoad{Demand: demoEdgeDemand()}, edge); close(edgeDone) }()
	go func() { sd.Run(ctx, dur, 10, services...); close(servicesDone) }()

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
		progress(ctx, out, c, d, ed, el, shares)
	}
	<-edgeDone
	<-servicesDone
	return writeDemoReport(out, c, d, edge, sd, shares)
}

// demoLoads are the demo's direct checks over a run of dur: api-global
// and per-tenant heavy in one region a quarter at a time (us, eu, eu, ap),
// and edge-tenant's hot tenant checked directly in the regions without
// the edge.
func demoLoads(dur time.Duration) (global, tenant, direct Load) {
	phase := func(el time.Duration) int { return int(4 * el / dur) } // 0..3
	heavy := []string{"us", "eu", "eu", "ap"}
	global = Load{Policy: "api-global", Attribute: "api", Identities: 1,
		Rate: func(region string, el time.Duration) float64 {
			if heavy[min(phase(el), 3)] == region {
				return 60
			}
			return 12
		}}
	tenant = Load{Policy: "per-tenant", Attribute: "tenant", Identities: 40, Hot: 0.5,
		Rate: func(region string, el time.Duration) float64 {
			if heavy[min(phase(el), 3)] == region {
				return 25
			}
			return 5
		}}
	direct = Load{Policy: "edge-tenant", Attribute: "tenant",
		Identity: func(string, time.Duration) string { return "t-0" },
		Rate: func(region string, _ time.Duration) float64 {
			if region == DemoEdgeRegion {
				return 0
			}
			return 10
		}}
	return global, tenant, direct
}

// startDemoEdge starts the demo's Envoy-like clients behind DemoEdgeRegion,
// configured as DemoEdgePolicy states.
func startDemoEdge(ctx context.Context, c *Cluster) (*Edge, error) {
	ps, err := policy.ParsePolicies([]byte(DemoEdgePolicy))
	if err != nil {
		return nil, err
	}
	const every = 2 * time.Second
	set, err := rlqsenvoy.SettingsFor(ps[0].Edge, every)
	if err != nil {
		return nil, err
	}
	return c.StartEdge(ctx, DemoEdgeRegion, EdgeOptions{
		Envoys:         demoEnvoys,
		Filters:        []EdgeFilter{{Domain: "demo", Settings: set}},
		ReportInterval: every,
	})
}

// demoEdgeDemand is what each Envoy-like client asks of edge-tenant: the
// hot tenant t-0 10/s from every client (60/s, three times its limit), and
// each of 19 others 1/s from one client.
func demoEdgeDemand() func(string, int, time.Duration) []EdgeDemand {
	demand := make([][]EdgeDemand, demoEnvoys)
	bucket := func(n int) map[string]string {
		return map[string]string{"policy": "edge-tenant", "tenant": fmt.Sprint("t-", n)}
	}
	for i := range demand {
		demand[i] = append(demand[i], EdgeDemand{Bucket: bucket(0), Rate: 10})
		for n := 1 + i; n < 20; n += demoEnvoys {
			demand[i] = append(demand[i], EdgeDemand{Bucket: bucket(n), Rate: 1})
		}
	}
	return func(_ string, i int, _ time.Duration) []EdgeDemand { return demand[i] }
}

// progress prints one line: every region's lease on api-global (state and
// share of the limit), what it admitted so far, and what the edge's
// clients admitted of what they decided.
func progress(
	ctx context.Context,
	out io.Writer,
	c *Cluster,
	d *Driver,
	ed *EdgeDriver,
	el time.Duration,
	shares map[string][]float64,
) {
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
	decided, allowed := ed.Decisions()
	fmt.Fprintf(out, "%s | api-global admitted so far: %s | %s's Envoys admitted %d of %d\n",
		strings.Join(line, "  "), strings.Join(adm, ", "), DemoEdgeRegion, allowed, decided)
}

// writeDemoReport writes the demo's closing report to out: per policy,
// what each region, the Envoys and the services sent and admitted, and
// the fullest window against the bound the policy publishes.
func writeDemoReport(
	out io.Writer,
	c *Cluster,
	d *Driver,
	edge *Edge,
	sd *ServiceDriver,
	shares map[string][]float64,
) error {
	ps, err := policy.ParsePolicies([]byte(DemoPolicies + "---\n" + DemoEdgePolicy))
	if err != nil {
		return err
	}
	dep := bound.Deployment{Regions: len(c.Agents), Instances: 1, LeaseDuration: c.Opts.LeaseDuration, Drift: 1e-4}
	const w = 5 * time.Second
	adm := append(append(d.Admissions(), edge.Admissions()...), sd.Admissions()...)
	for _, p := range ps {
		b, err := bound.Compute(p, dep, bound.Leased, w+200*time.Millisecond)
		if err != nil {
			return err
		}
		fmt.Fprintf(out, "\npolicy %s\n", p.Name)
		fmt.Fprintln(out, "sent, admitted, rejected: checks; leased, degraded, fallback, unleased: checks "+
			"decided in that mode; share: of the limit, over the progress lines")
		tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintln(tw, "region\tsent\tadmitted\trejected\tleased\tdegraded\tfallback\tunleased\tshare min/avg/max\t")
		var total Stats
		for _, a := range c.Agents {
			s := d.Stats(p.Name)[a.Region]
			total.Sent, total.Admitted, total.Rejected = total.Sent+s.Sent, total.Admitted+s.Admitted, total.Rejected+s.Rejected
			fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%s\t\n", a.Region, s.Sent, s.Admitted, s.Rejected,
				s.Modes["leased"], s.Modes["degraded"], s.Modes["local-fallback"], s.Modes["unleased"],
				shareRange(shares[p.Name+"/"+a.Region]))
		}
		if p.Edge != nil {
			// Decided by the Envoy-like clients themselves: no mode.
			s := edge.Stats()
			total.Sent, total.Admitted, total.Rejected =
				total.Sent+int64(s.Allowed+s.Denied), total.Admitted+int64(s.Allowed), total.Rejected+int64(s.Denied)
			fmt.Fprintf(tw, "%s's Envoys\t%d\t%d\t%d\t\t\t\t\t\t\n", edge.Region, s.Allowed+s.Denied, s.Allowed, s.Denied)
			admitted, refused := sd.Counts()
			total.Sent, total.Admitted, total.Rejected =
				total.Sent+int64(admitted+refused), total.Admitted+int64(admitted), total.Rejected+int64(refused)
			fmt.Fprintf(tw, "%s's services\t%d\t%d\t%d\t\t\t\t\t\t\n", DemoServiceRegion, admitted+refused, admitted, refused)
		}
		fmt.Fprintf(tw, "total\t%d\t%d\t%d\t\t\t\t\t\t\n", total.Sent, total.Admitted, total.Rejected)
		tw.Flush()
		got, id := 0, ""
		forEachWindow(adm, p.Name, w, func(identity string, _ time.Time, n int) error {
			if n > got {
				got, id = n, identity
			}
			return nil
		})
		verdict := "within the bound"
		if float64(got) > b.WorstCase {
			verdict = "OVER THE BOUND"
		}
		what := ""
		if p.Edge != nil {
			what = fmt.Sprintf(" (Envoys' own records, the services' answers and direct checks; the bound's edge "+
				"term %g: the Envoys and services deny without an assignment)", b.Terms[bound.TermEdge])
		}
		fmt.Fprintf(out, "most admitted for one identity (%s) in any %s window%s: %d; one ideal global limiter "+
			"admits at most %.0f (%s); bound %.0f: %s\n",
			id, w, what, got, bound.Reference(p, w), referenceOf(p, w), b.WorstCase, verdict)
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
	return fmt.Sprintf("%g per %s window, a window boundary inside %s counting one more",
		p.Limit, time.Duration(p.Period), w)
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
