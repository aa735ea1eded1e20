package coordinator

import (
	"time"
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

// compactTicker ticks every interval, or never when interval is 0
// (compaction off: an operator compacts etcd another way).
func compactTicker(interval time.Duration) (<-chan time.Time, func()) {
	if interval <= 0 {
		return nil, func() {}
	}
	t := time.NewTicker(interval)
	return t.C, t.Stop
}
