package agent

import (
	"sort"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/quota-lease/quota-lease/admission"
	"github.com/quota-lease/quota-lease/bound"
	"github.com/quota-lease/quota-lease/internal/testenv"
	"github.com/quota-lease/quota-lease/lease"
	"github.com/quota-lease/quota-lease/policy"
)

// maxInWindow is the most admissions, by the client's own clock, in any
// window of length w.
func maxInWindow(at []time.Duration, w time.Duration) int {
	sort.Slice(at, func(i, j int) bool { return at[i] < at[j] })
	best, lo := 0, 0
	for hi := range at {
		for at[hi]-at[lo] >= w {
			lo++
		}
		best = max(best, hi-lo+1)
	}
	return best
}

// Redis paused and resumed in short cycles around the check timeout (and
// in long ones) while 300 checks a second arrive: each stall sends checks
// to the local fallback, each resume sends them back to Redis. The client
// counts what it was admitted in every 1 s window and compares it with the
// bound the system publishes for the policy with Redis outages. Before the
// fallback was a budget of its own, every Redis success reset it, so each
// stall met a full bucket.
func TestFlappingRedisStaysWithinBound(t *testing.T) {
	testenv.SkipSlow(t, "stops and starts a real redis-server under load for over 10 s")
	const yaml = "name: api\nidentity: [tenant]\nlimit: 20\nperiod: 1s\nscope: region\n"
	k := policyCoordinator(t, yaml)
	redisSrv := startRedis(t)
	ra := startAgent(t, "us", redisSrv.Addr, []string{k.addr}, func(c *Config) { c.CheckTimeout = DefaultConfig().CheckTimeout })

	start := time.Now()
	var mu sync.Mutex
	var admitted []time.Duration
	var fallbackDecisions, checks atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for range 3 { // 3 callers at about 100 checks/s each
		wg.Add(1)
		go func() {
			defer wg.Done()
			callEvery(t, ra.a, admission.Request{Policy: "api", Attributes: tenantA}, 10*time.Millisecond, 20_000, stop, func(o admission.Outcome) {
				checks.Add(1)
				if o.Mode == lease.ModeLocalFallback {
					fallbackDecisions.Add(1)
				}
				if o.Allowed {
					mu.Lock()
					admitted = append(admitted, time.Since(start))
					mu.Unlock()
				}
			})
		}()
	}
	// Stall/run cycles: around the 20 ms check timeout, then long ones.
	cycles := []struct{ paused, running, phase time.Duration }{
		{10 * time.Millisecond, 10 * time.Millisecond, 2 * time.Second},
		{25 * time.Millisecond, 25 * time.Millisecond, 2 * time.Second},
		{40 * time.Millisecond, 15 * time.Millisecond, 2 * time.Second},
		{250 * time.Millisecond, 1250 * time.Millisecond, 3 * time.Second},
	}
	for _, c := range cycles {
		end := time.Now().Add(c.phase)
		for time.Now().Before(end) {
			if err := redisSrv.Pause(); err != nil {
				t.Fatal(err)
			}
			time.Sleep(c.paused)
			if err := redisSrv.Resume(); err != nil {
				t.Fatal(err)
			}
			time.Sleep(c.running)
		}
	}
	close(stop)
	wg.Wait()

	p := testenv.MustPolicy(t, yaml)
	// Decisions made by Redis reach the client up to one check timeout
	// later than they were made: the window the bound is taken over is
	// that much longer than the one counted.
	b, err := bound.Compute(p, bound.Deployment{Regions: 1, Instances: 1, Drift: testTiming.Drift, RedisOutages: true},
		bound.Leased, time.Second+20*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	got := maxInWindow(admitted, time.Second)
	t.Logf("%d checks, %d by the local fallback, %d admitted; most in 1 s: %d; bound %.1f", checks.Load(), fallbackDecisions.Load(), len(admitted), got, b.WorstCase)
	if fallbackDecisions.Load() == 0 {
		t.Fatal("no check met the local fallback: the stalls did not reach the check timeout")
	}
	if float64(got) > b.WorstCase {
		t.Fatalf("admitted %d in one 1 s window, above the published bound %.1f (%v)", got, b.WorstCase, b.Terms)
	}
}

// 200 callers race for the last token of a bucket while Redis answers
// around the default check timeout, so some of them are decided by the
// local fallback: still at most one is admitted. A fallback that started
// full admitted up to ten.
func TestLastTokenRaceWithSlowRedis(t *testing.T) {
	k := policyCoordinator(t, "name: last\nidentity: [tenant]\nlimit: 1\nperiod: 1h\nburst: 10\nscope: region\n")
	proxy := startRedisBehindProxy(t)
	// Every check its own round trip (no pipelining), so that checks queued
	// behind others in the connection pool miss the timeout and meet the
	// fallback: the race between the two paths is what this test is about.
	ra := startAgent(t, "us", proxy.Addr, []string{k.addr}, func(c *Config) {
		c.CheckTimeout, c.RedisPipelines = DefaultConfig().CheckTimeout, 0
	})
	ctx := t.Context()
	testenv.WaitFor(t, 5*time.Second, "a warm connection and script", func() bool {
		o, _ := ra.a.Check(ctx, admission.Request{Policy: "last", Attributes: map[string]string{"tenant": "warm"}})
		return o.Mode == lease.ModeRegion
	})
	var warm sync.WaitGroup // fill the connection pool, so racers do not wait for dials
	for range 32 {
		warm.Add(1)
		go func() {
			defer warm.Done()
			ra.a.Check(ctx, admission.Request{Policy: "last", Attributes: map[string]string{"tenant": "warm"}})
		}()
	}
	warm.Wait()
	testenv.WaitFor(t, 5*time.Second, "the breaker closed after warming", func() bool {
		o, _ := ra.a.Check(ctx, admission.Request{Policy: "last", Attributes: map[string]string{"tenant": "warm"}})
		return o.Mode == lease.ModeRegion
	})
	// Drain 9 of the 10 tokens in Redis through the engine itself, without
	// the agent's 20 ms check timeout: one slow round trip on a loaded
	// machine must not send the drain to the fallback.
	p, _ := ra.a.policies.Policy("last")
	tk, err := admission.Resolve(p, admission.Request{Policy: "last", Attributes: tenantA, Cost: 1}, p.Limits())
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 9; i++ {
		if r := ra.a.engine.Decide(ctx, []*admission.Ticket{&tk})[0]; r.Err != nil || !r.Decision.Allowed {
			t.Fatalf("draining token %d: %+v", i, r)
		}
	}
	proxy.SetDelay(time.Millisecond) // each way: some checks make the 20 ms timeout, queued ones do not
	var admitted, byFallback atomic.Int64
	var ready, wg sync.WaitGroup
	gate := make(chan struct{})
	for range 200 {
		ready.Add(1)
		wg.Add(1)
		go func() {
			defer wg.Done()
			ready.Done()
			<-gate
			o, err := ra.a.Check(ctx, admission.Request{Policy: "last", Attributes: tenantA})
			if err != nil {
				t.Errorf("check: %v", err)
				return
			}
			if o.Allowed {
				admitted.Add(1)
			}
			if o.Mode == lease.ModeLocalFallback {
				byFallback.Add(1)
			}
		}()
	}
	ready.Wait()
	close(gate)
	wg.Wait()
	t.Logf("200 racers: %d admitted, %d decided by the local fallback", admitted.Load(), byFallback.Load())
	if byFallback.Load() == 0 {
		t.Fatal("no racer met the local fallback: the test did not race the two paths")
	}
	if admitted.Load() > 1 {
		t.Fatalf("%d racers admitted for the last token", admitted.Load())
	}
}

// A keyed retry is charged once, whichever path decides it: sent three
// times while Redis is gone (local fallback), then again once Redis is
// back, it is admitted every time and charged one token, locally.
func TestKeyedRetryChargedOnceAcrossOutage(t *testing.T) {
	// fallback_start 1: the fallback budget starts full, so it admits.
	k := policyCoordinator(t, "name: keyed\nidentity: [tenant]\nlimit: 10\nperiod: 1h\nscope: region\n"+
		"failure: {fallback_start: 1}\n")
	proxy := startRedisBehindProxy(t)
	ra := startAgent(t, "us", proxy.Addr, []string{k.addr}, nil)
	ctx := t.Context()
	keyed := admission.Request{Policy: "keyed", Attributes: tenantA, IdempotencyKey: "order-42"}

	proxy.Cut()
	for i := 0; i < 3; i++ {
		o, err := ra.a.Check(ctx, keyed)
		if err != nil || !o.Allowed || o.Mode != lease.ModeLocalFallback {
			t.Fatalf("keyed attempt %d during the outage: %+v %v", i, o, err)
		}
	}
	// The fallback charged one token of its 10: an unkeyed check sees 8 left.
	// (Refill adds 10/h: a few micro-units.)
	near := func(got, want int64) bool {
		return got >= want*policy.Micro && got < want*policy.Micro+policy.Micro/10
	}
	if o, err := ra.a.Check(ctx, admission.Request{Policy: "keyed", Attributes: tenantA}); err != nil || o.Mode != lease.ModeLocalFallback || !near(o.Remaining, 8) {
		t.Fatalf("after three keyed attempts the fallback has %v left (%+v %v), want 8", float64(o.Remaining)/float64(policy.Micro), o, err)
	}

	proxy.Restore()
	testenv.WaitFor(t, 5*time.Second, "Redis decisions again", func() bool {
		o, _ := ra.a.Check(ctx, admission.Request{Policy: "keyed", Attributes: map[string]string{"tenant": "probe"}})
		return o.Mode == lease.ModeRegion
	})
	if o, err := ra.a.Check(ctx, keyed); err != nil || !o.Allowed || o.Mode != lease.ModeLocalFallback {
		t.Fatalf("keyed attempt after recovery: %+v %v, want the first answer replayed", o, err)
	}
	// Redis never charged tenant a for the keyed request: 10 - 1 left after this check.
	if o, err := ra.a.Check(ctx, admission.Request{Policy: "keyed", Attributes: tenantA}); err != nil || o.Mode != lease.ModeRegion || !near(o.Remaining, 9) {
		t.Fatalf("Redis has %v left for tenant a (%+v %v), want 9", float64(o.Remaining)/float64(policy.Micro), o, err)
	}
	if got := counterValue(t, ra.a, "quotalease_agent_idempotent_replays_total"); got != 3 {
		t.Fatalf("replays counted %v, want 3", got)
	}
}
