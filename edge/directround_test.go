package edge

import (
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/quota-lease/quota-lease/policy"
)

// Direct checks arriving at random at a steady 4 a second count their
// rate averaged over a few seconds, not each second's chance count (which
// is 2 or fewer one second in four, and 6 or more one in five): the
// direct demand the edge splits the capacity against holds within a
// fraction of its spread a second's count has. A real change, to 40 a
// second, counts at once.
func TestDirectDemandAveraged(t *testing.T) {
	p := testPolicy(t, policy.TokenBucket, 100, 100, time.Second, 1)
	p.Edge = &policy.Edge{Instances: 4, NoAssignment: policy.EdgeDeny}
	w := newRoundWorld(p, func(time.Duration) int64 { return p.Limits().Amount() })
	r := w.rounds(Config{Tuning: DefaultTuning(), Drift: 1e-4})
	r.SetPolicies([]*policy.Policy{p})
	id := ID{p.Name, "tenant=a"}
	rng := rand.New(rand.NewPCG(1, 2))
	rate := func(at time.Duration) float64 {
		if at < 40*time.Second {
			return 4
		}
		return 40
	}
	var next time.Duration // the next direct check
	var steady []float64   // the direct demand, requests a second, every step from 10 s to 40 s
	jumped := time.Duration(-1)
	w.each = func(at time.Duration) {
		for ; next <= at; next += time.Duration(rng.ExpFloat64() / rate(next) * float64(time.Second)) {
			r.ObserveDirect(p.Name, id.Identity, p.Cost*policy.Micro)
		}
		k := r.keys[id]
		if k == nil {
			return
		}
		d := float64(k.direct) / float64(DemandAmount(p, 1))
		switch {
		case at >= 10*time.Second && at < 40*time.Second:
			steady = append(steady, d)
		case at >= 40*time.Second && jumped < 0 && d >= 32:
			jumped = at - 40*time.Second
		}
	}
	w.run(r, id, 50*time.Second, func(time.Duration) map[int]uint64 { return map[int]uint64{1: 100} })

	var sum, sq float64
	for _, d := range steady {
		sum += d
	}
	mean := sum / float64(len(steady))
	for _, d := range steady {
		sq += (d - mean) * (d - mean)
	}
	spread := math.Sqrt(sq/float64(len(steady))) / mean
	t.Logf("steady 4/s: mean %.2f/s, spread %.0f%%; 40/s counted after %v", mean, 100*spread, jumped)
	if len(steady) < 100 || mean < 3 || mean > 5 || spread > 0.35 {
		t.Errorf("direct demand at a steady 4/s: mean %.2f/s, spread %.0f%% of it over %d steps; want about 4/s within 35%% "+
			"(a second's count alone spreads 50%%)", mean, 100*spread, len(steady))
	}
	if jumped < 0 || jumped > 3*time.Second {
		t.Errorf("direct demand moved from 4/s to 40/s: counted 80%% of it after %v, want within 3s (a measure a second, at a read)", jumped)
	}
}
