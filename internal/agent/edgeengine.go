package agent

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
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
// (edge.Key.Plan or Release), sync the reservations with Redis (edgeSync:
// growth granted within the capacity, the other agents' read), then push
// what the reservations every agent can see allow (edge.Key.Push). The
// direct path reads what the edge holds through reserved (edgeShares). It
// is safe for concurrent use.
type edgeEngine struct {
	a   *Agent
	cfg EdgeConfig
	rc  edge.Config // the rounds' tuning: cfg's, with the lease's drift
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
	regionKeys map[edgeKeyID]edge.Others // the other agents' holdings, from the last sync
	directAt   time.Time                 // when direct demands were last measured
	syncDown   outage
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
	var b [8]byte
	_, _ = rand.Read(b[:])
	rc := cfg.rounds(a.cfg.Drift)
	e := &edgeEngine{a: a, cfg: cfg, rc: rc, m: newEdgeMetrics(a.m.reg), id: hex.EncodeToString(b[:]), trust: rc.Trust(), streams: map[uint64]*rlqsStream{},
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
			u, write, drop := k.Release(now, k.direct, e.rc)
			if drop {
				delete(e.keys, id)
			} else if write {
				updates = append(updates, edgeUpdate{key: id, Update: u})
			}
			continue
		}
		validLeft := time.Duration(0)
		if until := e.a.leaser.validUntil(id.policy); until.After(now) {
			validLeft = until.Sub(now)
		}
		capacityAt := func(t time.Time) int64 {
			c, _ := e.a.leaser.EnforceAt(id.policy, id.identity, t)
			return c
		}
		if u, write := k.Plan(now, pol, validLeft, capacityAt, k.direct, k.others, e.rc); write {
			updates = append(updates, edgeUpdate{key: id, Update: u})
		}
	}
	for id, d := range e.directOnly {
		if k := e.keys[id]; k != nil {
			delete(e.directOnly, id)
			continue
		}
		if measure {
			updates = append(updates, edgeUpdate{key: id, Update: edge.Update{Direct: d, Life: e.rc.KeepFor(5 * time.Second)}})
			if d == 0 {
				delete(e.directOnly, id)
			}
		}
	}
	return updates
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

// synced applies a successful sync sent at sent and answered at done
// (edge.Key.Synced says what counts from which). e.mu is held.
func (e *edgeEngine) synced(sent, done time.Time, updates []edgeUpdate, granted []int64, others map[edgeKeyID]edge.Others) {
	for i, u := range updates {
		if k := e.keys[u.key]; k != nil {
			k.Synced(sent, done, u.Update, granted[i], e.rc)
		}
	}
	e.regionKeys = others
	v := edge.NewView(sent)
	for id, o := range others {
		v.Add(id.policy, id.identity, o.Reserved)
	}
	for id, k := range e.keys {
		k.others = others[id]
		v.Add(id.policy, id.identity, k.Written)
	}
	e.view.Store(v)
}

// push sends, on every key's slots, the changes its ledger allows and the
// refreshes due, and abandons idle buckets (edge.Key.Push). e.mu is held.
func (e *edgeEngine) push(now time.Time) {
	for _, k := range e.keys {
		for _, a := range k.Push(now, k.pol, e.rc) {
			s := k.slots[a.Slot]
			if a.Abandon {
				s.st.pend = append(s.st.pend, abandonAction(s.id))
				e.dropSlot(a.Slot, s)
				continue
			}
			s.st.pend = append(s.st.pend, assignAction(s.id, a.Bucket, a.TTL))
		}
	}
}

// abandon tells a bucket's Envoy instance to drop it and forgets it; what
// it was assigned keeps counting until it expires. e.mu is held.
func (e *edgeEngine) abandon(sid rlqsSlotID, s *rlqsSlot) {
	s.st.pend = append(s.st.pend, abandonAction(s.id))
	e.dropSlot(sid, s)
}

func (e *edgeEngine) dropSlot(sid rlqsSlotID, s *rlqsSlot) {
	s.key.Remove(sid)
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
		k = &edgeKey{Key: edge.NewKey(compareSlots), id: id, pol: p, slots: map[rlqsSlotID]*rlqsSlot{}}
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
