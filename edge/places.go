package edge

import "time"

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
// take what is free, first those of the group (Slot.Group, the host an
// instance runs on) holding fewest, in order. The store grants no fewer
// than an agent held unless its entry was lost or a write's answer was
// (Unsynced), and the policy's instances may be lowered: then slots of
// the group holding most lose their places, the last first, and are
// abandoned at the next push (lost), so that their assignments cannot
// outlive the place into their fallback. Then, while a slot waits whose
// group holds two places fewer than another group, that group's last
// placed slot gives its place up to it, abandoned the same way: places are
// shared max-min fairly between groups, so that streams that came first
// from one host, however many, cannot keep the policy's instances from
// every other host's. With refuse (the store granted fewer places than it
// was asked), the slots left without a place are marked refused, and those
// newly so returned. Without it they wait for the answer to a write that
// asks for them.
func (k *Key[K]) place(refuse bool) (refused []K) {
	most := k.Places
	if k.most > 0 {
		most = min(most, k.most)
	}
	if k.placed == int64(len(k.Slots)) && k.placed <= most {
		return nil // every slot placed, within the places: nothing to do (most keys, most rounds)
	}
	defer func() { k.placed = k.countPlaced() }()
	g := groups[K]{k: k, ids: k.sorted(), held: map[string]int64{}, leaving: map[K]bool{}}
	for _, id := range k.lost {
		g.leaving[id] = true
	}
	var placed int64
	for _, id := range g.ids {
		if s := k.Slots[id]; s.Placed {
			placed++
			g.held[s.Group]++
		}
	}
	for ; placed > most; placed-- {
		id, _ := g.richest() // some slot holds a place
		g.give(id)
	}
	for ; placed < most; placed++ {
		id, ok := g.poorest()
		if !ok {
			break
		}
		g.take(id)
	}
	for {
		poor, ok1 := g.poorest()
		rich, ok2 := g.richest()
		if !ok1 || !ok2 || g.held[k.Slots[rich].Group]-g.held[k.Slots[poor].Group] < 2 {
			break
		}
		g.give(rich)
		g.take(poor)
	}
	for _, id := range g.ids {
		if s := k.Slots[id]; refuse && !s.Placed && !s.Refused && !g.leaving[id] {
			s.Refused = true
			refused = append(refused, id)
		}
	}
	return refused
}

// groups is a key's slots, in order, as place shares the places between
// their groups: the places each group holds, and the slots giving theirs
// up (lost).
type groups[K comparable] struct {
	k       *Key[K]
	ids     []K
	held    map[string]int64
	leaving map[K]bool
}

// poorest is the first waiting slot (no place, not leaving) of the group
// holding fewest places; ok is false when none waits.
func (g groups[K]) poorest() (id K, ok bool) {
	var best *Slot
	for _, i := range g.ids {
		if s := g.k.Slots[i]; !s.Placed && !g.leaving[i] && (best == nil || g.held[s.Group] < g.held[best.Group]) {
			id, best = i, s
		}
	}
	return id, best != nil
}

// richest is the last placed slot of the group holding most places; ok is
// false when none holds one.
func (g groups[K]) richest() (id K, ok bool) {
	var best *Slot
	for _, i := range g.ids {
		if s := g.k.Slots[i]; s.Placed && (best == nil || g.held[s.Group] >= g.held[best.Group]) {
			id, best = i, s
		}
	}
	return id, best != nil
}

// take places slot id.
func (g groups[K]) take(id K) {
	s := g.k.Slots[id]
	s.Placed, s.Refused = true, false
	g.held[s.Group]++
}

// give takes slot id's place from it: it is abandoned at the next push.
func (g groups[K]) give(id K) {
	s := g.k.Slots[id]
	s.Placed, s.Refused = false, true
	g.held[s.Group]--
	g.leaving[id] = true
	g.k.lost = append(g.k.lost, id)
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
