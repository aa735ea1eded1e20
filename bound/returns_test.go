package bound

import (
	"testing"
	"time"

	"github.com/quota-lease/quota-lease/policy"
)

// A policy that accepts returns has the same worst case, over the units
// admitted and not returned, and says so with a "returned" term of 0; a
// policy that does not has no such term.
func TestReturnedTerm(t *testing.T) {
	p := &policy.Policy{Name: "c", Identity: []string{"u"}, Algorithm: policy.FixedWindow, Limit: 100, Period: policy.Duration(time.Minute)}
	p.Normalize()
	d := Deployment{Regions: 3, Instances: 2, LeaseDuration: 10 * time.Second, Drift: 1e-4, RedisOutages: true}
	plain, err := Compute(p, d, Leased, 0)
	if err != nil {
		t.Fatal(err)
	}
	q := *p
	q.Returns = true
	held, err := Compute(&q, d, Leased, 0)
	if err != nil {
		t.Fatal(err)
	}
	if v, ok := held.Terms[TermReturned]; !ok || v != 0 || held.WorstCase != plain.WorstCase {
		t.Fatalf("with returns: %+v, want a returned term of 0 and worst case %v", held, plain.WorstCase)
	}
	if _, ok := plain.Terms[TermReturned]; ok {
		t.Fatalf("without returns: %+v, want no returned term", plain)
	}
}
