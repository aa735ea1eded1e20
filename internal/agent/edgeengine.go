package agent

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"maps"
	"math"
	"slices"
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
// and the token buckets it assigns them, through the two phases of
// edge.Ledger. Every Tick a round: compute each key's capacity, target
// and split (edge.Target, edge.Split), sync the reservations with Redis
// (edgeSync: growth granted within the capacity, the other agents' read),
// then push what the reservations every agent can see allow. The direct
// path reads what the edge holds through reserved (edgeShares). It is safe
// for concurrent use.
type edgeEngine struct {
	a   *Agent
	cfg EdgeConfig
	m   *edgeMetrics
	id  string // this process's name in the region's reservations
	// trust is how long a read of the reservations may be relied on: less
	// than GrowWait, however the clocks drift.
	trust time.Duration

	mu         sync.Mutex
	streams    map[uint64]*rlqsStream
	keys       map[edgeKeyID]*edgeKey
	nextStream uint64
	// directOnly are policy identities other agents serve at the edge and
	// this one only checks directly: its direct demand, as last written.
	directOnly map[edgeKeyID]int64
	regionKeys map[edgeKeyID]edgeOthers // the other agents' holdings, from the last sync
	directAt   time.Time                // when direct demands were last measured
	syncDown   outage
	metricKeys map[string]bool // policies with edge gauges set

	// directMu guards direct: the cost (micro-units) direct checks asked
	// of policy identities the edge serves since they were last measured.
	directMu sync.Mutex
	direct   map[edgeKeyID]int64

	view    atomic.Pointer[edgeView]
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

// edgeKey is one policy identity the edge serves from this agent.
type edgeKey struct {
	id     edgeKeyID
	pol    *policy.Policy // nil: no longer served (policy gone or without edge settings)
	ledger *edge.Ledger[rlqsSlotID]
	slots  map[rlqsSlotID]*rlqsSlot

	// This round's plan.
	want      map[rlqsSlotID]int64
	ttl, life time.Duration
	capacity  int64
	self      int64 // this agent's edge demand

	// The reservation. written is what the region's Redis holds for this
	// agent (confirmed by a sync); visible what every agent may be
	// counting (written for GrowWait); pending a larger written amount
	// waiting for that since pendingSince; covered until when Redis keeps
	// the entry, on this agent's clock.
	written, visible, pending int64
	pendingSince, covered     time.Time
	others                    edgeOthers
	direct                    int64 // this agent's direct demand
	sentEdge, sentDirect      int64 // the demands last written
}

// rlqsSlot is a bucket an Envoy instance reports.
type rlqsSlot struct {
	st      *rlqsStream
	id      *rlqsv3.BucketId
	key     *edgeKey
	demand  int64     // amount units per policy period; -1 unknown
	at      time.Time // last report
	busy    time.Time // last report with requests (or its first)
	bucket  edge.Bucket
	changed time.Time // when its bucket last changed
}

// edgeView is the region's edge reservations as last synced, for the
// direct path: per policy and identity, what every agent reserved.
type edgeView struct {
	readAt   time.Time
	byPolicy map[string]map[string]int64
}

func newEdgeEngine(a *Agent, cfg EdgeConfig) *edgeEngine {
	var b [8]byte
	_, _ = rand.Read(b[:])
	trust := cfg.GrowWait - time.Duration(math.Ceil(3*a.cfg.Drift*float64(cfg.GrowWait))) - time.Millisecond
	e := &edgeEngine{a: a, cfg: cfg, m: newEdgeMetrics(a.m.reg), id: hex.EncodeToString(b[:]), trust: trust, streams: map[uint64]*rlqsStream{},
		keys: map[edgeKeyID]*edgeKey{}, direct: map[edgeKeyID]int64{}, directOnly: map[edgeKeyID]int64{}, metricKeys: map[string]bool{},
		syncDown: outage{what: "edge reservation syncs with Redis", interval: 30 * time.Second}, kick: make(chan struct{}, 1)}
	none := map[string]bool{}
	e.enabled.Store(&none)
	return e
}

// setPolicies notes which policies the edge serves.
func (e *edgeEngine) setPolicies(ps []*policy.Policy) {
	m := map[string]bool{}
	for _, p := range ps {
		if p.Edge != nil && p.Scope == policy.ScopeGlobal {
			m[p.Name] = true
		}
	}
	e.enabled.Store(&m)
}

// reserved is what direct checks of policy name must leave the edge of
// identity's capacity at now: every agent's reservation for it, or, when
// this agent's last read of them is too old to rely on, everything.
func (e *edgeEngine) reserved(name, identity string, now time.Time) int64 {
	if !(*e.enabled.Load())[name] {
		return 0
	}
	v := e.view.Load()
	if v == nil || now.After(v.readAt.Add(e.trust)) {
		return math.MaxInt64
	}
	return v.byPolicy[name][identity]
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
	v := e.view.Load()
	if v == nil {
		return false // never synced: nothing was assigned
	}
	ids := v.byPolicy[name]
	if now.After(v.readAt.Add(e.trust)) {
		return len(ids) > 0 // unknown now: keep what covered them
	}
	for id, r := range ids {
		if r > g.AmountFor(id) {
			return true
		}
	}
	return false
}

// run does a round every Tick, and soon after a new bucket appears, until
// ctx ends.
func (e *edgeEngine) run(ctx context.Context) {
	t := time.NewTicker(e.cfg.Tick)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-e.kick:
		}
		e.round(ctx)
	}
}

func (e *edgeEngine) kickSoon() {
	select {
	case e.kick <- struct{}{}:
	default:
	}
}

// round plans, syncs the reservations and pushes.
func (e *edgeEngine) round(ctx context.Context) {
	if len(*e.enabled.Load()) == 0 && e.idle() {
		return // no policy is served at the edge: nothing to reserve or read
	}
	e.mu.Lock()
	updates := e.prepare(e.a.cfg.Clock.Now())
	e.mu.Unlock()
	sent := e.a.cfg.Clock.Now()
	sctx, cancel := context.WithTimeout(ctx, e.cfg.GrowWait)
	granted, others, err := edgeSync(sctx, e.a.cfg.Redis, e.a.cfg.Region, e.id, updates)
	cancel()
	e.mu.Lock()
	if err != nil {
		if ctx.Err() == nil {
			e.syncDown.failed(e.a.cfg.Logger, sent, "error", err)
		}
	} else {
		e.syncDown.ok(e.a.cfg.Logger, sent)
		e.synced(sent, e.a.cfg.Clock.Now(), updates, granted, others)
	}
	now := e.a.cfg.Clock.Now()
	e.push(now)
	out := e.collect()
	e.updateMetrics(now)
	e.mu.Unlock()
	for st, m := range out {
		st.send(m, e.m)
	}
}

func (e *edgeEngine) idle() bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return len(e.keys) == 0 && len(e.directOnly) == 0 && len(e.streams) == 0
}

// keepFor is how long the region's Redis keeps a reservation entry past a
// sync: twice the longest life of an assignment plus a few rounds, so that
// entries are rewritten about once per life and pushes never wait for one.
func (e *edgeEngine) keepFor(life time.Duration) time.Duration {
	return 2*life + 4*e.cfg.Tick
}

// prepare computes every key's plan at now and the updates to write.
// e.mu is held.
func (e *edgeEngine) prepare(now time.Time) []edgeUpdate {
	measure := now.Sub(e.directAt) >= time.Second
	if measure {
		e.measureDirect(now, e.directAt)
		e.directAt = now
	}
	var updates []edgeUpdate
	for id, k := range e.keys {
		pol, ok := e.a.policies.Policy(id.policy)
		if !ok || pol.Edge == nil || pol.Scope != policy.ScopeGlobal {
			pol = nil
		}
		if k.pol != nil && pol == nil {
			for sid, s := range k.slots {
				e.abandon(sid, s)
			}
		}
		k.pol = pol
		if pol == nil || len(k.slots) == 0 {
			k.want = nil
			need := k.ledger.Committed(now)
			if need == 0 && k.written == 0 && k.ledger.Empty(now) {
				delete(e.keys, id)
				continue
			}
			if need != k.written || k.direct != k.sentDirect {
				updates = append(updates, edgeUpdate{key: id, want: need, direct: k.direct, life: e.keepFor(max(k.life, time.Second))})
			}
			continue
		}
		validLeft := time.Duration(0)
		if until := e.a.leaser.validUntil(id.policy); until.After(now) {
			validLeft = until.Sub(now)
		}
		k.ttl, _ = edge.TTL(pol.Edge.EdgeTTL(), validLeft, e.a.cfg.Drift, e.cfg.Margin)
		k.life = edge.Lifetime(k.ttl, e.a.cfg.Drift, e.cfg.Margin)
		// The least the region may enforce over the assignment's life: at
		// its end, since no grant's capacity grows while nothing is renewed
		// (a grant, then its degraded budget, which only decays), and a
		// renewal that shrinks it is not acknowledged while the edge may
		// enforce more (holds).
		k.capacity, _ = e.a.leaser.Enforce(id.policy, id.identity, now.Add(k.life))
		ids := slices.SortedFunc(maps.Keys(k.slots), func(a, b rlqsSlotID) int {
			return cmp.Or(cmp.Compare(a.stream, b.stream), cmp.Compare(a.bucket, b.bucket))
		})
		demands := make([]int64, len(ids))
		var known, sum int64
		for i, sid := range ids {
			demands[i] = k.slots[sid].demand
			if demands[i] >= 0 {
				known++
				sum += demands[i]
			}
		}
		k.self = sum
		if unknown := int64(len(ids)) - known; unknown > 0 {
			guess := k.capacity
			if known > 0 {
				guess = sum / known
			}
			k.self += unknown * guess
		}
		target := edge.Target(k.capacity, k.others.direct+k.direct, k.self, k.others.edge)
		shares := edge.Split(target, demands)
		k.want = make(map[rlqsSlotID]int64, len(ids))
		for i, sid := range ids {
			k.want[sid] = shares[i]
		}
		need := k.ledger.Need(now, k.want)
		if need != k.written || now.Add(k.life+2*e.cfg.Tick).After(k.covered) || moved(k.self, k.sentEdge) || k.direct != k.sentDirect {
			updates = append(updates, edgeUpdate{key: id, want: need, capacity: k.capacity, edgeDemand: k.self, direct: k.direct, life: e.keepFor(k.life)})
		}
	}
	for id, d := range e.directOnly {
		if k := e.keys[id]; k != nil {
			delete(e.directOnly, id)
			continue
		}
		if measure {
			updates = append(updates, edgeUpdate{key: id, direct: d, life: e.keepFor(5 * time.Second)})
			if d == 0 {
				delete(e.directOnly, id)
			}
		}
	}
	return updates
}

// moved reports whether a demand moved by more than a tenth since it was
// last written.
func moved(now, sent int64) bool {
	return now > sent+sent/10 || now < sent-sent/10
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
	secs := now.Sub(since).Seconds()
	rate := func(id edgeKeyID) int64 {
		p, ok := e.a.policies.Policy(id.policy)
		if !ok || secs <= 0 {
			return 0
		}
		return p.Limits().RateAmount(int64(float64(counts[id]) / secs))
	}
	for id, k := range e.keys {
		k.direct = rate(id)
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

// synced applies a successful sync sent at sent and answered at done.
// Redis ran it in between: the entries' lives count from sent (they end
// no sooner), a larger reservation's wait from done (every agent's read
// that missed it began before done), and the others' holdings are trusted
// from sent. e.mu is held.
func (e *edgeEngine) synced(sent, done time.Time, updates []edgeUpdate, granted []int64, others map[edgeKeyID]edgeOthers) {
	for i, u := range updates {
		k := e.keys[u.key]
		if k == nil {
			continue
		}
		g := granted[i]
		k.written, k.sentEdge, k.sentDirect = g, u.edgeDemand, u.direct
		switch {
		case g <= k.visible:
			k.visible, k.pending = g, 0
		case g <= k.pending:
			k.pending = g // part of what was written then
		default:
			if k.pending > 0 && !done.Before(k.pendingSince.Add(e.cfg.GrowWait)) {
				k.visible = k.pending
			}
			k.pending, k.pendingSince = g, done
		}
		// Redis counts the entry's life from when it ran the script, after
		// sent, on its own clock.
		k.covered = sent.Add(u.life - time.Duration(math.Ceil(2*e.a.cfg.Drift*float64(u.life))))
	}
	e.regionKeys = others
	v := &edgeView{readAt: sent, byPolicy: map[string]map[string]int64{}}
	add := func(id edgeKeyID, r int64) {
		if r <= 0 {
			return
		}
		m := v.byPolicy[id.policy]
		if m == nil {
			m = map[string]int64{}
			v.byPolicy[id.policy] = m
		}
		m[id.identity] += r
	}
	for id, o := range others {
		add(id, o.reserved)
	}
	for id, k := range e.keys {
		k.others = others[id]
		add(id, k.written)
	}
	e.view.Store(v)
}

// push sends, on every key's slots, the changes its ledger allows and the
// refreshes due, and abandons idle buckets. e.mu is held.
func (e *edgeEngine) push(now time.Time) {
	for _, k := range e.keys {
		if k.pending > 0 && !now.Before(k.pendingSince.Add(e.cfg.GrowWait)) {
			k.visible, k.pending = max(k.visible, k.pending), 0
		}
		k.visible = min(k.visible, k.written)
		if k.pol == nil || k.want == nil || now.Add(k.life).After(k.covered) {
			continue // nothing served, or Redis keeps no entry long enough for one more push
		}
		changes := k.ledger.Plan(now, k.want, k.visible, e.cfg.ChangeEvery)
		from := now.Add(k.ttl - time.Duration(math.Ceil(2*e.a.cfg.Drift*float64(k.ttl))))
		for sid, s := range k.slots {
			if now.Sub(s.busy) >= e.cfg.AbandonAfter && now.Sub(s.changed) >= e.cfg.ChangeEvery {
				e.abandon(sid, s)
				continue
			}
			share, change := changes[sid]
			if change {
				s.bucket = edge.Assign(edge.ShapeOf(k.pol, share), e.cfg.ChangeEvery, e.cfg.BurstFraction, s.bucket)
				s.changed = now
			} else {
				cur, active := k.ledger.Current(sid, now)
				if !active || cur > k.want[sid] || !k.ledger.Due(sid, now, e.refreshLead(k.ttl)) {
					// A share above what the slot may have now (its capacity
					// fell, or it is being moved away and its change waits
					// for ChangeEvery) is never extended: it expires.
					continue
				}
				share = cur // a refresh: the same bucket, a new time to live
			}
			k.ledger.Pushed(sid, share, now, from, now.Add(k.life))
			s.st.pend = append(s.st.pend, assignAction(s.id, s.bucket, k.ttl))
		}
	}
}

// refreshLead is how long before an assignment of ttl may expire it is
// sent again: a quarter of it, or a few rounds. Later would risk a gap;
// sooner keeps a share that is being moved away alive longer.
func (e *edgeEngine) refreshLead(ttl time.Duration) time.Duration {
	return max(ttl/4, 4*e.cfg.Tick)
}

// abandon tells a bucket's Envoy instance to drop it and forgets it; what
// it was assigned keeps counting until it expires. e.mu is held.
func (e *edgeEngine) abandon(sid rlqsSlotID, s *rlqsSlot) {
	s.st.pend = append(s.st.pend, abandonAction(s.id))
	e.dropSlot(sid, s)
}

func (e *edgeEngine) dropSlot(sid rlqsSlotID, s *rlqsSlot) {
	s.key.ledger.Remove(sid)
	delete(s.key.slots, sid)
	delete(s.st.slots, sid.bucket)
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
		k = &edgeKey{id: id, pol: p, ledger: edge.NewLedger[rlqsSlotID](), slots: map[rlqsSlotID]*rlqsSlot{}}
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
			if _, active := k.ledger.Current(sid, now); active {
				g.rate += s.bucket.Rate()
			}
			if s.demand > 0 {
				g.usage += float64(s.demand)
			}
		}
		if k.pol != nil {
			g.reserve += k.pol.Limit * float64(k.written) / float64(k.pol.Limits().Amount())
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
