package coordinator

import (
	"sync/atomic"
	"time"
)

// leaderLease tracks until when this replica surely still holds its etcd
// session, and so its leadership: from the send time of the last
// successful keepalive, the session TTL less twice the drift and a margin.
// etcd cannot expire the session, and no successor can be elected, before
// that moment, so grants made before it cannot overlap a successor's.
//
// Both ends are monotonic readings (clock.Clock's Mono): a wall clock
// stepped backwards must not let an old leader keep granting past its
// session, nor one stepped forwards stop a live leader.
type leaderLease struct {
	until atomic.Int64 // a Mono reading, in nanoseconds
}

func (l *leaderLease) valid(mono time.Duration) bool { return int64(mono) < l.until.Load() }

func (l *leaderLease) extend(sentAt time.Duration, ttl time.Duration, drift float64, margin time.Duration) {
	v := int64(sentAt + ttl - time.Duration(2*drift*float64(ttl)) - margin)
	for {
		old := l.until.Load()
		if v <= old || l.until.CompareAndSwap(old, v) {
			return
		}
	}
}
