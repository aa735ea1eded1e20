package edge

import (
	"context"
	"iter"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/quota-lease/quota-lease/policy"
)

// Round is an agent's edge rounds (docs/rlqs-server.md), the one sequence
// the agent and the simulator both run: per policy identity the Envoy
// instances report (a Served key), plan what of the region's capacity to
// reserve and how to split it (Key.Plan, or Release once nothing is
// served), sync the reservations with the region's store (Store: growth
// granted within the capacity, the other agents' holdings read), then push
// the assignments the reservations every agent can see allow (Key.Push,
// and Key.PushAlong for the instances sent something anyway). Direct
// checks read what the edge holds through View. What a round asks of the
// leases, the store and the instances are the interfaces in roundio.go.
//
// A Round is not safe for concurrent use, except ObserveDirect, Serves,
// Serving and View: its user holds one lock over it and the instances'
// state for every other call, and Run releases it only while the store
// syncs.
type Round[S comparable] struct {
	cfg    Config
	order  func(a, b S) int
	leases Leases
	store  Store
	out    Sender[S]

	keys map[ID]*Served[S]
	// directOnly are policy identities other agents serve at the edge and
	// this one only checks directly: its direct demand, as last written.
	directOnly map[ID]int64
	regionKeys map[ID]Others  // the other agents' holdings, from the last read
	own        owned          // this agent's reservations, as written (Written)
	directAt   time.Time      // when direct demands were last measured
	directRate map[ID]float64 // direct checks' rates, requests a second, as last measured (averaged)
	// readAt is when the last round that read the reservations (and wrote
	// what waited for it) planned: reads come every ReadEvery, even
	// between urgent syncs. planAt is when this round planned.
	readAt, planAt time.Time
	heir           string       // the predecessor whose instances this agent took, as last planned
	visited        []*Served[S] // the keys this round plans and pushes
	nextGrow       time.Time    // when the first pending growth becomes usable
	// keepAlive is how long each sync keeps this agent alive in the store
	// (KeepFor the longest life planned); alive until when the last sync
	// surely did, on this agent's clock, in the store's life life.
	keepAlive time.Duration
	alive     time.Time
	life      int64
	// fps are the fingerprints of the policies last set: a reload that
	// changed nothing plans no key again.
	fps map[*policy.Policy]uint64

	// directMu guards direct: the cost (micro-units) direct checks asked
	// of policy identities the edge serves since they were last measured.
	directMu sync.Mutex
	direct   map[ID]int64

	view       atomic.Pointer[View]            // the region's reservations as last synced, for the direct path
	readWanted atomic.Bool                     // a direct check waits for a read (WantRead)
	quietNow   atomic.Bool                     // the last round was quiet (Quiet)
	readFailed bool                            // the last read failed: the rounds are not quiet
	enabled    atomic.Pointer[map[string]bool] // policies with edge settings
}

// NewRound returns rounds with no key, run with cfg; order sorts slot
// keys. The leases, the store and the sender are the agent's.
func NewRound[S comparable](cfg Config, order func(a, b S) int, l Leases, st Store, out Sender[S]) *Round[S] {
	r := &Round[S]{cfg: cfg, order: order, leases: l, store: st, out: out, keys: map[ID]*Served[S]{},
		directOnly: map[ID]int64{}, direct: map[ID]int64{}}
	none := map[string]bool{}
	r.enabled.Store(&none)
	return r
}

// Result is what one Run did, and when the next is wanted.
type Result struct {
	// Next is when the next round is wanted (After keeps it within a
	// Tick and a ReadEvery); Soon asks for one at once (the store moved a
	// predecessor's entry to this agent).
	Next time.Time
	Soon bool
	// Planned counts the keys planned; Synced says the store was called.
	Planned int
	Synced  bool
	// Quiet: the rounds have nothing to read the region's reservations
	// for until a direct check asks for a read (edge/quiet.go).
	Quiet bool
}

// After is how long an agent waits, at now, for its next round after the
// one that returned res: none when it asked for one soon; QuietEvery when
// quiet (a direct check that wants a read kicks the rounds); else until
// the time it wanted, but at least a Tick and at most a ReadEvery.
func (res Result) After(cfg Config, now time.Time) time.Duration {
	switch {
	case res.Soon:
		return 0
	case res.Quiet:
		return QuietEvery
	}
	return min(max(res.Next.Sub(now), cfg.Tick), cfg.ReadEvery())
}

// Run does one round: plans at clock's now, with mu held; syncs with the
// store, mu released; pushes, with mu held again. Keys due between rounds
// wait for the next one: their times (Key.Next) leave room for that.
func (r *Round[S]) Run(ctx context.Context, mu sync.Locker, clock func() time.Time) Result {
	mu.Lock()
	writes, sync, read := r.prepare(clock())
	res := Result{Planned: len(r.visited), Synced: sync}
	mu.Unlock()
	if sync {
		sent := clock()
		ans, err := r.store.Sync(ctx, writes, read, r.keepAlive)
		mu.Lock()
		res.Soon = r.synced(sent, clock(), writes, ans, err, read)
		mu.Unlock()
	}
	mu.Lock()
	defer mu.Unlock()
	now := clock()
	if now.Sub(r.planAt) > r.pushSlack() {
		// The sync outlasted what the plans allowed for (their time to
		// live and capacity count on a push within pushSlack): push the
		// keys whose plan still holds now (the capacity at the end of an
		// assignment's life no less than planned), plan the rest again.
		holds := r.visited[:0]
		for _, k := range r.visited {
			if k.pol == nil || r.capacityAt(k.ID, 0)(now.Add(k.Life)) >= k.Capacity {
				holds = append(holds, k)
			} else {
				k.dirty = true
			}
		}
		r.visited = holds
	}
	r.push(now)
	res.Next = earliest(r.nextGrow, r.readAt.Add(r.cfg.ReadEvery()))
	res.Quiet = r.quiet()
	r.quietNow.Store(res.Quiet)
	return res
}

// prepare plans, at now, the keys that need it (needsRound) and returns
// the updates to write, and whether to sync with the store: when an update
// grows a reservation (assignments wait for it), or when the region's
// reservations are due to be read again (read; Config.ReadEvery: the
// direct path relies on the last read only so long). Other updates wait
// for that read; their keys are planned again then.
func (r *Round[S]) prepare(now time.Time) (writes []Write, sync, read bool) {
	r.planAt = now
	wanted := r.readWanted.Swap(false)
	read = r.cfg.ReadDue(r.readAt, now) && (wanted || !r.quiet())
	measured := read && now.Sub(r.directAt) >= time.Second
	if read {
		r.readAt = now
	}
	if measured {
		r.measureDirect(now, r.directAt)
		r.directAt = now
	}
	if heir := r.leases.Heir(); heir != r.heir {
		// The Envoy instances of the process this one succeeded are its
		// own now: slots refused a place while that process held them ask
		// again.
		r.heir = heir
		for _, k := range r.keys {
			k.dirty = true
		}
	}
	r.visited, r.nextGrow = r.visited[:0], time.Time{}
	policies := map[string]grantNow{} // looked up once a round
	var longest time.Duration
	for _, k := range r.keys {
		longest = max(longest, k.Life)
		g, ok := policies[k.ID.Policy]
		if !ok {
			g = r.grantAt(k.ID.Policy, now)
			policies[k.ID.Policy] = g
		}
		if r.needsRound(k, g, now, read) {
			r.visited = append(r.visited, k)
			k.validUntil = g.until
		} else {
			r.nextGrow = earliest(r.nextGrow, k.growAt(r.cfg))
		}
	}
	// In order: what the instances are sent does not depend on the map's.
	slices.SortFunc(r.visited, func(a, b *Served[S]) int { return CompareIDs(a.ID, b.ID) })
	urgent := false
	for _, k := range r.visited {
		if u, write := r.plan(k, policies[k.ID.Policy].pol, now); write {
			urgent = urgent || k.Urgent(u)
			writes = append(writes, Write{ID: k.ID, Update: u})
		}
		longest = max(longest, k.Life)
	}
	r.keepAlive = r.cfg.KeepFor(longest)
	writes = append(writes, r.directOnlyWrites(measured)...)
	if read || urgent {
		return writes, true, read
	}
	for _, w := range writes {
		if k := r.keys[w.ID]; k != nil {
			k.unwritten = true // planned again, and written, with the next read
		}
	}
	return nil, false, false
}

// plan plans k, of pol (nil: no longer served), at now: the update to
// write, if any. A key no longer served abandons its slots; one with no
// slot left releases its reservation, and is dropped once that is
// written down.
func (r *Round[S]) plan(k *Served[S], pol *policy.Policy, now time.Time) (Update, bool) {
	if k.pol != nil && pol == nil {
		for _, s := range slices.Clone(k.sorted()) {
			r.abandon(k, s)
		}
	}
	k.pol, k.fp, k.dirty, k.unwritten = pol, r.fps[pol], false, false
	if pol == nil || len(k.Slots) == 0 {
		u, write, drop := k.Release(now, k.direct, r.cfg)
		if drop {
			delete(r.keys, k.ID)
			return Update{}, false
		}
		return u, write
	}
	// Planned now, pushed after the sync: as if pushed at the latest.
	at := now.Add(r.pushSlack())
	return k.Plan(now, pol, max(0, k.validUntil.Sub(at)), r.capacityAt(k.ID, r.pushSlack()), k.direct, k.others, r.cfg)
}

// synced applies the store's answer to a sync sent at sent and answered at
// done (Key.Synced says what counts from which): its grants answer the
// writes that landed, all of them unless err; its others are what the read
// found, nil when it read nothing (the view keeps the last read's). A key
// whose update did not land is planned again next round, and counts the
// lesser of both. It reports whether the store moved a predecessor's
// entry to this agent: a round is then wanted at once.
func (r *Round[S]) synced(sent, done time.Time, writes []Write, ans SyncAnswer, err error, read bool) (soon bool) {
	granted, others := ans.Granted, ans.Others
	lapsed := ans.Life != 0 && r.lived(sent, ans.Life) // a sync that failed may still have kept this agent alive
	if err != nil {
		for _, w := range writes[len(granted):] {
			if k := r.keys[w.ID]; k != nil {
				k.Unsynced(w.Update) // landed or not: the lesser of both counts
				k.dirty = true
				r.setOwn(k)
			}
		}
		writes, others = writes[:len(granted)], nil
		if read {
			r.readAt = time.Time{} // read again next round
		}
	}
	if read {
		r.readFailed = err != nil
	}
	changed := lapsed // the view drops what this agent no longer holds
	for i, w := range writes {
		k := r.keys[w.ID]
		if k == nil {
			continue
		}
		changed = changed || granted[i].Reserved != k.Written
		if in := granted[i].Inherited; in.Reserved > 0 || in.Places > 0 {
			// The others' read before the move counted the entry this
			// agent took over: plan again without it, soon.
			k.others, k.dirty, soon = k.others.Without(in), true, true
			if o, ok := r.regionKeys[w.ID]; ok {
				r.regionKeys = maps.Clone(r.regionKeys)
				r.regionKeys[w.ID] = o.Without(in)
			}
		}
		for _, s := range k.Synced(sent, done, w.Update, granted[i], r.cfg) {
			r.out.Refused(k.ID, s)
		}
		r.setOwn(k)
	}
	r.setView(sent, changed, others)
	return soon
}

// setOwn notes k's reservation as written, for the next view.
func (r *Round[S]) setOwn(k *Served[S]) { r.own.set(k.ID, k.Written) }

// lived takes the life a sync sent at sent found this agent in: it lives
// until at least the sync's keepAlive from then. A life other than the
// last one means the last one ended (this agent was stopped, or could not
// reach the store, longer than that): the store holds nothing of what it
// wrote then, so every key lapses (Key.Lapsed), before the sync's grants,
// which the store made in the new life, are applied: they grow from none
// and wait as any growth does, as the others may not have read them yet.
// It reports whether the keys lapsed.
func (r *Round[S]) lived(sent time.Time, life int64) (lapsed bool) {
	if r.life != 0 && life != r.life {
		for _, k := range r.keys {
			k.Lapsed()
			k.dirty = true
			r.setOwn(k)
		}
		lapsed = true
	}
	r.life, r.alive = life, sent.Add(surely(r.keepAlive, r.cfg.Drift))
	return lapsed
}

// setView stores the view of a read at sent that found others (nil: no
// read; the last read's, with this agent's own reservations as written
// now, if they changed).
func (r *Round[S]) setView(sent time.Time, changed bool, others map[ID]Others) {
	readAt := sent
	old := r.view.Load()
	if others == nil {
		if !changed {
			return
		}
		others, readAt = r.regionKeys, time.Time{}
		if old != nil {
			readAt = old.ReadAt
		}
	} else if !maps.Equal(others, r.regionKeys) {
		r.regionKeys = others
		for id, k := range r.keys {
			if o := others[id]; o != k.others {
				k.others, k.dirty = o, true
			}
		}
	} else if old != nil && !changed {
		r.view.Store(old.ReadAgain(sent)) // the same reservations, read again
		return
	}
	r.view.Store(&View{ReadAt: readAt, others: others, own: r.own.view()})
}

// push sends, on the slots of every key this round planned, the changes
// its ledger allows and the refreshes due, abandons idle buckets
// (Key.Push), and notes when the key is next due (Key.Next). Refreshes
// ride along: an instance sent something this round also gets the
// refreshes of its other buckets due soon (Key.PushAlong), so that its
// refreshes come in one message.
func (r *Round[S]) push(now time.Time) {
	for _, k := range r.visited {
		if r.keys[k.ID] == k { // not dropped this round
			r.send(k, k.Push(now, k.pol, r.alive, r.cfg), now)
			// Due from the plan on: a time that passed during the sync
			// makes the next round plan the key.
			k.due = k.Next(r.planAt, r.cfg)
		}
	}
	type slotOf struct {
		id   ID
		slot S
	}
	var along []slotOf // listed first: pushing along may abandon slots
	for id, s := range r.out.Along() {
		along = append(along, slotOf{id, s})
	}
	for _, a := range along {
		k := r.keys[a.id]
		if k != nil && k.Slots[a.slot] != nil && r.alongOK(k, now) &&
			k.Ledger.Due(a.slot, now, r.cfg.AlongLead(k.TTL)) {
			r.send(k, k.PushAlong(now, k.pol, r.alive, r.cfg), now)
			k.due = earliest(k.due, k.Next(now, r.cfg))
		}
	}
}

// send hands a key's actions to the sender; an abandoned slot is
// forgotten.
func (r *Round[S]) send(k *Served[S], acts []Send[S], now time.Time) {
	for _, a := range acts {
		if a.Abandon {
			r.abandon(k, a.Slot)
			continue
		}
		r.out.Queue(k.ID, a)
	}
	k.pushed = now
	r.nextGrow = earliest(r.nextGrow, k.growAt(r.cfg))
}

// abandon tells slot s's instance to drop its bucket of k, and forgets the
// slot; what it was assigned keeps counting until it expires.
func (r *Round[S]) abandon(k *Served[S], s S) {
	r.out.Queue(k.ID, Send[S]{Slot: s, Abandon: true})
	r.Remove(k, s)
}

// Key returns the key of id, made if new, of policy p.
func (r *Round[S]) Key(id ID, p *policy.Policy) *Served[S] {
	k := r.keys[id]
	if k == nil {
		k = &Served[S]{Key: NewKey(r.order), ID: id, pol: p, others: r.regionKeys[id], dirty: true}
		r.keys[id] = k
	}
	return k
}

// Lookup returns the key of id, nil if none.
func (r *Round[S]) Lookup(id ID) *Served[S] { return r.keys[id] }

// Remove forgets slot s of k (its stream ended, or its bucket was
// abandoned): the next round plans k again.
func (r *Round[S]) Remove(k *Served[S], s S) {
	k.Remove(s)
	k.dirty = true
}

// Keys lists the keys served, in no order.
func (r *Round[S]) Keys() iter.Seq2[ID, *Served[S]] { return maps.All(r.keys) }

// Idle reports whether nothing is served, nor only checked directly.
// Len is how many keys are served.
func (r *Round[S]) Len() int { return len(r.keys) }

func (r *Round[S]) Idle() bool { return len(r.keys) == 0 && len(r.directOnly) == 0 }

// Leave returns, as the agent stops (its rounds over, its streams
// ended), the writes that cut each reservation down to what its
// assignments may still enforce, kept only until they may have expired
// (Key.Leave).
func (r *Round[S]) Leave(now time.Time) []Write {
	var writes []Write
	for id, k := range r.keys {
		if u, write := k.Leave(now, r.cfg); write {
			writes = append(writes, Write{ID: id, Update: u})
		}
	}
	return writes
}

// SetPolicies notes which policies the edge serves: those of ps with edge
// settings and global scope. The round's lock is held.
func (r *Round[S]) SetPolicies(ps []*policy.Policy) {
	m, fps := map[string]bool{}, map[*policy.Policy]uint64{}
	for _, p := range ps {
		if p.Edge != nil && p.Scope == policy.ScopeGlobal {
			m[p.Name] = true
			fps[p] = p.Fingerprint()
		}
	}
	r.enabled.Store(&m)
	r.fps = fps
}

// Serves reports whether the edge serves policy name. Safe for concurrent
// use.
func (r *Round[S]) Serves(name string) bool { return (*r.enabled.Load())[name] }

// Serving reports whether the edge serves any policy. Safe for concurrent
// use.
func (r *Round[S]) Serving() bool { return len(*r.enabled.Load()) > 0 }

// View is the region's reservations as last synced (nil before the
// first). Safe for concurrent use.
func (r *Round[S]) View() *View { return r.view.Load() }
