package agent

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/quota-lease/quota-lease/admission"
)

// A hot key over its limit costs Redis one call per retry delay, not one
// per check: Redis counts the scripts it ran. Every check is still
// rejected, and the key is admitted by Redis again once it refilled.
func TestHotRejectedKeySparesRedis(t *testing.T) {
	k := policyCoordinator(t, "name: api\nidentity: [tenant]\nlimit: 2\nperiod: 1s\nburst: 2\nscope: region\n")
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
		if o, _ := ra.a.Check(ctx, admission.Request{Policy: "api", Attributes: tenantA, Cost: 1}); !o.Allowed {
			t.Fatalf("check %d of the burst rejected", i)
		}
	}
	before := scripts()
	rejected := 0
	var last admission.Outcome
	for i := 0; i < 200; i++ {
		o, err := ra.a.Check(ctx, admission.Request{Policy: "api", Attributes: tenantA, Cost: 1})
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
	if o, _ := ra.a.Check(ctx, admission.Request{Policy: "api", Attributes: tenantA, Cost: 1}); !o.Allowed {
		t.Fatalf("after the retry delay: %+v, want admitted", o)
	}
}
