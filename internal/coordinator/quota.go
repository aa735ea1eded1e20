package coordinator

import (
	"fmt"
	"sort"
	"sync"
	"time"

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

// floor is region's least share: the policy's floor for it and, for a
// region taking part (holding or asking for a lease), the static share its
// failure mode falls back to. A region with no lease needs no static floor:
// it has nothing to fall back from.
func (q *quota) floor(region string, active bool) int64 {
	total := q.book.Total()
	var f int64
	if active {
		f = lease.Floor(q.policy.Failure, total)
	}
	if units, ok := q.policy.Floors[region]; ok {
		f = max(f, int64(units/q.policy.Limit*float64(total)))
	}
	return f
}

// checkFloors reports a policy whose floors cannot all be met with the
// declared regions.
func checkFloors(p *regional.Policy, regions []string) error {
	if p.Scope == regional.ScopeRegion {
		return nil
	}
	q := &quota{policy: p}
	total := lease.Amount(p.Limits())
	q.book = lease.NewBook(total, p.Failure, lease.DefaultTiming, 0)
	var sum int64
	for _, r := range regions {
		sum += q.floor(r, true)
	}
	for r := range p.Floors {
		if !contains(regions, r) {
			return fmt.Errorf("policy %q: floor for unknown region %q; declare it with 'coordinator regions set-weight %s 1'", p.Name, r, r)
		}
	}
	if sum > total {
		return fmt.Errorf("%w: policy %q: with %d regions the floors and static shares need %.0f%% of the quota",
			allocation.ErrFloorsExceedTotal, p.Name, len(regions), 100*float64(sum)/float64(total))
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
// targets. The first round of a quota is not damped.
func (q *quota) rebalance(regions map[string]regionRecord, strategy allocation.Strategy, maxStep, hysteresis float64, now time.Time) error {
	demand := q.book.Demands()
	var names []string
	active := map[string]bool{}
	for name := range regions {
		_, active[name] = demand[name]
		if active[name] || q.floor(name, false) > 0 {
			names = append(names, name)
		}
	}
	sort.Strings(names)
	total := q.book.Total()
	in := make([]allocation.Region, len(names))
	prev := make([]int64, len(names))
	floors := make([]int64, len(names))
	first := len(q.targets) == 0
	for i, n := range names {
		in[i] = allocation.Region{Name: n, Weight: regions[n].Weight, Floor: q.floor(n, active[n]), Demand: min(demand[n], total)}
		prev[i], floors[i] = q.targets[n], in[i].Floor
	}
	ideal, err := allocation.Allocate(strategy, total, in)
	if err != nil {
		return fmt.Errorf("rebalance %s: %w", q.policy.Name, err)
	}
	next := ideal
	if !first {
		d := allocation.Damping{MaxStep: int64(maxStep * float64(total)), Hysteresis: int64(hysteresis * float64(total))}
		next = allocation.Damp(prev, ideal, floors, total, d)
	}
	q.targets = make(map[string]int64, len(names))
	for i, n := range names {
		q.targets[n] = next[i]
	}
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
