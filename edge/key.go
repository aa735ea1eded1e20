package edge

import (
	"maps"
	"slices"
	"time"

	"github.com/quota-lease/quota-lease/edge/tokens"
	"github.com/quota-lease/quota-lease/policy"
)

// Key is one policy identity an agent serves at the edge: the slots
// (Envoy instances' buckets) that report it, keyed by K, their ledger,
// this round's plan, and the agent's reservation in the region's store.
// An agent round, every Config.Tick, is: Plan (or Release when the
// identity is no longer served) for the update to write; the store's
// answer to Synced; Push for what to send. Not safe for concurrent use.
type Key[K comparable] struct {
	Ledger *Ledger[K]
	// Slots are the slots reporting the identity now.
	Slots map[K]*Slot
	order func(a, b K) int

	// This round's plan: each slot's share (nil when nothing is served),
	// the assignments' time to live and life (Lifetime), the capacity of
	// the region they come from, and this agent's edge demand.
	Want           map[K]int64
	TTL, Life      time.Duration
	Capacity, Self int64

	// The reservation. Written is what the region's store holds for this
	// agent (confirmed by a sync); Visible what every agent may be
	// counting (written GrowWait ago); Pending a larger written amount
	// waiting for that since PendingSince; Covered until when the store
	// keeps the entry, on this agent's clock; SentEdge and SentDirect the
	// demands last written.
	Written, Visible, Pending int64
	PendingSince, Covered     time.Time
	SentEdge, SentDirect      int64
	// SentLargest is the largest share the store records for this agent
	// (Update.Largest).
	SentLargest int64
	// Places is how many instance places the store holds for this agent
	// (places.go), SentInstances how many it last asked for.
	Places, SentInstances int64
	askedAt               time.Time // when places were last asked for
	most                  int64     // the policy's instances, as last planned
	placed                int64     // the slots holding a place
	lost                  []K       // slots that lost their places, to abandon

	changed time.Time // the last push that changed or abandoned an assignment
	ids     []K       // the slots' keys in order (sorted), nil after Add or Remove
}

// NewKey returns a key with no slots; order sorts slot keys (splits and
// pushes go through slots in that order).
func NewKey[K comparable](order func(a, b K) int) *Key[K] {
	return &Key[K]{Ledger: NewLedger[K](), Slots: map[K]*Slot{}, order: order}
}

// Add starts slot id at now (its bucket's first report), demand unknown.
func (k *Key[K]) Add(id K, now time.Time) *Slot {
	s := &Slot{Demand: -1, Busy: now}
	k.Slots[id] = s
	k.ids = nil
	return s
}

// Remove forgets slot id (its stream ended, or its bucket was abandoned);
// what it was sent keeps counting until it may have expired.
func (k *Key[K]) Remove(id K) {
	if s := k.Slots[id]; s != nil && s.Placed {
		k.placed--
	}
	k.Ledger.Remove(id)
	delete(k.Slots, id)
	k.ids = nil
}

// sorted returns the slots' keys in order, sorted again only after Add or
// Remove. The caller must not change the slice.
func (k *Key[K]) sorted() []K {
	if k.ids == nil {
		k.ids = slices.SortedFunc(maps.Keys(k.Slots), k.order)
	}
	return k.ids
}

// Others is what the other agents of the region hold for one policy
// identity, as the store returns it.
type Others struct{ Reserved, Edge, Direct int64 }

// Update is what an agent writes to the region's store for one policy
// identity: the reservation it wants (growth granted up to Capacity
// counting the other agents'; a smaller one whole), the instance places
// it wants (one per slot; growth granted up to Most, the policy's
// instances per region, the same way), its edge and direct demand, the
// largest share one instance may enforce while the entry stands (for a
// successor: inherit.go), the entry kept for Life.
type Update struct {
	Want, Capacity     int64
	Instances, Most    int64
	EdgeDemand, Direct int64
	Largest            int64
	Life               time.Duration
}

// Plan is a round's plan at now for an identity of p (with edge settings)
// that slots report: the time to live from what is left of the region's
// grant (validLeft; TTL), the capacity at the end of the assignments' life
// (capacityAt: no grant's capacity grows while nothing is renewed, and a
// renewal that shrinks it is not acknowledged while the edge may enforce
// more), split by demand between direct checks (this agent's direct and
// the others'), the others' Envoy instances and this agent's (Wants):
// slots refused a place take no part; new ones do, as the store usually
// has a place for them. It returns the update to write, if the store
// needs one.
func (k *Key[K]) Plan(
	now time.Time,
	p *policy.Policy,
	validLeft time.Duration,
	capacityAt func(time.Time) int64,
	direct int64,
	others Others,
	cfg Config,
) (Update, bool) {
	k.TTL, _ = TTL(p.Edge.EdgeTTL(), validLeft, cfg.Drift, cfg.Margin)
	k.Life = Lifetime(k.TTL, cfg.Drift, cfg.Margin)
	k.Capacity = capacityAt(now.Add(k.Life))
	k.most = int64(p.Edge.Instances)
	k.place(false) // places freed here go to slots waiting for one
	ids, demands := k.sorted(), make([]int64, 0, len(k.Slots))
	if k.placed < int64(len(k.Slots)) {
		ids = make([]K, 0, len(k.Slots))
		for _, id := range k.sorted() {
			if !k.Slots[id].Refused {
				ids = append(ids, id)
			}
		}
	}
	for _, id := range ids {
		demands = append(demands, k.Slots[id].Demand)
	}
	var shares []int64
	k.Self, shares = Wants(k.Capacity, others.Direct+direct, others.Edge, demands)
	shares = k.keep(now, ids, shares, k.Capacity-others.Reserved)
	if k.Want == nil {
		k.Want = make(map[K]int64, len(k.Slots))
	} else {
		clear(k.Want) // reused: no one holds it past a round
	}
	if len(ids) < len(k.Slots) {
		for id := range k.Slots {
			k.Want[id] = 0 // refused a place: no part in the split
		}
	}
	for i, id := range ids {
		k.Want[id] = shares[i]
	}
	k.adopt(now)
	need, largest := k.Ledger.Need(now, k.Want), k.Ledger.Largest(now, k.Want)
	instances := int64(len(k.Slots))
	if need != k.Written || now.After(k.rewriteAt(cfg)) ||
		moved(k.Self, k.SentEdge, k.Capacity) || moved(direct, k.SentDirect, k.Capacity) ||
		instances != k.SentInstances || largest != k.SentLargest || k.Waiting(now) {
		return Update{Want: need, Capacity: k.Capacity, Instances: instances, Most: int64(p.Edge.Instances),
			EdgeDemand: k.Self, Direct: direct, Largest: largest, Life: cfg.EntryFor(k.Life)}, true
	}
	return Update{}, false
}

// keep returns shares with each slot's current share kept where the split
// moved it by at most a 64th: a change costs a message and may start the
// bucket full, so demand that wavers does not change assignments. Kept
// shares never total more than the split's total and a 64th, nor limit
// (the capacity less the other agents' reservations), so a capacity that
// falls still shrinks them.
func (k *Key[K]) keep(now time.Time, ids []K, shares []int64, limit int64) []int64 {
	out := slices.Clone(shares)
	var sum, kept int64
	for i, id := range ids {
		if cur, active := k.Ledger.Current(id, now); active && max(shares[i]-cur, cur-shares[i]) <= cur/64 {
			out[i] = cur
		}
		sum, kept = sum+shares[i], kept+out[i]
	}
	if kept > sum+sum/64 || kept > limit {
		return shares
	}
	return out
}

// rewriteAt is when the reservation entry wants rewriting: early enough
// that one more assignment's life fits in what the store keeps, with a
// few rounds and a wait for the next read (Config.ReadEvery) to spare.
func (k *Key[K]) rewriteAt(cfg Config) time.Time {
	return k.Covered.Add(-k.Life - 2*cfg.Tick - cfg.ReadEvery())
}

// growAt is when the larger reservation written and waiting (Pending)
// becomes usable: GrowWait after it was written, when every agent has read
// it. Zero when none waits.
func (k *Key[K]) growAt(cfg Config) time.Time {
	if k.Pending == 0 {
		return time.Time{}
	}
	return k.PendingSince.Add(cfg.GrowWait)
}

// grown reports whether the growth waiting is usable at now.
func (k *Key[K]) grown(now time.Time, cfg Config) bool {
	at := k.growAt(cfg)
	return !at.IsZero() && !now.Before(at)
}

// Urgent reports whether u, the update a round planned, should be written
// at once rather than with the next read (Config.ReadEvery): it grows the
// reservation, asks places for new slots, or records a larger share for
// one instance, which assignments wait for. Whatever else it changes can
// wait, as the reservation written stays at least what the assignments
// sent may enforce; slots refused a place ask again with the next read.
func (k *Key[K]) Urgent(u Update) bool {
	return u.Want > k.Written || u.Instances > k.SentInstances || u.Largest > k.SentLargest
}

// Release is a round at now for an identity no longer served (no slot, or
// its policy gone or without edge settings): the reservation follows what
// the assignments sent may still enforce. drop says the key can be
// forgotten: nothing is reserved or may be enforced.
func (k *Key[K]) Release(now time.Time, direct int64, cfg Config) (u Update, write, drop bool) {
	k.Want = nil
	need := k.Ledger.Committed(now)
	if need == 0 && k.Written == 0 && k.SentInstances == 0 && k.Ledger.Empty(now) {
		return Update{}, false, true
	}
	largest := k.Ledger.Largest(now, nil)
	if need != k.Written || moved(direct, k.SentDirect, k.Capacity) || k.SentInstances != 0 ||
		largest != k.SentLargest {
		life := cfg.KeepFor(max(k.Life, time.Second))
		return Update{Want: need, Direct: direct, Largest: largest, Life: life}, true, false
	}
	return Update{}, false, false
}

// adopt takes the slots, in order, for the predecessor's instances the
// ledger's pool still counts (inherit.go), if it counts any.
func (k *Key[K]) adopt(now time.Time) {
	for _, id := range k.sorted() {
		k.Ledger.Adopt(id, now)
	}
}

// Leave is the update an agent that stops, and pushes nothing more,
// writes at now: what its assignments may still enforce, and its places,
// kept only until the last of them may have expired (on the store's clock,
// which may run slow by the drift), not for the entry's usual life, so
// that the agents its Envoy instances move to may use the rest sooner.
// write is false when the store holds nothing for this agent.
func (k *Key[K]) Leave(now time.Time, cfg Config) (u Update, write bool) {
	if k.Written == 0 && k.SentInstances == 0 && k.Places == 0 {
		return Update{}, false
	}
	need, left := k.Ledger.Committed(now), time.Duration(0)
	if end := k.Ledger.End(now); end.After(now) {
		left = Lifetime(end.Sub(now), cfg.Drift, 0)
	}
	return Update{Want: need, Capacity: need, Instances: k.Places, Most: k.Places, Largest: k.Ledger.Largest(now, nil),
		Life: max(left, time.Millisecond)}, true
}

// moved reports whether a demand moved since it was last written by more
// than a tenth and more than a 64th of capacity: the other agents split
// the capacity by it, and a smaller move changes their shares by less than
// a share moves before it is changed (keep). Demand counted over a few
// seconds wavers by more than a tenth by chance alone (5 s of 2 requests
// a second count 10 ± 3), so with the tenth alone most reports would cost
// a write.
func moved(now, sent, capacity int64) bool {
	d := max(sent/10, capacity/64)
	return now-sent > d || sent-now > d // both at least 0: no overflow
}

// Synced applies the store's answer to u, sent at sent and answered at
// done: it granted g. The store ran it in between: the entry's life
// counts from sent (it ends no sooner; the store keeps it for u.Life on
// its own clock), a larger reservation's wait from done (every other
// agent's read that missed it began before done); it becomes visible
// (usable) GrowWait after that. Places are usable at once: the store
// counted every other agent's as it granted them, and so is what it moved
// from the process this agent succeeded (inherit.go). It returns the slots
// newly refused a place.
func (k *Key[K]) Synced(sent, done time.Time, u Update, g Granted, cfg Config) (refused []K) {
	granted := g.Reserved
	k.Written, k.SentEdge, k.SentDirect = granted, u.EdgeDemand, u.Direct
	k.Places, k.SentInstances, k.askedAt = g.Places, u.Instances, sent
	k.SentLargest = max(u.Largest, g.Inherited.Largest)
	k.Ledger.Confirm(u.Largest)
	if g.Inherited.Reserved > 0 {
		k.Visible += g.Inherited.Reserved
		k.Ledger.Inherit(g.Inherited, done, cfg.Drift)
		k.adopt(done)
		// The plan counted the predecessor's entry among the others' and
		// split the capacity with it: nothing is pushed from it (a share
		// of nothing would end the buckets the predecessor's instances
		// still hold); the next round plans again.
		k.Want = nil
	}
	switch {
	case granted <= k.Visible:
		k.Visible, k.Pending = granted, 0
	case granted <= k.Pending:
		k.Pending = granted // part of what was written then
	default:
		if k.grown(done, cfg) {
			k.Visible = k.Pending
		}
		k.Pending, k.PendingSince = granted, done
	}
	k.Covered = sent.Add(surely(u.Life, cfg.Drift))
	// Only a store that granted fewer places than asked refused any. A
	// slot added while the write was in flight was not asked for: it asks
	// with the next write (Urgent), unless the store just refused others,
	// when there is surely no place for it either.
	return k.place(g.Places < u.Instances)
}

// Lapsed is a key whose agent's life in the store ended (a sync found the
// store counting it in another: Store): the store holds nothing of it for
// this agent any more, so its reservation grows again from none, waiting
// as any growth does, and nothing is pushed until it is written (the
// write asks for its places again: the answer says which slots keep one).
func (k *Key[K]) Lapsed() {
	k.Written, k.Visible, k.Pending = 0, 0, 0
	k.SentEdge, k.SentDirect, k.SentLargest, k.SentInstances = 0, 0, 0, 0
	k.Covered = time.Time{}
}

// Send is one action for one slot: an assignment of Bucket for TTL, or an
// abandon (the slot is then removed).
type Send[K comparable] struct {
	Slot    K
	Abandon bool
	Bucket  tokens.Bucket
	TTL     time.Duration
}

// Push returns, at now, the actions for the slots of an identity of p (nil
// when not served): the changes the ledger allows within the visible
// reservation (Ledger.Plan; a changed share gets a new bucket, tokens.Assign),
// the refreshes due, and abandons of slots idle for AbandonAfter. Nothing
// is pushed while the store may not keep the reservation for one more
// assignment's life: its entry (Covered), or this agent alive (until
// alive, on this agent's clock: the entry ends with the agent's life,
// Store).
func (k *Key[K]) Push(now time.Time, p *policy.Policy, alive time.Time, cfg Config) []Send[K] {
	return k.push(now, p, alive, cfg, cfg.RefreshLead(k.TTL))
}

// PushAlong is Push for a key whose round is not due (Next), when an
// Envoy instance it assigns to gets a message anyway: it also refreshes
// every assignment due within AlongLead, so that the refreshes of one
// instance's buckets come together, one message per assignment's life,
// instead of one message for each.
func (k *Key[K]) PushAlong(now time.Time, p *policy.Policy, alive time.Time, cfg Config) []Send[K] {
	return k.push(now, p, alive, cfg, cfg.AlongLead(k.TTL))
}

func (k *Key[K]) push(now time.Time, p *policy.Policy, alive time.Time, cfg Config, lead time.Duration) []Send[K] {
	if k.grown(now, cfg) {
		k.Visible, k.Pending = max(k.Visible, k.Pending), 0
	}
	k.Visible = min(k.Visible, k.Written)
	out := k.abandonLost(now)
	if p == nil || k.Want == nil || now.Add(k.Life).After(k.Covered) || now.Add(k.Life).After(alive) {
		return out
	}
	changes := k.Ledger.Plan(now, k.placedWant(), k.Visible, cfg.ChangeEvery)
	from := now.Add(surely(k.TTL, cfg.Drift))
	for _, id := range k.sorted() {
		s := k.Slots[id]
		if now.Sub(s.Busy) >= cfg.AbandonAfter && now.Sub(s.Changed) >= cfg.ChangeEvery {
			k.Remove(id)
			k.changed = now
			out = append(out, Send[K]{Slot: id, Abandon: true})
			continue
		}
		if !s.Placed {
			continue // keeps the policy's no_assignment behaviour
		}
		share, change := changes[id]
		if change && share == 0 && s.Changed.IsZero() && !p.Edge.Unbounded() {
			// Never assigned: Envoy denies without an assignment, or keeps
			// the bucket a predecessor's instance may still hold (counted
			// in the pool: inherit.go), which a DENY_ALL would end; and
			// a DENY_ALL would hold the slot for ChangeEvery, when a share
			// may come with the next round.
			continue
		}
		if change {
			s.resize(now, p, share, cfg)
			s.Changed, k.changed = now, now
		} else {
			cur, active := k.Ledger.Current(id, now)
			switch {
			case !active || !k.Ledger.Due(id, now, lead):
				continue
			case cur > k.Want[id] && (k.Want[id] == 0 || !cfg.KeepsFill):
				// A share above what the slot may have now (its capacity
				// fell, or it is being moved away and its change waits
				// for ChangeEvery) is never extended: it expires.
				continue
			case cur > k.Want[id]:
				// Its change waits for ChangeEvery, but the bucket would
				// expire first: a shrink adds no tokens where Envoy keeps
				// the fill ratio, so it goes now, where an expiry would
				// make the change a start, paid for from the slack or sent
				// as DENY_ALL.
				share = k.Want[id]
				s.resize(now, p, share, cfg)
				s.Changed, k.changed = now, now
			default:
				share = cur // a refresh: the same bucket, a new time to live
				if s.refresh(now, p, share, cfg) {
					s.Changed, k.changed = now, now
				}
			}
		}
		k.Ledger.Pushed(id, share, now, from, now.Add(k.Life))
		s.pushed(from, now.Add(k.Life))
		out = append(out, Send[K]{Slot: id, Bucket: s.Bucket, TTL: k.TTL})
	}
	return out
}
