package edge

import "time"

// Direct checks' part of the region's demand: what each agent's direct
// checks of an identity the edge serves asked, measured every second with
// the reads and averaged over a few seconds, written with the agent's
// reservation so that every agent splits the capacity by it (Key.Plan's
// direct and Others.Direct).

// ObserveDirect counts cost (micro-units) a direct check asked of
// identity of policy name, if the edge serves the policy. Safe for
// concurrent use.
func (r *Round[S]) ObserveDirect(name, identity string, cost int64) {
	if !r.Serves(name) {
		return
	}
	r.directMu.Lock()
	r.direct[ID{name, identity}] += cost
	r.directMu.Unlock()
}

// measureDirect turns the direct checks' cost since the last measure into
// every key's direct demand, and notes the policy identities only other
// agents serve at the edge that this one checks directly. Each identity's
// rate is averaged over a few seconds as a slot's reports are (averaged):
// a second of a few requests a second counts half or twice its rate by
// chance, and every dip would move the edge's shares up, reserved until
// they expire, and leave the direct checks less than their part.
func (r *Round[S]) measureDirect(now, since time.Time) {
	r.directMu.Lock()
	counts := r.direct
	r.direct = map[ID]int64{}
	r.directMu.Unlock()
	rates, demand := map[ID]float64{}, map[ID]int64{}
	measure := func(id ID, cost int64) {
		p := r.leases.Policy(id.Policy)
		if p == nil {
			return
		}
		last, ok := r.directRate[id]
		if !ok {
			last = -1 // unknown
		}
		if rate := averaged(last, DirectCount(p, cost), now.Sub(since)); rate >= minDirectRate {
			rates[id], demand[id] = rate, DemandAmount(p, rate)
		}
	}
	for id, cost := range counts {
		measure(id, cost)
	}
	for id := range r.directRate {
		if _, ok := counts[id]; !ok {
			measure(id, 0) // no check since
		}
	}
	r.directRate = rates
	for id, k := range r.keys {
		if d := demand[id]; d != k.direct {
			k.direct, k.dirty = d, true
		}
	}
	for id := range r.directOnly {
		r.directOnly[id] = 0
	}
	for id, d := range demand {
		if _, served := r.regionKeys[id]; served && r.keys[id] == nil {
			r.directOnly[id] = d
		}
	}
}

// minDirectRate is the least direct rate, requests a second, an identity's
// checks are measured at: below it, they asked nothing.
const minDirectRate = 0.01

// directOnlyWrites are the writes of the direct demands of identities
// only other agents serve at the edge, when measured this round; an
// identity this agent serves now, or no longer checks, is forgotten.
func (r *Round[S]) directOnlyWrites(measured bool) []Write {
	var writes []Write
	for id, d := range r.directOnly {
		if r.keys[id] != nil {
			delete(r.directOnly, id)
			continue
		}
		if measured {
			writes = append(writes, Write{ID: id, Update: Update{Direct: d, Life: r.cfg.KeepFor(5 * time.Second)}})
			if d == 0 {
				delete(r.directOnly, id)
			}
		}
	}
	return writes
}
