package agent

import (
	"math"
	"time"
)

// What the edge engine asks of the leases.

// validUntil is when this process's grant of policy name stops holding,
// on its clock (zero without one).
func (l *leaser) validUntil(name string) time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	q := l.quotas[name]
	if q == nil {
		return time.Time{}
	}
	g, until := q.a.Grant()
	if g.ID == "" {
		return time.Time{}
	}
	return until
}

// identityRates is this process's direct demand for identities of policy
// name (the cost they asked of its checks), in the policy's amount unit.
func (l *leaser) identityRates(name string, ids map[string]bool, now time.Time) map[string]int64 {
	l.mu.Lock()
	q := l.quotas[name]
	if q == nil {
		l.mu.Unlock()
		return nil
	}
	limits := q.policy.Limits()
	l.mu.Unlock()
	q.meter.mu.Lock()
	rates := q.meter.m.Rates(now.UnixMilli(), math.MaxInt64, func(id string) bool { return ids[id] })
	q.meter.mu.Unlock()
	for id, r := range rates {
		rates[id] = limits.RateAmount(r)
	}
	return rates
}
