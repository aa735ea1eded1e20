package lease

import (
	"time"

	"github.com/quota-lease/quota-lease/policy"
	"github.com/quota-lease/quota-lease/scale"
)

// Grant is a region's share of one quota for a bounded time.
type Grant struct {
	// ID names the grant; an agent presents it on renewal to acknowledge it.
	ID string
	// Amount is the share in the quota's primary unit: micro-units per
	// second for a token bucket, micro-units per window for the window
	// algorithms. It is the default share: every identity of the policy
	// that Identities does not name is enforced at it.
	Amount int64
	// Identities are the identities that hold shares of their own in this
	// grant, with their amounts: an identity whose demand lives in a few
	// regions gets its limit where it lives instead of every region's
	// default share (docs/identity-shares.md). Nil for most grants.
	Identities map[string]int64
	// Epoch is the leader epoch that issued it.
	Epoch int64
	// ValidFor is how long it holds.
	ValidFor time.Duration
	// RenewAfter is when the coordinator asks the agent to renew, from the
	// request's send time; 0, or not before the agent's validity ends,
	// means the agent's own Timing.RenewAfter.
	RenewAfter time.Duration
	// Total is the quota's total amount when the grant was issued (0:
	// unknown). The degraded budget falling back from the grant is
	// computed from it, the lower of it and the agent's policy's total
	// (DegradedTotal): an agent cut off before it learns of a lowered limit
	// then falls back to no more than the coordinator reserves for it.
	Total int64
}

// DegradedTotal is the total the degraded budget falling back from g is
// computed from, for an agent (or book) whose policy's total is total.
func (g Grant) DegradedTotal(total int64) int64 {
	if g.Total > 0 {
		return min(total, g.Total)
	}
	return total
}

// AmountFor is the share g gives identity: its own, or the default.
func (g Grant) AmountFor(identity string) int64 {
	if a, ok := g.Identities[identity]; ok {
		return a
	}
	return g.Amount
}

// largest is the largest share g gives any identity.
func (g Grant) largest() int64 {
	m := g.Amount
	for _, a := range g.Identities {
		m = max(m, a)
	}
	return m
}

// DegradedBudget is the degraded budget, as an amount, of a region whose
// lease lapsed since ago, under failure policy f, for a quota of total
// amount, given the last share the region held. It is what the agent
// enforces and what the coordinator reserves (fail-open is enforced but not
// reserved).
//
// The static share is capped at the last share: a region normally holds at
// least its static share (it is a floor), but one that was granted less,
// because others still held the capacity, must not jump above what was
// counted for it when its lease lapses.
func DegradedBudget(f policy.Failure, total, last int64, ago time.Duration) int64 {
	static := min(int64(f.StaticFraction*float64(total)), last)
	switch f.Mode {
	case policy.StaticShare:
		return static
	case policy.LastLease:
		if last <= static || ago >= time.Duration(f.Decay) {
			return static
		}
		left := 1 - float64(ago)/float64(time.Duration(f.Decay))
		return static + int64(float64(last-static)*left)
	case policy.FailOpen:
		return int64(f.OpenFraction * float64(total))
	default:
		return 0
	}
}

// Reserved reports whether the coordinator keeps a failure mode's degraded
// budget out of other regions' reach. Fail-open is not reserved: its budget
// is overshoot, and bound counts it.
func Reserved(f policy.Failure) bool { return f.Mode != policy.FailOpen }

// Floor is the least amount a region's share must have for the failure
// mode to be safe: a region must already hold the static share it would
// fall back to, or another region could be holding it when it lapses.
func Floor(f policy.Failure, total int64) int64 {
	if f.Mode == policy.StaticShare || f.Mode == policy.LastLease {
		return int64(f.StaticFraction * float64(total))
	}
	return 0
}

// RegionFloor is the least share (an amount) region must get of policy p:
// the policy's explicit floor for it and, for a region taking part
// (holding or asking for a lease), the static share its failure mode falls
// back to and the least useful share: one whose bucket can hold a request
// of the policy's cost (a share's capacity is the burst scaled by the
// share, and a bucket smaller than one request admits nothing). A region
// with no lease needs neither: it has nothing to fall back from or admit.
func RegionFloor(p *policy.Policy, region string, active bool) int64 {
	full := p.Limits()
	total := full.Amount()
	var f int64
	if active {
		f = max(Floor(p.Failure, total), UsefulShare(p))
	}
	if units, ok := p.Floors[region]; ok {
		f = max(f, int64(units/p.Limit*float64(total)))
	}
	return f
}

// UsefulShare is the least amount whose share of p's capacity holds one
// request of p's default cost.
func UsefulShare(p *policy.Policy) int64 {
	full := p.Limits()
	return min(full.Amount(), scale.Up(p.Cost*policy.Micro, full.Amount(), full.Capacity))
}
