package coordinator

import (
	"fmt"
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
	fp      uint64 // policy.Fingerprint(), sent with every grant
	full    regional.Limits
	book    *lease.Book
	targets map[string]int64
}

func newQuota(p *regional.Policy, t lease.Timing, epoch int64) *quota {
	full := p.Limits()
	return &quota{policy: p, fp: p.Fingerprint(), full: full, book: lease.NewBook(lease.Amount(full), p.Failure, t, epoch), targets: map[string]int64{}}
}

// setPolicy replaces the policy (a quota change); outstanding grants keep
// counting until they end.
func (q *quota) setPolicy(p *regional.Policy) {
	q.policy, q.fp, q.full = p, p.Fingerprint(), p.Limits()
	q.book.SetQuota(lease.Amount(q.full), p.Failure)
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

// rebalance recomputes the targets (lease.Plan).
func (q *quota) rebalance(regions map[string]regionRecord, strategy allocation.Strategy, maxStep, hysteresis float64) error {
	weights := make(map[string]float64, len(regions))
	for name, r := range regions {
		weights[name] = r.Weight
	}
	targets, err := lease.Plan(q.policy, q.book, weights, strategy, maxStep, hysteresis, q.targets)
	if err != nil {
		return fmt.Errorf("rebalance %s: %w", q.policy.Name, err)
	}
	q.targets = targets
	return nil
}
