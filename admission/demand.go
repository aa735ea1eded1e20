package admission

import "github.com/quota-lease/quota-lease/policy"

// Demand is what a request of cost whole units asked of p's limit, in
// micro-units, for the demand meters that size a region's lease: its cost.
// A check (cost 0) of a policy that takes charges after the fact asks for
// a request whose cost is charged later; admitted, that charge shows its
// demand, but refused, nothing would: a user whose budget ran out would
// show no demand until its window ended, and its region's share would
// drift to idle regions meanwhile. Such a check counts the policy's
// declared largest cost (max_cost), or its cost when that is undeclared.
func Demand(p *policy.Policy, cost int64, allowed bool) int64 {
	if cost == 0 && !allowed && p.PostHoc {
		if p.MaxCost > 0 {
			return p.MaxCost * policy.Micro
		}
		return p.Cost * policy.Micro
	}
	return cost * policy.Micro
}
