package sim

import (
	"cmp"
	"maps"
	"slices"
	"strconv"
	"time"

	"github.com/quota-lease/quota-lease/edge"
	"github.com/quota-lease/quota-lease/edge/envoy"
	"github.com/quota-lease/quota-lease/lease"
	"github.com/quota-lease/quota-lease/policy"
)

// This file gives each region Envoy instances and makes its agent their
// Rate Limit Quota Service (docs/rlqs.md), as internal/agent does: per
// policy identity the instances report, the agent's rounds are package
// edge's (edge.Key: plan, reserve in the region's Redis, push), the
// region's Redis keeps the reservations as lua/edge_sync.lua does
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

// EdgeSpec is the scenario's edge: Envoy instances behind every region.
type EdgeSpec struct {
	// Instances per region; default and at most the policy's
	// edge.instances (the bound's edge term counts that many).
	Instances int `yaml:"instances"`
	// Delay is the one-way delay between an instance and its agent.
	// Default 1ms.
	Delay policy.Duration `yaml:"delay"`
	// ReportInterval is Envoy's report period: 5s, hard-coded in Envoy.
	ReportInterval policy.Duration `yaml:"report_interval"`
	// ChangeEvery, BurstFraction and RepayOver override the agent's
	// defaults (edge.DefaultConfig): the least time between changes of one
	// bucket's assignment, the most of its refill given up to pay for
	// buckets that start full, and the time over which it pays
	// (edge.Assign, edge.Resize).
	ChangeEvery   policy.Duration `yaml:"change_every"`
	BurstFraction float64         `yaml:"burst_fraction"`
	RepayOver     policy.Duration `yaml:"repay_over"`
	// OldEnvoy runs Envoy from before PR #37624, whose replaced token
	// buckets start full, and the agent set for it
	// (--edge-envoy-keeps-fill=false).
	OldEnvoy bool `yaml:"old_envoy"`
}

// config is the agent's edge tuning in the scenario.
func (s *EdgeSpec) config(drift float64) edge.Config {
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

// EnvoyReportInterval is the report period of Envoy's rate limit quota
// filter, whatever its settings say (filter_persistence.cc).
const EnvoyReportInterval = 5 * time.Second

// MaxEdgeInstances bounds the instances a region may run in a scenario.
const MaxEdgeInstances = 1000

// edgeRegion is region r's edge: its agent's RLQS side and its Envoy
// instances.
type edgeRegion struct {
	e   *engine
	r   *region
	cfg edge.Config
	set envoy.Settings
	// up: the agent runs; cut: the instances cannot reach it.
	up, cut bool
	gen     int // the agent process's generation: its name in the reservations

	keys       map[int]*simKey // by identity
	streams    map[uint64]int  // open streams: the instance at the other end
	nextStream uint64
	view       *edge.View
	readAt     time.Time // the last sync (edge.Config.ReadDue)
	trust      time.Duration
	direct     map[int]int64 // direct checks' cost (micro-units) since directAt
	directAt   time.Time
	kicked     bool
	acked      lease.Grant // the grant renewals acknowledge

	// res is the region's Redis's reservations: per identity, per agent
	// generation, what it reserved and until when (Redis's clock, ms).
	res map[int]map[int]reservation

	envoys []*envoyInst
}

// simKey is one policy identity the region's edge serves.
type simKey struct {
	*edge.Key[uint64] // slots are streams: one bucket per identity on each
	direct            int64
	others            edge.Others
}

type reservation struct {
	reserved, places, edgeDemand, direct int64
	expiresMs, largest                   int64
}

// newEdge gives region r its edge.
func (e *engine) newEdge(r *region) *edgeRegion {
	cfg := e.s.Edge.config(e.s.Lease.Drift)
	x := &edgeRegion{e: e, r: r, cfg: cfg, set: envoy.SettingsOf(e.policy.Edge), up: true, trust: cfg.Trust(),
		keys: map[int]*simKey{}, streams: map[uint64]int{}, direct: map[int]int64{}, res: map[int]map[int]reservation{}}
	x.set.StartsFull = !cfg.KeepsFill // Envoy as the agent is set for
	x.directAt = r.leaseTime(e.now)
	for i := 0; i < e.s.Edge.Instances; i++ {
		x.envoys = append(x.envoys, &envoyInst{x: x, idx: i, buckets: map[int]*envoy.Bucket{}})
	}
	return x
}

// startEdges schedules every region's agent rounds.
func (e *engine) startEdges() {
	for _, r := range e.regions {
		x := r.edge
		tick := x.cfg.Tick.Milliseconds()
		var round func()
		round = func() { x.round(); e.at(e.now+tick, round) }
		e.at(0, round)
	}
}

// delay is the one-way delay between an instance and the agent, ms.
func (x *edgeRegion) delay() int64 { return time.Duration(x.e.s.Edge.Delay).Milliseconds() }

// round is the agent's edge round (internal/agent edgeEngine.round):
// plan every key, sync the reservations with Redis, push.
func (x *edgeRegion) round() {
	x.kicked = false
	if !x.up {
		return
	}
	now := x.r.leaseTime(x.e.now)
	ids, updates := x.prepare(now)
	urgent := false
	for i, id := range ids {
		urgent = urgent || x.keys[id].Urgent(updates[i])
	}
	// As the agent: a growth is written at once, the rest with the next
	// read (the keys are planned again then).
	if !x.r.redisDown && (urgent || x.cfg.ReadDue(x.readAt, now)) {
		x.readAt = now
		granted, others := x.sync(ids, updates)
		for i, id := range ids {
			if k := x.keys[id]; k != nil {
				k.Synced(now, now, updates[i], granted[i], x.cfg)
			}
		}
		x.view = edge.NewView(now)
		name := x.e.policy.Name
		for id, o := range others {
			x.view.Add(name, x.e.ids.names[id], o.Reserved)
		}
		for id, k := range x.keys {
			k.others = others[id]
			x.view.Add(name, x.e.ids.names[id], k.Written)
		}
	}
	x.push(now)
}

// kick runs a round soon, as the agent does when a bucket appears.
func (x *edgeRegion) kick() {
	if !x.kicked {
		x.kicked = true
		x.e.at(x.e.now, x.round)
	}
}

// prepare plans every key at now and returns the updates to write, by
// identity.
func (x *edgeRegion) prepare(now time.Time) ([]int, []edge.Update) {
	p := x.e.policy
	if d := now.Sub(x.directAt); d >= time.Second {
		for id, k := range x.keys {
			k.direct = edge.DirectDemand(p, x.direct[id], d)
		}
		x.direct, x.directAt = map[int]int64{}, now
	}
	var ids []int
	var updates []edge.Update
	g, until := x.r.holder.Grant()
	validLeft := time.Duration(0)
	if g.ID != "" && until.After(now) {
		validLeft = until.Sub(now)
	}
	for _, id := range slices.Sorted(maps.Keys(x.keys)) {
		k := x.keys[id]
		if len(k.Slots) == 0 {
			u, write, drop := k.Release(now, k.direct, x.cfg)
			if drop {
				delete(x.keys, id)
			} else if write {
				ids, updates = append(ids, id), append(updates, u)
			}
			continue
		}
		name := x.e.ids.names[id]
		// As the agent asks its lease (leaser.EnforceAt): the holder's
		// EnforceAt at the end of the assignments' life.
		capacityAt := func(t time.Time) int64 {
			c, _ := x.r.holder.EnforceAt(name, t)
			return c
		}
		if u, write := k.Plan(now, p, validLeft, capacityAt, k.direct, k.others, x.cfg); write {
			ids, updates = append(ids, id), append(updates, u)
		}
	}
	return ids, updates
}

// sync is lua/edge_sync.lua on the region's Redis: applies this agent's
// updates (edge.Reserve, for the reservation and the instance places) and
// returns what it granted each and what the other live agents hold, per
// identity. A restarted agent takes its previous generation's entry as
// its own (its instances reconnect to it: edge/inherit.go), as the agent
// does that of the process it succeeded under its name.
func (x *edgeRegion) sync(ids []int, updates []edge.Update) ([]edge.Granted, map[int]edge.Others) {
	nowMs := x.r.clock(x.e.now)
	granted := make([]edge.Granted, len(ids))
	for i, id := range ids {
		u := updates[i]
		var old, others edge.Granted
		var in edge.Inheritance
		keep := map[int]reservation{}
		for gen, en := range x.res[id] {
			switch {
			case en.expiresMs <= nowMs:
				continue
			case gen == x.gen:
				old.Reserved, old.Places = en.reserved, old.Places+en.places
				continue
			case gen == x.gen-1: // moves to this generation's entry
				in = edge.Inheritance{Reserved: en.reserved, Largest: en.largest, Places: en.places,
					Left: time.Duration(en.expiresMs-nowMs) * time.Millisecond, Edge: en.edgeDemand, Direct: en.direct}
				old.Places, others.Reserved = old.Places+en.places, others.Reserved+en.reserved
				continue
			}
			others.Reserved, others.Places = others.Reserved+en.reserved, others.Places+en.places
			keep[gen] = en
		}
		g := edge.Granted{Reserved: edge.Reserve(u.Want, old.Reserved, u.Capacity, others.Reserved) + in.Reserved,
			Places: edge.Reserve(u.Instances, old.Places, u.Most, others.Places), Inherited: in}
		if g.Reserved > 0 || g.Places > 0 || u.EdgeDemand > 0 || u.Direct > 0 {
			life := max(1, u.Life.Milliseconds(), in.Left.Milliseconds())
			keep[x.gen] = reservation{g.Reserved, g.Places, u.EdgeDemand, u.Direct, nowMs + life, max(u.Largest, in.Largest)}
		}
		x.res[id] = keep
		granted[i] = g
	}
	others := map[int]edge.Others{}
	for id, es := range x.res {
		var o edge.Others
		for gen, en := range es {
			if en.expiresMs <= nowMs {
				delete(es, gen)
				continue
			}
			if gen != x.gen {
				o.Reserved, o.Edge, o.Direct = o.Reserved+en.reserved, o.Edge+en.edgeDemand, o.Direct+en.direct
			}
		}
		if len(es) == 0 {
			delete(x.res, id)
		}
		if o != (edge.Others{}) {
			others[id] = o
		}
	}
	return granted, others
}

// push sends every key's actions (edge.Key.Push) down their streams.
func (x *edgeRegion) push(now time.Time) {
	for _, id := range slices.Sorted(maps.Keys(x.keys)) {
		for _, a := range x.keys[id].Push(now, x.e.policy, x.cfg) {
			in := x.envoys[x.streams[a.Slot]]
			x.e.at(x.e.now+x.delay(), func() { in.apply(a.Slot, id, a) })
			x.e.edgeRes.count(a)
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
	for _, k := range x.keys {
		if k.Slots[st] != nil {
			k.Remove(st)
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
	now := x.r.leaseTime(x.e.now)
	p := x.e.policy
	for _, u := range us {
		k := x.keys[u.identity]
		if k == nil {
			k = &simKey{Key: edge.NewKey[uint64](cmp.Compare[uint64])}
			x.keys[u.identity] = k
		}
		s := k.Slots[st]
		if s == nil {
			s = k.Add(st, now)
			x.kick()
		}
		count := u.allowed + u.denied
		x.e.observe(x.r, u.identity, edge.ReportedCost(p, count))
		s.Report(p, count, u.elapsed, now)
	}
}

// reserved is what direct checks of identity must leave the edge at now
// (edgeEngine.reserved).
func (x *edgeRegion) reserved(identity string, now time.Time) int64 {
	return x.view.Reserved(x.e.policy.Name, identity, now, x.trust)
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
	if base.ID != "" && base.ID != x.acked.ID && x.view.Holds(x.e.policy.Name, base, now, x.trust) {
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
	x.up, x.gen = true, x.gen+1
	x.keys, x.view, x.direct = map[int]*simKey{}, nil, map[int]int64{}
	x.directAt = x.r.leaseTime(x.e.now)
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

// instanceName names instance i of region r.
func instanceName(r string, i int) string { return r + "/envoy-" + strconv.Itoa(i) }
