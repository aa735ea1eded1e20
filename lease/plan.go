package lease

import (
	"sort"

	"github.com/quota-lease/quota-lease/allocation"
	"github.com/quota-lease/quota-lease/policy"
)

// PlanOptions are the settings of a planning round: the allocation
// strategy, and the damping as fractions of the quota (a share moves at
// most MaxStep per round; changes below Hysteresis are not made).
type PlanOptions struct {
	Strategy            allocation.Strategy
	MaxStep, Hysteresis float64
}

// PlanTargets is one quota's rebalancing round, as the coordinator runs it
// every rebalance interval and the simulator drives it: the targets of the
// regions taking part (those in the book, holding or asking for a lease,
// and those with an explicit floor in p), with their floors and demand,
// split by o.Strategy (allocation.Plan) and damped from prev. weights gives
// every declared region's weight.
func PlanTargets(
	p *policy.Policy,
	b *Book,
	weights map[string]float64,
	prev map[string]int64,
	o PlanOptions,
) (map[string]int64, error) {
	demand := b.Demands()
	total := b.Total()
	var in []allocation.Region
	for name, w := range weights {
		_, active := demand[name]
		if active || RegionFloor(p, name, false) > 0 {
			in = append(in, allocation.Region{
				Name:   name,
				Weight: w,
				Floor:  RegionFloor(p, name, active),
				Demand: min(demand[name], total),
			})
		}
	}
	sort.Slice(in, func(i, j int) bool { return in[i].Name < in[j].Name })
	d := allocation.Damping{MaxStep: int64(o.MaxStep * float64(total)), Hysteresis: int64(o.Hysteresis * float64(total))}
	return allocation.Plan(o.Strategy, total, in, prev, d)
}

// Target is region's target share under the current plan. A region not yet
// in a planning round asks for its demand (at least its floor); the book
// caps that at what is free, and the next round takes it into account.
func Target(p *policy.Policy, targets map[string]int64, region string, demand int64) int64 {
	if t, ok := targets[region]; ok {
		return t
	}
	return max(RegionFloor(p, region, true), demand)
}
