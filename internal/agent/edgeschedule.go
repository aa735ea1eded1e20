package agent

import (
	"time"

	"github.com/quota-lease/quota-lease/edge"
	"github.com/quota-lease/quota-lease/policy"
)

// Which edge keys a round plans. A key is planned only when something
// that decides its plan may have changed: its inputs (edgeKey.dirty), its
// policy or its grant, or a time its own state names (edge.Key.Next), so
// that an agent serving many identities pays for those that move, not for
// every identity every round. edge.TestKeySkipsOnlyIdleRounds proves that
// a round skipped this way would have written and pushed nothing.

// needsRound reports whether key k, of policy pol (nil: no longer served)
// under a grant valid until until, must be planned at now, in a round that
// reads the reservations or not: an input changed, its Next came, its
// update waits for this read, or its time to live or capacity may differ
// from its last round's (the grant changed, or is too near its end for a
// whole assignment's life). e.mu is held.
func (e *edgeEngine) needsRound(k *edgeKey, pol *policy.Policy, until, now time.Time, read bool) bool {
	if fp, ok := e.fps[pol]; ok && pol != k.pol && k.pol != nil && fp == k.fp {
		k.pol = pol // reloaded, unchanged
	}
	switch {
	case k.dirty || (k.unwritten || k.Waiting(now)) && read || pol != k.pol || pol == nil:
		return true
	case !k.due.IsZero() && !now.Before(k.due):
		return true
	case !e.steady(pol, until, now):
		return true
	case until.Equal(k.validUntil):
		return false
	}
	if c := e.capacityAt(k.id, e.pushSlack())(now.Add(k.Life)); c != k.Capacity {
		return true
	}
	k.validUntil = until // a renewal that left this identity's capacity as it was
	return false
}

// steady reports whether an assignment of policy p pushed at now, or as
// late as a round's push may come after its plan, gets the whole time to
// live and the capacity of the grant valid until until
// (edge.SteadyUntil).
func (e *edgeEngine) steady(p *policy.Policy, until, now time.Time) bool {
	return now.Add(e.pushSlack()).Before(edge.SteadyUntil(p, until, e.rc))
}

// pushSlack is the longest a round's push may come after its plan: its
// sync's timeout (GrowWait), and a round for the rest.
func (e *edgeEngine) pushSlack() time.Duration { return e.cfg.GrowWait + e.cfg.Tick }

// capacityAt is the region's capacity for id at a time, looked up later by
// slack (leaser.EnforceAt; no capacity grows while nothing is renewed).
func (e *edgeEngine) capacityAt(id edgeKeyID, slack time.Duration) func(time.Time) int64 {
	return func(t time.Time) int64 {
		c, _ := e.a.leaser.EnforceAt(id.policy, id.identity, t.Add(slack))
		return c
	}
}

// earliest is the earliest of ts that is not the zero time (the zero time
// when all are).
func earliest(ts ...time.Time) time.Time {
	var at time.Time
	for _, t := range ts {
		if !t.IsZero() && (at.IsZero() || t.Before(at)) {
			at = t
		}
	}
	return at
}

// growAt is when k's larger reservation, written and waiting, becomes
// usable (GrowWait after it was written); zero when none waits.
func (k *edgeKey) growAt(cfg edge.Config) time.Time {
	if k.Pending == 0 {
		return time.Time{}
	}
	return k.PendingSince.Add(cfg.GrowWait)
}
