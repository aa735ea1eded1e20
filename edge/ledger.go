package edge

import (
	"time"

	"github.com/quota-lease/quota-lease/scale"
)

// Ledger is what one agent sent the Envoy instances reporting one policy
// identity (its slots: a bucket on a stream), and so what they may still
// be enforcing: the lease protocol's book, one level down. It carries the
// two phases:
//
//   - a larger share is pushed only when the reservation every agent of the
//     region sees for the edge (visible) covers every share that may still
//     be enforced with it (Plan);
//   - a smaller share is pushed at once, but the larger one keeps counting
//     until it may have expired (Committed, Need): Envoy acknowledges
//     nothing, so only time proves it stopped.
//
// It also paces changes: a slot's assignment changes at most once per
// `every` (a changed token bucket may start full). Not safe for
// concurrent use.
type Ledger[K comparable] struct {
	slots map[K]*slot
	gone  []held // shares of removed slots that may still be enforced
	// ended is the latest end of a share no longer counted (pruned), so
	// that Key.Next sees a share that stopped counting after a round
	// planned, during its push.
	ended time.Time
	// pool is the instances of the process this agent succeeded
	// (inherit.go); largest the most one slot may be sent: what the
	// region's store last recorded (Confirm), for a successor's pool.
	pool    pool
	largest int64
}

// held is a share sent that may be enforced until end (inherited: a
// predecessor's, Adopt).
type held struct {
	share     int64
	end       time.Time
	inherited bool
}

type slot struct {
	cur int64 // the share last sent
	// from: before it, Envoy surely still holds cur (its earliest expiry);
	// end: after it, surely no longer (its Lifetime).
	from, end time.Time
	started   time.Time // when the slot's assignment last changed (or started again after expiring)
	held      []held    // every share sent that may still be enforced
	ended     time.Time // the latest end of a share pruned from held
	adopted   bool      // taken for one of a predecessor's instances (Adopt)
}

// NewLedger returns an empty ledger.
func NewLedger[K comparable]() *Ledger[K] { return &Ledger[K]{slots: map[K]*slot{}} }

// Pushed records share sent to slot k at now: Envoy holds it at least
// until from (the time to live on a fast clock from the send) and at most
// until end (its Lifetime).
func (l *Ledger[K]) Pushed(k K, share int64, now, from, end time.Time) {
	s := l.slots[k]
	if s == nil {
		s = &slot{}
		l.slots[k] = s
	}
	if s.started.IsZero() || share != s.cur || !now.Before(s.from) {
		s.started = now // a change, or a bucket that may have expired: it may start full
	}
	s.cur, s.from, s.end = share, from, end
	for i := range s.held {
		if s.held[i].share == share && !s.held[i].inherited {
			s.held[i].end = later(s.held[i].end, end)
			return
		}
	}
	s.held = append(s.held, held{share: share, end: end})
}

// Remove forgets slot k (its stream ended or its bucket was abandoned).
// What it was sent keeps counting until it expires.
func (l *Ledger[K]) Remove(k K) {
	if s := l.slots[k]; s != nil {
		l.gone = append(l.gone, s.held...)
		delete(l.slots, k)
	}
}

// Current returns slot k's share and whether Envoy surely still holds it.
func (l *Ledger[K]) Current(k K, now time.Time) (int64, bool) {
	s := l.slots[k]
	if s == nil {
		return 0, false
	}
	return s.cur, now.Before(s.from)
}

// Due reports whether slot k holds an assignment to refresh: sent, and
// surely held for less than lead from now.
func (l *Ledger[K]) Due(k K, now time.Time, lead time.Duration) bool {
	s := l.slots[k]
	return s != nil && !s.from.IsZero() && !now.Add(lead).Before(s.from)
}

// Slots is how many slots the ledger tracks.
func (l *Ledger[K]) Slots() int { return len(l.slots) }

// Empty reports whether nothing sent may still be enforced and no slot is
// tracked: the ledger can be dropped.
func (l *Ledger[K]) Empty(now time.Time) bool {
	return len(l.slots) == 0 && l.Committed(now) == 0
}

// live is the largest share s may still be enforcing at now.
func (s *slot) live(now time.Time) int64 { return s.largest(now, true) }

// own is the largest share s may still be enforcing at now from what this
// agent sent.
func (s *slot) own(now time.Time) int64 { return s.largest(now, false) }

// largest is the largest share s may still be enforcing at now, a
// predecessor's (Adopt) counted or not.
func (s *slot) largest(now time.Time, inherited bool) int64 {
	s.held = prune(s.held, now, &s.ended)
	var m int64
	for _, h := range s.held {
		if inherited || !h.inherited {
			m = max(m, h.share)
		}
	}
	return m
}

// Committed is the most the sent assignments may be enforcing at now: per
// slot the largest share it may still hold, plus what removed slots may.
func (l *Ledger[K]) Committed(now time.Time) int64 {
	var sum int64
	for _, s := range l.slots {
		sum += s.live(now)
	}
	l.gone = prune(l.gone, now, &l.ended)
	for _, h := range l.gone {
		sum += h.share
	}
	return sum + l.pooled(now)
}

// Largest is the most one instance may be enforcing at now, or be sent
// toward want: what the store records for a successor (Update.Largest).
func (l *Ledger[K]) Largest(now time.Time, want map[K]int64) int64 {
	var m int64
	for k, s := range l.slots {
		m = max(m, s.live(now), want[k])
	}
	for _, h := range l.gone {
		m = max(m, h.share)
	}
	if l.pooled(now) > 0 {
		m = max(m, l.pool.largest)
	}
	return m
}

// End is when nothing sent (nor a predecessor's pool) may be enforced any
// more, as of now: the zero time when nothing may be now.
func (l *Ledger[K]) End(now time.Time) time.Time {
	var end time.Time
	for _, s := range l.slots {
		s.held = prune(s.held, now, &s.ended)
		for _, h := range s.held {
			end = later(end, h.end)
		}
	}
	l.gone = prune(l.gone, now, &l.ended)
	for _, h := range l.gone {
		end = later(end, h.end)
	}
	if l.pooled(now) > 0 {
		end = later(end, l.pool.end)
	}
	return end
}

// Confirm records that the store holds largest as this agent's Largest:
// Plan grows no slot past it. None (0) tells a successor nothing, and caps
// nothing.
func (l *Ledger[K]) Confirm(largest int64) { l.largest = largest }

// Need is the reservation that lets every slot have want (a slot missing
// from want keeps what it has): per slot the larger of what it may still
// be enforcing and what it wants, plus what removed slots may enforce.
func (l *Ledger[K]) Need(now time.Time, want map[K]int64) int64 {
	sum := l.Committed(now)
	for k, w := range want {
		var live int64
		if s := l.slots[k]; s != nil {
			live = s.live(now)
		}
		sum += max(0, w-live)
	}
	return sum
}

// Plan returns the new shares to send at now, by slot, toward want, with
// visible the reservation every agent of the region may be counting for
// this agent's slots. A slot whose assignment changed less than every ago
// keeps it. A smaller share is sent at once. A larger one only as far as
// visible covers it with everything that may still be enforced: growth is
// scaled down in proportion when it does not all fit, and never past the
// largest share the store records (Confirm). Unchanged shares are not
// listed (Due says which to refresh).
func (l *Ledger[K]) Plan(now time.Time, want map[K]int64, visible int64, every time.Duration) map[K]int64 {
	out := map[K]int64{}
	type grow struct {
		k          K
		cur        int64
		active     bool
		live, want int64
	}
	var grows []grow
	var extra int64
	// A predecessor's instances (inherit.go) may count for more than was
	// reserved (uneven shares; a micro-unit a slot of rounding): an
	// adopted slot's largest share is then no room of its own.
	committed := l.Committed(now)
	over := committed > visible+int64(len(l.slots))
	for k, w := range want {
		w = max(0, w)
		s := l.slots[k]
		var cur, live int64
		active := false
		if s != nil {
			active = now.Before(s.from)
			if active {
				cur = s.cur
			}
			if active && w == cur || now.Sub(s.started) < every {
				continue
			}
			live = s.live(now)
			if over {
				live = s.own(now)
			}
		}
		switch {
		case active && w < cur, w <= live:
			out[k] = w // counted already: what it may still enforce is at least w
		default:
			grows = append(grows, grow{k, cur, active, live, w})
			extra += w - live
		}
	}
	room := max(0, visible-committed)
	if extra <= 0 {
		return out
	}
	for _, g := range grows {
		add := g.want - g.live
		if extra > room {
			add = scale.Down(add, room, extra) // rounded down: the growth sums to at most room
		}
		n := g.live + add // what it may enforce already (an adopted slot's: inherit.go), and its growth
		if n == 0 && room == 0 {
			continue // nothing counted for it, and no room
		}
		if l.largest > 0 {
			n = min(n, max(g.live, l.largest)) // what a successor would count
		}
		if n > g.cur || !g.active {
			out[g.k] = n
		}
	}
	return out
}

// prune drops the shares of hs that no longer count at now, noting the
// latest end of those in ended.
func prune(hs []held, now time.Time, ended *time.Time) []held {
	keep := hs[:0]
	for _, h := range hs {
		if now.Before(h.end) {
			keep = append(keep, h)
		} else {
			*ended = later(*ended, h.end)
		}
	}
	return keep
}

func later(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

func earlier(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}
