package bound

import (
	"math"
	"testing"
	"time"

	"github.com/quota-lease/quota-lease/policy"
)

// A policy taking charges after the fact adds what was in flight when the
// limit ran out (MaxInFlight × MaxCost, once per counter and counter
// window a span meets) to every mode's worst case, and says it cannot
// bound it (+Inf) when it does not declare both.
func TestPostHocTerm(t *testing.T) {
	p := &policy.Policy{Name: "llm", Identity: []string{"user"}, Algorithm: policy.FixedWindow, Limit: 1000, Period: policy.Duration(time.Minute)}
	p.Normalize()
	d := Deployment{Regions: 2, Instances: 1, LeaseDuration: 10 * time.Second}
	for _, m := range []Mode{Leased, Static, Central, Independent} {
		plain, err := Compute(p, d, m, 0)
		if err != nil {
			t.Fatal(err)
		}
		q := *p
		q.PostHoc, q.MaxCost, q.MaxInFlight = true, 600, 5
		ph, err := Compute(&q, d, m, 0)
		if err != nil {
			t.Fatal(err)
		}
		// A period meets two fixed windows, of each region's counter but
		// for the central one.
		want := 2 * 2 * 3000.0
		if m == Central {
			want = 2 * 3000
		}
		if ph.Terms[TermPostHoc] != want || ph.WorstCase != plain.WorstCase+want {
			t.Errorf("%s: %+v, want a post-hoc term of %v on top of %v", m, ph, want, plain.WorstCase)
		}
		q.MaxInFlight = 0
		if ph, _ = Compute(&q, d, m, 0); !math.IsInf(ph.Terms[TermPostHoc], 1) {
			t.Errorf("%s, max_in_flight undeclared: %+v, want an infinite post-hoc term", m, ph)
		}
		if _, ok := plain.Terms[TermPostHoc]; ok {
			t.Errorf("%s without post_hoc: %+v, want no post-hoc term", m, plain)
		}
	}
}

// The post-hoc term counts one in-flight overshoot per counter window the
// span meets: fixed and sliding windows ceil(w/P)+1, a sliding log
// ceil(w/P), a token bucket once (its debt holds every later check).
func TestPostHocTermPerWindow(t *testing.T) {
	for _, c := range []struct {
		alg  policy.Algorithm
		w    time.Duration
		want float64
	}{
		{policy.FixedWindow, time.Minute, 2 * 3000},
		{policy.FixedWindow, 90 * time.Second, 3 * 3000},
		{policy.SlidingWindow, 30 * time.Second, 2 * 3000},
		{policy.SlidingLog, time.Minute, 3000},
		{policy.SlidingLog, 2 * time.Minute, 2 * 3000},
		{policy.TokenBucket, 5 * time.Minute, 3000},
	} {
		p := &policy.Policy{Name: "llm", Identity: []string{"user"}, Algorithm: c.alg, Limit: 1000, Period: policy.Duration(time.Minute),
			PostHoc: true, MaxCost: 600, MaxInFlight: 5}
		p.Normalize()
		if got := PostHoc(p, 1, c.w); got != c.want {
			t.Errorf("%s over %s: %v, want %v", c.alg, c.w, got, c.want)
		}
	}
}

// With Redis outages, every instance's local fallback is one more counter
// that can end a window over its limit by what was in flight.
func TestPostHocTermCountsFallbacks(t *testing.T) {
	p := &policy.Policy{Name: "llm", Identity: []string{"user"}, Algorithm: policy.TokenBucket, Limit: 1000, Period: policy.Duration(time.Minute),
		PostHoc: true, MaxCost: 600, MaxInFlight: 5}
	p.Normalize()
	d := Deployment{Regions: 2, Instances: 6, LeaseDuration: 10 * time.Second, RedisOutages: true}
	r, err := Compute(p, d, Leased, 0)
	if err != nil {
		t.Fatal(err)
	}
	if want := (2 + 2*6) * 3000.0; r.Terms[TermPostHoc] != want {
		t.Errorf("post-hoc term %v, want %v: two regions' keys and six fallbacks in each", r.Terms[TermPostHoc], want)
	}
	p.Shards = 4
	if r, _ = Compute(p, d, Leased, 0); r.Terms[TermPostHoc] != 4*(2+2*6)*3000.0 {
		t.Errorf("four shards: post-hoc term %v, want every shard's key counted", r.Terms[TermPostHoc])
	}
}
