package lease

import (
	"math/rand/v2"
	"reflect"
	"strconv"
	"testing"
)

// Whatever the demands do and however many renewals go unanswered, the
// plan ends up holding what the instance last measured (to within the 1%
// the reports leave out), each renewal carries at most the cap, and a
// plan that lost the report (a new leader) is caught up.
func TestDemandReportConverges(t *testing.T) {
	const total, limit = 100_000, 50
	rng := rand.New(rand.NewPCG(7, 8))
	p := NewIdentityPlan(1000)
	var r DemandReport
	now := map[string]int64{}
	for round := 0; round < 400; round++ {
		for k := 0; k < 30; k++ { // demands move, appear and go
			id := "id-" + strconv.Itoa(rng.IntN(300))
			if rng.IntN(4) == 0 {
				delete(now, id)
			} else {
				now[id] = rng.Int64N(total)
			}
		}
		if round == 200 {
			p = NewIdentityPlan(1000) // a new leader holds nothing
		}
		changes := r.Changes(now, total, limit)
		if len(changes) > limit {
			t.Fatalf("round %d: %d changes, cap %d", round, len(changes), limit)
		}
		known := p.Update("us", "us-1", "n1", r.Len(), changes)
		if rng.IntN(5) == 0 {
			continue // the answer was lost: the agent sends the changes again
		}
		r.Answered(changes, known)
	}
	for i := 0; i < 100; i++ { // demands stop moving: the report catches up
		changes := r.Changes(now, total, limit)
		r.Answered(changes, p.Update("us", "us-1", "n1", r.Len(), changes))
	}
	for id, d := range now {
		if got := p.demand[id]["us"]; abs64(got-d) > total/identityHysteresis || (d > total/identityHysteresis && got == 0) {
			t.Errorf("%s: plan holds %d, instance measures %d", id, got, d)
		}
	}
	for id := range p.demand {
		if _, ok := now[id]; !ok {
			t.Errorf("%s: plan holds demand the instance no longer has", id)
		}
	}
	// A restarted process (new nonce) replaces the old one's report.
	if p.Update("us", "us-1", "n2", 0, map[string]int64{"fresh": 5}) {
		t.Fatal("a new process's first report was taken as a change to the old one's")
	}
	if len(p.demand) != 1 || p.demand["fresh"]["us"] != 5 {
		t.Fatalf("after the restart the plan holds %v", p.demand)
	}
}

// DiffIdentities and ApplyIdentities are inverse: any set of shares is
// rebuilt from any other and the changes between them.
func TestIdentityDiffApply(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	gen := func() map[string]int64 {
		var m map[string]int64
		for i := 0; i < rng.IntN(20); i++ {
			if m == nil {
				m = map[string]int64{}
			}
			m["id-"+strconv.Itoa(rng.IntN(30))] = rng.Int64N(5)
		}
		return m
	}
	for i := 0; i < 1000; i++ {
		base, next := gen(), gen()
		set, unset := DiffIdentities(base, next)
		if got := ApplyIdentities(base, set, unset); !reflect.DeepEqual(got, next) && !(len(got) == 0 && len(next) == 0) {
			t.Fatalf("base %v, next %v: rebuilt %v", base, next, got)
		}
	}
}
