package agent

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/quota-lease/quota-lease/clock"
	"github.com/quota-lease/quota-lease/internal/testenv"
	"github.com/quota-lease/quota-lease/policy"
)

// The cache answers a remembered rejection with the delay left, counted
// from the send time and rounded up; it misses for a smaller cost, for
// other limits (dropping the entry), and once the delay has passed.
func TestOverLimitEntries(t *testing.T) {
	var clk clock.Manual
	clk.Set(1_000_000)
	l := policy.Limits{Algorithm: policy.TokenBucket, Capacity: 10 * policy.Micro, Rate: policy.Micro}
	c := newOverLimit(2)
	sent := clk.Now()
	c.put("k", l, 2*policy.Micro, policy.Decision{RetryAfterMs: 1500, ResetAfterMs: 9000, Remaining: 500_000}, sent)
	clk.Set(1_000_400)
	d, ok := c.get("k", l, 2*policy.Micro, clk.Now())
	if !ok || d.Allowed || d.RetryAfterMs != 1100 || d.ResetAfterMs != 8600 {
		t.Fatalf("after 400 ms: %+v %v, want retry 1100 and reset 8600", d, ok)
	}
	if _, ok := c.get("k", l, policy.Micro, clk.Now()); ok {
		t.Fatal("a smaller cost, which may fit sooner, was answered from the cache")
	}
	if _, ok := c.get("k", l, 5*policy.Micro, clk.Now()); !ok {
		t.Fatal("a larger cost missed")
	}
	clk.Set(1_001_499)
	if d, ok := c.get("k", l, 2*policy.Micro, clk.Now()); !ok || d.RetryAfterMs != 1 {
		t.Fatalf("1 ms before the end: %+v %v, want retry 1", d, ok)
	}
	clk.Set(1_001_500)
	if _, ok := c.get("k", l, 2*policy.Micro, clk.Now()); ok {
		t.Fatal("answered after the delay passed")
	}
	c.put("k", l, 2*policy.Micro, policy.Decision{RetryAfterMs: 1000}, clk.Now())
	bigger := l.Scale(2, 1)
	if _, ok := c.get("k", bigger, 2*policy.Micro, clk.Now()); ok {
		t.Fatal("answered under other limits (a larger share)")
	}
	if _, ok := c.get("k", l, 2*policy.Micro, clk.Now()); ok {
		t.Fatal("an entry that missed on its limits was kept")
	}
	// Admissions, replays and zero delays are never remembered; a full
	// cache sweeps expired entries, else remembers nothing new.
	c.put("a", l, 1, policy.Decision{Allowed: true, RetryAfterMs: 5}, clk.Now())
	c.put("b", l, 1, policy.Decision{Replayed: true, RetryAfterMs: 5}, clk.Now())
	c.put("c", l, 1, policy.Decision{}, clk.Now())
	c.put("d", l, 1, policy.Decision{RetryAfterMs: 10}, clk.Now())
	c.put("e", l, 1, policy.Decision{RetryAfterMs: 10}, clk.Now())
	c.put("f", l, 1, policy.Decision{RetryAfterMs: 10}, clk.Now())
	if len(c.m) != 2 {
		t.Fatalf("%d entries, want 2 (d and e)", len(c.m))
	}
	clk.Set(1_001_600)
	c.put("f", l, 1, policy.Decision{RetryAfterMs: 10}, clk.Now())
	if _, ok := c.m["f"]; !ok || len(c.m) != 1 {
		t.Fatalf("after the sweep: %v", c.m)
	}
}

// A hot key over its limit costs Redis one call per retry delay, not one
// per check: Redis counts the scripts it ran. Every check is still
// rejected, and the key is admitted by Redis again once it refilled.
func TestHotRejectedKeySparesRedis(t *testing.T) {
	prefix := testenv.Prefix(t)
	k := startCoordinator(t, prefix, "")
	setPolicy(t, k.addr, "name: api\nidentity: [tenant]\nlimit: 2\nperiod: 1s\nburst: 2\nscope: region\n")
	srv := startRedis(t)
	ra := startAgent(t, "us", srv.Addr, []string{k.addr}, nil)
	ctx := context.Background()
	rdb := srv.Client(t)
	scripts := func() int64 {
		info := rdb.Info(ctx, "commandstats").Val()
		var n int64
		for _, line := range strings.Split(info, "\n") {
			if strings.HasPrefix(line, "cmdstat_evalsha:") || strings.HasPrefix(line, "cmdstat_eval:") {
				f := strings.Split(strings.SplitN(line, ":", 2)[1], ",")[0]
				v, _ := strconv.ParseInt(strings.TrimPrefix(f, "calls="), 10, 64)
				n += v
			}
		}
		return n
	}
	for i := 0; i < 2; i++ { // the burst
		if o, _ := ra.a.Check(ctx, Input{Policy: "api", Attributes: tenantA, Cost: 1}); !o.Allowed {
			t.Fatalf("check %d of the burst rejected", i)
		}
	}
	before := scripts()
	rejected := 0
	var last Outcome
	for i := 0; i < 200; i++ {
		o, err := ra.a.Check(ctx, Input{Policy: "api", Attributes: tenantA, Cost: 1})
		if err != nil {
			t.Fatal(err)
		}
		if o.Allowed {
			break // refilled meanwhile: a slow machine
		}
		rejected++
		last = o
	}
	ran := scripts() - before
	hits := counterValue(t, ra.a, "quotalease_agent_overlimit_cache_hits_total")
	t.Logf("%d rejections, %d scripts run, %v answered in-process; last retry %d ms", rejected, ran, hits, last.RetryAfterMs)
	if rejected < 100 {
		t.Fatalf("only %d checks rejected before a refill: the test does not exercise the cache", rejected)
	}
	if ran > 3 || hits < float64(rejected-3) {
		t.Fatalf("%d scripts ran for %d rejections (%v from the cache): the hot key still costs Redis", ran, rejected, hits)
	}
	if last.RetryAfterMs < 1 || last.RetryAfterMs > 500 {
		t.Fatalf("retry %d ms, want the delay left until one unit refills (at most 500 ms)", last.RetryAfterMs)
	}
	// Real time must pass for the bucket to refill: waiting the advertised
	// delay (and 10 ms) is the claim under test.
	time.Sleep(time.Duration(last.RetryAfterMs)*time.Millisecond + 10*time.Millisecond)
	if o, _ := ra.a.Check(ctx, Input{Policy: "api", Attributes: tenantA, Cost: 1}); !o.Allowed {
		t.Fatalf("after the retry delay: %+v, want admitted", o)
	}
}
