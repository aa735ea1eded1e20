package cluster

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/quota-lease/quota-lease/internal/testenv"
)

// libraryPolicy is one tenant's limit served at the edge to at most four
// instances per region, which deny while they hold no assignment (the
// bound's edge term is 0).
const libraryPolicy = `name: lib-tenant
identity: [tenant]
limit: 100
period: 1s
burst: 100
failure: {mode: static-share, static_fraction: 0.05}
edge: {instances: 4, no_assignment: deny}
`

// libraryAgentArgs tune the agents' edge rounds for clients that report
// every second (Envoy: every 5 s): 2% of an instance's refill rebuilds the
// slack that pays for buckets that start full (the default is 20%).
// Measured here after warm-up: 94-96% of the limit, against 90-92% with
// the default.
var libraryAgentArgs = []string{"--edge-burst-fraction", "0.02"}

// Go services deciding in-process with package quotalease, as real
// processes: one coordinator, regions us and eu each with its
// redis-server and agent, three examples/limited-service processes per
// region (mutual TLS as a service, reports every second) and direct checks
// of the same tenant, the tenant asking twice its limit. After warm-up
// the tenant gets over 90% of its limit (the check allows 88% on a loaded
// machine); then through an agent killed
// and restarted, a service's stream cut and a region's Redis paused 2 s,
// every window of what the HTTP clients and direct callers saw admitted
// stays within the bound the coordinator publishes.
func TestLibraryServicesE2E(t *testing.T) {
	testenv.SkipMultiProcess(t)
	c := startWith(t, libraryPolicy, Options{Regions: []string{"us", "eu"}, Coordinators: 1, LeaseDuration: 10 * time.Second,
		CheckTimeout: 250 * time.Millisecond, AgentArgs: libraryAgentArgs})
	ctx := t.Context()
	var services []*ServiceProcess
	for _, r := range []string{"us", "eu"} {
		svs, err := c.StartServices(ctx, r, "lib-tenant", 3, time.Second)
		if err != nil {
			t.Fatal(err)
		}
		services = append(services, svs...)
	}

	traffic, stop := context.WithCancel(ctx)
	defer stop()
	var wg sync.WaitGroup
	lib, direct := &ServiceDriver{Policy: "lib-tenant", Tenant: "a"}, NewDriver(c)
	wg.Add(2)
	go func() { defer wg.Done(); lib.Run(traffic, 2*time.Minute, 30, services...) }()
	go func() {
		defer wg.Done()
		direct.Run(traffic, 2*time.Minute, Load{Policy: "lib-tenant", Attribute: "tenant",
			Identity: func(string, time.Duration) string { return "a" },
			Rate:     func(string, time.Duration) float64 { return 10 }})
	}()

	// Warm-up, then 20 seconds judged against the limit: 6 × 30 + 2 × 10
	// a second asked, twice the limit, so an ideal limiter admits all of
	// it. Measured: 93.5-96.4% on a quiet machine, 90.6-94.5% with this
	// test under -race beside four busy loops. The check leaves CI's
	// loaded -race pass that margin: below 88% is a regression.
	time.Sleep(8 * time.Second)
	from := time.Now()
	time.Sleep(20 * time.Second)
	to := time.Now()
	adm := append(lib.Admissions(), direct.Admissions()...)
	n := 0
	for _, a := range adm {
		if !a.At.Before(from) && a.At.Before(to) {
			n++
		}
	}
	use := float64(n) / (100 * to.Sub(from).Seconds())
	t.Logf("after warm-up: %d admitted in %v, %.1f%% of the limit", n, to.Sub(from).Round(time.Millisecond), 100*use)
	if use < 0.88 {
		t.Errorf("after warm-up the tenant got %.1f%% of its limit, want at least 88%% (90%% or more unloaded)", 100*use)
	}

	// Faults: us's agent killed and started again, one eu service's stream
	// cut for a second, eu's Redis paused 2 s.
	ag := c.RegionAgents("us")[0]
	ag.Kill()
	if err := ag.Restart(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(4 * time.Second)
	services[3].Proxy.Cut()
	time.Sleep(time.Second)
	services[3].Proxy.Restore()
	time.Sleep(3 * time.Second)
	pauseRedis(t, c, "eu", 2*time.Second)
	time.Sleep(4 * time.Second)
	stop()
	wg.Wait()

	t.Logf("services: %s", lib.Describe())
	for region, st := range direct.Stats("lib-tenant") {
		t.Logf("direct checks in %s: %s", region, st.Describe())
	}
	adm = append(lib.Admissions(), direct.Admissions()...)
	slack := time.Duration(0)
	for _, x := range adm {
		slack = max(slack, x.Took)
	}
	p, dep := policyOf(t, libraryPolicy), edgeDeployment(c)
	checkPublished(t, c, p, dep)
	for _, w := range []time.Duration{time.Second, 5 * time.Second} {
		checkWindows(t, adm, p, dep, w, slack)
	}
}
