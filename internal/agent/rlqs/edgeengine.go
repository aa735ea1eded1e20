// Package rlqs is the regional agent's side of leases to the edge:
// Envoy's Rate Limit Quota Service (docs/rlqs.md, docs/rlqs-server.md).
// Envoy instances stream usage reports of their buckets; the Engine
// matches each bucket to a policy identity, runs the edge rounds on them
// (edge.Round, which the simulator runs too), reserves the region's
// capacity for them in its Redis (regional.EdgeStore), and sends each
// instance the token bucket it may enforce. It takes what it uses of the
// agent at construction (Host, a small Leaser); the agent asks it what the
// edge holds (Reserved, Holds, Summary).
package rlqs

import (
	"context"
	"fmt"
	"iter"
	"sync"
	"sync/atomic"
	"time"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	"github.com/hashicorp/go-hclog"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/quota-lease/quota-lease/edge"
	"github.com/quota-lease/quota-lease/internal/logs"
	"github.com/quota-lease/quota-lease/lease"
	"github.com/quota-lease/quota-lease/policy"
	pb "github.com/quota-lease/quota-lease/proto/quotalease/v1"
	"github.com/quota-lease/quota-lease/regional"
)

// Engine is the agent's side of leases to the edge (docs/rlqs.md): the
// RLQS streams of its Envoy instances, and the rounds that reserve the
// region's capacity for them in the region's Redis and assign them token
// buckets (edge.Round: the simulator runs the same rounds). This puts the
// rounds on the wire and in Redis: it is their Sender (the streams), and
// gives them the leases (edgeLeases) and the region's reservations
// (edgeStore). The direct path reads what the edge holds through Reserved
// (the agent's edgeShares). It is safe for concurrent use.
type Engine struct {
	h   Host
	cfg Config
	rc  edge.Config // the rounds' tuning: cfg's, with the lease's drift
	m   *metrics
	// trust is how long a read of the reservations may be relied on: less
	// than GrowWait, however the clocks drift.
	trust time.Duration

	// draining, closed once (EndStreams), ends the RLQS streams and
	// refuses new ones.
	draining  chan struct{}
	drainOnce sync.Once

	mu         sync.Mutex // over the streams and the rounds (r)
	r          *edge.Round[rlqsSlotID]
	streams    map[uint64]*rlqsStream
	buckets    int                    // the streams' slots, ALLOW_ALL buckets and refused second spellings (MaxBuckets)
	callers    map[string]*callerLoad // what each caller holds of streams and buckets (callers.go)
	nextStream uint64

	counted atomic.Pointer[edgeCount] // the last count of the edge, per policy (edgesummary.go)
	kick    chan struct{}
	viewed  atomic.Pointer[chan struct{}] // closed, and replaced, as a round makes a new view (view)
}

func New(h Host, cfg Config, drift float64, reg *prometheus.Registry) *Engine {
	rc := cfg.rounds(drift)
	e := &Engine{h: h, cfg: cfg, rc: rc, m: newMetrics(reg), trust: rc.Trust(), streams: map[uint64]*rlqsStream{},
		callers: map[string]*callerLoad{}, kick: make(chan struct{}, 1),
		draining: make(chan struct{})}
	viewed := make(chan struct{})
	e.viewed.Store(&viewed)
	down := logs.Outage{What: "edge reservation syncs with Redis", Interval: 30 * time.Second, Level: hclog.Warn}
	st := &edgeStore{store: h.Shared.EdgeStore(e.self, h.Clock.Now, rc.Trust(), cfg.GrowWait), now: h.Clock.Now,
		logger: h.Logger, down: down}
	e.r = edge.NewRound(rc, compareSlots, edgeLeases{h.Policies, h.Leases}, st, e)
	reg.MustRegister(newEdgeGauges(func() *edgeCount {
		e.mu.Lock()
		defer e.mu.Unlock()
		return e.count(e.h.Clock.Now(), time.Second)
	}))
	return e
}

// EndStreams ends every RLQS stream and refuses new ones, as the agent
// shuts down: its Envoy instances reopen theirs (on their next report) to
// another agent of the region, or to this one's successor, instead of
// holding streams the server's graceful stop would wait for.
func (e *Engine) EndStreams() { e.drainOnce.Do(func() { close(e.draining) }) }

// Leave writes, as the agent stops (its rounds over, its streams ended),
// each reservation down to what its assignments may still enforce, kept
// only until they may have expired (edge.Round.Leave): the agents its
// Envoy instances reopen their streams to may use the rest then, not once
// the entries' usual life ran out, about twice as long. A successor under
// the same name takes the entries over at once anyway.
func (e *Engine) Leave(ctx context.Context) error {
	e.mu.Lock()
	writes := e.r.Leave(e.h.Clock.Now())
	e.mu.Unlock()
	if len(writes) == 0 {
		return nil
	}
	if _, err := e.h.Shared.EdgeWrite(ctx, e.self(), writes); err != nil {
		return fmt.Errorf("shorten this agent's edge reservations to its assignments' life: %w", err)
	}
	return nil
}

// self names this agent process in the region's reservations, with the
// process it succeeded under its name, if any.
func (e *Engine) self() regional.EdgeAgent { return regional.EdgeAgentOf(e.h.Leases.Succession()) }

// SetPolicies notes which policies the edge serves, and wakes the rounds:
// a policy newly served there has reservations to read before its direct
// checks can rely on them.
func (e *Engine) SetPolicies(ps []*policy.Policy) {
	e.mu.Lock()
	e.r.SetPolicies(ps)
	e.mu.Unlock()
	e.kickSoon()
}

// Reserved is what direct checks of policy name must leave the edge of
// identity's capacity at now: every agent's reservation for it, or, when
// this agent's last read of them is too old to rely on, everything.
func (e *Engine) Reserved(name, identity string, now time.Time) int64 {
	if !e.r.Serves(name) {
		return 0
	}
	return e.view(now).Reserved(name, identity, now, e.trust)
}

// view is the region's reservations for a direct check at now: as last
// read, or, when that read is too old to rely on and the rounds are quiet
// (they read only when asked: edge/quiet.go), as a read the check asks for
// reads them, waited for at most a Tick. Rounds that are not quiet read
// anyway: a view they left stale is one Redis did not answer.
func (e *Engine) view(now time.Time) *edge.View {
	viewed := *e.viewed.Load()
	if v := e.r.View(); v.Fresh(now, e.trust) || !e.r.Quiet() {
		return v
	}
	e.r.WantRead()
	e.kickSoon()
	t := time.NewTimer(e.rc.Tick)
	defer t.Stop()
	select {
	case <-viewed:
	case <-t.C:
	}
	return e.r.View()
}

// Holds reports whether acknowledging g, a grant of policy name, would let
// the coordinator count less for this region than the edge may still be
// enforcing for some identity: the agent then keeps presenting the grant
// it acknowledged before (the lease protocol's two-phase shrink, one
// level down).
func (e *Engine) Holds(name string, g lease.Grant, now time.Time) bool {
	if !e.r.Serves(name) {
		return false
	}
	return e.r.View().Holds(name, g, now, e.trust)
}

// ObserveDirect counts cost (micro-units) a direct check asked of
// identity of policy name, if the edge serves the policy: the direct part
// of the demand the region's capacity is split by.
func (e *Engine) ObserveDirect(name, identity string, cost int64) {
	e.r.ObserveDirect(name, identity, cost)
}

// Run does a round with every read of the region's reservations (about
// every ReadEvery), when a larger reservation becomes usable (new buckets
// wait for it), at most every Tick, at once when a new bucket appears or a
// direct check wants a read, and every QuietEvery while quiet, until ctx
// ends.
func (e *Engine) Run(ctx context.Context) {
	t := time.NewTimer(e.cfg.Tick)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-e.kick:
		}
		t.Reset(e.round(ctx).After(e.rc, e.h.Clock.Now()))
	}
}

func (e *Engine) kickSoon() {
	select {
	case e.kick <- struct{}{}:
	default:
	}
}

// round runs one edge.Round and sends what it queued; its result says
// when the next round is wanted (run).
func (e *Engine) round(ctx context.Context) edge.Result {
	if !e.r.Serving() && e.idle() {
		e.r.Rest()
		return edge.Result{Quiet: true} // no policy is served at the edge: nothing to reserve or read
	}
	before := e.r.View()
	res := e.r.Run(ctx, &e.mu, e.h.Clock.Now)
	if e.r.View() != before {
		viewed := make(chan struct{})
		close(*e.viewed.Swap(&viewed))
	}
	e.m.rounds.Inc()
	e.m.plans.Add(float64(res.Planned))
	if res.Synced {
		e.m.syncs.Inc()
	}
	e.mu.Lock()
	now := e.h.Clock.Now()
	out := e.collect()
	if res.Quiet {
		e.count(now, 0) // the next round may be QuietEvery away
	} else {
		e.count(now, countEvery)
	}
	e.mu.Unlock()
	for st, m := range out {
		st.send(m, e.m)
	}
	return res
}

func (e *Engine) idle() bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.r.Idle() && len(e.streams) == 0
}

// slot is the wire side of slot sid. e.mu is held.
func (e *Engine) slot(sid rlqsSlotID) *rlqsSlot { return e.streams[sid.stream].slots[sid.bucket] }

// Queue queues a round's action on its slot's stream (edge.Sender); an
// abandoned slot is forgotten. e.mu is held.
func (e *Engine) Queue(_ edge.ID, a edge.Send[rlqsSlotID]) {
	s := e.slot(a.Slot)
	if !a.Abandon {
		s.st.pend = append(s.st.pend, assignAction(s.id, a.Bucket, a.TTL))
		return
	}
	s.st.pend = append(s.st.pend, abandonAction(s.id))
	delete(s.st.slots, a.Slot.bucket)
	e.countBuckets(s.st, -1)
}

// Refused counts and logs a slot refused an instance place (edge.Sender).
// e.mu is held.
func (e *Engine) Refused(id edge.ID, sid rlqsSlotID) {
	st := e.slot(sid).st
	e.m.refused.WithLabelValues(refusedReason(errInstances)).Inc()
	st.refused.Failed(e.h.Logger, e.h.Clock.Now(),
		"domain", st.domain, "bucket", sid.bucket, "policy", id.Policy, "error", errInstances)
}

// Along lists the slots of the streams with a message this round
// (edge.Sender). e.mu is held.
func (e *Engine) Along() iter.Seq2[edge.ID, rlqsSlotID] {
	return func(yield func(edge.ID, rlqsSlotID) bool) {
		for _, st := range e.streams {
			if len(st.pend) == 0 {
				continue
			}
			for bk, s := range st.slots {
				if !yield(s.key.ID, rlqsSlotID{st.id, bk}) {
					return
				}
			}
		}
	}
}

// dropSlot forgets a slot whose stream ended. e.mu is held.
func (e *Engine) dropSlot(sid rlqsSlotID, s *rlqsSlot) {
	e.r.Remove(s.key, sid)
	delete(s.st.slots, sid.bucket)
	e.countBuckets(s.st, -1)
}

// collect takes every stream's pending actions as one message each. e.mu
// is held.
func (e *Engine) collect() map[*rlqsStream]*rlqsv3.RateLimitQuotaResponse {
	out := map[*rlqsStream]*rlqsv3.RateLimitQuotaResponse{}
	for _, st := range e.streams {
		if len(st.pend) > 0 {
			out[st] = &rlqsv3.RateLimitQuotaResponse{BucketAction: st.pend}
			st.pend = nil
		}
	}
	return out
}

// countBuckets adds n (negative to remove) to the buckets of the agent
// and of st's caller. e.mu is held.
func (e *Engine) countBuckets(st *rlqsStream, n int) {
	e.buckets += n
	st.caller.buckets += n
}

// count returns the count of the edge at now: the last one while it is
// younger than maxAge, else counted again. e.mu is held.
func (e *Engine) count(now time.Time, maxAge time.Duration) *edgeCount {
	if c := e.counted.Load(); c != nil && now.Sub(c.at) < maxAge && !now.Before(c.at) {
		return c
	}
	c := &edgeCount{at: now, by: map[string]*policyCount{}}
	for id, k := range e.r.Keys() {
		pc := c.by[id.Policy]
		if pc == nil {
			pc = &policyCount{streams: map[uint64]bool{}}
			c.by[id.Policy] = pc
		}
		for sid, s := range k.Slots {
			pc.streams[sid.stream] = e.streams[sid.stream] != nil && e.streams[sid.stream].library
			pc.buckets++
			if _, active := k.Ledger.Current(sid, now); active {
				pc.rate += s.Bucket.Rate()
			}
			if s.Demand > 0 {
				pc.usage += float64(s.Demand)
			}
		}
		if p := k.Policy(); p != nil {
			pc.reserve += p.Limit * float64(k.Written) / float64(p.Limits().Amount())
			pc.pol = p
		}
	}
	e.counted.Store(c)
	return c
}

// Summary returns what renewals report of policy name's edge, as last
// counted (about countEvery ago), nil when no Envoy instance holds a
// bucket of it (or the policy is no longer served at the edge: a count
// from before that would be stale). It takes no lock: renewals call it
// under the leases' lock, which the rounds take under the engine's.
func (e *Engine) Summary(name string) *pb.EdgeSummary {
	if !e.r.Serves(name) {
		return nil
	}
	c := e.counted.Load()
	if c == nil || c.by[name] == nil {
		return nil
	}
	pc := c.by[name]
	if pc.pol == nil || len(pc.streams) == 0 {
		return nil
	}
	return &pb.EdgeSummary{Instances: clampInt32(len(pc.streams)), LibraryInstances: clampInt32(countTrue(pc.streams)),
		Buckets: clampInt32(pc.buckets), Assigned: edge.DemandAmount(pc.pol, pc.rate), Usage: amountOf(pc.usage)}
}
