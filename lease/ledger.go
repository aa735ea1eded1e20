package lease

import (
	"sort"
	"time"
)

// LedgerMark is one region's durable record for a quota: the most it may
// be enforcing (its high-water mark), with the process and grant it was
// written for. A new leader restores every mark (Book.Restore), so it never
// books a region for less than the region may still be enforcing.
type LedgerMark struct {
	Region, Instance, Nonce, GrantID string
	Amount                           int64
	// Total is the largest total the region's grants were issued under
	// (Grant.Total), for its degraded budget.
	Total int64
}

// LedgerDelta is a change the durable ledger must take, in one atomic
// write, before the book change that produced it takes effect: marks
// raised, marks lowered and regions deleted. The coordinator turns it into
// etcd operations, the simulator applies it to a map; both then call
// Book.Written, so both run the same step. A writer that must split a
// delta writes Lower and Delete before Raise: should it die in between,
// the ledger holds lowered marks (still at least what each region may
// enforce) and no raise for a grant never answered.
type LedgerDelta struct {
	Raise  []LedgerMark
	Lower  []LedgerMark
	Delete []string
}

// Empty reports whether d changes nothing.
func (d LedgerDelta) Empty() bool {
	return len(d.Raise) == 0 && len(d.Lower) == 0 && len(d.Delete) == 0
}

// Ledger is what the ledger must take before p is committed: nothing while
// the region's mark does not rise; else the raised mark and, in the same
// write, the marks of the other regions that shrank, so that the marks sum
// to at most the quota at every committed state and a successor restoring
// them all at once books no more than the total.
func (p *Pending) Ledger() LedgerDelta { return p.ledger }

// Flush is the ledger's periodic catch-up: it drops what can no longer
// count (Prune) and returns the deletions and the lowered marks of regions
// enforcing less than their mark.
func (b *Book) Flush(now time.Time) LedgerDelta {
	var d LedgerDelta
	d.Delete = b.Prune(now) // before the lowerings: one change per key
	d.Lower = b.lowered(now, "")
	return d
}

// Written records that the ledger took d: the lowered marks are now what
// it holds. (A raised mark is part of the pending renewal, which Commit
// installs.)
func (b *Book) Written(d LedgerDelta) {
	for _, m := range d.Lower {
		b.MarkPersisted(m.Region, m.Amount)
	}
}

// lowered returns a mark for every region but except whose enforcing
// amount fell below its mark, in region order.
func (b *Book) lowered(now time.Time, except string) []LedgerMark {
	var out []LedgerMark
	for region, amount := range b.Shrunk(now) {
		if region == except {
			continue
		}
		g, inst, nonce, _ := b.Current(region)
		out = append(out, LedgerMark{
			Region:   region,
			Instance: inst,
			Nonce:    nonce,
			GrantID:  g.ID,
			Amount:   amount,
			Total:    grantsTotal(b.regions[region]),
		})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Region < out[j].Region })
	return out
}
