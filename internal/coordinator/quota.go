package coordinator

import (
	"fmt"
	"math"
	"sync"
	"time"

	"github.com/quota-lease/quota-lease/allocation"
	"github.com/quota-lease/quota-lease/lease"
	"github.com/quota-lease/quota-lease/policy"
)

// quotaState is the leader's state for one policy: its book of grants and the
// current target share of every region. mu guards everything.
type quotaState struct {
	mu      sync.Mutex
	policy  *policy.Policy
	fp      uint64 // policy.Fingerprint(), sent with every grant
	full    policy.Limits
	book    *lease.Book
	targets map[string]int64
	ids     *lease.IdentityPlan // the identities with shares of their own
	edge    edgeReports         // what each agent instance's Envoy instances hold
}

func newQuota(p *policy.Policy, t lease.Timing, epoch int64) *quotaState {
	full := p.Limits()
	q := &quotaState{
		policy:  p,
		fp:      p.Fingerprint(),
		full:    full,
		book:    lease.NewBook(full.Amount(), p.Failure, t, epoch),
		targets: map[string]int64{},
		ids:     lease.NewIdentityPlan(p.IdentityShareLimit()),
	}
	q.ids.SetEdge(p.Edge != nil)
	return q
}

// setPolicy replaces the policy (a quota change); outstanding grants keep
// counting until they end.
func (q *quotaState) setPolicy(p *policy.Policy) {
	q.policy, q.fp, q.full = p, p.Fingerprint(), p.Limits()
	q.book.SetQuota(q.full.Amount(), p.Failure)
	q.ids.SetMax(p.IdentityShareLimit())
	q.ids.SetEdge(p.Edge != nil)
}

// inherit reserves in q, a policy just created, what every region may
// still be enforcing under old, the deleted policy of the same name: the
// same fraction of q's total, rounded up, held for one lease from now
// (longer than any of old's grants can last). Units may differ (a new
// algorithm): a fraction of the limit is what carries over. The old
// grants are enforced on other keys than the new ones, so they add up
// with the region's new grant rather than count as another instance of
// it: each is booked under a pseudo-region "<region>.retired", a name no
// real region can have ('.' is not allowed in region names), which no
// plan gives a target and which ends with its grant. It returns the number
// of regions reserved.
func (q *quotaState) inherit(old *quotaState, now time.Time) int {
	n := 0
	oldTotal, newTotal := old.book.Total(), q.book.Total()
	for _, st := range old.book.Statuses(now) {
		if st.Enforcing <= 0 || oldTotal <= 0 {
			continue
		}
		amount := min(newTotal, int64(math.Ceil(float64(st.Enforcing)*float64(newTotal)/float64(oldTotal))))
		q.book.Restore(st.Region+retiredSuffix, st.Instance, "retired", st.GrantID, amount, 0, now)
		n++
	}
	return n
}

// retiredSuffix marks a pseudo-region holding a deleted policy's grants.
const retiredSuffix = ".retired"

// checkFloors reports a policy whose floors cannot all be met with the
// declared regions.
func checkFloors(p *policy.Policy, regions []string) error {
	if p.Scope == policy.ScopeRegion {
		return nil
	}
	total := p.Limits().Amount()
	var sum int64
	for _, r := range regions {
		sum += lease.RegionFloor(p, r, true)
	}
	for r := range p.Floors {
		if !contains(regions, r) {
			return fmt.Errorf("policy %q: floor for unknown region %q; declare it with 'coordinator regions "+
				"set-weight %s 1'", p.Name, r, r)
		}
	}
	if sum > total {
		return fmt.Errorf("%w: policy %q: with %d regions the floors, static shares and least useful shares (a "+
			"share's burst must hold one request) need %.0f%% of the quota; lower the floors or static_fraction, "+
			"or raise burst to at least %d x cost",
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

// rebalance recomputes the targets (lease.PlanTargets).
func (q *quotaState) rebalance(regions map[string]regionRecord, o lease.PlanOptions) error {
	weights := make(map[string]float64, len(regions))
	for name, r := range regions {
		weights[name] = r.Weight
	}
	targets, err := lease.PlanTargets(q.policy, q.book, weights, q.targets, o)
	if err != nil {
		return fmt.Errorf("rebalance %s: %w", q.policy.Name, err)
	}
	q.targets = targets
	q.ids.Plan(q.book.Total(), lease.UsefulShare(q.policy), q.targets)
	return nil
}
