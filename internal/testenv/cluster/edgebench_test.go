package cluster

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"text/tabwriter"
	"time"

	commonrl "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlqfv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/rate_limit_quota/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/quota-lease/quota-lease/internal/mtls"
	"github.com/quota-lease/quota-lease/internal/testenv"
	"github.com/quota-lease/quota-lease/internal/testenv/rlqsenvoy"
	"github.com/quota-lease/quota-lease/policy"
)

// edgeBenchConfig is the envoyproxy/ratelimit configuration of domain,
// a limit per tenant of perSecond, with edge (quota-lease's addition,
// YAML) when set. The limit of the decision benchmark is high enough that
// its load measures deciding, not rejecting.
func edgeBenchConfig(domain string, perSecond int, edge string) string {
	s := fmt.Sprintf("domain: %s\ndescriptors:\n  - key: tenant\n    rate_limit: {unit: second, requests_per_unit: %d}\n", domain, perSecond)
	if edge != "" {
		s += "edge: " + edge + "\n"
	}
	return s
}

// edgeShape is one edge load of the decision benchmark: envoys Envoy
// instances, each deciding the requests of buckets tenants of its own at
// perBucket requests a second, reporting every 5 s (Envoy's interval).
// The agent's cost at the edge grows with the buckets it is reported,
// not with the decisions, so the benchmark runs two shapes at
// ShouldRateLimit's rate, and the first one again at five times that
// rate, which ShouldRateLimit could not serve on these 2 cores (it would
// need about 2.7 of them): not the same traffic, but it shows the edge's
// cost does not follow the rate.
type edgeShape struct {
	envoys, buckets int
	perBucket       float64
}

func (s edgeShape) name() string {
	n := fmt.Sprintf("at the edge, %d buckets at %g/s", s.envoys*s.buckets, s.perBucket)
	if r := float64(s.envoys*s.buckets) * s.perBucket; r != edgeBenchRate {
		n += fmt.Sprintf(" (%g× the rate)", r/edgeBenchRate)
	}
	return n
}

// edgeBenchRate is every system's decisions a second: the edge shapes',
// and ShouldRateLimit's (one descriptor a call, over edgeBenchTenants
// tenants in turn).
const edgeBenchRate, edgeBenchTenants = 2000, 1000

var edgeShapes = []edgeShape{{envoys: 20, buckets: 5, perBucket: 20}, {envoys: 20, buckets: 5, perBucket: 100}, {envoys: 20, buckets: 50, perBucket: 2}}

// The report benchmark: fleetEnvoys instances, each reporting the same
// fleetBuckets tenants every 5 s.
const fleetEnvoys, fleetBuckets = 100, 1000

// BenchmarkEdgePeers measures issue 26's claim: what a decision made at
// the edge (Envoy's rate_limit_quota filter, played by rlqsenvoy clients
// in this process, deciding every request themselves and reporting every
// 5 s to the agent's RLQS server) costs the agent and its Redis, against
// the same traffic decided by ShouldRateLimit, one call per request, on
// the agent and on envoyproxy/ratelimit (each with its own redis-server),
// in one run. CPU is user and system time from /proc of the server and its
// Redis over each round; the clients, and the fault proxies between them
// and the agent, run in this process and are not counted. The agent is a
// cluster's (mutual TLS on every call and stream, as deployed);
// envoyproxy/ratelimit serves plain gRPC. The ShouldRateLimit rounds (ours and the peer's alternating) come first, so
// that no stream of the edge is open during them.
//
// Then reports from fleetEnvoys instances x fleetBuckets buckets: the
// agent's CPU while it handles them, and each bucket's report-to-first-
// assignment latency as the clients measured it (rlqsenvoy.FirstAssignments).
//
// `make bench-peers` runs it (QUOTALEASE_PEER_RATELIMIT names
// envoyproxy/ratelimit's service_cmd); without that it is skipped.
func BenchmarkEdgePeers(b *testing.B) {
	peerBin := peerRatelimit(b)
	ctx := b.Context()
	dir := b.TempDir()
	// Leases of 10 s (the default), and a check timeout long enough that
	// every ShouldRateLimit decision is Redis's, as every one of
	// envoyproxy/ratelimit's is. The report benchmark's instances all
	// hold this process's certificate, one caller: its budget of buckets
	// is the agent's (100,000), not half of it.
	prof := agentProfiler{dir: os.Getenv("QUOTALEASE_BENCH_PROFILES")}
	args := []string{"--edge-max-buckets-per-caller", "100000"}
	if prof.dir != "" {
		// go test runs in this package's folder, not the caller's.
		if !filepath.IsAbs(prof.dir) {
			b.Fatalf("QUOTALEASE_BENCH_PROFILES=%s: give an absolute path", prof.dir)
		}
		if err := os.MkdirAll(prof.dir, 0o755); err != nil {
			b.Fatal(err)
		}
		prof.addr = testenv.FreeAddr(b)
		args = append(args, "--debug-listen", prof.addr)
	}
	c, err := Start(ctx, bins, dir, Options{Regions: []string{"bench"}, Coordinators: 1, LeaseDuration: 10 * time.Second, CheckTimeout: time.Second,
		AgentArgs: args})
	if err != nil {
		b.Fatal(err)
	}
	defer c.Stop()
	edgeCfg := edgeBenchConfig("edge", 100000, "{instances: 100, no_assignment: deny}")
	for _, cfg := range []string{edgeCfg, edgeBenchConfig("bench", 100000, ""), edgeBenchConfig("fleet", 1000, "{instances: 100, no_assignment: deny}")} {
		if err := c.SetPolicies(ctx, cfg); err != nil {
			b.Fatal(err)
		}
	}
	agent := c.Agents[0]
	ours := []int{agent.Pid(), c.Redis[0].Pid()}
	cc := dial(b, agent.Addr, c.pki.service)
	peerAddr, _, peer := startRatelimit(b, dir, peerBin, edgeBenchConfig("bench", 100000, ""))
	pc := dial(b, peerAddr, mtls.Files{})
	systems := []struct {
		name   string
		client rlsv3.RateLimitServiceClient
		pids   []int
	}{{"quota-lease ShouldRateLimit", rlsv3.NewRateLimitServiceClient(cc), ours}, {"envoyproxy/ratelimit ShouldRateLimit", rlsv3.NewRateLimitServiceClient(pc), peer}}
	for _, s := range systems {
		waitAnswers(b, s.name, s.client)
	}

	runs := map[string][]benchRound{}
	var idle time.Duration
	for b.Loop() {
		// What the agent and its Redis spend with nothing to do: lease
		// renewals, the edge's rounds, probes.
		cpu0 := processCPU(b, ours)
		time.Sleep(10 * time.Second)
		idle = (processCPU(b, ours) - cpu0) / 10
		for range 3 {
			for _, s := range systems {
				cpu0, redis0 := processCPU(b, s.pids), processCPU(b, s.pids[1:])
				t0 := time.Now()
				lat := rlsOpenLoop(b, ctx, s.client, edgeBenchRate, 5*time.Second)
				runs[s.name] = append(runs[s.name], benchRound{decisions: float64(len(lat)), dur: time.Since(t0),
					cpu: processCPU(b, s.pids) - cpu0, redis: processCPU(b, s.pids[1:]) - redis0, lat: lat})
			}
		}
		// The edge: the same rate, decided by the clients; the shape with
		// fewer buckets first, so that what the agent still holds of it
		// (until its reservations expire) weighs little in the next.
		for _, sh := range edgeShapes {
			runs[sh.name()] = measureEdge(b, c, ours, sh, edgeCfg, prof)
		}
	}
	order := []string{systems[0].name, systems[1].name}
	for _, sh := range edgeShapes {
		order = append(order, sh.name())
	}
	var out strings.Builder
	tw := tabwriter.NewWriter(&out, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "path\tdecisions/s\tp99\tCPU ms per 1,000 decisions (server + Redis)\tof which Redis\tvs quota-lease ShouldRateLimit\tvs envoyproxy/ratelimit\t")
	perK := map[string]float64{}
	for _, name := range order {
		var n float64
		var dur, cpu, redis time.Duration
		var lat []time.Duration
		for _, r := range runs[name] {
			n, dur, cpu, redis, lat = n+r.decisions, dur+r.dur, cpu+r.cpu, redis+r.redis, append(lat, r.lat...)
		}
		perK[name] = cpu.Seconds() * 1000 / max(1, n/1000)
		p99, vs := "(in Envoy)", []string{"", ""}
		if len(lat) > 0 {
			slices.Sort(lat)
			p99 = lat[min(len(lat)-1, len(lat)*99/100)].Round(time.Microsecond).String()
		} else {
			for i := range vs {
				vs[i] = fmt.Sprintf("%.0f× less", perK[order[i]]/max(perK[name], 1e-9))
			}
		}
		fmt.Fprintf(tw, "%s\t%.0f\t%s\t%.2f\t%.2f\t%s\t%s\t\n", name, n/dur.Seconds(), p99, perK[name], redis.Seconds()*1000/max(1, n/1000), vs[0], vs[1])
		b.ReportMetric(perK[name], strings.NewReplacer(" ", "-", ",", "").Replace(name)+"-cpu-ms/1000")
	}
	tw.Flush()
	b.Logf("%d decisions/s each: ShouldRateLimit over %d tenants, one descriptor a call (3 rounds of 5 s per system, interleaved); at the edge, 20 Envoy-like instances reporting every %s (2 rounds of %s per shape). The agent and its Redis idle: %.1f ms of CPU a second.\n%s",
		edgeBenchRate, edgeBenchTenants, rlqsenvoy.EnvoyReportInterval, 4*rlqsenvoy.EnvoyReportInterval, idle.Seconds()*1000, out.String())
	fleetReports(b, c, agent, edgeBenchConfig("fleet", 1000, "{instances: 100, no_assignment: deny}"))
}

// benchRound is one measured round of one path: the decisions made, how
// long it took, the server's and its Redis's CPU (and of it, the
// Redis's), and the latency of every call (none at the edge: Envoy
// decides).
type benchRound struct {
	decisions       float64
	dur, cpu, redis time.Duration
	lat             []time.Duration
}

// measureEdge starts sh's Envoy-like clients behind the cluster's region
// on configuration cfg, drives them until every bucket is assigned, then
// measures two rounds of four reporting intervals (profiling the agent
// over them, with prof), and stops them.
func measureEdge(b *testing.B, c *Cluster, pids []int, sh edgeShape, cfg string, prof agentProfiler) []benchRound {
	demand := make([][]EdgeDemand, sh.envoys)
	for i := range demand {
		for j := range sh.buckets {
			demand[i] = append(demand[i], EdgeDemand{Bucket: map[string]string{"tenant": fmt.Sprint("t", i*sh.buckets+j)}, Rate: sh.perBucket})
		}
	}
	e, d, stop := driveBenchEdge(b, c, "edge", cfg, sh.envoys,
		EdgeLoad{Demand: func(_ string, i int, _ time.Duration) []EdgeDemand { return demand[i] }})
	defer stop()
	waitAssigned(b, e, sh.envoys*sh.buckets, time.Minute)
	var out []benchRound
	defer prof.start(b, fmt.Sprintf("edge-%d-buckets-at-%g", sh.envoys*sh.buckets, sh.perBucket), 8*rlqsenvoy.EnvoyReportInterval)()
	act0, t0 := edgeActivity(b, c.Agents[0]), time.Now()
	defer func() {
		b.Logf("%s: %s", sh.name(), edgeActivity(b, c.Agents[0]).per(act0, time.Since(t0)))
	}()
	for range 2 {
		cpu0, redis0, n0 := processCPU(b, pids), processCPU(b, pids[1:]), decided(d)
		t0 := time.Now()
		time.Sleep(4 * rlqsenvoy.EnvoyReportInterval)
		out = append(out, benchRound{decisions: decided(d) - n0, dur: time.Since(t0),
			cpu: processCPU(b, pids) - cpu0, redis: processCPU(b, pids[1:]) - redis0})
	}
	return out
}

// fleetReports starts fleetEnvoys instances reporting the same
// fleetBuckets buckets each (every bucket asked once every 10 s, so that
// none is abandoned) and logs the agent's and its Redis's CPU while they
// report, and the report-to-first-assignment latencies.
func fleetReports(b *testing.B, c *Cluster, agent *AgentProcess, cfg string) {
	var buckets []EdgeDemand
	for j := range fleetBuckets {
		buckets = append(buckets, EdgeDemand{Bucket: map[string]string{"tenant": fmt.Sprint("t", j)}, Rate: 0.1})
	}
	e, _, stop := driveBenchEdge(b, c, "fleet", cfg, fleetEnvoys, EdgeLoad{
		Demand: func(string, int, time.Duration) []EdgeDemand { return buckets },
		Step:   200 * time.Millisecond, DemandEvery: time.Minute})
	defer stop()
	t0 := time.Now()
	waitAssigned(b, e, fleetEnvoys*fleetBuckets, 3*time.Minute)
	allAssigned := time.Since(t0)
	pids := []int{agent.Pid(), c.Redis[0].Pid()}
	agentCPU0, redisCPU0 := processCPU(b, pids[:1]), processCPU(b, pids[1:])
	t1 := time.Now()
	const steady = 6 * rlqsenvoy.EnvoyReportInterval
	time.Sleep(steady)
	el := time.Since(t1)
	agentCPU, redisCPU := processCPU(b, pids[:1])-agentCPU0, processCPU(b, pids[1:])-redisCPU0
	var lat []time.Duration
	for _, in := range e.Instances(0) {
		lat = append(lat, in.FirstAssignments()...)
	}
	slices.Sort(lat)
	q := func(p float64) time.Duration {
		return lat[min(len(lat)-1, int(p*float64(len(lat))))].Round(time.Millisecond)
	}
	reports := float64(fleetEnvoys*fleetBuckets) * el.Seconds() / rlqsenvoy.EnvoyReportInterval.Seconds()
	limited := scrapeMetric(b, agent, "quotalease_agent_edge_reports_limited_total")
	b.Logf("%d Envoy instances x %d buckets, reports every %s (%.0f bucket reports/s): all %d buckets assigned %s after the instances started;\n"+
		"  agent CPU %.1f%% of a core (%.1f ms per 1,000 bucket reports), its Redis %.1f%%, over %s;\n"+
		"  report-to-first-assignment latency over %d buckets: p50 %s, p99 %s, max %s; messages the agent dropped beyond a stream's pace (first reports of 1,000 new buckets at once): %v",
		fleetEnvoys, fleetBuckets, rlqsenvoy.EnvoyReportInterval, reports/el.Seconds(), fleetEnvoys*fleetBuckets, allAssigned.Round(100*time.Millisecond),
		100*agentCPU.Seconds()/el.Seconds(), agentCPU.Seconds()*1000/(reports/1000), 100*redisCPU.Seconds()/el.Seconds(), el.Round(100*time.Millisecond),
		len(lat), q(.5), q(.99), lat[len(lat)-1].Round(time.Millisecond), limited)
	b.ReportMetric(100*agentCPU.Seconds()/el.Seconds(), "fleet-agent-cpu-%")
	b.ReportMetric(float64(q(.99).Milliseconds()), "fleet-p99-report-to-assignment-ms")
}

// driveBenchEdge starts envoys Envoy-like clients behind the cluster's
// region bench, each with one filter of domain configured as cfg's edge
// states and reporting at Envoy's interval, and drives load through them
// (for at most 5 minutes); stop ends the traffic and closes the clients,
// so that each measurement's clients are gone before the next one's start.
func driveBenchEdge(b *testing.B, c *Cluster, domain, cfg string, envoys int, load EdgeLoad) (e *Edge, d *EdgeDriver,
	stop func()) {
	b.Helper()
	e, err := c.StartEdge(b.Context(), "bench", EdgeOptions{Envoys: envoys,
		Filters:        []EdgeFilter{{Domain: domain, Settings: edgeSettings(b, cfg)}},
		ReportInterval: rlqsenvoy.EnvoyReportInterval})
	if err != nil {
		b.Fatal(err)
	}
	d = NewEdgeDriver()
	traffic, cancel := context.WithCancel(b.Context())
	done := make(chan struct{})
	go func() { defer close(done); d.Run(traffic, 5*time.Minute, load, e) }()
	return e, d, func() { cancel(); <-done; e.Close() }
}

// edgeSettings are the bucket settings of an Envoy configured as the edge
// settings of configuration cfg state.
func edgeSettings(b testing.TB, cfg string) *rlqfv3.RateLimitQuotaBucketSettings {
	ps, err := policy.ParsePolicyFile([]byte(cfg))
	if err != nil || len(ps) == 0 {
		b.Fatalf("%v: %s", err, cfg)
	}
	s, err := rlqsenvoy.SettingsFor(ps[0].Edge, rlqsenvoy.EnvoyReportInterval)
	if err != nil {
		b.Fatal(err)
	}
	return s
}

// waitAssigned waits until e's instances hold n assigned buckets, all of
// them assigned at least once.
func waitAssigned(b testing.TB, e *Edge, n int, limit time.Duration) {
	b.Helper()
	poll(b, limit, 200*time.Millisecond, func() error {
		got := 0
		for _, in := range e.Instances(0) {
			got += len(in.FirstAssignments())
		}
		if got >= n {
			return nil
		}
		return fmt.Errorf("%d of %d buckets assigned after %s: %+v", got, n, limit, e.Stats())
	})
}

func decided(d *EdgeDriver) float64 { n, _ := d.Decisions(); return float64(n) }

// rlsOpenLoop calls ShouldRateLimit at rate calls a second for dur, one
// descriptor each, tenants t0, t1, ... in turn over edgeBenchTenants: 32
// callers, each keeping its own schedule (a late call is
// sent at once, so a system that falls behind answers fewer). It returns
// every answered call's latency; a failed call fails b.
func rlsOpenLoop(b *testing.B, ctx context.Context, client rlsv3.RateLimitServiceClient, rate float64, dur time.Duration) []time.Duration {
	const callers = 32
	ctx, cancel := context.WithTimeout(ctx, dur)
	defer cancel()
	start := time.Now()
	return gather(callers, func(g int) []time.Duration {
		var mine []time.Duration
		for i := g; ctx.Err() == nil; i += callers {
			if w := time.Until(start.Add(time.Duration(float64(i) / rate * float64(time.Second)))); w > 0 {
				select {
				case <-ctx.Done():
				case <-time.After(w):
				}
				if ctx.Err() != nil {
					break
				}
			}
			req := &rlsv3.RateLimitRequest{Domain: "bench", Descriptors: []*commonrl.RateLimitDescriptor{{Entries: []*commonrl.RateLimitDescriptor_Entry{
				{Key: "tenant", Value: "t" + strconv.Itoa(i%edgeBenchTenants)}}}}}
			t := time.Now()
			if _, err := client.ShouldRateLimit(ctx, req); err != nil {
				if !ending(ctx) {
					b.Errorf("ShouldRateLimit: %v", err)
				}
				break
			}
			mine = append(mine, time.Since(t))
		}
		return mine
	})
}

// waitAnswers waits until client, of the system name, answers
// ShouldRateLimit with a limit.
func waitAnswers(b *testing.B, name string, client rlsv3.RateLimitServiceClient) {
	b.Helper()
	poll(b, 30*time.Second, 100*time.Millisecond, func() error {
		if err := answersLimit(b.Context(), client); err != nil {
			return fmt.Errorf("%s %v", name, err)
		}
		return nil
	})
}

// answersLimit returns an error unless client answers a call of one
// tenant's descriptor (domain bench) with its limit, as a system serving
// the benchmark's configuration does.
func answersLimit(ctx context.Context, client rlsv3.RateLimitServiceClient) error {
	resp, err := client.ShouldRateLimit(ctx, peerLoad{descriptors: 1}.request(0))
	if err == nil && resp.Statuses[0].CurrentLimit != nil {
		return nil
	}
	return fmt.Errorf("not answering with the limit: %v %v", resp, err)
}

// activity is what an agent's edge rounds did, from its counters.
type activity map[string]float64

// edgeCounters are the agent's edge round counters (quotalease_agent_edge_<name>_total)
// logged per shape, in the order logged.
var edgeCounters = []string{"rounds", "syncs", "identity_plans", "messages"}

// edgeActivity reads a's edge round counters, in one scrape.
func edgeActivity(b testing.TB, a *AgentProcess) activity {
	out := activity{}
	for _, s := range scrape(b, a.web, a.HTTP+"/metrics") {
		for _, n := range edgeCounters {
			if s.name == "quotalease_agent_edge_"+n+"_total" {
				out[n] += s.value
			}
		}
	}
	return out
}

// per is how many of each a did a second since was, d ago.
func (a activity) per(was activity, d time.Duration) string {
	var parts []string
	for _, n := range edgeCounters {
		parts = append(parts, fmt.Sprintf("%s %.1f/s", n, (a[n]-was[n])/d.Seconds()))
	}
	return strings.Join(parts, ", ")
}

// scrapeMetric sums every series of the metric name on agent's /metrics;
// a name with labels (name{label="value"}) selects the one series written
// so.
func scrapeMetric(b testing.TB, a *AgentProcess, name string) float64 {
	sum := 0.0
	for _, s := range scrape(b, a.web, a.HTTP+"/metrics") {
		if s.name == name || s.labels != "" && s.name+"{"+s.labels+"}" == name {
			sum += s.value
		}
	}
	return sum
}

// agentProfiler takes CPU profiles of the agent from its debug listener
// (addr) into dir, when make bench-peers runs with
// QUOTALEASE_BENCH_PROFILES=dir; with no dir it does nothing.
type agentProfiler struct{ addr, dir string }

// start begins a profile of the agent over d, saved as dir/name.prof, and
// returns a function that waits for it.
func (p agentProfiler) start(b *testing.B, name string, d time.Duration) (wait func()) {
	if p.dir == "" {
		return func() {}
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		resp, err := http.Get(fmt.Sprintf("http://%s/debug/pprof/profile?seconds=%d", p.addr, int(d.Seconds())))
		if err != nil {
			b.Errorf("profile %s: %v", name, err)
			return
		}
		defer resp.Body.Close()
		f, err := os.Create(filepath.Join(p.dir, name+".prof"))
		if err == nil {
			_, err = io.Copy(f, resp.Body)
			err = errors.Join(err, f.Close())
		}
		if err != nil {
			b.Errorf("profile %s: %v", name, err)
		}
	}()
	return func() { <-done }
}
