package edge

import "time"

// Next is the earliest time, not before now, at which another round of the
// key could write or push something a round at now did not: a share that
// stops being surely held, wants refreshing or may change again, a share
// sent that stops counting, a larger reservation that becomes visible, the
// reservation entry that wants rewriting, a slot to abandon; and the next
// round, after one that changed or abandoned an assignment. Until then a
// round whose inputs are unchanged (the slots and their reports, the
// policy, the capacity and time to live the region's grant gives, the
// other agents' holdings, the direct demand) plans, writes and pushes
// nothing new, so an agent serving many identities plans only those whose
// inputs changed or whose Next came. Call it after the round's Push, with
// now the time the round planned (a push may come a little later). The
// zero time means never.
func (k *Key[K]) Next(now time.Time, cfg Config) time.Time {
	n := next{now: now}
	k.Ledger.next(&n, cfg.RefreshLead(k.TTL), cfg.ChangeEvery)
	n.add(k.growAt(cfg)) // zero when none waits: never before now
	if !k.Covered.IsZero() {
		n.add(k.rewriteAt(cfg))
	}
	for _, s := range k.Slots {
		n.add(s.Busy.Add(cfg.AbandonAfter))
		n.add(s.Changed.Add(cfg.ChangeEvery))
	}
	if !k.changed.Before(now) {
		// A round that changed or abandoned an assignment: the slots that
		// may change, and the room their growth shares, are not what they
		// were, so the next round may change another (Ledger.Plan).
		n.add(now)
	}
	return n.at
}

// next is the earliest of the times added that are not before now.
type next struct{ now, at time.Time }

func (n *next) add(t time.Time) {
	if !t.Before(n.now) && (n.at.IsZero() || t.Before(n.at)) {
		n.at = t
	}
}

// next adds the times at which the ledger's answers change: each slot's
// share stops being surely held (from), wants refreshing (lead before
// that) or may change again (every after it started), and each share sent
// stops counting (or stopped since now: pruned during the push).
func (l *Ledger[K]) next(n *next, lead, every time.Duration) {
	for _, s := range l.slots {
		n.add(s.from)
		n.add(s.from.Add(-lead))
		n.add(s.started.Add(every))
		n.add(s.ended)
		for _, h := range s.held {
			n.add(h.end)
		}
	}
	n.add(l.ended)
	for _, h := range l.gone {
		n.add(h.end)
	}
}
