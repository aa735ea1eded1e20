package edge

import (
	"cmp"
	"time"

	"github.com/quota-lease/quota-lease/policy"
)

// ID names a policy identity served at the edge.
type ID struct{ Policy, Identity string }

// CompareIDs orders IDs by policy, then identity.
func CompareIDs(a, b ID) int {
	return cmp.Or(cmp.Compare(a.Policy, b.Policy), cmp.Compare(a.Identity, b.Identity))
}

// Served is one policy identity an agent serves at the edge: its Key (the
// slots that report it, their ledger, the reservation) and what decides
// whether a round plans it again (Round).
type Served[S comparable] struct {
	*Key[S]
	ID ID

	pol    *policy.Policy // nil: no longer served (policy gone or without edge settings)
	fp     uint64         // pol's fingerprint
	others Others         // the other agents' holdings, from the last sync
	direct int64          // this agent's direct demand

	// A key is planned in a round only when an input changed (dirty: a
	// report, a slot added or dropped, the others' holdings or the direct
	// demand), when its policy or grant did (validUntil is the grant's
	// validity its last round planned with), when due (Key.Next), or
	// when its last update waits for the next read (unwritten): an agent
	// serving many identities pays for those that move.
	dirty, unwritten bool
	due, validUntil  time.Time
	pushed           time.Time // the round it last pushed in
}

// Policy is the policy the key was last planned with; nil when it is no
// longer served at the edge.
func (k *Served[S]) Policy() *policy.Policy { return k.pol }

// Touch notes that an input of the key changed (a report, a slot added or
// removed): the next round plans it.
func (k *Served[S]) Touch() { k.dirty = true }

// needsRound reports whether k, under g (its policy's grant this round:
// pol nil when no longer served), must be planned at now, in a round that
// reads the reservations or not: an input changed, its Next came, its
// update waits for this read, or its time to live or capacity may differ
// from its last round's (the grant changed, or is too near its end for a
// whole assignment's life). TestKeySkipsOnlyIdleRounds proves that a
// round skipped this way would have written and pushed nothing.
func (r *Round[S]) needsRound(k *Served[S], g grantNow, now time.Time, read bool) bool {
	pol, until := g.pol, g.until
	if fp, ok := r.fps[pol]; ok && pol != k.pol && k.pol != nil && fp == k.fp {
		k.pol = pol // reloaded, unchanged
	}
	switch {
	case k.dirty || read && (k.unwritten || k.Waiting(now)) || pol != k.pol || pol == nil:
		return true
	case !k.due.IsZero() && !now.Before(k.due):
		return true
	case !g.steady:
		return true
	case until.Equal(k.validUntil):
		return false
	}
	if c := r.capacityAt(k.ID, r.pushSlack())(now.Add(k.Life)); c != k.Capacity {
		return true
	}
	k.validUntil = until // a renewal that left this identity's capacity as it was
	return false
}

// grantNow is what a round knows of a policy's grant, looked up once a
// round for all its keys: the policy (nil: no longer served at the edge),
// the grant's validity, and whether an assignment pushed this round gets
// the whole time to live and capacity of it (steady).
type grantNow struct {
	pol    *policy.Policy
	until  time.Time
	steady bool
}

// grantAt looks up policy name's grant for a round at now.
func (r *Round[S]) grantAt(name string, now time.Time) grantNow {
	g := grantNow{pol: r.leases.Policy(name), until: r.leases.ValidUntil(name)}
	g.steady = g.pol != nil && r.steady(g.pol, g.until, now)
	return g
}

// steady reports whether an assignment of policy p pushed at now, or as
// late as a round's push may come after its plan, gets the whole time to
// live and the capacity of the grant valid until until (SteadyUntil).
func (r *Round[S]) steady(p *policy.Policy, until, now time.Time) bool {
	return now.Add(r.pushSlack()).Before(SteadyUntil(p, until, r.cfg))
}

// pushSlack is the longest a round's push may come after its plan: its
// sync's timeout (GrowWait), and a round for the rest.
func (r *Round[S]) pushSlack() time.Duration { return r.cfg.GrowWait + r.cfg.Tick }

// capacityAt is the region's capacity for id at a time, looked up later by
// slack (Leases.EnforceAt; no capacity grows while nothing is renewed).
func (r *Round[S]) capacityAt(id ID, slack time.Duration) func(time.Time) int64 {
	return func(t time.Time) int64 { return r.leases.EnforceAt(id.Policy, id.Identity, t.Add(slack)) }
}

// alongOK reports whether k, not planned this round, may push along at
// now: its last plan still holds (nothing changed, nothing due, no update
// waiting) and its assignments get the whole time to live of its grant.
func (r *Round[S]) alongOK(k *Served[S], now time.Time) bool {
	return !k.pushed.Equal(now) && k.pol != nil && !k.dirty && !k.unwritten &&
		(k.due.IsZero() || now.Before(k.due)) && r.steady(k.pol, k.validUntil, now)
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
