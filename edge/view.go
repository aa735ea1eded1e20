package edge

import (
	"math"
	"time"

	"github.com/quota-lease/quota-lease/lease"
)

// View is the region's edge reservations as an agent last read them from
// the store (its own included): per policy and identity, what every agent
// reserved for its Envoy instances. Direct checks leave that to the edge
// (Reserved); a renewal keeps presenting the grant that covered it
// (Holds).
type View struct {
	ReadAt   time.Time
	ByPolicy map[string]map[string]int64
}

// NewView is an empty view read at readAt.
func NewView(readAt time.Time) *View {
	return &View{ReadAt: readAt, ByPolicy: map[string]map[string]int64{}}
}

// ReadAgain is v read again at readAt and found unchanged.
func (v *View) ReadAgain(readAt time.Time) *View { return &View{ReadAt: readAt, ByPolicy: v.ByPolicy} }

// Add counts r reserved for identity of policy name.
func (v *View) Add(name, identity string, r int64) {
	if r <= 0 {
		return
	}
	m := v.ByPolicy[name]
	if m == nil {
		m = map[string]int64{}
		v.ByPolicy[name] = m
	}
	m[identity] += r
}

// Reserved is what direct checks of identity of policy name must leave
// the edge at now: every agent's reservation for it, or everything when
// the view is older than trust (Config.Trust), or there is none.
func (v *View) Reserved(name, identity string, now time.Time, trust time.Duration) int64 {
	if v == nil || now.After(v.ReadAt.Add(trust)) {
		return math.MaxInt64
	}
	return v.ByPolicy[name][identity]
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
	ids := v.ByPolicy[name]
	if now.After(v.ReadAt.Add(trust)) {
		return len(ids) > 0 // unknown now: keep what covered them
	}
	for id, r := range ids {
		if r > g.AmountFor(id) {
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
