package coordinator

import (
	"fmt"
	"sort"
	"sync"

	"github.com/quota-lease/quota-lease/allocation"
	"github.com/quota-lease/quota-lease/lease"
	"github.com/quota-lease/quota-lease/regional"
)

// quota is the leader's state for one policy: its book of grants and the
// current target share of every region. mu guards everything.
type quota struct {
	mu      sync.Mutex
	policy  *regional.Policy
	full    regional.Limits
	book    *lease.Book
	targets map[string]int64
}

func newQuota(p *regional.Policy, t lease.Timing, epoch int64) *quota {
	full := p.Limits()
	return &quota{policy: p, full: full, book: lease.NewBook(lease.Amount(full), p.Failure, t, epoch), targets: map[string]int64{}}
}

// setPolicy replaces the policy (a quota change); outstanding grants keep
// counting until they end.
func (q *quota) setPolicy(p *regional.Policy) {
	q.policy, q.full = p, p.Limits()
	q.book.SetQuota(lease.Amount(q.full), p.Failure)
}

func (q *quota) floor(region string, active bool) int64 {
	return lease.RegionFloor(q.policy, region, active)
}

// checkFloors reports a policy whose floors cannot all be met with the
// declared regions.
func checkFloors(p *regional.Policy, regions []string) error {
	if p.Scope == regional.ScopeRegion {
		return nil
	}
	total := lease.Amount(p.Limits())
	var sum int64
	for _, r := range regions {
		sum += lease.RegionFloor(p, r, true)
	}
	for r := range p.Floors {
		if !contains(regions, r) {
			return fmt.Errorf("policy %q: floor for unknown region %q; declare it with 'coordinator regions set-weight %s 1'", p.Name, r, r)
		}
	}
	if sum > total {
		return fmt.Errorf("%w: policy %q: with %d regions the floors, static shares and least useful shares (a share's burst must hold one request) need %.0f%% of the quota; lower the floors or static_fraction, or raise burst to at least %d x cost",
			allocation.ErrFloorsExceedTotal, p.Name, len(regions), 100*float64(sum)/float64(total), len(regions))
	}
	return nil
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// rebalance recomputes the targets of the regions that take part (those
// with a lease or a floor) from their demand, damped from the current
// targets.
func (q *quota) rebalance(regions map[string]regionRecord, strategy allocation.Strategy, maxStep, hysteresis float64) error {
	demand := q.book.Demands()
	total := q.book.Total()
	var in []allocation.Region
	for name, r := range regions {
		_, active := demand[name]
		if active || q.floor(name, false) > 0 {
			in = append(in, allocation.Region{Name: name, Weight: r.Weight, Floor: q.floor(name, active), Demand: min(demand[name], total)})
		}
	}
	sort.Slice(in, func(i, j int) bool { return in[i].Name < in[j].Name })
	d := allocation.Damping{MaxStep: int64(maxStep * float64(total)), Hysteresis: int64(hysteresis * float64(total))}
	targets, err := allocation.Plan(strategy, total, in, q.targets, d)
	if err != nil {
		return fmt.Errorf("rebalance %s: %w", q.policy.Name, err)
	}
	q.targets = targets
	return nil
}

// target is region's target share. A region not yet in a rebalance round
// asks for its demand (at least its floor); the book caps that at what is
// free, and the next round takes it into account.
func (q *quota) target(region string, demand int64) int64 {
	if t, ok := q.targets[region]; ok {
		return t
	}
	return max(q.floor(region, true), demand)
}
