package coordinator

import (
	"context"
	"errors"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Compaction: every ledger mark, policy and region write leaves a
// revision in etcd's history, which etcd keeps until it is compacted; a
// deployment left running would walk toward etcd's backend quota and its
// NOSPACE alarm, after which nothing is stored. The leader compacts it:
// every CompactionInterval it compacts the history up to the revision it
// read one interval earlier, so etcd keeps between one and two intervals
// of it. Nothing of quota-lease reads an old revision (no watch resumes
// from one). Compacting frees space inside etcd's database for reuse;
// the file itself shrinks only when an operator defragments it
// (docs/runbook.md, "etcd's space").

// compactor remembers the revision to compact up to at the next tick.
type compactor struct {
	next int64
}

// compact reads etcd's current revision and compacts up to the one read
// at the previous call. A revision compacted already (by another
// compactor, or etcd's own) is no failure; the others are logged and
// retried at the next tick.
func (c *Coordinator) compact(ctx context.Context, cp *compactor) {
	ctx, cancel := context.WithTimeout(ctx, c.cfg.EtcdTimeout)
	defer cancel()
	resp, err := c.cli.Get(ctx, c.keys.clusterID(), clientv3.WithCountOnly())
	if err != nil {
		if ctx.Err() == nil {
			c.log.Warn("etcd compaction: could not read etcd's revision; will retry", "error", err)
		}
		return
	}
	if cp.next > 0 {
		_, err := c.cli.Compact(ctx, cp.next)
		switch {
		case err == nil:
			c.compacted.Store(cp.next)
		case errors.Is(err, rpctypes.ErrCompacted):
		default:
			c.log.Warn("etcd compaction failed; will retry", "revision", cp.next, "error", err)
			return
		}
	}
	cp.next = resp.Header.Revision
}

// compactTicker ticks every interval, or never when interval is 0
// (compaction off: an operator compacts etcd another way).
func compactTicker(interval time.Duration) (<-chan time.Time, func()) {
	if interval <= 0 {
		return nil, func() {}
	}
	t := time.NewTicker(interval)
	return t.C, t.Stop
}
