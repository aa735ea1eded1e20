package bound

import (
	"math"
	"testing"
	"time"

	"github.com/quota-lease/quota-lease/internal/testenv"
)

// The edge term: nothing when Envoy denies without an assignment, every
// instance of every region's fallback bucket under a token bucket (a full
// bucket at every start, one per second at most, and its refill), and no
// bound at all when Envoy allows.
func TestEdgeTerm(t *testing.T) {
	d := Deployment{Regions: 2, Instances: 1, LeaseDuration: 10 * time.Second}
	base := "name: api\nidentity: [tenant]\nlimit: 100\nperiod: 1s\ncost: 2\n"
	for _, c := range []struct {
		edge string
		want float64
	}{
		{"edge: {instances: 5, no_assignment: deny}\n", 0},
		{"edge: {instances: 5, no_assignment: deny, expired: {rule: token_bucket, max_tokens: 3, tokens_per_second: 2, timeout: 10s}}\n",
			// 2 regions × 5 instances × ((1 + 2 starts) × 3 tokens + 2/s × 2s) × cost 2
			2 * 5 * (3*3 + 2*2) * 2},
		{"edge: {instances: 5, no_assignment: allow}\n", math.Inf(1)},
		{"edge: {instances: 5, no_assignment: deny, expired: {rule: allow}}\n", math.Inf(1)},
	} {
		p := testenv.MustPolicy(t, base+c.edge)
		r, err := Compute(p, d, Leased, 2*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		got, ok := r.Terms[TermEdge]
		if !ok || got != c.want {
			t.Errorf("%s: edge term %v (present %v), want %v", c.edge, got, ok, c.want)
		}
		if !near(r.WorstCase, r.Limit+c.want) && !(math.IsInf(c.want, 1) && math.IsInf(r.WorstCase, 1)) {
			t.Errorf("%s: worst case %v, want the reference %v plus the edge term", c.edge, r.WorstCase, r.Limit)
		}
	}
	r, err := Compute(testenv.MustPolicy(t, base), d, Leased, 0)
	if _, ok := r.Terms[TermEdge]; err != nil || ok {
		t.Errorf("a policy without edge settings names no edge term: %v %v", r.Terms, err)
	}
}
