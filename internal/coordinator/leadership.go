package coordinator

import (
	"context"
	"sync/atomic"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
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

// keepAlive renews the session lease every ttl/3 (each renewal within the
// etcd timeout) and extends l after each success, until ctx ends. Its
// failures are the replica's first sign of an etcd outage, recorded and
// logged by etcdCall. etcd's own keepalive (started by the session)
// runs too; this one exists to know the send times.
func (c *Coordinator) keepAlive(ctx context.Context, id clientv3.LeaseID, l *leaderLease) {
	t := time.NewTicker(c.cfg.SessionTTL / 3)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		sent := c.cfg.Clock.Mono()
		err := c.etcdCall(ctx, "renew the leadership session", func(ctx context.Context) error {
			_, err := c.cli.KeepAliveOnce(ctx, id)
			return err
		})
		if err != nil {
			continue // an etcd failure is logged, paced, by etcdCall
		}
		l.extend(sent, c.cfg.SessionTTL, c.cfg.Timing.Drift, c.cfg.Timing.Margin)
	}
}
