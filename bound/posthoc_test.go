package bound

import (
	"math"
	"testing"
	"time"

	"github.com/quota-lease/quota-lease/policy"
)

// A policy taking charges after the fact adds what was in flight when the
// limit ran out (MaxInFlight × MaxCost) to every mode's worst case, and
// says it cannot bound it (+Inf) when it does not declare both.
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
		if ph.Terms[TermPostHoc] != 3000 || ph.WorstCase != plain.WorstCase+3000 {
			t.Errorf("%s: %+v, want a post-hoc term of 3000 on top of %v", m, ph, plain.WorstCase)
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
