package agent

import (
	"context"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/resolver"
	"google.golang.org/grpc/resolver/manual"

	"github.com/quota-lease/quota-lease/internal/testenv"
	"github.com/quota-lease/quota-lease/internal/testenv/rlqsenvoy"
	"github.com/quota-lease/quota-lease/lease"
)

// startEnvoyOn starts an Envoy-like instance whose cluster lists addrs,
// the first first (pick_first): it moves to the next when one dies.
func startEnvoyOn(t testing.TB, name string, addrs ...string) *rlqsenvoy.Instance {
	t.Helper()
	r := manual.NewBuilderWithScheme("agents" + name)
	var st resolver.State
	for _, a := range addrs {
		st.Addresses = append(st.Addresses, resolver.Address{Addr: a})
	}
	r.InitialState(st)
	cfg := rlqsenvoy.DefaultConfig()
	cfg.Name, cfg.Target, cfg.Domain, cfg.Settings, cfg.ReportInterval = name, r.Scheme()+":///agents", "shop", denySettings(), edgeTestReport
	cfg.DialOptions = []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithResolvers(r)}
	in, err := rlqsenvoy.New(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { in.Close() })
	return in
}

// Two agent instances of one region share its Redis; Envoy instances
// stream to either, direct checks go to both, and then one agent dies: its
// Envoy moves to the other agent, its reservation ends by itself in
// Redis. Everything admitted for the tenant, counted from the clients' own
// records, stays within what one limiter admits in every window.
func TestRLQSTwoAgentsOneRedis(t *testing.T) {
	k := policyCoordinator(t, edgeTestPolicy)
	rs := startRedis(t)
	one := startAgent(t, "us", rs.Addr, []string{k.addr}, func(c *Config) { fastEdge(c); c.Instance = "us-1" })
	two := startAgent(t, "us", rs.Addr, []string{k.addr}, func(c *Config) { fastEdge(c); c.Instance = "us-2" })
	a := startEnvoyOn(t, "a", one.grpcAddr, two.grpcAddr)
	b := startEnvoyOn(t, "b", two.grpcAddr)
	tr := newEdgeTraffic(t)
	tr.drive(a, 300, 30*time.Second)
	tr.drive(b, 300, 30*time.Second)
	tr.check(t, one.a, 8*time.Millisecond)
	tr.check(t, two.a, 8*time.Millisecond)
	testenv.WaitFor(t, 10*time.Second, "both agents reserving for the edge", func() bool {
		return gaugeValue(t, one.a, "quotalease_agent_edge_reserved") > 0 && gaugeValue(t, two.a, "quotalease_agent_edge_reserved") > 0 &&
			assignedRate(a, acme) > 0 && assignedRate(b, acme) > 0
	})
	time.Sleep(2 * time.Second) // traffic runs; the checks are below, on the records
	one.stop()
	testenv.WaitFor(t, 10*time.Second, "a's Envoy moved to the other agent", func() bool {
		return a.Stats().StreamStarts >= 2 && gaugeValue(t, two.a, "quotalease_agent_edge_streams") == 2
	})
	time.Sleep(2 * time.Second)
	withinLimit(t, tr.end(), 100, 100)
	if s := a.Stats(); s.Allowed < 50 {
		t.Fatalf("a admitted only %d", s.Allowed)
	}
}

// When the region's lease lapses, assignments follow its degraded budget
// (a fifth of the limit here), before the grant ends: what the edge admits
// after it, counted from the client's records, stays within that budget.
func TestRLQSDegraded(t *testing.T) {
	k, ra := coordinatedAgent(t, edgeTestPolicy, fastEdge)
	a, b := startEnvoy(t, ra.grpcAddr, "a"), startEnvoy(t, ra.grpcAddr, "b")
	tr := newEdgeTraffic(t)
	tr.drive(a, 300, 30*time.Second)
	tr.drive(b, 300, 30*time.Second)
	testenv.WaitFor(t, 10*time.Second, "the edge holding most of the limit", func() bool {
		return assignedRate(a, acme)+assignedRate(b, acme) > 60
	})
	k.stop()
	testenv.WaitFor(t, 10*time.Second, "the lease lapsing", func() bool {
		_, mode := ra.a.leaser.Enforce("api", "acme", time.Now())
		return mode == lease.ModeDegraded
	})
	lapsed := time.Now()
	if got := assignedRate(a, acme) + assignedRate(b, acme); got > 20 {
		t.Errorf("assigned %.1f requests/s when the lease lapsed, the degraded budget is 20", got)
	}
	time.Sleep(3 * time.Second)
	rec := tr.end()
	var after admissions
	for _, at := range rec.at {
		if at.After(lapsed.Add(1100 * time.Millisecond)) { // assignments made before may live that long
			after.add(at)
		}
	}
	got, _ := after.most(time.Second)
	t.Logf("degraded: most admitted in 1s %d, the budget's %d", got, 20+20)
	if got > 40 || got < 10 {
		t.Errorf("%d admitted in a second on a degraded budget of 20/s (burst 20)", got)
	}
}

// Demand moves from one region's edge to another's, back and forth, both
// beyond the limit: the region losing share does not acknowledge its
// smaller grant while its Envoy instances may still enforce the larger
// one, so what both regions' edges admit together, counted from the
// clients' records, stays within one limiter's worth in every window.
func TestRLQSRegionsShift(t *testing.T) {
	if os.Getenv("QUOTALEASE_RLQS_LONG") == "" {
		t.Skip("moves a tenant's share between regions for 12 s: make test-rlqs (QUOTALEASE_RLQS_LONG=1)")
	}
	// Little burst: an overlap would show.
	k := policyCoordinator(t, strings.Replace(edgeTestPolicy, "burst: 100", "burst: 10", 1))
	us := startAgent(t, "us", startRedis(t).Addr, []string{k.addr}, fastEdge)
	eu := startAgent(t, "eu", startRedis(t).Addr, []string{k.addr}, fastEdge)
	a, b := startEnvoy(t, us.grpcAddr, "us-a"), startEnvoy(t, eu.grpcAddr, "eu-a")
	b.Allow(acme)
	var wg sync.WaitGroup
	phase := func(in *rlqsenvoy.Instance, d time.Duration) {
		stop := make(chan struct{})
		wg.Add(1)
		go func() { defer wg.Done(); drive(in, acme, 400, stop, d) }()
		time.Sleep(d)
		close(stop)
	}
	phase(a, 4*time.Second)
	phase(b, 8*time.Second) // the tenant's share moves to eu within it
	wg.Wait()
	var rec admissions
	rec.addEnvoy(acme, a, b)
	withinLimit(t, &rec, 10, 100)
	if sa, sb := a.Stats(), b.Stats(); sa.Allowed < 100 || sb.Allowed < 50 {
		t.Fatalf("the edges admitted %d and %d: shares did not follow demand", sa.Allowed, sb.Allowed)
	}
}
