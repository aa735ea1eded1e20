package edge

import (
	"cmp"
	"maps"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/quota-lease/quota-lease/policy"
)

// A key planned only when an input changed or its Next came misses
// nothing: on random reports, slots that come and go, capacity, direct
// demand and the other agents' holdings changing, every round it skips is
// one in which a copy of it, planned then, writes nothing the store would
// take (only a growth the store already refused, asked again) and pushes
// nothing. As in the agent, a planned round pushes up to 600 ms after its
// plan (the store's sync comes between) and is next due from its plan
// time.
func TestKeySkipsOnlyIdleRounds(t *testing.T) {
	p := edgePolicy(t)
	cfg := DefaultConfig()
	cfg.Drift, cfg.AbandonAfter = 1e-4, 10*time.Second
	limit := p.Limits().Amount()
	skipped, planned, retries := 0, 0, 0
	for seed := range uint64(40) {
		r := rand.New(rand.NewPCG(seed, 7))
		k := NewKey[int](cmp.Compare[int])
		capacity, direct, others := limit, int64(0), Others{}
		capAt := func(time.Time) int64 { return capacity }
		var due time.Time
		dirty := true
		now := t0
		for step := range 3000 {
			now = now.Add(cfg.Tick)
			if evs := slotEvents(r); len(evs) > 0 {
				for _, ev := range evs {
					ev.apply(k, p, now)
				}
				dirty = true
			}
			switch x := r.IntN(1000); {
			case x < 5:
				capacity, dirty = r.Int64N(limit+1), true
			case x < 10:
				direct, dirty = r.Int64N(limit/2), true
			case x < 15:
				others, dirty = Others{Reserved: r.Int64N(limit / 2), Edge: r.Int64N(limit), Direct: r.Int64N(limit)}, true
			}
			plan, gap := k, time.Duration(0)
			if !dirty && now.Before(due) {
				plan = cloneKey(k) // what planning now would do
			} else {
				gap = time.Duration(r.IntN(600)) * time.Millisecond
			}
			u, write := plan.Plan(now, p, time.Minute, capAt, direct, others, cfg)
			granted := Reserve(u.Want, plan.Written, u.Capacity, others.Reserved)
			retry := write && granted == plan.Written && u.Want > granted && !now.After(plan.rewriteAt(cfg)) &&
				!moved(u.EdgeDemand, plan.SentEdge, u.Capacity) && !moved(u.Direct, plan.SentDirect, u.Capacity) && u.Instances == plan.SentInstances
			if write {
				plan.Synced(now, now.Add(gap), u, Granted{Reserved: granted, Places: Reserve(u.Instances, plan.Places, u.Most, 0)}, cfg)
			}
			sends := plan.Push(now.Add(gap), p, t0.Add(time.Hour), cfg)
			if plan != k {
				skipped++
				if write && !retry || len(sends) > 0 {
					t.Fatalf("seed %d step %d: skipped a round that writes %+v (granted %d, written %d) and pushes %+v", seed, step, u, granted, plan.Written, sends)
				}
				if retry {
					retries++
				}
				continue
			}
			planned++
			due, dirty = k.Next(now, cfg), false
			now = now.Add(gap) // the next round comes after this one's push
		}
	}
	t.Logf("%d rounds planned, %d skipped (%d of them would only ask again for a refused growth)", planned, skipped, retries)
	if skipped < planned {
		t.Fatalf("skipped only %d of %d rounds: the test no longer tells anything", skipped, skipped+planned)
	}
}

// cloneKey is a deep copy of k.
func cloneKey(k *Key[int]) *Key[int] {
	c := *k
	l := *k.Ledger
	l.slots, l.gone = map[int]*slot{}, slices.Clone(k.Ledger.gone)
	c.Ledger = &l
	for id, s := range k.Ledger.slots {
		cs := *s
		cs.held = slices.Clone(s.held)
		c.Ledger.slots[id] = &cs
	}
	c.Slots = map[int]*Slot{}
	for id, s := range k.Slots {
		cs := *s
		c.Slots[id] = &cs
	}
	c.Want = maps.Clone(k.Want)
	return &c
}

// slotEvent is a random change of one slot: added, removed, or a report
// of requests over Envoy's 5 s.
type slotEvent struct {
	id, kind int
	requests uint64
}

func slotEvents(r *rand.Rand) []slotEvent {
	var evs []slotEvent
	for id := range 4 {
		switch x := r.IntN(1000); {
		case x < 3:
			evs = append(evs, slotEvent{id: id, kind: 0})
		case x < 5:
			evs = append(evs, slotEvent{id: id, kind: 1})
		case x < 40:
			evs = append(evs, slotEvent{id: id, kind: 2, requests: uint64(r.IntN(1000))})
		}
	}
	return evs
}

func (ev slotEvent) apply(k *Key[int], p *policy.Policy, now time.Time) {
	s := k.Slots[ev.id]
	switch {
	case ev.kind == 0 && s == nil:
		k.Add(ev.id, now)
	case ev.kind == 1 && s != nil:
		k.Remove(ev.id)
	case ev.kind == 2 && s != nil:
		s.Report(p, ev.requests, 5*time.Second, now)
	}
}
