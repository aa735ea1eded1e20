package lease

import (
	"time"
)

// MeterSpan is the length of one demand bucket.
const MeterSpan = 5 * time.Second

// MeterTracks is how many identities a Meter for a policy that may give
// shares of their own to identityShares identities tracks per bucket: at
// least 10,000, and four times the shares, so the identities that hold
// shares (and those that may next) are measured among the long tail.
func MeterTracks(identityShares int) int { return max(10_000, 4*identityShares) }

// Meter estimates the demand a region's share must serve: the cost asked
// by its hottest identity per bucket of MeterSpan (every identity's bucket
// is scaled by the same share, so the hottest one decides what share is
// enough; for a policy with a single identity it is the total), as a rate
// over the last four buckets. Buckets of several seconds keep a sparse
// identity's single request from reading as a high rate. A usage report,
// a cost asked over a span, counts as a flow at its rate (meterflow.go).
// It tracks at most a bounded number of identities per bucket (NewMeter). Time is in milliseconds of any clock
// that does not go back. It is not safe for concurrent use.
type Meter[K comparable] struct {
	buckets [4]int64 // hottest identity's cost per bucket, newest first
	cur     map[K]int64
	prev    map[K]int64  // every identity's cost in the bucket before cur
	bucket  int64        // number (nowMs / span) of buckets[0]
	track   int          // most identities per bucket
	started int64        // ms of the first look: before it nothing was counted
	flows   map[K][]flow // costs reported over a span, counted as time passes (meterflow.go)
}

// NewMeter returns an empty meter that tracks at most track identities per
// bucket (MeterTracks); costs of further identities count in no bucket.
func NewMeter[K comparable](track int) *Meter[K] {
	return &Meter[K]{cur: map[K]int64{}, prev: map[K]int64{}, track: track, flows: map[K][]flow{}}
}

func (m *Meter[K]) roll(nowMs int64) {
	span := MeterSpan.Milliseconds()
	b := nowMs / span
	if m.bucket == 0 {
		m.bucket, m.started = b, nowMs
	}
	for m.bucket < b {
		m.accrue((m.bucket + 1) * span) // the flows' part of the bucket that ends
		copy(m.buckets[1:], m.buckets[:3])
		m.buckets[0] = 0
		m.prev, m.cur = m.cur, m.prev
		clear(m.cur)
		m.bucket++
		if b-m.bucket > 4 {
			m.buckets, m.bucket = [4]int64{}, b
			clear(m.prev)
			clear(m.flows) // flows last at most four buckets: none reaches this one
		}
	}
}

// Age is how long the meter has measured at nowMs: since its first look.
func (m *Meter[K]) Age(nowMs int64) time.Duration {
	m.roll(nowMs)
	return time.Duration(nowMs-m.started) * time.Millisecond
}

// SetTracks changes how many identities m tracks per bucket from now on
// (MeterTracks); identities already tracked stay.
func (m *Meter[K]) SetTracks(n int) { m.track = n }

// Add counts cost (micro-units) asked by identity id over the spanMs ms
// up to nowMs: at nowMs for a check (0), as a flow for a usage report
// (meterflow.go).
func (m *Meter[K]) Add(id K, cost, spanMs, nowMs int64) { m.count(id, cost, spanMs, nowMs, false) }

// AddOwn counts cost asked by id, an identity holding shares of its own,
// as Add does: in its own rate (Rates), not in the region's default
// demand (Rate), which its shares do not serve.
func (m *Meter[K]) AddOwn(id K, cost, spanMs, nowMs int64) { m.count(id, cost, spanMs, nowMs, true) }

// count is Add, and AddOwn when own.
func (m *Meter[K]) count(id K, cost, spanMs, nowMs int64, own bool) {
	m.roll(nowMs)
	if spanMs > 0 {
		m.flow(id, cost, spanMs, nowMs, own)
		return
	}
	m.add(id, cost, own)
}

// add counts cost to id's current bucket, and to the hottest identity's
// unless own, unless the bucket tracks too many identities already.
func (m *Meter[K]) add(id K, cost int64, own bool) {
	c, ok := m.cur[id]
	if !ok && len(m.cur) >= m.track {
		return
	}
	c += cost
	m.cur[id] = c
	if !own {
		m.buckets[0] = max(m.buckets[0], c)
	}
}

// Rate is the hottest identity's cost over the three complete buckets and
// the current partial one, in micro-units per second.
func (m *Meter[K]) Rate(nowMs int64) int64 {
	m.roll(nowMs)
	m.accrue(nowMs)
	span := MeterSpan.Milliseconds()
	frac := float64(nowMs%span) / float64(span)
	sum := m.buckets[0] + m.buckets[1] + m.buckets[2] + m.buckets[3]
	return int64(float64(sum) / ((3 + frac) * MeterSpan.Seconds()))
}

// Rates returns every identity's own rate, in micro-units per second, over
// the last complete bucket and the current partial one, for the
// identities whose rate is at least atLeast or for which want says yes:
// the demand of the identities a region may want shares of their own for.
func (m *Meter[K]) Rates(nowMs, atLeast int64, want func(K) bool) map[K]int64 {
	m.roll(nowMs)
	m.accrue(nowMs)
	span := MeterSpan.Milliseconds()
	// The ms the two buckets cover, or less for a meter younger than
	// that (a restarted agent): a second at least, so a meter's first
	// requests do not read as a burst.
	elapsed := min(span+nowMs%span, max(nowMs-m.started, 1000))
	out := map[K]int64{}
	rate := func(id K) int64 { return (m.prev[id] + m.cur[id]) * 1000 / elapsed }
	for _, set := range []map[K]int64{m.prev, m.cur} {
		for id := range set {
			if r := rate(id); r >= atLeast || want(id) {
				out[id] = r
			}
		}
	}
	return out
}
