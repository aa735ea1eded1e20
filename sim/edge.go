package sim

import (
	"cmp"
	"context"
	"errors"
	"iter"
	"maps"
	"slices"
	"strconv"
	"time"

	"github.com/quota-lease/quota-lease/edge"
	"github.com/quota-lease/quota-lease/edge/envoy"
	"github.com/quota-lease/quota-lease/lease"
	"github.com/quota-lease/quota-lease/policy"
	"github.com/quota-lease/quota-lease/sim/scenario"
)

// This file gives each region Envoy instances and makes its agent their
// Rate Limit Quota Service (docs/rlqs.md), as internal/agent does: per
// policy identity the instances report, the agent's rounds are package
// edge's (edge.Key: plan, reserve in the region's Redis, push), the
// region's Redis keeps the reservations as regional/lua/edge_sync.lua does
// (edge.Reserve), direct checks leave the edge its reservation
// (edge.View, edge.DirectShare), and renewals keep acknowledging the grant
// that covered what the edge may still enforce (edge.View.Holds). Each
// instance's buckets are package edge/envoy's, Envoy's behaviour: reports
// every reporting interval and at a bucket's first request, token buckets
// enforced locally (kept, partially filled or full), time to live and
// fallback timers, a stream reopened only on the report timer.
//
// What is left out: one agent per region (the agent's handling of other
// agents' reservations is exercised only by a restarted agent's old
// entry); the agent's caps on buckets and messages per stream (the
// simulated Envoy stays within them); a stream opens at once, and a round's
// Redis sync takes no time.

// edgeConfig is the agent's edge tuning in the scenario's edge s.
func edgeConfig(s *scenario.EdgeSpec, drift float64) edge.Config {
	cfg := edge.DefaultConfig()
	cfg.Drift = drift
	if s.ChangeEvery > 0 {
		cfg.ChangeEvery = time.Duration(s.ChangeEvery)
	}
	if s.BurstFraction > 0 {
		cfg.BurstFraction = s.BurstFraction
	}
	if s.RepayOver > 0 {
		cfg.RepayOver = time.Duration(s.RepayOver)
	}
	cfg.KeepsFill = !s.OldEnvoy
	return cfg
}

// edgeRegion is region r's edge: its agent's RLQS side and its Envoy
// instances. Its agent's rounds are the agent's (edge.Round); the region
// gives them the leases (edge.Leases) and its instances (edge.Sender),
// and its Redis the reservations (edge.MemStore, through regionStore).
type edgeRegion struct {
	e   *engine
	r   *region
	cfg edge.Config
	set envoy.Settings
	// up: the agent runs; cut: the instances cannot reach it.
	up, cut bool

	rounds     *edge.Round[uint64] // slots are streams: one bucket per identity on each
	seq        int                 // the round scheduled last; earlier ones do not run
	queued     map[uint64]bool     // streams sent something this round
	streams    map[uint64]int      // open streams: the instance at the other end
	nextStream uint64
	trust      time.Duration
	acked      lease.Grant    // the grant renewals acknowledge
	store      *edge.MemStore // the region's Redis's reservations
	// the agent process's generation: its name in the reservations
	gen int
	// what the rounds plan with: the region's holder (x), or a test's
	leases edge.Leases
	// a test's record of what the rounds send
	sent func(instance int, id edge.ID, a edge.Send[uint64])

	envoys []*envoyInst
}

// newEdge gives region r its edge.
func (e *engine) newEdge(r *region) *edgeRegion {
	cfg := edgeConfig(e.s.Edge, e.s.Lease.Drift)
	x := &edgeRegion{e: e, r: r, cfg: cfg, set: envoy.SettingsOf(e.policy.Edge), up: true, trust: cfg.Trust(),
		streams: map[uint64]int{}, store: edge.NewMemStore(func() int64 { return r.clock(e.now) })}
	x.set.StartsFull = !cfg.KeepsFill // Envoy as the agent is set for
	x.leases = x
	x.start()
	for i := 0; i < e.s.Edge.Instances; i++ {
		x.envoys = append(x.envoys, &envoyInst{x: x, idx: i, buckets: map[int]*envoy.Bucket{}})
	}
	return x
}

// start starts the agent's edge as a new process: no state, the next
// generation in the reservations, which takes the entries of the one
// before (its instances reconnect to it: edge/inherit.go), as the agent
// does those of the process it succeeded under its name.
func (x *edgeRegion) start() {
	x.gen++
	st := regionStore{x.r, x.store.Agent(strconv.Itoa(x.gen), strconv.Itoa(x.gen-1))}
	x.rounds = edge.NewRound(x.cfg, cmp.Compare[uint64], x.leases, st, x)
	x.rounds.SetPolicies([]*policy.Policy{x.e.policy})
}

// startEdges schedules every region's agent rounds.
func (e *engine) startEdges() {
	for _, r := range e.regions {
		r.edge.schedule(r.edge.cfg.Tick.Milliseconds()) // as the agent's first round
	}
}

// delay is the one-way delay between an instance and the agent, ms.
func (x *edgeRegion) delay() int64 { return time.Duration(x.e.s.Edge.Delay).Milliseconds() }

// now is the agent's clock.
func (x *edgeRegion) now() time.Time { return x.r.leaseTime(x.e.now) }

// schedule runs a round at (ms) instead of the one scheduled before, as
// the agent's timer does.
func (x *edgeRegion) schedule(at int64) {
	x.seq++
	seq := x.seq
	x.e.at(at, func() {
		if seq == x.seq {
			x.round()
		}
	})
}

// round is the agent's edge round (internal/agent edgeEngine.round): one
// edge.Round, the next scheduled as the agent's timer would be.
func (x *edgeRegion) round() {
	if !x.up {
		return
	}
	clear(x.queued)
	res := x.rounds.Run(context.Background(), nopLocker{}, x.now)
	x.schedule(x.e.now + res.After(x.cfg, x.now()).Milliseconds())
}

// nopLocker is the lock over a round: the simulation runs one thing at a
// time.
type nopLocker struct{}

func (nopLocker) Lock()   {}
func (nopLocker) Unlock() {}

// kick runs a round now, as the agent does when a bucket appears.
func (x *edgeRegion) kick() { x.schedule(x.e.now) }

// Policy, ValidUntil, EnforceAt and Heir are the leases the rounds plan
// with (edge.Leases): the region's holder's.
func (x *edgeRegion) Policy(name string) *policy.Policy {
	if name != x.e.policy.Name {
		return nil
	}
	return x.e.policy
}

func (x *edgeRegion) ValidUntil(string) time.Time {
	if g, until := x.r.holder.Grant(); g.ID != "" {
		return until
	}
	return time.Time{}
}

func (x *edgeRegion) EnforceAt(_, identity string, t time.Time) int64 {
	c, _ := x.r.holder.EnforceAt(identity, t)
	return c
}

// Heir is none: a restarted agent's rounds start anew (start), and the
// store moves the entry of the generation before.
func (x *edgeRegion) Heir() string { return "" }

// regionStore is the region's Redis's reservations as an agent process
// syncs with them, failing while the Redis is down.
type regionStore struct {
	r *region
	edge.Store
}

// errRedisDown is the store's answer while the region's Redis is down.
var errRedisDown = errors.New("the region's Redis is down")

func (s regionStore) Sync(
	ctx context.Context,
	writes []edge.Write,
	read bool,
	alive time.Duration,
) (edge.SyncAnswer, error) {
	if s.r.redisDown {
		return edge.SyncAnswer{}, errRedisDown
	}
	return s.Store.Sync(ctx, writes, read, alive)
}

// Queue delivers a round's action to its stream's instance after the
// delay (edge.Sender).
func (x *edgeRegion) Queue(id edge.ID, a edge.Send[uint64]) {
	in, identity := x.envoys[x.streams[a.Slot]], x.e.ids.index[id.Identity]
	x.e.at(x.e.now+x.delay(), func() { in.apply(a.Slot, identity, a) })
	x.e.edgeRes.count(a)
	if x.sent != nil {
		x.sent(x.streams[a.Slot], id, a)
	}
	if x.queued == nil {
		x.queued = map[uint64]bool{}
	}
	x.queued[a.Slot] = true
}

// Refused: the simulated instances stay within the policy's.
func (x *edgeRegion) Refused(edge.ID, uint64) {}

// Along lists the slots of the streams sent something this round, in
// order (edge.Sender).
func (x *edgeRegion) Along() iter.Seq2[edge.ID, uint64] {
	return func(yield func(edge.ID, uint64) bool) {
		if len(x.queued) == 0 {
			return
		}
		ids := slices.SortedFunc(maps.Keys(maps.Collect(x.rounds.Keys())), edge.CompareIDs)
		for _, st := range slices.Sorted(maps.Keys(x.queued)) {
			for _, id := range ids {
				if x.rounds.Lookup(id).Slots[st] != nil && !yield(id, st) {
					return
				}
			}
		}
	}
}

// open registers a new stream from instance i.
func (x *edgeRegion) open(i int) uint64 {
	x.nextStream++
	x.streams[x.nextStream] = i
	return x.nextStream
}

// close forgets stream st (it ended): what its slots were sent keeps
// counting until it expires.
func (x *edgeRegion) close(st uint64) {
	for _, k := range x.rounds.Keys() {
		if k.Slots[st] != nil {
			x.rounds.Remove(k, st)
		}
	}
	delete(x.streams, st)
}

// usage is one bucket's part of a usage report.
type usage struct {
	identity        int
	allowed, denied uint64
	elapsed         time.Duration
}

// report is the agent receiving a usage report on stream st
// (edgeEngine.report): a bucket it does not know subscribes (a new slot,
// and a round soon); its requests are the region's demand too (the lease
// meter); its rate is the slot's demand.
func (x *edgeRegion) report(st uint64, us []usage) {
	if _, open := x.streams[st]; !open || !x.up {
		return
	}
	now := x.now()
	p := x.e.policy
	for _, u := range us {
		k := x.rounds.Key(edge.ID{Policy: p.Name, Identity: x.e.ids.names[u.identity]}, p)
		s := k.Slots[st]
		if s == nil {
			s = k.Add(st, now)
			s.Group = "instance " + strconv.Itoa(x.streams[st]) // each instance a host of its own, as the agent's groupOf
			x.kick()
		}
		count := u.allowed + u.denied
		span := s.Report(p, count, u.elapsed, now)
		x.e.observe(x.r, u.identity, edge.ReportedCost(p, count), span)
		k.Touch()
	}
}

// reserved is what direct checks of identity must leave the edge at now
// (rlqs.Engine.Reserved): when the last read is too old to rely on and the
// rounds are quiet (they read only when a check asks: edge/quiet.go), a
// round reads the region's reservations first, at once.
func (x *edgeRegion) reserved(identity string, now time.Time) int64 {
	if !x.rounds.View().Fresh(now, x.trust) && x.rounds.Quiet() {
		x.rounds.WantRead()
		x.round()
	}
	return x.rounds.View().Reserved(x.e.policy.Name, identity, now, x.trust)
}

// present is the grant a renewal of the region acknowledges, req asking
// to present its holder's grant (leaser.renew): not one smaller than what
// the edge may still enforce for some identity; the one acknowledged
// before instead.
func (x *edgeRegion) present(req lease.Request, now time.Time) string {
	base, _ := x.r.holder.Grant()
	if req.GrantID == "" || base.ID != req.GrantID {
		base = lease.Grant{}
	}
	if base.ID != "" && base.ID != x.acked.ID && x.rounds.View().Holds(x.e.policy.Name, base, now, x.trust) {
		base = x.acked
	}
	x.acked = base
	return base.ID
}

// down stops the region's agent (agent-outage): every stream ends, its
// state is gone; back restarts it as a new process with no edge state.
func (x *edgeRegion) down() {
	x.up = false
	x.endStreams()
}

func (x *edgeRegion) back() {
	x.up = true
	x.start()
	x.schedule(x.e.now)
}

// endStreams ends every stream: the agent forgets them, each instance
// sees its stream close (and reopens one on its next report tick).
func (x *edgeRegion) endStreams() {
	for st := range x.streams {
		x.close(st)
	}
	for _, in := range x.envoys {
		in.stream = 0
	}
}

// envoyInst is one Envoy instance: its bucket cache (package edge/envoy),
// its report timer and its one stream to the region's agent.
type envoyInst struct {
	x       *edgeRegion
	idx     int
	buckets map[int]*envoy.Bucket // by identity
	ticking bool
	stream  uint64 // 0: none
}

// mono is the instance's monotonic clock: the region's.
func (in *envoyInst) mono() time.Duration {
	return time.Duration(in.x.r.clock(in.x.e.now)) * time.Millisecond
}

// decide is the filter deciding one request of identity: a bucket it
// holds decides; a new one is decided by the no-assignment behaviour,
// created and reported at once, alone (the first ever also starts the
// report timer and the stream).
func (in *envoyInst) decide(identity int) bool {
	now := in.mono()
	if b := in.buckets[identity]; b != nil {
		return b.Allow(now)
	}
	b := envoy.New(&in.x.set, now)
	ok := in.x.set.FirstAllowed()
	b.Count(ok)
	in.buckets[identity] = b
	if !in.ticking {
		in.ticking = true
		in.connect()
		every := time.Duration(in.x.e.s.Edge.ReportInterval).Milliseconds()
		var tick func()
		tick = func() { in.tick(); in.x.e.at(in.x.e.now+every, tick) }
		in.x.e.at(in.x.e.now+every, tick)
	}
	a, d, el := b.Usage(now)
	in.send([]usage{{identity, a, d, el}})
	return ok
}

// tick is the report timer: every bucket's usage (counts reset whether or
// not the report is delivered), on the stream, reopened first if down.
func (in *envoyInst) tick() {
	now := in.mono()
	us := make([]usage, 0, len(in.buckets))
	for _, id := range slices.Sorted(maps.Keys(in.buckets)) {
		b := in.buckets[id]
		b.Settle(now)
		a, d, el := b.Usage(now)
		us = append(us, usage{id, a, d, el})
	}
	if in.stream == 0 {
		in.connect()
	}
	in.send(us)
}

// connect opens a stream if the agent is up and reachable.
func (in *envoyInst) connect() {
	if in.x.up && !in.x.cut {
		in.stream = in.x.open(in.idx)
	}
}

// send delivers a report on the stream after the delay, or drops it when
// there is none; a stream that ended meanwhile loses it.
func (in *envoyInst) send(us []usage) {
	in.x.e.edgeRes.Reports++
	if in.stream == 0 || len(us) == 0 {
		in.x.e.edgeRes.ReportsDropped++
		return
	}
	st := in.stream
	in.x.e.at(in.x.e.now+in.x.delay(), func() { in.x.report(st, us) })
}

// apply is Envoy applying one action of its stream st for identity's
// bucket: an assignment (a token bucket or DENY_ALL) or an abandon. A
// bucket the cache does not hold is skipped; a stream that ended lost it.
func (in *envoyInst) apply(st uint64, identity int, a edge.Send[uint64]) {
	if in.stream != st {
		return
	}
	b := in.buckets[identity]
	if b == nil {
		return
	}
	if a.Abandon {
		delete(in.buckets, identity)
		return
	}
	if in.x.e.breakEdge == "assignments" {
		return
	}
	b.Assign(envoy.Assignment(a.Bucket), a.TTL, in.mono())
	in.x.e.follow.assigned(in, identity)
}
