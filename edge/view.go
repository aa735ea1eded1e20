package edge

import (
	"math"
	"time"

	"github.com/quota-lease/quota-lease/lease"
)

// View is the region's edge reservations as an agent last read them from
// the store, its own as it wrote them: per policy identity, what every
// agent reserved for its Envoy instances. Direct checks leave that to the
// edge (Reserved); a renewal keeps presenting the grant that covered it
// (Holds). A view is not changed once made: the direct path reads it
// while the rounds make the next.
type View struct {
	ReadAt time.Time
	others map[ID]Others // the other agents' holdings
	own    ownedView     // this agent's reservations
}

// ReadAgain is v read again at readAt and found unchanged.
func (v *View) ReadAgain(readAt time.Time) *View {
	return &View{ReadAt: readAt, others: v.others, own: v.own}
}

// reserved is every agent's reservation for id.
func (v *View) reserved(id ID) int64 { return max(0, v.own.get(id)) + max(0, v.others[id].Reserved) }

// Reserved is what direct checks of identity of policy name must leave
// the edge at now: every agent's reservation for it, or everything when
// the view is older than trust (Config.Trust), or there is none.
func (v *View) Reserved(name, identity string, now time.Time, trust time.Duration) int64 {
	if !v.Fresh(now, trust) {
		return math.MaxInt64
	}
	return v.reserved(ID{name, identity})
}

// Fresh reports whether v may be relied on at now: read no longer than
// trust (Config.Trust) ago.
func (v *View) Fresh(now time.Time, trust time.Duration) bool {
	return v != nil && !now.After(v.ReadAt.Add(trust))
}

// Holds reports whether acknowledging g, a grant of policy name, would let
// the coordinator count less for the region than the edge may still be
// enforcing for some identity: the agent then keeps presenting the grant
// it acknowledged before (the lease protocol's two-phase shrink, one level
// down).
func (v *View) Holds(name string, g lease.Grant, now time.Time, trust time.Duration) bool {
	if v == nil {
		return false // never synced: nothing was assigned
	}
	stale := now.After(v.ReadAt.Add(trust))
	over := func(id ID) bool {
		r := v.reserved(id)
		return id.Policy == name && r > 0 && (stale || r > g.AmountFor(id.Identity)) // stale: keep what covered them
	}
	if v.own.ids(over) {
		return true
	}
	for id := range v.others {
		if over(id) {
			return true
		}
	}
	return false
}

// DirectShare is what direct checks of an identity may enforce of amount,
// the region's capacity for it, when the edge holds reserved of it.
func DirectShare(amount, reserved int64) int64 {
	if amount <= 0 {
		return amount
	}
	return max(0, amount-reserved)
}

// Reserve is what the region's store grants an agent that holds old and
// wants want of one policy identity's capacity, or of its instance places
// (capacity the policy's instances), when the other agents hold others: a
// smaller want whole; growth never past the capacity, counting the
// others. regional/lua/edge_sync.lua applies it in Redis; this is
// its twin for the simulator's model of Redis.
func Reserve(want, old, capacity, others int64) int64 {
	r := want
	if want > old {
		r = max(old, min(want, capacity-others))
	}
	return max(0, r)
}
