package cluster

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/quota-lease/quota-lease/internal/testenv"
)

// floodPolicy is a per-tenant policy served at the edge and checked
// directly, as the runbook's deployments serve api-per-tenant.
const floodPolicy = `name: api
identity: [tenant]
limit: 1000
period: 1s
edge: {instances: 20, no_assignment: deny, ttl: 2s}
`

// Envoy-like clients holding the service certificate flood an agent with
// buckets of distinct tenants (20 streams of 2,000 each, reported every
// 2 s: four times the identities an agent serves at the edge), while a
// quiet tenant is checked directly through the same agent. No command
// holds the region's Redis long but by chance (its own SLOWLOG, 50 ms: the
// edge's reservations are written and read in calls of about a
// millisecond, and the agent serves at most its identities; the previous
// code's one-call read of the whole reservation took 57-94 ms here, every
// round), the quiet tenant's checks stay decided by Redis, and the agent
// stays ready and small. The check timeout is 250 ms, as in the other
// tests on these shared cores: at the default 20 ms a loaded machine alone
// sends checks to the local fallback.
func TestRLQSFloodLeavesDirectChecks(t *testing.T) {
	testenv.SkipMultiProcess(t)
	c := startWith(t, floodPolicy, Options{Regions: []string{"us"}, Coordinators: 1, CheckTimeout: 250 * time.Millisecond})
	agent := c.Agents[0]
	ctx := t.Context()
	if err := agent.WaitKnows(ctx, floodPolicy); err != nil {
		t.Fatal(err)
	}
	waitLeased(t, agent, "api", "tenant", 30*time.Second)
	quiet := Load{Policy: "api", Attribute: "tenant", Identities: 1, Rate: func(string, time.Duration) float64 { return 100 }}
	// checks runs the quiet tenant's direct checks for dur: the part of the
	// decisions taken by the local fallback, the p99 of the admitted ones,
	// how many were decided and refused. Refusals are counted, not judged:
	// an agent too loaded to read the region's reservations within their
	// trust leaves the edge's policies' direct checks nothing until it
	// does (docs/rlqs-server.md), which the -race build on a busy machine
	// shows whatever the flood does to Redis.
	checks := func(d *Driver, dur time.Duration) (fallback float64, p99 time.Duration, n, refused int64) {
		d.Run(ctx, dur, quiet)
		st := d.Stats("api")["us"]
		if n = st.Admitted + st.Rejected; n == 0 {
			t.Fatalf("no direct check was decided: %+v", st)
		}
		var took []time.Duration
		for _, a := range d.Admissions() {
			took = append(took, a.Took)
		}
		if len(took) > 0 {
			slices.Sort(took)
			p99 = took[len(took)*99/100]
		}
		return float64(st.Modes["local-fallback"]) / float64(n), p99, n, st.Rejected
	}
	baseFallback, baseP99, baseN, baseRefused := checks(NewDriver(c), 4*time.Second)
	rdb := redis.NewClient(&redis.Options{Addr: c.Redis[0].Addr})
	defer rdb.Close()
	const slow, maxSlow = 50 * time.Millisecond, 2
	if err := rdb.ConfigSet(ctx, "slowlog-log-slower-than", strconv.FormatInt(slow.Microseconds(), 10)).Err(); err != nil {
		t.Fatal(err)
	}
	if err := rdb.SlowLogReset(ctx).Err(); err != nil {
		t.Fatal(err)
	}

	const streams, buckets = 20, 2000
	e := startEdge(t, c, "us", EdgeOptions{Envoys: streams,
		Filters:        []EdgeFilter{{Domain: "shop", Settings: edgeSettings(t, floodPolicy)}},
		ReportInterval: 2 * time.Second})
	for i, in := range e.Instances(0) {
		for j := range buckets {
			in.Allow(map[string]string{"policy": "api", "tenant": fmt.Sprintf("flood-%d-%d", i, j)})
		}
	}
	notReady := make(chan int, 1)
	probe, stopProbe := context.WithCancel(ctx)
	go func() { notReady <- pollReady(probe, agent) }()
	time.Sleep(3 * time.Second) // the first reports of every bucket reach the agent
	fallback, p99, n, refused := checks(NewDriver(c), 8*time.Second)
	stopProbe()
	rss := procStatus(t, agent.Pid(), "VmRSS") / 1024 // MB
	slowlog, err := rdb.SlowLogGet(ctx, 10).Result()
	if err != nil {
		t.Fatal(err)
	}
	// A command the machine's other processes kept off the CPU shows as slow
	// too: one or two such are noise; a read of the whole reservation
	// (the previous code) is slow every round.
	for _, e := range slowlog {
		t.Logf("Redis ran a command for %v (more than %v) during the flood: %.80q", e.Duration, slow, strings.Join(e.Args, " "))
	}
	if len(slowlog) > maxSlow {
		t.Errorf("Redis ran %d commands of more than %v during the flood, want at most %d", len(slowlog), slow, maxSlow)
	}
	limited := scrapeMetric(t, agent, `quotalease_agent_edge_reports_limited_total{reason="identities"}`)
	t.Logf("unloaded: %d checks (%d refused), %.2f%% by the local fallback, p99 %v; flooded (%d streams x %d tenants): %d checks (%d refused), %.2f%% by the local fallback, p99 %v; agent RSS %d MB; %.0f buckets beyond the identities an agent serves",
		baseN, baseRefused, 100*baseFallback, baseP99, streams, buckets, n, refused, 100*fallback, p99, rss, limited)
	if fallback > max(0.01, baseFallback+0.01) {
		t.Errorf("%.2f%% of the quiet tenant's checks went to the local fallback under the flood (%.2f%% unloaded), want at most 1%% more", 100*fallback, 100*baseFallback)
	}
	if k := <-notReady; k > 0 {
		t.Errorf("the agent was not ready %d times during the flood", k)
	}
	if rss >= 512 {
		t.Errorf("agent RSS %d MB, want under 512", rss)
	}
	if limited == 0 {
		t.Error("no bucket beyond the agent's identities was counted")
	}
}

// pollReady polls a's /readyz every 200 ms until ctx ends and returns how
// many answers were not 200.
func pollReady(ctx context.Context, a *AgentProcess) int {
	bad := 0
	for {
		select {
		case <-ctx.Done():
			return bad
		case <-time.After(200 * time.Millisecond):
		}
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, a.HTTP+"/readyz", nil)
		resp, err := a.web.Do(req)
		if err != nil {
			if ctx.Err() == nil {
				bad++
			}
			continue
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			bad++
		}
	}
}
