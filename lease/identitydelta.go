package lease

import (
	"cmp"
	"maps"
	"slices"
)

// Identity shares and identity demands travel as changes, not whole sets
// (docs/identity-shares.md, "On the wire"): a quota with 100,000 identity
// shares changes a few of them per renewal, and a renewal's size and cost
// should follow those few.

// DiffIdentities returns what turns the identity shares base into next:
// the identities next gives another amount than base, or that base does
// not name (set), and those base names and next does not (unset, sorted),
// which go back to the default share.
func DiffIdentities(base, next map[string]int64) (set map[string]int64, unset []string) {
	for id, a := range next {
		if b, ok := base[id]; !ok || b != a {
			if set == nil {
				set = map[string]int64{}
			}
			set[id] = a
		}
	}
	for id := range base {
		if _, ok := next[id]; !ok {
			unset = append(unset, id)
		}
	}
	slices.Sort(unset)
	return set, unset
}

// ApplyIdentities returns base changed by set and unset (DiffIdentities):
// a new map, or nil when no identity is left; base is not changed.
func ApplyIdentities(base, set map[string]int64, unset []string) map[string]int64 {
	if len(set) == 0 && len(unset) == 0 {
		return base
	}
	out := maps.Clone(base)
	if out == nil {
		out = make(map[string]int64, len(set))
	}
	for _, id := range unset {
		delete(out, id)
	}
	for id, a := range set {
		out[id] = a
	}
	if len(out) == 0 {
		return nil
	}
	return out
}

// MaxDemandChanges bounds the identity demands one renewal of one quota
// carries (DemandReport.Changes); more wait for the next renewal.
const MaxDemandChanges = 2000

// DemandReport is what one agent instance has told the coordinator of its
// identities' demand for one quota, and the coordinator holds
// (IdentityPlan.Update): each renewal sends only the demands that moved
// since, so a renewal's size follows what changes, not how many
// identities are hot. The zero value has reported nothing. It is not safe
// for concurrent use.
type DemandReport struct {
	held map[string]int64 // what the coordinator holds for this instance
}

// Changes returns at most n demands of now (lease.IdentityDemands) that
// the coordinator should be told, as absolute values capped at total, 0
// for an identity whose demand is gone: those it does not hold, and those that moved by
// more than 1% of total (the plan's damping, IdentityPlan.Plan, ignores
// less), the largest moves first. Sending the same changes twice is
// harmless, so an unanswered renewal just sends them again.
func (r *DemandReport) Changes(now map[string]int64, total int64, n int) map[string]int64 {
	type change struct {
		id        string
		to, delta int64
	}
	var all []change
	step := total / identityHysteresis
	for id, d := range now {
		d = min(d, total) // the coordinator caps a demand at the total: more says nothing
		old, ok := r.held[id]
		delta := abs64(d - old)
		if !ok && d > 0 || delta > step {
			if !ok {
				delta += step // new to the coordinator: ahead of a move of the same size
			}
			all = append(all, change{id, d, delta})
		}
	}
	for id, old := range r.held {
		if _, ok := now[id]; !ok {
			all = append(all, change{id, 0, old + step})
		}
	}
	if len(all) > n {
		slices.SortFunc(all, func(a, b change) int { return cmp.Or(cmp.Compare(b.delta, a.delta), cmp.Compare(a.id, b.id)) })
		all = all[:n]
	}
	out := make(map[string]int64, len(all))
	for _, c := range all {
		out[c.id] = c.to
	}
	return out
}

// Answered records the coordinator's answer to a renewal that carried
// changes: it took them, starting afresh from them when known is false
// (IdentityPlan.Update).
func (r *DemandReport) Answered(changes map[string]int64, known bool) {
	if !known {
		r.held = nil
	}
	for id, d := range changes {
		if d <= 0 {
			delete(r.held, id)
			continue
		}
		if r.held == nil {
			r.held = map[string]int64{}
		}
		r.held[id] = d
	}
}

// Len is how many identity demands the coordinator holds.
func (r *DemandReport) Len() int { return len(r.held) }
