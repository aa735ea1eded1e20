package admission

import (
	"sync"

	"github.com/quota-lease/quota-lease/policy"
)

// fallback is the in-process budget an agent instance decides with while
// Redis is slow or down: a policy.LocalBudget per (policy, identity) on
// this process's monotonic clock, enforcing the region's share divided
// among its live instances. It is never reset when Redis answers again,
// so a flapping Redis cannot hand out a fresh burst per flap (see
// policy.LocalBudget and docs/bound.md).
//
// Memory is bounded: with maxKeys identities tracked and none idle, new
// identities are rejected rather than others evicted.
type fallback struct {
	maxKeys int

	mu       sync.Mutex
	b        *policy.LocalBudget[string]
	prunedMs int64 // when idle entries were last dropped
}

func newFallback(maxKeys int) *fallback {
	return &fallback{maxKeys: maxKeys, b: policy.NewLocalBudget[string]()}
}

// decide charges cost micro-units to key under l at nowMs (monotonic
// milliseconds); a new key starts holding fraction start of l. full
// reports a new key refused because the table is full.
func (f *fallback) decide(
	key string,
	l policy.Limits,
	start float64,
	nowMs, cost int64,
) (d policy.Decision, full bool, err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.b.Len() >= f.maxKeys && !f.b.Has(key) {
		if nowMs-f.prunedMs >= 1000 { // Prune walks the whole table: at most once a second
			f.prunedMs = nowMs
			f.b.Prune(nowMs)
		}
		if f.b.Len() >= f.maxKeys {
			return policy.Decision{RetryAfterMs: 1000}, true, nil
		}
	}
	d, err = f.b.Decide(key, l, start, nowMs, cost)
	return d, false, err
}
