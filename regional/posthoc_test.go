package regional

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/quota-lease/quota-lease/policy"
)

// Charges after the fact raced from many clients, through the fixed
// window's counters and the script, for every algorithm: every unit
// charged is counted in Redis, admitted or not, and the charges admitted
// (each fitted when it was decided) add up to no more than the limit.
func TestPostHocRacedChargesAllCounted(t *testing.T) {
	h := newHarness(t)
	for _, alg := range []policy.Algorithm{policy.FixedWindow, policy.SlidingWindow, policy.SlidingLog, policy.TokenBucket} {
		for _, path := range windowPaths {
			if path.scripted && alg != policy.FixedWindow {
				continue
			}
			name := path.name
			if alg != policy.FixedWindow {
				name = "script"
			}
			t.Run(fmt.Sprintf("%s/%s", alg, name), func(t *testing.T) {
				h.t = t
				h.fresh(path.scripted)
				h.now.Set(3_600_000 * 1000) // the start of an hour's window
				l := policy.Limits{Algorithm: alg, Capacity: 100 * policy.Micro, WindowMs: 3_600_000, PostHoc: true}
				if alg == policy.TokenBucket {
					l.WindowMs, l.Rate = 0, 1000 // 0.001 a second: no refill during the test
				}
				tenant := "raced-" + path.name
				var mu sync.Mutex
				var charged, admitted int64
				var wg sync.WaitGroup
				for g := range 20 {
					wg.Go(func() {
						r := rand.New(rand.NewPCG(uint64(g), 7))
						for range 25 {
							cost := r.Int64N(60) + 1
							d, err := h.eng.Check(context.Background(), Request{Policy: algPolicy[alg],
								Attributes: map[string]string{"tenant": tenant}, Cost: cost, Limits: &l})
							if err != nil {
								t.Error(err)
								return
							}
							mu.Lock()
							charged += cost
							if d.Allowed {
								admitted += cost
							}
							mu.Unlock()
						}
					})
				}
				wg.Wait()
				if admitted > 100 || admitted < 41 { // the first refusal needs more than 100-60 admitted
					t.Fatalf("admitted %d units against a limit of 100", admitted)
				}
				d := h.check(h.now.Now().UnixMilli(), l, tenant, 0) // a check reads what is counted
				if d.Allowed || d.Debt != (charged-100)*policy.Micro {
					t.Fatalf("after %d units charged: %+v, want a check refused, %d units over the limit", charged, d, charged-100)
				}
			})
		}
	}
}

// A token bucket in debt lives in Redis until its debt is repaid and it is
// full again: expiring after the time a full refill takes would forgive
// the debt.
func TestTokenBucketDebtOutlivesItsRefill(t *testing.T) {
	h := newHarness(t)
	h.now.Set(1_000_000)
	l := policy.Limits{Algorithm: policy.TokenBucket, Capacity: 1000 * policy.Micro, Rate: 1000 * policy.Micro, PostHoc: true}
	if d := h.check(1_000_000, l, "debtor", 5000); d.Allowed || d.Debt != 4000*policy.Micro {
		t.Fatalf("a charge of 5000 into a bucket of 1000: %+v, want refused, 4000 in debt", d)
	}
	// 5 s to repay the debt and refill, where a full refill takes 1 s.
	if ttl := h.rdb.PTTL(context.Background(), h.key(policy.TokenBucket, "debtor")).Val(); ttl < 5*time.Second {
		t.Fatalf("the key expires in %v, before its debt is repaid (5 s)", ttl)
	}
	b := policy.NewLocalBudget[string]()
	if _, err := b.Decide("debtor", l, 0, 1_000_000, 5000*policy.Micro); err != nil {
		t.Fatal(err)
	}
	if b.Prune(1_000_000 + 2_200); !b.Has("debtor") {
		t.Fatal("the local fallback forgot a bucket in debt after 2.2 s, forgiving what it owed")
	}
}
