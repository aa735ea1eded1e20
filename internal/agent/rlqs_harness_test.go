package agent

import (
	"context"
	"maps"
	"slices"
	"sync"
	"testing"
	"time"

	rlqfv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/rate_limit_quota/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/quota-lease/quota-lease/admission"
	"github.com/quota-lease/quota-lease/internal/testenv"
	"github.com/quota-lease/quota-lease/internal/testenv/rlqsenvoy"
)

// edgeTestPolicy is a policy served at the edge, for one tenant per
// bucket: 100 requests/s, Envoy denying without an assignment.
const edgeTestPolicy = `name: api
identity: [tenant]
limit: 100
period: 1s
burst: 100
failure: {mode: static-share, static_fraction: 0.2}
edge: {instances: 4, no_assignment: deny, ttl: 1s}
`

// edgeTestReport is the Envoy-like clients' report interval in these
// tests (Envoy's is 5 s).
const edgeTestReport = 250 * time.Millisecond

// fastEdge sets the agent's RLQS timings for tests: a round every 20 ms,
// changes at most every two reports.
func fastEdge(c *Config) {
	c.Edge.Tick, c.Edge.GrowWait, c.Edge.Margin = 20*time.Millisecond, 100*time.Millisecond, 100*time.Millisecond
	c.Edge.ChangeEvery, c.Edge.AbandonAfter = 2*edgeTestReport, 5*time.Second
	// Changes every 0.5 s pay for their buckets' starts out of the refill
	// (tokens.Assign): with the default fifth that would leave 88% of the rate
	// refilled; these tests' evenly paced traffic needs no bucket to speak of.
	c.Edge.BurstFraction = 0.05
}

// denySettings are Envoy bucket settings that deny without an assignment,
// as edgeTestPolicy says.
func denySettings() *rlqfv3.RateLimitQuotaBucketSettings {
	deny := &typev3.RateLimitStrategy{Strategy: &typev3.RateLimitStrategy_BlanketRule_{BlanketRule: typev3.RateLimitStrategy_DENY_ALL}}
	return &rlqfv3.RateLimitQuotaBucketSettings{
		ReportingInterval: durationpb.New(edgeTestReport),
		NoAssignmentBehavior: &rlqfv3.RateLimitQuotaBucketSettings_NoAssignmentBehavior{
			NoAssignmentBehavior: &rlqfv3.RateLimitQuotaBucketSettings_NoAssignmentBehavior_FallbackRateLimit{FallbackRateLimit: deny}},
	}
}

// startEnvoy starts an Envoy-like instance streaming to target, closed at
// the end of t.
func startEnvoy(t testing.TB, target, name string) *rlqsenvoy.Instance {
	return startEnvoyEvery(t, target, name, edgeTestReport)
}

// startEnvoyEvery is startEnvoy reporting every interval.
func startEnvoyEvery(t testing.TB, target, name string, every time.Duration) *rlqsenvoy.Instance {
	t.Helper()
	cfg := rlqsenvoy.DefaultConfig()
	cfg.Name, cfg.Target, cfg.Domain, cfg.Settings, cfg.ReportInterval = name, target, "shop", denySettings(), every
	cfg.DialOptions = []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}
	in, err := rlqsenvoy.New(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { in.Close() })
	return in
}

// servedEnvoy runs edgeTestPolicy's coordinator, an agent of region us on
// the Redis at redisAddr and one Envoy-like instance sending acme 50
// requests a second until the test ends, and waits until the instance
// holds a token bucket the agent assigned.
func servedEnvoy(t *testing.T, redisAddr string) (*runningAgent, *rlqsenvoy.Instance) {
	t.Helper()
	k := policyCoordinator(t, edgeTestPolicy)
	ra := startAgent(t, "us", redisAddr, []string{k.addr}, fastEdge)
	in := startEnvoy(t, ra.grpcAddr, "a")
	stop := make(chan struct{})
	t.Cleanup(func() { close(stop) })
	go drive(in, acme, 50, stop, 20*time.Second)
	testenv.WaitFor(t, 10*time.Second, "the Envoy assigned a bucket", func() bool {
		st, ok := in.State(acme)
		return ok && st.Assigned && st.Strategy.GetTokenBucket() != nil
	})
	return ra, in
}

// drive sends requests of bucket to in (an Envoy-like instance or a
// library client) at about perSecond until stop is closed or limit passes.
func drive[D any](in interface{ Allow(map[string]string) D }, bucket map[string]string, perSecond float64,
	stop <-chan struct{}, limit time.Duration) {
	every := time.Duration(float64(time.Second) / perSecond)
	t := time.NewTicker(every)
	defer t.Stop()
	end := time.After(limit)
	for {
		select {
		case <-stop:
			return
		case <-end:
			return
		case <-t.C:
			in.Allow(bucket)
		}
	}
}

// edgeTraffic is load on tenant acme's bucket from Envoy-like instances
// and direct checks, running until end; rec holds what the direct checks
// admitted (and, once ended, the instances' admissions too).
type edgeTraffic struct {
	stop    chan struct{}
	stopped sync.Once
	wg      sync.WaitGroup
	envoys  []*rlqsenvoy.Instance
	rec     admissions
}

// newEdgeTraffic is load that has not started yet: drive and check start
// its parts. It is stopped at the end of t at the latest, before the
// agents it runs against.
func newEdgeTraffic(t testing.TB) *edgeTraffic {
	t.Helper()
	tr := &edgeTraffic{stop: make(chan struct{})}
	t.Cleanup(tr.halt)
	return tr
}

// drive has in send acme's requests at about perSecond, for at most limit.
func (tr *edgeTraffic) drive(in *rlqsenvoy.Instance, perSecond float64, limit time.Duration) {
	tr.envoys = append(tr.envoys, in)
	tr.wg.Add(1)
	go func() { defer tr.wg.Done(); drive(in, acme, perSecond, tr.stop, limit) }()
}

// check checks acme in on a every interval, recording what it admits.
func (tr *edgeTraffic) check(t testing.TB, a *Agent, every time.Duration) {
	t.Helper()
	tr.wg.Add(1)
	go func() {
		defer tr.wg.Done()
		in := admission.Request{Policy: "api", Attributes: map[string]string{"tenant": "acme"}}
		checkDirect(t, a, in, every, tr.stop, &tr.rec)
	}()
}

// end stops the load, waits for it to stop and returns everything it had
// admitted, by the direct checks' and the instances' own records.
func (tr *edgeTraffic) end() *admissions {
	tr.halt()
	tr.rec.addEnvoy(acme, tr.envoys...)
	return &tr.rec
}

// halt stops the load and waits for it to stop.
func (tr *edgeTraffic) halt() {
	tr.stopped.Do(func() { close(tr.stop) })
	tr.wg.Wait()
}

// assignedRate is the refill, in requests per second, of the token bucket
// in assigns to bucket now; 0 without one.
func assignedRate(in *rlqsenvoy.Instance, bucket map[string]string) float64 {
	st, ok := in.State(bucket)
	tb := st.Strategy.GetTokenBucket()
	if !ok || !st.Assigned || tb == nil {
		return 0
	}
	secs := tb.GetFillInterval().GetSeconds()
	if secs < 1 {
		return 0
	}
	return float64(tb.GetTokensPerFill().GetValue()) / float64(secs)
}

// regionRate is what region's agent a may enforce of policy name for
// tenant now, in requests per second of a policy of limit per second.
func regionRate(a *Agent, name, tenant string, limit float64) float64 {
	p, _ := a.policies.Policy(name)
	id, _ := p.IdentityOf(map[string]string{"tenant": tenant})
	amt, _ := a.leaser.Enforce(name, id, a.cfg.Clock.Now())
	return limit * float64(amt) / float64(p.Limits().Amount())
}

// admissions are the times requests of one identity were admitted, from
// the clients' own records: Envoy-like instances' and direct checks'.
type admissions struct {
	mu sync.Mutex
	at []time.Time
}

func (r *admissions) add(t time.Time) {
	r.mu.Lock()
	r.at = append(r.at, t)
	r.mu.Unlock()
}

func (r *admissions) count() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.at)
}

// addEnvoy adds what each of ins admitted of bucket.
func (r *admissions) addEnvoy(bucket map[string]string, ins ...*rlqsenvoy.Instance) {
	for _, in := range ins {
		for _, rec := range in.Records() {
			if maps.Equal(rec.Bucket, bucket) {
				for _, t := range rec.Admitted {
					r.add(t)
				}
			}
		}
	}
}

// most is the most admitted in any window of length w, and when it
// starts.
func (r *admissions) most(w time.Duration) (int, time.Time) {
	r.mu.Lock()
	at := slices.Clone(r.at)
	r.mu.Unlock()
	slices.SortFunc(at, func(a, b time.Time) int { return a.Compare(b) })
	best, from, j := 0, time.Time{}, 0
	for i := range at {
		for j < len(at) && at[j].Sub(at[i]) <= w {
			j++
		}
		if j-i > best {
			best, from = j-i, at[i]
		}
	}
	return best, from
}

// checkDirect checks in on a every interval until stop, recording what
// it admitted.
func checkDirect(t testing.TB, a *Agent, in admission.Request, every time.Duration, stop <-chan struct{}, rec *admissions) {
	callEvery(t, a, in, every, int(time.Minute/every), stop, func(o admission.Outcome) {
		if o.Allowed {
			rec.add(time.Now())
		}
	})
}

// gaugeValue sums every series of the gauge named name on a's registry.
func gaugeValue(t testing.TB, a *Agent, name string) float64 {
	t.Helper()
	mfs, err := a.m.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	sum := 0.0
	for _, mf := range mfs {
		if mf.GetName() == name {
			for _, m := range mf.GetMetric() {
				sum += m.GetGauge().GetValue()
			}
		}
	}
	return sum
}

// withinLimit fails t if rec holds, in some window of 0.5 s, 1 s or 3 s,
// more than one limiter of burst plus rate per second admits in it.
func withinLimit(t *testing.T, rec *admissions, burst, rate float64) {
	t.Helper()
	for _, w := range []time.Duration{500 * time.Millisecond, time.Second, 3 * time.Second} {
		got, from := rec.most(w)
		ref := burst + rate*w.Seconds()
		t.Logf("most admitted in %s: %d (from %s), the limit's %v", w, got, from.Format("15:04:05.000"), ref)
		if float64(got) > ref*1.001 {
			t.Errorf("%d admitted in a window of %s starting %s, more than one limiter admits (%v)", got, w, from.Format("15:04:05.000"), ref)
		}
	}
}
