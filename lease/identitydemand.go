package lease

import "github.com/quota-lease/quota-lease/policy"

// Owns reports whether g gives identity a share of its own.
func (g Grant) Owns(identity string) bool {
	_, ok := g.Identities[identity]
	return ok
}

// IdentityDemands is what an agent instance reports of its identities' own
// demand (amount units) under grant g of a quota with limits full: the
// identities whose rate on m is over the instance's part of the default
// share (the default divided by the region's live instances, since the
// coordinator sums their reports), and those g gives shares of their own
// (0 when not asked for lately), at most most in all (the hottest, and
// every one g gives a share: Reported). name names m's keys. Nil before any grant.
func IdentityDemands[K comparable](
	m *Meter[K],
	nowMs int64,
	g Grant,
	full policy.Limits,
	instances, most int,
	name func(K) string,
) map[string]int64 {
	if g.ID == "" {
		return nil
	}
	over := g.Amount/int64(max(1, instances)) + 1 // as a rate, micro-units per second
	if full.Algorithm != policy.TokenBucket {
		over = over * 1000 / full.WindowMs
	}
	rates := m.Rates(nowMs, over, func(id K) bool { return g.Owns(name(id)) })
	out := make(map[string]int64, len(rates)+len(g.Identities))
	for id := range g.Identities {
		out[id] = 0
	}
	for id, r := range rates {
		out[name(id)] = full.RateAmount(r)
	}
	return hottestDemands(out, g.Owns, most)
}
