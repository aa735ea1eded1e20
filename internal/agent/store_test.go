package agent

import (
	"sync"
	"testing"
	"time"

	"github.com/quota-lease/quota-lease/admission"
	"github.com/quota-lease/quota-lease/bound"
	"github.com/quota-lease/quota-lease/internal/testenv"
)

// Redis killed (SIGKILL) and restarted empty four times while one tenant
// asks 100 times a second. Every restart forgets every bucket; before the
// store's birth marker, each one minted a fresh burst of 10, so a 10 s
// window admitted about 10 + 4*10 + 10 = 60, where the published bound is
// 40. Now a bucket lost with the store starts as if it had used everything
// at the loss, and the client's own count stays within the bound.
func TestRedisRestartedEmptyMintsNoBurst(t *testing.T) {
	testenv.SkipSlow(t, "restarts a real redis-server under load for over 10 s")
	const yaml = "name: api\nidentity: [tenant]\nlimit: 10\nperiod: 10s\nscope: region\n"
	k := policyCoordinator(t, yaml)
	redisSrv := startRedis(t)
	ra := startAgent(t, "us", redisSrv.Addr, []string{k.addr}, nil)

	start := time.Now()
	var mu sync.Mutex
	var admitted []time.Duration
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		callEvery(t, ra.a, admission.Request{Policy: "api", Attributes: tenantA}, 10*time.Millisecond, 3000, stop, func(o admission.Outcome) { // at most 30 s
			if o.Allowed {
				mu.Lock()
				admitted = append(admitted, time.Since(start))
				mu.Unlock()
			}
		})
	}()
	const restarts = 4
	for i := 0; i < restarts; i++ {
		time.Sleep(2 * time.Second) // the scenario: a restart every 2 s under load
		if err := redisSrv.Restart(); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(3 * time.Second) // load after the last restart
	close(stop)
	wg.Wait()

	b, err := bound.Compute(testenv.MustPolicy(t, yaml), bound.Deployment{Regions: 1, Instances: 1, Drift: testTiming.Drift, RedisOutages: true},
		bound.Leased, 10*time.Second+20*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	got := maxInWindow(admitted, 10*time.Second)
	losses := counterValue(t, ra.a, "quotalease_agent_store_losses_total")
	t.Logf("%d admitted in %s; most in 10 s: %d; bound %.1f; store losses seen %v", len(admitted), time.Since(start).Round(time.Millisecond), got, b.WorstCase, losses)
	if float64(got) > b.WorstCase {
		t.Fatalf("admitted %d in one 10 s window across %d empty restarts, above the published bound %.1f (%v)", got, restarts, b.WorstCase, b.Terms)
	}
	// Redis decides what it can: a restart is short, and the buckets then
	// refill at 1/s, so the run admits about its length in seconds.
	if got > 10+10+restarts { // the first burst, the refill, a token per outage at most
		t.Fatalf("admitted %d in one 10 s window: more than one burst and the refill", got)
	}
	if losses < 1 || losses > restarts {
		t.Fatalf("agent counted %v store losses, want 1..%d", losses, restarts)
	}
}
