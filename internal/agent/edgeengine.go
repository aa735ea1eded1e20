package agent

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"sync"
	"sync/atomic"
	"time"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"

	"github.com/quota-lease/quota-lease/edge"
	"github.com/quota-lease/quota-lease/lease"
	"github.com/quota-lease/quota-lease/policy"
)

// edgeEngine is the agent's side of leases to the edge (docs/rlqs.md): per
// policy identity that Envoy instances report (an edgeKey), what of the
// region's capacity this agent reserves for them in the region's Redis,
// and the token buckets it assigns them. What to plan, reserve and push is
// package edge's (edge.Key: the simulator runs the same rounds); this puts
// it on the wire and in Redis. Every Tick a round: plan each key
// (edge.Key.Plan or Release), sync the reservations with Redis (the other
// agents' read, edgeReader; growth granted within the capacity,
// edgeWrite), then push
// what the reservations every agent can see allow (edge.Key.Push). The
// direct path reads what the edge holds through reserved (edgeShares). It
// is safe for concurrent use.
type edgeEngine struct {
	a   *Agent
	cfg EdgeConfig
	rc  edge.Config // the rounds' tuning: cfg's, with the lease's drift
	m   *edgeMetrics
	// trust is how long a read of the reservations may be relied on: less
	// than GrowWait, however the clocks drift.
	trust time.Duration

	// draining, closed once (endStreams), ends the RLQS streams and
	// refuses new ones.
	draining  chan struct{}
	drainOnce sync.Once

	mu         sync.Mutex
	streams    map[uint64]*rlqsStream
	buckets    int // the streams' slots and ALLOW_ALL buckets together (MaxBuckets)
	keys       map[edgeKeyID]*edgeKey
	nextStream uint64
	// directOnly are policy identities other agents serve at the edge and
	// this one only checks directly: its direct demand, as last written.
	directOnly map[edgeKeyID]int64
	regionKeys map[edgeKeyID]edge.Others // the other agents' holdings, from the last sync
	directAt   time.Time                 // when direct demands were last measured
	// readRoundAt is when the last round that read the reservations (and
	// wrote what waited for it) planned: reads come every ReadEvery, even
	// between urgent syncs. planAt is when this round planned.
	readRoundAt, planAt time.Time
	syncDown            outage
	heir                string      // the predecessor whose instances this agent took, as last synced
	reader              *edgeReader // the other agents' reservations, read as they change; used by sync only
	visited             []*edgeKey  // the keys this round plans and pushes
	nextGrow            time.Time   // when the first pending growth becomes usable
	// fps are the fingerprints of the policies last loaded: a reload that
	// changed nothing plans no key again.
	fps        map[*policy.Policy]uint64
	metricsAt  time.Time       // when the gauges were last set
	metricKeys map[string]bool // policies with edge gauges set

	// directMu guards direct: the cost (micro-units) direct checks asked
	// of policy identities the edge serves since they were last measured.
	directMu sync.Mutex
	direct   map[edgeKeyID]int64

	view    atomic.Pointer[edge.View]              // the region's reservations as last synced, for the direct path
	summary atomic.Pointer[map[string]edgeSummary] // per policy, as of the last round (edgesummary.go)
	enabled atomic.Pointer[map[string]bool]        // policies with edge settings
	kick    chan struct{}
}

// edgeKeyID names a policy identity served at the edge.
type edgeKeyID struct{ policy, identity string }

// rlqsSlotID is one bucket on one stream: one Envoy instance's view of
// one policy identity.
type rlqsSlotID struct {
	stream uint64
	bucket string
}

// edgeKey is one policy identity the edge serves from this agent: its
// rounds' state (edge.Key, over slots named by rlqsSlotID) and the wire
// side of its slots.
type edgeKey struct {
	*edge.Key[rlqsSlotID]
	id     edgeKeyID
	pol    *policy.Policy // nil: no longer served (policy gone or without edge settings)
	slots  map[rlqsSlotID]*rlqsSlot
	others edge.Others // the other agents' holdings, from the last sync
	direct int64       // this agent's direct demand

	// A key is planned in a round only when an input changed (dirty: a
	// report, a slot added or dropped, the others' holdings or the direct
	// demand), when its policy or grant did (validUntil is the grant's
	// validity its last round planned with), when due (edge.Key.Next), or
	// when its last update waits for the next read (unwritten): an agent
	// serving many identities pays for those that move.
	dirty, unwritten bool
	due              time.Time
	validUntil       time.Time
	fp               uint64    // pol's fingerprint
	pushed           time.Time // the round it last pushed in
}

// rlqsSlot is a bucket an Envoy instance reports: the key's edge.Slot of
// it, and where to send its actions.
type rlqsSlot struct {
	*edge.Slot
	st  *rlqsStream
	id  *rlqsv3.BucketId
	key *edgeKey
}

func compareSlots(a, b rlqsSlotID) int {
	return cmp.Or(cmp.Compare(a.stream, b.stream), cmp.Compare(a.bucket, b.bucket))
}

func newEdgeEngine(a *Agent, cfg EdgeConfig) *edgeEngine {
	rc := cfg.rounds(a.cfg.Drift)
	e := &edgeEngine{a: a, cfg: cfg, rc: rc, m: newEdgeMetrics(a.m.reg), trust: rc.Trust(), streams: map[uint64]*rlqsStream{},
		keys: map[edgeKeyID]*edgeKey{}, direct: map[edgeKeyID]int64{}, directOnly: map[edgeKeyID]int64{}, metricKeys: map[string]bool{},
		syncDown: outage{what: "edge reservation syncs with Redis", interval: 30 * time.Second}, kick: make(chan struct{}, 1),
		draining: make(chan struct{})}
	none := map[string]bool{}
	e.enabled.Store(&none)
	return e
}

// endStreams ends every RLQS stream and refuses new ones, as the agent
// shuts down: its Envoy instances reopen theirs (on their next report) to
// another agent of the region, or to this one's successor, instead of
// holding streams the server's graceful stop would wait for.
func (e *edgeEngine) endStreams() { e.drainOnce.Do(func() { close(e.draining) }) }

// leave writes, as the agent stops (its rounds over, its streams ended),
// each reservation down to what its assignments may still enforce, kept
// only until they may have expired (edge.Key.Leave): the agents its Envoy
// instances reopen their streams to may use the rest then, not once the
// entries' usual life ran out, about twice as long. A successor under the
// same name takes the entries over at once anyway.
func (e *edgeEngine) leave(ctx context.Context) error {
	e.mu.Lock()
	now := e.a.cfg.Clock.Now()
	var updates []edgeUpdate
	for id, k := range e.keys {
		if u, write := k.Leave(now, e.rc); write {
			updates = append(updates, edgeUpdate{key: id, Update: u})
		}
	}
	e.mu.Unlock()
	if len(updates) == 0 {
		return nil
	}
	if _, err := edgeWrite(ctx, e.a.cfg.Redis, e.a.cfg.Region, e.self(), updates); err != nil {
		return fmt.Errorf("shorten this agent's edge reservations to its assignments' life: %w", err)
	}
	return nil
}

// self names this agent process in the region's reservations, with the
// process it succeeded under its name, if any.
func (e *edgeEngine) self() edgeAgent { return edgeAgentOf(e.a.leaser.Succession()) }

// setPolicies notes which policies the edge serves.
func (e *edgeEngine) setPolicies(ps []*policy.Policy) {
	m, fps := map[string]bool{}, map[*policy.Policy]uint64{}
	for _, p := range ps {
		if p.Edge != nil && p.Scope == policy.ScopeGlobal {
			m[p.Name] = true
			fps[p] = p.Fingerprint()
		}
	}
	e.enabled.Store(&m)
	e.mu.Lock()
	e.fps = fps
	e.mu.Unlock()
}

// reserved is what direct checks of policy name must leave the edge of
// identity's capacity at now: every agent's reservation for it, or, when
// this agent's last read of them is too old to rely on, everything.
func (e *edgeEngine) reserved(name, identity string, now time.Time) int64 {
	if !(*e.enabled.Load())[name] {
		return 0
	}
	return e.view.Load().Reserved(name, identity, now, e.trust)
}

// holds reports whether acknowledging g, a grant of policy name, would let
// the coordinator count less for this region than the edge may still be
// enforcing for some identity: the agent then keeps presenting the grant
// it acknowledged before (the lease protocol's two-phase shrink, one
// level down).
func (e *edgeEngine) holds(name string, g lease.Grant, now time.Time) bool {
	if !(*e.enabled.Load())[name] {
		return false
	}
	return e.view.Load().Holds(name, g, now, e.trust)
}

// run does a round with every read of the region's reservations (about
// every ReadEvery), when a larger reservation becomes usable (new buckets
// wait for it), at most every Tick, and at once when a new bucket appears,
// until ctx ends. Keys due between rounds wait for the next one: their
// times (edge.Key.Next) leave room for that.
func (e *edgeEngine) run(ctx context.Context) {
	t := time.NewTimer(e.cfg.Tick)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-e.kick:
		}
		next := e.round(ctx).Sub(e.a.cfg.Clock.Now())
		t.Reset(min(max(next, e.cfg.Tick), e.rc.ReadEvery()))
	}
}

func (e *edgeEngine) kickSoon() {
	select {
	case e.kick <- struct{}{}:
	default:
	}
}

// round plans, syncs the reservations and pushes, and returns when the
// next round is wanted (run). A report or a closed stream waits for it.
func (e *edgeEngine) round(ctx context.Context) time.Time {
	if len(*e.enabled.Load()) == 0 && e.idle() {
		return e.a.cfg.Clock.Now().Add(time.Second) // no policy is served at the edge: nothing to reserve or read
	}
	e.mu.Lock()
	updates, sync, read := e.prepare(e.a.cfg.Clock.Now())
	e.m.rounds.Inc()
	e.m.plans.Add(float64(len(e.visited)))
	e.mu.Unlock()
	if sync {
		e.m.syncs.Inc()
		e.sync(ctx, updates, read)
	}
	e.mu.Lock()
	now := e.a.cfg.Clock.Now()
	if now.Sub(e.planAt) > e.pushSlack() {
		// The sync outlasted what the plans allowed for (their time to
		// live and capacity count on a push within pushSlack): push the
		// keys whose plan still holds now (the capacity at the end of an
		// assignment's life no less than planned), plan the rest again.
		holds := e.visited[:0]
		for _, k := range e.visited {
			if k.pol == nil || e.capacityAt(k.id, 0)(now.Add(k.Life)) >= k.Capacity {
				holds = append(holds, k)
			} else {
				k.dirty = true
			}
		}
		e.visited = holds
	}
	e.push(now)
	out := e.collect()
	if now.Sub(e.metricsAt) >= time.Second {
		e.updateMetrics(now)
		e.metricsAt = now
	}
	next := earliest(e.nextGrow, e.readRoundAt.Add(e.rc.ReadEvery()))
	e.mu.Unlock()
	for st, m := range out {
		st.send(m, e.m)
	}
	return next
}

func (e *edgeEngine) idle() bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return len(e.keys) == 0 && len(e.directOnly) == 0 && len(e.streams) == 0
}

// prepare plans, at now, the keys that need it (edgeKey.dirty) and
// returns the updates to write, and whether to sync with Redis: when an
// update grows a reservation (assignments wait for it), or when the
// region's reservations are due to be read again (read;
// edge.Config.ReadEvery: the direct path relies on the last read only so
// long). Other updates wait for that read; their keys are planned again
// then. e.mu is held.
func (e *edgeEngine) prepare(now time.Time) (updates []edgeUpdate, sync, read bool) {
	e.planAt = now
	read = e.rc.ReadDue(e.readRoundAt, now)
	measured := read && now.Sub(e.directAt) >= time.Second
	if read {
		e.readRoundAt = now
	}
	if measured {
		e.measureDirect(now, e.directAt)
		e.directAt = now
	}
	type served struct {
		pol   *policy.Policy // nil: no longer served at the edge
		until time.Time      // its grant's validity
	}
	policies := map[string]served{} // looked up once a round
	urgent := false
	if _, heir := e.a.leaser.Succession(); heir != e.heir {
		// The Envoy instances of the process this one succeeded are its
		// own now: slots refused a place while that process held them ask
		// again.
		e.heir = heir
		for _, k := range e.keys {
			k.dirty = true
		}
	}
	e.visited, e.nextGrow = e.visited[:0], time.Time{}
	for id, k := range e.keys {
		sv, ok := policies[id.policy]
		if !ok {
			sv.pol, ok = e.a.policies.Policy(id.policy)
			if !ok || sv.pol.Edge == nil || sv.pol.Scope != policy.ScopeGlobal {
				sv.pol = nil
			}
			sv.until = e.a.leaser.validUntil(id.policy)
			policies[id.policy] = sv
		}
		pol, until := sv.pol, sv.until
		if !e.needsRound(k, pol, until, now, read) {
			e.nextGrow = earliest(e.nextGrow, k.growAt(e.rc))
			continue
		}
		if k.pol != nil && pol == nil {
			for sid, s := range k.slots {
				e.abandon(sid, s)
			}
		}
		k.pol, k.fp, k.validUntil, k.dirty, k.unwritten = pol, e.fps[pol], until, false, false
		e.visited = append(e.visited, k)
		var u edge.Update
		var write, drop bool
		if pol == nil || len(k.slots) == 0 {
			u, write, drop = k.Release(now, k.direct, e.rc)
		} else {
			// Planned now, pushed after the sync: as if pushed at the latest.
			at := now.Add(e.pushSlack())
			u, write = k.Plan(now, pol, max(0, until.Sub(at)), e.capacityAt(id, e.pushSlack()), k.direct, k.others, e.rc)
		}
		switch {
		case drop:
			delete(e.keys, id)
		case write:
			urgent = urgent || k.Urgent(u)
			updates = append(updates, edgeUpdate{key: id, Update: u})
		}
	}
	for id, d := range e.directOnly {
		if k := e.keys[id]; k != nil {
			delete(e.directOnly, id)
			continue
		}
		if measured {
			updates = append(updates, edgeUpdate{key: id, Update: edge.Update{Direct: d, Life: e.rc.KeepFor(5 * time.Second)}})
			if d == 0 {
				delete(e.directOnly, id)
			}
		}
	}
	if read || urgent {
		return updates, true, read
	}
	for _, u := range updates {
		if k := e.keys[u.key]; k != nil {
			k.unwritten = true // planned again, and written, with the next read
		}
	}
	return nil, false, false
}

// sync reads the other agents' reservations when read, then writes
// updates to the region's reservations, applying the answers; a key whose
// update did not land is planned again next round, and what landed
// counts. The read may take as long as it may be trusted
// (edge.Config.Trust: it counts from when it was sent); the updates get
// GrowWait after it.
func (e *edgeEngine) sync(ctx context.Context, updates []edgeUpdate, read bool) {
	sent := e.a.cfg.Clock.Now()
	agent := e.self()
	if e.reader == nil {
		e.reader = newEdgeReader(agent.id, e.a.cfg.Clock.Now)
	}
	// The read first: it is trusted from sent, so however long the updates
	// take, it does not age while they run (the script's growth rule counts
	// whatever the others wrote since).
	var others map[edgeKeyID]edge.Others
	var readErr error
	if read {
		rctx, rcancel := context.WithTimeout(ctx, e.rc.Trust())
		others, readErr = e.reader.read(rctx, e.a.cfg.Redis, e.a.cfg.Region, agent)
		rcancel()
	}
	sctx, cancel := context.WithTimeout(ctx, e.cfg.GrowWait)
	granted, err := edgeWrite(sctx, e.a.cfg.Redis, e.a.cfg.Region, agent, updates)
	cancel()
	if err == nil {
		err = readErr
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if err != nil {
		if ctx.Err() == nil && !errors.Is(err, errEdgeSweeping) {
			e.syncDown.failed(e.a.cfg.Logger, sent, "error", err)
		}
		e.synced(sent, e.a.cfg.Clock.Now(), updates[:len(granted)], granted, nil) // the batches that landed
		for _, u := range updates[len(granted):] {
			if k := e.keys[u.key]; k != nil {
				k.Unsynced(u.Update) // landed or not: the lesser of both counts
				k.dirty = true
			}
		}
		if read {
			e.readRoundAt = time.Time{} // read again next round
		}
		return
	}
	e.syncDown.ok(e.a.cfg.Logger, sent)
	e.synced(sent, e.a.cfg.Clock.Now(), updates, granted, others)
}

// observeDirect counts cost (micro-units) a direct check asked of
// identity of policy name, if the edge serves the policy: the direct part
// of the demand the region's capacity is split by.
func (e *edgeEngine) observeDirect(name, identity string, cost int64) {
	if !(*e.enabled.Load())[name] {
		return
	}
	e.directMu.Lock()
	e.direct[edgeKeyID{name, identity}] += cost
	e.directMu.Unlock()
}

// measureDirect turns the direct checks' cost since the last measure into
// every edge key's direct demand, and notes the policy identities only
// other agents serve at the edge that this one checks directly. e.mu is
// held.
func (e *edgeEngine) measureDirect(now, since time.Time) {
	e.directMu.Lock()
	counts := e.direct
	e.direct = map[edgeKeyID]int64{}
	e.directMu.Unlock()
	rate := func(id edgeKeyID) int64 {
		p, ok := e.a.policies.Policy(id.policy)
		if !ok {
			return 0
		}
		return edge.DirectDemand(p, counts[id], now.Sub(since))
	}
	for id, k := range e.keys {
		if d := rate(id); d != k.direct {
			k.direct, k.dirty = d, true
		}
	}
	for id := range e.directOnly {
		e.directOnly[id] = 0
	}
	for id := range counts {
		if _, served := e.regionKeys[id]; served && e.keys[id] == nil {
			e.directOnly[id] = rate(id)
		}
	}
}

// synced applies a successful sync sent at sent and answered at done
// (edge.Key.Synced says what counts from which); others is nil when it
// read nothing, and the view keeps the last read's. e.mu is held.
func (e *edgeEngine) synced(sent, done time.Time, updates []edgeUpdate, granted []edge.Granted, others map[edgeKeyID]edge.Others) {
	changed := false
	for i, u := range updates {
		if k := e.keys[u.key]; k != nil {
			changed = changed || granted[i].Reserved != k.Written
			if in := granted[i].Inherited; in.Reserved > 0 || in.Places > 0 {
				// The others' read before the move counted the entry
				// this agent took over: plan again without it, soon.
				k.others, k.dirty = k.others.Without(in), true
				if o, ok := e.regionKeys[u.key]; ok {
					e.regionKeys = maps.Clone(e.regionKeys)
					e.regionKeys[u.key] = o.Without(in)
				}
				e.kickSoon()
			}
			for _, sid := range k.Synced(sent, done, u.Update, granted[i], e.rc) {
				e.m.refused.WithLabelValues(refusedReason(errInstances)).Inc()
				k.slots[sid].st.refused.failed(e.a.cfg.Logger, done, "domain", k.slots[sid].st.domain, "bucket", sid.bucket, "policy", k.id.policy, "error", errInstances)
			}
		}
	}
	readAt := sent
	old := e.view.Load()
	if others == nil {
		if !changed {
			return
		}
		others, readAt = e.regionKeys, time.Time{}
		if old != nil {
			readAt = old.ReadAt
		}
	} else if old != nil && !changed && maps.Equal(others, e.regionKeys) {
		e.view.Store(old.ReadAgain(sent)) // the same reservations, read again
		return
	}
	e.regionKeys = others
	v := edge.NewView(readAt)
	for id, o := range others {
		v.Add(id.policy, id.identity, o.Reserved)
	}
	for id, k := range e.keys {
		if o := others[id]; o != k.others {
			k.others, k.dirty = o, true
		}
		v.Add(id.policy, id.identity, k.Written)
	}
	e.view.Store(v)
}

// push sends, on the slots of every key this round planned, the changes
// its ledger allows and the refreshes due, abandons idle buckets
// (edge.Key.Push), and notes when the key is next due (edge.Key.Next).
// e.mu is held.
func (e *edgeEngine) push(now time.Time) {
	for _, k := range e.visited {
		if e.keys[k.id] == k { // not dropped this round
			e.send(k, k.Push(now, k.pol, e.rc), now)
			// Due from the plan on: a time that passed during the sync
			// makes the next round plan the key.
			k.due = k.Next(e.planAt, e.rc)
		}
	}
	// Refreshes ride along: an Envoy instance that gets a message this
	// round also gets the refreshes of its other buckets due soon
	// (edge.Key.PushAlong), so that its refreshes come in one message.
	for _, st := range e.streams {
		if len(st.pend) == 0 {
			continue
		}
		for bk, s := range st.slots {
			if k := s.key; e.alongOK(k, now) && k.Ledger.Due(rlqsSlotID{st.id, bk}, now, e.rc.AlongLead(k.TTL)) {
				e.send(k, k.PushAlong(now, k.pol, e.rc), now)
				k.due = earliest(k.due, k.Next(now, e.rc))
			}
		}
	}
}

// alongOK reports whether key k, not planned this round, may push along
// at now: its last plan still holds (nothing changed, nothing due, no
// update waiting) and its assignments get the whole time to live of its
// grant. e.mu is held.
func (e *edgeEngine) alongOK(k *edgeKey, now time.Time) bool {
	return !k.pushed.Equal(now) && k.pol != nil && !k.dirty && !k.unwritten &&
		(k.due.IsZero() || now.Before(k.due)) && e.steady(k.pol, k.validUntil, now)
}

// send queues a key's actions on their streams. e.mu is held.
func (e *edgeEngine) send(k *edgeKey, acts []edge.Send[rlqsSlotID], now time.Time) {
	for _, a := range acts {
		s := k.slots[a.Slot]
		if a.Abandon {
			e.abandon(a.Slot, s)
			continue
		}
		s.st.pend = append(s.st.pend, assignAction(s.id, a.Bucket, a.TTL))
	}
	k.pushed = now
	e.nextGrow = earliest(e.nextGrow, k.growAt(e.rc))
}

// abandon tells a bucket's Envoy instance to drop it and forgets it; what
// it was assigned keeps counting until it expires. e.mu is held.
func (e *edgeEngine) abandon(sid rlqsSlotID, s *rlqsSlot) {
	s.st.pend = append(s.st.pend, abandonAction(s.id))
	e.dropSlot(sid, s)
}

func (e *edgeEngine) dropSlot(sid rlqsSlotID, s *rlqsSlot) {
	s.key.dirty = true
	s.key.Remove(sid)
	delete(s.key.slots, sid)
	delete(s.st.slots, sid.bucket)
	e.buckets--
}

// collect takes every stream's pending actions as one message each. e.mu
// is held.
func (e *edgeEngine) collect() map[*rlqsStream]*rlqsv3.RateLimitQuotaResponse {
	out := map[*rlqsStream]*rlqsv3.RateLimitQuotaResponse{}
	for _, st := range e.streams {
		if len(st.pend) > 0 {
			out[st] = &rlqsv3.RateLimitQuotaResponse{BucketAction: st.pend}
			st.pend = nil
		}
	}
	return out
}

// key returns the edge key of id, made if new. e.mu is held.
func (e *edgeEngine) key(id edgeKeyID, p *policy.Policy) *edgeKey {
	k := e.keys[id]
	if k == nil {
		k = &edgeKey{Key: edge.NewKey(compareSlots), id: id, pol: p, slots: map[rlqsSlotID]*rlqsSlot{}, others: e.regionKeys[id], dirty: true}
		e.keys[id] = k
	}
	return k
}

// updateMetrics sets the per-policy edge gauges and the summary renewals
// report. e.mu is held.
func (e *edgeEngine) updateMetrics(now time.Time) {
	type agg struct {
		streams              map[uint64]bool
		buckets              int
		rate, reserve, usage float64
		pol                  *policy.Policy
	}
	by := map[string]*agg{}
	for id, k := range e.keys {
		g := by[id.policy]
		if g == nil {
			g = &agg{streams: map[uint64]bool{}}
			by[id.policy] = g
		}
		for sid, s := range k.slots {
			g.streams[sid.stream] = true
			g.buckets++
			if _, active := k.Ledger.Current(sid, now); active {
				g.rate += s.Bucket.Rate()
			}
			if s.Demand > 0 {
				g.usage += float64(s.Demand)
			}
		}
		if k.pol != nil {
			g.reserve += k.pol.Limit * float64(k.Written) / float64(k.pol.Limits().Amount())
			g.pol = k.pol
		}
	}
	sums := map[string]edgeSummary{}
	for name, g := range by {
		if g.pol != nil && len(g.streams) > 0 {
			sums[name] = edgeSummary{instances: len(g.streams), buckets: g.buckets, assigned: edge.DemandAmount(g.pol, g.rate), usage: amountOf(g.usage)}
		}
	}
	e.summary.Store(&sums)
	for name := range e.metricKeys {
		if by[name] == nil {
			by[name] = &agg{}
		}
	}
	e.metricKeys = map[string]bool{}
	for name, g := range by {
		e.metricKeys[name] = len(g.streams) > 0 || g.reserve > 0
		if !e.metricKeys[name] {
			delete(e.metricKeys, name)
		}
		e.m.streams.WithLabelValues(name).Set(float64(len(g.streams)))
		e.m.buckets.WithLabelValues(name).Set(float64(g.buckets))
		e.m.assignedRate.WithLabelValues(name).Set(g.rate)
		e.m.reserved.WithLabelValues(name).Set(g.reserve)
	}
}
