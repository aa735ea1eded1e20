package regional

import (
	"testing"

	"github.com/quota-lease/quota-lease/policy"
)

// The worked example of the design discussion: burst 20, refill 5/s, 3.5
// tokens at t=100.0s.
func TestWorkedExamplePure(t *testing.T) {
	l := policy.Limits{Algorithm: policy.TokenBucket, Capacity: 20 * policy.Micro, Rate: 5 * policy.Micro}
	s := policy.State{Exists: true, LastMs: 100_000, Tokens: 3_500_000}

	s, d, err := policy.Apply(s, l, 100_300, 4*policy.Micro)
	if err != nil {
		t.Fatal(err)
	}
	if !d.Allowed || d.Remaining != 1*policy.Micro || s.Tokens != 1*policy.Micro || s.LastMs != 100_300 {
		t.Fatalf("cost 4 at 100.3s: got %+v state %+v, want admitted with 1 token left", d, s)
	}
	s, d, err = policy.Apply(s, l, 100_500, 4*policy.Micro)
	if err != nil {
		t.Fatal(err)
	}
	if d.Allowed || d.RetryAfterMs != 400 || d.Remaining != 2*policy.Micro {
		t.Fatalf("cost 4 at 100.5s: got %+v, want rejected, retry 400 ms, 2 tokens left", d)
	}
	// The rejection persisted the refill: the same 200 ms are not counted again.
	if s.Tokens != 2*policy.Micro || s.LastMs != 100_500 {
		t.Fatalf("state after rejection %+v, want 2 tokens at 100.5s", s)
	}
}

func TestWorkedExampleRedis(t *testing.T) {
	h := newHarness(t)
	l := policy.Limits{Algorithm: policy.TokenBucket, Capacity: 20 * policy.Micro, Rate: 5 * policy.Micro}
	if err := h.rdb.HSet(t.Context(), h.key(policy.TokenBucket, "acme"), "t", 3_500_000, "l", 100_000).Err(); err != nil {
		t.Fatal(err)
	}
	if d := h.check(100_300, l, "acme", 4); !d.Allowed || d.Remaining != 1*policy.Micro {
		t.Fatalf("cost 4 at 100.3s: %+v, want admitted with 1 token left", d)
	}
	if d := h.check(100_500, l, "acme", 4); d.Allowed || d.RetryAfterMs != 400 {
		t.Fatalf("cost 4 at 100.5s: %+v, want rejected with retry 400 ms", d)
	}
	if s := h.state(policy.TokenBucket, "acme"); s.Tokens != 2*policy.Micro || s.LastMs != 100_500 {
		t.Fatalf("state after rejection %+v, want 2 tokens at 100.5s", s)
	}
}

// A retry delay whose exact value is fractional rounds up, and waiting
// exactly that long is enough (and one ms less is not).
func TestRetryRoundsUp(t *testing.T) {
	l := policy.Limits{Algorithm: policy.TokenBucket, Capacity: 10 * policy.Micro, Rate: 3 * policy.Micro}
	empty := policy.State{Exists: true, LastMs: 1000, Tokens: 0}
	_, d, _ := policy.Apply(empty, l, 1000, policy.Micro)
	if d.Allowed || d.RetryAfterMs != 334 {
		t.Fatalf("deficit 1 at 3/s: %+v, want retry 334 ms (not 333)", d)
	}
	if _, d, _ := policy.Apply(empty, l, 1000+333, policy.Micro); d.Allowed {
		t.Fatalf("admitted after 333 ms: %+v", d)
	}
	if _, d, _ := policy.Apply(empty, l, 1000+334, policy.Micro); !d.Allowed {
		t.Fatalf("rejected after the promised 334 ms: %+v", d)
	}

	h := newHarness(t)
	h.check(1000, l, "x", 10) // drain the new, full bucket
	if d := h.check(1000, l, "x", 1); d.Allowed || d.RetryAfterMs != 334 {
		t.Fatalf("redis: %+v, want retry 334", d)
	}
	if d := h.check(1333, l, "x", 1); d.Allowed {
		t.Fatalf("redis: admitted after 333 ms: %+v", d)
	}
	if d := h.check(1334, l, "x", 1); !d.Allowed {
		t.Fatalf("redis: rejected after 334 ms: %+v", d)
	}
}

// For every deficit and rate, waiting RetryAfterMs admits the request.
func TestRetryIsSufficientExhaustive(t *testing.T) {
	for rate := int64(1); rate <= 2000; rate += 37 {
		l := policy.Limits{Algorithm: policy.TokenBucket, Capacity: 50 * policy.Micro, Rate: rate * policy.Micro / 7}
		for have := int64(0); have < 3*policy.Micro; have += 333_333 {
			s := policy.State{Exists: true, LastMs: 0, Tokens: have}
			_, d, err := policy.Apply(s, l, 0, 3*policy.Micro)
			if err != nil {
				t.Fatal(err)
			}
			if d.Allowed {
				continue
			}
			if _, d2, _ := policy.Apply(s, l, d.RetryAfterMs, 3*policy.Micro); !d2.Allowed {
				t.Fatalf("rate %d have %d: rejected after promised %d ms", l.Rate, have, d.RetryAfterMs)
			}
			if _, d3, _ := policy.Apply(s, l, d.RetryAfterMs-1, 3*policy.Micro); d3.Allowed {
				t.Fatalf("rate %d have %d: retry %d ms is not the smallest", l.Rate, have, d.RetryAfterMs)
			}
		}
	}
}

func TestClockBackwardMintsNothing(t *testing.T) {
	l := policy.Limits{Algorithm: policy.TokenBucket, Capacity: 10 * policy.Micro, Rate: 10 * policy.Micro}
	s, _, _ := policy.Apply(policy.State{}, l, 10_000, 10*policy.Micro) // drain at t=10s
	// The clock jumps back 5 s: nothing is refilled.
	s, d, _ := policy.Apply(s, l, 5_000, policy.Micro)
	if d.Allowed || s.Tokens != 0 || s.LastMs != 10_000 {
		t.Fatalf("after clock went back: %+v %+v, want rejected, 0 tokens, last stays 10s", d, s)
	}
	// Back at t=10s: the interval 5s..10s was never elapsed time; still nothing.
	s, d, _ = policy.Apply(s, l, 10_000, policy.Micro)
	if d.Allowed || s.Tokens != 0 {
		t.Fatalf("back at 10s: %+v %+v, want nothing refilled", d, s)
	}
	// 100 ms later, exactly 100 ms worth (1 token) is refilled, once.
	s, d, _ = policy.Apply(s, l, 10_100, policy.Micro)
	if !d.Allowed || s.Tokens != 0 {
		t.Fatalf("at 10.1s: %+v %+v, want the 1 refilled token admitted", d, s)
	}
	s, d, _ = policy.Apply(s, l, 10_050, policy.Micro)
	if d.Allowed {
		t.Fatalf("clock back again to 10.05s: %+v, want rejected", d)
	}
}

func TestClockFarForwardCapsAtCapacity(t *testing.T) {
	l := policy.Limits{Algorithm: policy.TokenBucket, Capacity: 10 * policy.Micro, Rate: 10 * policy.Micro}
	s, _, _ := policy.Apply(policy.State{}, l, 0, 10*policy.Micro)
	s, d, _ := policy.Apply(s, l, policy.MaxTimeMs, policy.Micro)
	if !d.Allowed || d.Remaining != 9*policy.Micro {
		t.Fatalf("far forward: %+v, want full bucket minus 1", d)
	}
	if _, _, err := policy.Apply(s, l, policy.MaxTimeMs+1, policy.Micro); err == nil {
		t.Fatal("time beyond MaxTimeMs accepted")
	}
}

func TestRateAndBurstChangeMidLife(t *testing.T) {
	l := policy.Limits{Algorithm: policy.TokenBucket, Capacity: 20 * policy.Micro, Rate: 5 * policy.Micro}
	s, _, _ := policy.Apply(policy.State{}, l, 0, 2*policy.Micro) // 18 left
	// Burst lowered to 10: the bucket is capped, never over capacity.
	small := policy.Limits{Algorithm: policy.TokenBucket, Capacity: 10 * policy.Micro, Rate: 5 * policy.Micro}
	s, d, _ := policy.Apply(s, small, 0, policy.Micro)
	if !d.Allowed || s.Tokens != 9*policy.Micro {
		t.Fatalf("after burst lowered: %+v, want 9 tokens", s)
	}
	// Rate raised to 50/s: the next 100 ms refill 5 tokens, at the new rate.
	fast := policy.Limits{Algorithm: policy.TokenBucket, Capacity: 10 * policy.Micro, Rate: 50 * policy.Micro}
	s, _, _ = policy.Apply(s, fast, 0, 9*policy.Micro)
	s, d, _ = policy.Apply(s, fast, 100, policy.Micro)
	if !d.Allowed || s.Tokens != 4*policy.Micro {
		t.Fatalf("after rate raised: %+v, want 5 refilled, 4 left", s)
	}
	// Burst raised to 100: tokens do not jump, they refill at the rate.
	big := policy.Limits{Algorithm: policy.TokenBucket, Capacity: 100 * policy.Micro, Rate: 50 * policy.Micro}
	s, d, _ = policy.Apply(s, big, 100, policy.Micro)
	if !d.Allowed || s.Tokens != 3*policy.Micro {
		t.Fatalf("after burst raised: %+v, want 3 left", s)
	}
}
