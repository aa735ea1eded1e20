package sim

import (
	"math/rand/v2"
	"strconv"
	"time"

	"github.com/quota-lease/quota-lease/lease"
)

// addGroups registers every tenant of the scenario's groups as an
// identity, each group's tenants one after the other.
func (e *engine) addGroups() error {
	for _, g := range e.s.Groups {
		e.groupIDs = append(e.groupIDs, len(e.ids.names))
		for i := 0; i < g.Tenants; i++ {
			if _, err := e.ids.add(g.Name + "-" + strconv.Itoa(i)); err != nil {
				return err
			}
		}
	}
	return nil
}

// generateGroups schedules the next second's arrivals of every group: in
// each region, a Poisson number with the group's rate times the region's
// part of its weights at mid-second, each from one of its tenants picked
// uniformly.
func (e *engine) generateGroups() {
	sec := e.now
	mid := time.Duration(sec+500) * time.Millisecond
	for gi := range e.s.Groups {
		g := &e.s.Groups[gi]
		w := g.Weights(mid)
		var sum float64
		for _, v := range w {
			sum += v
		}
		for ri, r := range e.regions {
			n := poisson(e.rng, g.Rate*float64(g.Tenants)*w[r.name]/sum)
			for k := 0; k < n; k++ {
				id := e.groupIDs[gi] + e.rng.IntN(g.Tenants)
				a := arrival{t: time.Duration(sec+e.rng.Int64N(1000)) * time.Millisecond, region: ri, identity: id, cost: 1}
				if g.Edge > 0 && e.rng.Float64() < g.Edge {
					a.envoy = 1 + pick(e.rng, g.InstanceWeights(mid), e.s.Edge.Instances)
				}
				e.at(a.t.Milliseconds(), func() { e.arrive(a) })
			}
		}
	}
	e.at(sec+1000, e.generateGroups)
}

// identityDemands is what region r's agent reports of its identities'
// own demand (lease.IdentityDemands; the region runs one instance).
func (e *engine) identityDemands(r *region) map[string]int64 {
	g, _ := r.holder.Grant()
	most := lease.Reported(e.policy.IdentityShareLimit())
	return lease.IdentityDemands(r.meter, e.now, g, e.full, 1, most, func(id int) string { return e.ids.names[id] })
}

// pick draws one of n instances by weights (nil: alike; missing: 0).
func pick(r *rand.Rand, weights []float64, n int) int {
	if weights == nil {
		return r.IntN(n)
	}
	var sum float64
	for _, w := range weights {
		sum += w
	}
	x := r.Float64() * sum
	last := 0
	for i, w := range weights {
		if w <= 0 {
			continue
		}
		if x < w {
			return i
		}
		x -= w
		last = i
	}
	return last
}

// watchMoves schedules the follow tracker at every move of a group that
// sends through the edge.
func (e *engine) watchMoves() {
	for gi, g := range e.s.Groups {
		if g.Edge <= 0 {
			continue
		}
		for _, m := range g.Moves {
			gi, m := gi, m
			e.at(time.Duration(m.At).Milliseconds(), func() { e.follow.start(gi, m) })
		}
	}
}
