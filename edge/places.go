package edge

import (
	"slices"
	"time"
)

// Instance places. The bound's edge term counts N instances per region
// (the policy's edge.instances), each running its own fallback once an
// assignment expires, so a region assigns to at most N instances of an
// identity, whichever of its agents they connect to and however unevenly
// they spread. The region's store keeps, beside each agent's reservation,
// how many places the agent holds; a larger number is granted as a larger
// reservation is (Reserve: never past N, counting the other agents'), in
// the same atomic write, so two agents growing at once never hold more
// than N between them. Only a placed slot is assigned; the others keep
// the policy's no_assignment behaviour and ask again with the key's next
// write, so a place that frees anywhere in the region goes to the next
// instance that asks.

// Granted is what the region's store granted an Update: the reservation
// (of the capacity) and the instance places, and, at a successor's first
// write, what it moved to them from the process it succeeded (inherit.go).
type Granted struct {
	Reserved, Places int64
	Inherited        Inheritance
}

// place gives the places the store holds for this agent, at most the
// policy's instances, to its slots: placed slots keep theirs, the others
// take what is free in order. The store grants no fewer than an agent
// held unless its entry was lost or a write's answer was (Unsynced), and
// the policy's instances may be lowered: then the last slots in order
// lose their places, and are abandoned at the next push (lost), so that
// their assignments cannot outlive the place into their fallback. With
// refuse (the store granted fewer places than it was asked), the slots
// left without a place are marked refused, and those newly so returned.
// Without it they wait for the answer to a write that asks for them.
func (k *Key[K]) place(refuse bool) (refused []K) {
	most := k.Places
	if k.most > 0 {
		most = min(most, k.most)
	}
	if k.placed == int64(len(k.Slots)) && k.placed <= most {
		return nil // every slot placed, within the places: nothing to do (most keys, most rounds)
	}
	defer func() { k.placed = k.countPlaced() }()
	ids := k.sorted()
	var placed int64
	for _, id := range ids {
		if k.Slots[id].Placed {
			placed++
		}
	}
	for i := len(ids) - 1; i >= 0 && placed > most; i-- {
		if s := k.Slots[ids[i]]; s.Placed {
			s.Placed, s.Refused, placed = false, true, placed-1
			k.lost = append(k.lost, ids[i])
		}
	}
	for _, id := range ids {
		switch s := k.Slots[id]; {
		case s.Placed:
		case placed < most:
			s.Placed, s.Refused, placed = true, false, placed+1
		case refuse && !s.Refused:
			s.Refused = true
			refused = append(refused, id)
		}
	}
	if placed < int64(len(ids)) {
		k.balance(ids)
	}
	return refused
}

// balance shares the places between the slots' groups (Slot.Group, the
// hosts their instances run on) max-min fairly: while a slot waits whose
// group holds two places fewer than another group, that group's last
// placed slot gives its place up to it, and is abandoned at the next push
// (lost), so that it cannot hold an assignment beside the one that takes
// its place. So streams that came first from one host, however many,
// cannot keep the policy's instances from every other host's.
func (k *Key[K]) balance(ids []K) {
	held := map[string]int{}
	for _, id := range ids {
		if s := k.Slots[id]; s.Placed {
			held[s.Group]++
		}
	}
	for {
		var rich K
		var ps, rs *Slot // the first waiting slot of the poorest group, the last placed of the richest
		for _, id := range ids {
			s := k.Slots[id]
			switch {
			case !s.Placed && !slices.Contains(k.lost, id) && (ps == nil || held[s.Group] < held[ps.Group]):
				ps = s
			case s.Placed && (rs == nil || held[s.Group] >= held[rs.Group]):
				rich, rs = id, s
			}
		}
		if ps == nil || rs == nil || held[rs.Group]-held[ps.Group] < 2 {
			return
		}
		held[rs.Group]--
		held[ps.Group]++
		rs.Placed, rs.Refused = false, true
		ps.Placed, ps.Refused = true, false
		k.lost = append(k.lost, rich)
	}
}

// Unsynced takes a write of u whose answer was lost: the store may have
// applied it or not. This agent counts the lesser of before and u, for
// the reservation and for the places alike: what the store holds beyond
// that is only held back from the others until the next write, which a
// growth still wanted asks for at once (Urgent) and places still wanted
// with the next read (Waiting).
func (k *Key[K]) Unsynced(u Update) {
	k.Written, k.Visible = min(k.Written, u.Want), min(k.Visible, u.Want)
	k.Places, k.SentInstances = min(k.Places, u.Instances), u.Instances
	k.place(false)
}

// abandonLost returns the abandons of the slots that lost their places,
// and forgets them.
func (k *Key[K]) abandonLost(now time.Time) []Send[K] {
	var out []Send[K]
	for _, id := range k.lost {
		if _, ok := k.Slots[id]; ok {
			k.Remove(id)
			k.changed = now
			out = append(out, Send[K]{Slot: id, Abandon: true})
		}
	}
	k.lost = nil
	return out
}

// askEvery is how often a key whose slots wait for a place asks the
// store again: a few times an Envoy report interval, and no more, as
// every key beyond the policy's instances (a flood of streams, say) costs
// the region's Redis a write each time.
const askEvery = time.Second

// Waiting reports whether some slot has no place yet and the key may ask
// the store again at now.
func (k *Key[K]) Waiting(now time.Time) bool {
	return int64(len(k.Slots)) > k.Places && !now.Before(k.askedAt.Add(askEvery))
}

// countPlaced counts the slots holding a place.
func (k *Key[K]) countPlaced() int64 {
	var n int64
	for _, s := range k.Slots {
		if s.Placed {
			n++
		}
	}
	return n
}

// placedWant is the plan's wants of the slots that hold a place: only
// they are assigned.
func (k *Key[K]) placedWant() map[K]int64 {
	if k.placed == int64(len(k.Slots)) {
		return k.Want
	}
	out := make(map[K]int64, len(k.Want))
	for id, w := range k.Want {
		if s := k.Slots[id]; s != nil && s.Placed {
			out[id] = w
		}
	}
	return out
}
