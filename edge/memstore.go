package edge

import (
	"context"
	"time"
)

// MemStore is a region's store of edge reservations held in memory, kept
// as regional's script keeps them in the region's Redis
// (regional.TestEdgeStoreAsMemStore compares the two): per policy identity, per
// agent process, what it reserved, its instance places, its demands, the
// largest share one of its instances may enforce, and until when (on the
// store's clock): its own expiry, and the end of the agent's life it was
// written in (Store). An agent process's first write of an identity takes
// over the entry of the process it succeeded (inherit.go). The simulator's
// regions keep their reservations in one. Not safe for concurrent use.
type MemStore struct {
	nowMs func() int64 // the store's clock, ms
	res   map[ID]map[string]entry
	lives map[string]life // per agent process, its last life
}

type entry struct {
	reserved, places, edgeDemand, direct int64
	expiresMs, largest                   int64
	life                                 int64 // the start of the agent's life it was written in; 0: none
}

// life is one life of an agent process in the store: from start until.
type life struct{ until, start int64 }

// ends is when en, of agent process who, stops counting: its expiry, or
// the end of the life it was written in if sooner (a life not the agent's
// last is over).
func (m *MemStore) ends(who string, en entry) int64 {
	if en.life == 0 {
		return en.expiresMs
	}
	if l := m.lives[who]; l.start == en.life {
		return min(en.expiresMs, l.until)
	}
	return 0
}

// keepAlive makes who's life last at least until until, at nowMs,
// starting another if its last one ended.
func (m *MemStore) keepAlive(who string, until, nowMs int64) {
	l := m.lives[who]
	if l.until <= nowMs {
		l = life{nowMs, nowMs}
	}
	l.until = max(l.until, until)
	m.lives[who] = l
}

// NewMemStore returns an empty store on the clock nowMs (milliseconds).
func NewMemStore(nowMs func() int64) *MemStore {
	return &MemStore{nowMs: nowMs, res: map[ID]map[string]entry{}, lives: map[string]life{}}
}

// Holding is one agent process's entry for one policy identity: its
// reservation, its instance places, and the largest share one of its
// instances may enforce.
type Holding struct{ Reserved, Places, Largest int64 }

// Holdings are the store's entries, by identity and agent process,
// expired ones included until a sync drops them.
func (m *MemStore) Holdings() map[ID]map[string]Holding {
	out := make(map[ID]map[string]Holding, len(m.res))
	for id, es := range m.res {
		out[id] = make(map[string]Holding, len(es))
		for who, en := range es {
			out[id][who] = Holding{en.reserved, en.places, en.largest}
		}
	}
	return out
}

// Clear forgets every entry and life, as a store that lost its data.
func (m *MemStore) Clear() { clear(m.res); clear(m.lives) }

// Agent is the store as agent process id, which succeeded heir ("": none),
// syncs with it.
func (m *MemStore) Agent(id, heir string) Store { return memAgent{m, id, heir} }

type memAgent struct {
	m        *MemStore
	id, heir string
}

// Sync keeps the agent alive for alive more, applies the writes (Reserve,
// for the reservation and the instance places) and returns what it
// granted each and, when read, what the other live agents hold, per
// identity.
func (a memAgent) Sync(_ context.Context, writes []Write, read bool, alive time.Duration) (SyncAnswer, error) {
	nowMs := a.m.nowMs()
	var lifeStart int64
	if alive.Milliseconds() > 0 { // in whole ms, as regional sends it
		a.m.keepAlive(a.id, nowMs+alive.Milliseconds(), nowMs)
		lifeStart = a.m.lives[a.id].start
	}
	granted := make([]Granted, len(writes))
	for i, w := range writes {
		granted[i] = a.write(w.ID, w.Update, nowMs, lifeStart)
	}
	others := map[ID]Others{}
	for id, es := range a.m.res {
		var o Others
		for who, en := range es {
			if a.m.ends(who, en) <= nowMs {
				delete(es, who)
				continue
			}
			if who != a.id {
				o.Reserved, o.Edge, o.Direct = o.Reserved+en.reserved, o.Edge+en.edgeDemand, o.Direct+en.direct
			}
		}
		if len(es) == 0 {
			delete(a.m.res, id)
		}
		if o != (Others{}) {
			others[id] = o
		}
	}
	for who, l := range a.m.lives {
		if l.until <= nowMs {
			delete(a.m.lives, who) // its entries are over too
		}
	}
	if !read {
		others = nil
	}
	return SyncAnswer{Granted: granted, Others: others, Life: lifeStart}, nil
}

// write applies one update of this agent's entry for id at nowMs, in its
// life lifeStart (0: none).
func (a memAgent) write(id ID, u Update, nowMs, lifeStart int64) Granted {
	var old, others Granted
	var in Inheritance
	keep := map[string]entry{}
	for who, en := range a.m.res[id] {
		ends := a.m.ends(who, en)
		switch {
		case ends <= nowMs:
			continue
		case who == a.id:
			old.Reserved, old.Places = en.reserved, old.Places+en.places
			continue
		case who == a.heir && a.heir != "": // moves to this agent's entry
			in = Inheritance{Reserved: en.reserved, Largest: en.largest, Places: en.places,
				Left: time.Duration(ends-nowMs) * time.Millisecond, Edge: en.edgeDemand, Direct: en.direct}
			old.Places, others.Reserved = old.Places+en.places, others.Reserved+en.reserved
			continue
		}
		others.Reserved, others.Places = others.Reserved+en.reserved, others.Places+en.places
		keep[who] = en
	}
	g := Granted{Reserved: Reserve(u.Want, old.Reserved, u.Capacity, others.Reserved) + in.Reserved,
		Places: Reserve(u.Instances, old.Places, u.Most, others.Places), Inherited: in}
	if g.Reserved > 0 || g.Places > 0 || u.EdgeDemand > 0 || u.Direct > 0 {
		life := max(1, u.Life.Milliseconds(), in.Left.Milliseconds())
		keep[a.id] = entry{g.Reserved, g.Places, u.EdgeDemand, u.Direct, nowMs + life, max(u.Largest, in.Largest), lifeStart}
		if lifeStart != 0 {
			// What moved counts until the assignments under it may have
			// expired, whenever this agent's life would end.
			a.m.keepAlive(a.id, nowMs+in.Left.Milliseconds(), nowMs)
		}
	}
	a.m.res[id] = keep
	return g
}
