package sim

import (
	"bufio"
	"container/heap"
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"math"
	"math/rand/v2"
	"path/filepath"
	"slices"
	"strconv"
	"time"

	"github.com/quota-lease/quota-lease/admission"
	"github.com/quota-lease/quota-lease/bound"
	"github.com/quota-lease/quota-lease/lease"
	"github.com/quota-lease/quota-lease/policy"
	"github.com/quota-lease/quota-lease/sim/scenario"
)

// systems are the ways every arrival is decided, in the order of
// Result.Modes; the ideal limiter comes after them.
var systems = []bound.Mode{bound.Leased, bound.Independent, bound.Static, bound.Central}

// Ideal names the ideal global limiter's results in Result.Modes (bounded
// as Central), after the ways of limiting.
const Ideal = "ideal"

// boundMode is the mode whose bound judges the results named m.
func boundMode(m string) bound.Mode {
	if m == Ideal {
		return bound.Central
	}
	return bound.Mode(m)
}

// identities interns identity strings.
type identities struct {
	p     *policy.Policy
	names []string
	attrs []map[string]string // a request's attributes for each identity
	index map[string]int
}

func (ids *identities) add(value string) (int, error) {
	attrs := make(map[string]string, len(ids.p.Identity))
	for _, a := range ids.p.Identity {
		attrs[a] = value
	}
	name, err := ids.p.IdentityOf(attrs)
	if err != nil {
		return 0, err
	}
	if i, ok := ids.index[name]; ok {
		return i, nil
	}
	ids.index[name] = len(ids.names)
	ids.names = append(ids.names, name)
	ids.attrs = append(ids.attrs, attrs)
	return len(ids.names) - 1, nil
}

// event is one thing to happen at t (ms of true time); seq orders
// simultaneous events by scheduling order, for determinism.
type event struct {
	t   int64
	seq uint64
	do  func()
}

type queue []*event

func (q queue) Len() int { return len(q) }
func (q queue) Less(i, j int) bool {
	if q[i].t != q[j].t {
		return q[i].t < q[j].t
	}
	return q[i].seq < q[j].seq
}
func (q queue) Swap(i, j int) { q[i], q[j] = q[j], q[i] }
func (q *queue) Push(x any)   { *q = append(*q, x.(*event)) }
func (q *queue) Pop() any {
	old := *q
	e := old[len(old)-1]
	*q = old[:len(old)-1]
	return e
}

// region is one region's state in the simulation.
type region struct {
	name string
	// clock: region time = anchorRegion + (t - anchorTrue) * (1 + rate).
	anchorTrue, anchorRegion int64
	rate                     float64

	holder      *lease.Holder
	nonce       string
	lastSend    int64
	pending     map[uint64]bool
	meter       *lease.Meter[int]  // demand, measured as the agent measures it
	report      lease.DemandReport // identity demands the coordinator holds
	redisDown   bool
	partitioned bool

	store, indep, static map[int]policy.State
	// turn is the last shard turn of the region's one agent: a policy with
	// shards spreads an identity's checks over its shards in turn, as
	// regional.Engine does; store holds shard k of identity id at
	// id*MaxShards+k.
	turn int64
	// bornMs is the region store's birth marker (regional.BornKey), in
	// region time: 0 for the new store the run starts with, -1 once a
	// restart lost it and before a check has recorded the loss.
	bornMs int64
	// admit is the region's admission pipeline, the agent's. Its local
	// fallback, as the agent's, is never reset, neither when Redis returns
	// nor on a version bump.
	admit admitter
	// edge is the region's Envoy instances and its agent's side of them
	// (nil without an edge).
	edge *edgeRegion
}

func (r *region) clock(t int64) int64 {
	return r.anchorRegion + int64(float64(t-r.anchorTrue)*(1+r.rate))
}

// shardOf is the store key of the shard the region's next check of
// identity id goes to.
func (r *region) shardOf(id int, p *policy.Policy) int {
	r.turn++
	return id*policy.MaxShards + int(r.turn%p.ShardCount())
}

// leaseTime is the region's clock as a time.Time for the lease code.
func (r *region) leaseTime(t int64) time.Time { return time.UnixMilli(r.clock(t)) }

// Run simulates s and returns its result; decisions, when not nil,
// receives one JSON line per request decided by quota-lease.
func Run(s *scenario.Scenario, decisions io.Writer) (*Result, error) {
	return newEngine(s).run(decisions)
}

func newEngine(s *scenario.Scenario) *engine {
	return &engine{
		s:         s,
		rng:       rand.New(rand.NewPCG(s.Seed, 0x5eed)),
		policy:    s.Parsed(),
		maxPolicy: s.Parsed(),
		ledger:    map[string]lease.LedgerMark{},
	}
}

type engine struct {
	s         *scenario.Scenario
	rng       *rand.Rand
	q         queue
	seq       uint64
	now       int64
	policy    *policy.Policy // in force now
	maxPolicy *policy.Policy // the largest limits in force at any time
	full      policy.Limits
	timing    lease.Timing
	regions   []*region
	ids       *identities
	groupIDs  []int // the identity of each group's first tenant
	// err is the first error that stops the run.
	err error
	// wrap, when set, wraps each region's admission pipeline (tests
	// compare it with the agent's on Redis).
	wrap func(r *region, sim admitter) admitter
	// breakEdge, set by tests, makes the edge ignore one of its rules so
	// that they can show they would notice: "assignments" (Envoy never
	// applies one) or "reservations" (direct checks take the region's whole
	// capacity).
	breakEdge string

	book      *lease.Book
	targets   map[string]int64
	idPlan    *lease.IdentityPlan // identities with shares of their own
	coordUp   bool
	epoch     int64
	leaseMsgs int64
	outages   bool
	epochs    []*epoch                    // one per policy in force, oldest first
	ledger    map[string]lease.LedgerMark // the simulated etcd ledger, by region

	central, oracle map[int]policy.State
	centralDelay    int64

	res *Result
	// The edge's results, its windows and the moves watched (with an
	// edge).
	edgeRes *EdgeResult
	edgeWin *edgeWindows
	follow  *followTracker
	// conv is the conversations in flight (scenarios with conversations).
	conv *conversing

	track  map[string]*windowMax
	series *series
	out    *bufio.Writer
	line   []byte
}

// fail stops the run with err, unless an error stopped it already.
func (e *engine) fail(err error) {
	if e.err == nil {
		e.err = err
	}
}

func (e *engine) at(t int64, do func()) {
	e.seq++
	heap.Push(&e.q, &event{t: t, seq: e.seq, do: do})
}

func (e *engine) run(decisions io.Writer) (*Result, error) {
	index, err := e.setUp()
	if err != nil {
		return nil, err
	}
	if decisions != nil {
		e.out = bufio.NewWriterSize(decisions, 1<<20)
	}
	durMs := time.Duration(e.s.Duration).Milliseconds()
	if err := e.addTraffic(index, durMs); err != nil {
		return nil, err
	}
	e.series = newSeries(durMs, time.Duration(e.s.Window).Milliseconds(), len(e.s.Regions))
	e.schedule(durMs)

	for len(e.q) > 0 && e.err == nil {
		ev := heap.Pop(&e.q).(*event)
		if ev.t >= durMs {
			break
		}
		e.now = ev.t
		ev.do()
	}
	if e.err != nil {
		return nil, e.err
	}
	if e.out != nil {
		if err := e.out.Flush(); err != nil {
			return nil, fmt.Errorf("write decisions: %w", err)
		}
	}
	return e.finish()
}

// setUp makes the scenario's lease book, regions, trackers and results,
// and returns the regions' indexes by name.
func (e *engine) setUp() (map[string]int, error) {
	s := e.s
	e.full = e.policy.Limits()
	e.timing = lease.Timing{
		ValidFor:        time.Duration(s.Lease.Duration),
		Drift:           s.Lease.Drift,
		Margin:          time.Duration(s.Lease.Margin),
		DegradedTimeout: time.Duration(s.Lease.DegradedTimeout),
	}
	if err := e.timing.Validate(); err != nil {
		return nil, fmt.Errorf("%w: lease: %v", scenario.ErrInvalidScenario, err)
	}
	e.epoch, e.coordUp = 1, true
	e.book = lease.NewBook(e.full.Amount(), e.policy.Failure, e.timing, e.epoch)
	e.targets = map[string]int64{}
	e.idPlan = lease.NewIdentityPlan(e.policy.IdentityShareLimit())
	e.idPlan.SetEdge(e.policy.Edge != nil)
	e.central, e.oracle = map[int]policy.State{}, map[int]policy.State{}
	e.centralDelay = time.Duration(s.Network.Delay).Milliseconds()
	e.ids = &identities{p: e.policy, index: map[string]int{}}
	index := map[string]int{}
	for i, name := range s.Regions {
		index[name] = i
		e.regions = append(e.regions, &region{name: name, anchorRegion: 1_000_000_000_000 + int64(i)*7_777,
			holder: lease.NewHolder(e.timing, e.policy.Failure, e.full.Amount()), nonce: "sim-" + name, lastSend: -1 << 40,
			pending: map[uint64]bool{}, meter: lease.NewMeter[int](lease.MeterTracks(e.policy.IdentityShareLimit())),
			store: map[int]policy.State{}, indep: map[int]policy.State{}, static: map[int]policy.State{}})
		if err := e.admitIn(e.regions[i]); err != nil {
			return nil, err
		}
	}
	wMs := time.Duration(s.Window).Milliseconds()
	e.track = map[string]*windowMax{}
	for _, m := range systems {
		e.track[string(m)] = newWindowMax(wMs)
	}
	e.track[Ideal] = newWindowMax(wMs)
	e.res = &Result{
		Scenario:    s.Name,
		Description: s.Description,
		Seed:        s.Seed,
		Duration:    s.Duration.String(),
		Window:      s.Window.String(),
		Regions:     s.Regions,
	}
	for _, m := range systems {
		e.res.Modes = append(e.res.Modes, &ModeResult{Mode: string(m)})
	}
	e.res.Modes = append(e.res.Modes, &ModeResult{Mode: Ideal})
	e.beginEpoch(e.policy, false)
	if s.Edge != nil {
		for _, r := range e.regions {
			r.edge = e.newEdge(r)
		}
		e.edgeRes = &EdgeResult{Instances: s.Edge.Instances}
		e.edgeWin = &edgeWindows{w: wMs, sums: map[int][2]int64{}, ids: e.ids}
		e.follow = &followTracker{e: e}
	}
	if s.Conversations != nil {
		e.startConversations()
	}
	return index, nil
}

// addTraffic queues the scenario's traffic up to durMs: a trace, or
// Poisson arrivals generated second by second.
func (e *engine) addTraffic(index map[string]int, durMs int64) error {
	s := e.s
	if s.Trace != "" {
		tr, err := readTrace(filepath.Join(s.Dir(), s.Trace), index, e.ids)
		if err != nil {
			return err
		}
		for _, a := range tr {
			if a.t.Milliseconds() < durMs {
				a := a
				e.at(a.t.Milliseconds(), func() { e.arrive(a) })
			}
		}
	} else if len(s.Groups) > 0 {
		if err := e.addGroups(); err != nil {
			return err
		}
		e.at(0, e.generateGroups)
		if s.Edge != nil {
			e.startEdges()
			e.watchMoves()
		}
	} else {
		for i := 0; i < s.Tenants; i++ {
			if _, err := e.ids.add("tenant-" + strconv.Itoa(i)); err != nil {
				return err
			}
		}
		e.at(0, e.generate)
	}
	return nil
}

// schedule puts the periodic work and the scenario's events on the queue.
func (e *engine) schedule(durMs int64) {
	s := e.s
	var tick, rebalance, flush func()
	tick = func() { e.tick(); e.at(e.now+100, tick) }
	rebalance = func() { e.rebalance(); e.at(e.now+time.Duration(s.Rebalance.Interval).Milliseconds(), rebalance) }
	flush = func() {
		if e.coordUp {
			e.writeLedger(e.book.Flush(e.coordTime()))
		}
		e.at(e.now+1000, flush)
	}
	e.at(0, tick)
	e.at(0, rebalance)
	e.at(500, flush)
	for _, ev := range s.Events {
		ev := ev
		at := time.Duration(ev.At).Milliseconds()
		end := at + time.Duration(ev.For).Milliseconds()
		r := e.regionNamed(ev.Region)
		switch ev.Kind {
		case "partition":
			e.at(at, func() { r.partitioned = true })
			e.at(end, func() { r.partitioned = false })
		case "redis-outage":
			e.outages = true
			e.at(at, func() { r.redisDown = true })
			e.at(end, func() { r.redisDown = false })
		case "redis-restart": // down for 'for', then back empty
			e.outages = true
			e.at(at, func() { r.redisDown = true })
			e.at(end, func() {
				r.redisDown, r.store, r.bornMs = false, map[int]policy.State{}, -1
				if r.edge != nil {
					r.edge.store.Clear()
				}
			})
		case "redis-flap": // down for 'down' at the start of every 'period'
			e.outages = true
			period, down := time.Duration(ev.Period).Milliseconds(), time.Duration(ev.Down).Milliseconds()
			for t := at; t < end; t += period {
				e.at(t, func() { r.redisDown = true })
				e.at(min(t+down, end), func() { r.redisDown = false })
			}
		case "coordinator-crash":
			e.at(at, e.crash)
			e.at(end, e.recover)
		case "clock-drift":
			e.at(at, func() { r.anchorRegion, r.anchorTrue, r.rate = r.clock(e.now), e.now, ev.Rate })
		case "config-change":
			e.at(at, func() { e.reconfigure(ev) })
		case "agent-outage":
			e.at(at, r.edge.down)
			e.at(end, r.edge.back)
		case "edge-partition":
			e.at(at, func() { r.edge.cut = true; r.edge.endStreams() })
			e.at(end, func() { r.edge.cut = false })
		}
	}
}

func (e *engine) regionNamed(name string) *region {
	for _, r := range e.regions {
		if r.name == name {
			return r
		}
	}
	return nil
}

func (e *engine) coordTime() time.Time { return time.UnixMilli(2_000_000_000_000 + e.now) }

// generate schedules the next second's arrivals.
func (e *engine) generate() {
	s := e.s
	sec := e.now
	mid := time.Duration(sec+500) * time.Millisecond
	for ri, r := range e.regions {
		n := poisson(e.rng, s.Rate(r.name, mid))
		for k := 0; k < n; k++ {
			id := 0
			if s.Tenants > 1 && e.rng.Float64() >= s.HotTenant {
				id = 1 + e.rng.IntN(s.Tenants-1)
			}
			a := arrival{t: time.Duration(sec+e.rng.Int64N(1000)) * time.Millisecond, region: ri, identity: id, cost: 1}
			e.at(a.t.Milliseconds(), func() { e.arrive(a) })
		}
	}
	e.at(sec+1000, e.generate)
}

// poisson samples a Poisson variate: Knuth's method for small means, a
// rounded normal approximation for large ones.
func poisson(r *rand.Rand, mean float64) int {
	if mean <= 0 {
		return 0
	}
	if mean > 50 {
		return max(0, int(math.Round(mean+math.Sqrt(mean)*r.NormFloat64())))
	}
	l, k, p := math.Exp(-mean), 0, 1.0
	for {
		p *= r.Float64()
		if p <= l {
			return k
		}
		k++
	}
}

// tick sends due lease renewals.
func (e *engine) tick() {
	for _, r := range e.regions {
		rt := r.leaseTime(e.now)
		if !r.holder.NeedsRenewal(rt) || e.now-r.lastSend < 500 || r.edge != nil && !r.edge.up {
			continue
		}
		r.lastSend = e.now
		req := r.holder.Sending(rt)
		r.pending[req.Seq] = true
		e.leaseMsgs++
		demand := e.full.RateAmount(r.meter.Rate(e.now))
		changes := r.report.Changes(e.identityDemands(r), e.book.Total(), lease.MaxDemandChanges)
		grantID := req.GrantID
		if r.edge != nil {
			grantID = r.edge.present(req, rt)
		}
		renewal := lease.Renewal{
			Region:         r.name,
			Instance:       r.name,
			Nonce:          r.nonce,
			Seq:            req.Seq,
			GrantID:        grantID,
			Demand:         demand,
			Identities:     changes,
			IdentitiesHeld: r.report.Len(),
		}
		sentAt := e.now
		e.at(sentAt+1000, func() { e.timeout(r, req) })
		if r.partitioned || e.lost() {
			continue
		}
		e.at(e.now+e.delay(), func() { e.serve(r, req, renewal, sentAt) })
	}
}

func (e *engine) lost() bool { return e.s.Network.Loss > 0 && e.rng.Float64() < e.s.Network.Loss }

func (e *engine) delay() int64 {
	d := time.Duration(e.s.Network.Delay)
	if j := time.Duration(e.s.Network.Jitter); j > 0 {
		d += time.Duration(e.rng.Int64N(int64(j)))
	}
	return d.Milliseconds()
}

// serve is the coordinator receiving a renewal.
func (e *engine) serve(r *region, req lease.Request, renewal lease.Renewal, sentAt int64) {
	if !e.coordUp || r.partitioned {
		return
	}
	known := e.idPlan.Update(r.name, r.name, r.nonce, renewal.IdentitiesHeld, renewal.Identities)
	t := lease.Targets{
		Default:    lease.Target(e.policy, e.targets, r.name, renewal.Demand),
		Identities: e.idPlan.Targets(r.name),
	}
	p, err := e.book.PrepareTargets(e.coordTime(), renewal, t)
	var g lease.Grant
	if err == nil {
		e.writeLedger(p.Ledger()) // as the coordinator writes etcd
		e.book.Commit(p)
		g = p.Grant()
	}
	if r.partitioned || e.lost() {
		return
	}
	e.at(e.now+e.delay(), func() {
		if !r.pending[req.Seq] {
			return // timed out already
		}
		delete(r.pending, req.Seq)
		r.report.Answered(renewal.Identities, known)
		if err != nil {
			r.holder.Failed(req, err)
			return
		}
		r.holder.Granted(req, g)
	})
}

func (e *engine) timeout(r *region, req lease.Request) {
	if r.pending[req.Seq] {
		delete(r.pending, req.Seq)
		r.holder.Failed(req, fmt.Errorf("timed out"))
	}
}

// rebalance is the coordinator's planning round (lease.PlanTargets), every region
// with weight 1.
func (e *engine) rebalance() {
	if !e.coordUp {
		return
	}
	weights := make(map[string]float64, len(e.regions))
	for _, r := range e.regions {
		weights[r.name] = 1
	}
	opts := lease.PlanOptions{
		Strategy:   e.s.Rebalance.Strategy,
		MaxStep:    e.s.Rebalance.MaxStep,
		Hysteresis: e.s.Rebalance.Hysteresis,
	}
	if t, err := lease.PlanTargets(e.policy, e.book, weights, e.targets, opts); err == nil {
		e.targets = t
	}
	e.idPlan.Plan(e.book.Total(), lease.UsefulShare(e.policy), e.targets)
}

// writeLedger applies d to the simulated etcd ledger and tells the book,
// the step the coordinator runs against etcd (lease.LedgerDelta).
func (e *engine) writeLedger(d lease.LedgerDelta) {
	for _, region := range d.Delete {
		delete(e.ledger, region)
	}
	for _, m := range append(d.Lower, d.Raise...) {
		e.ledger[m.Region] = m
	}
	e.book.Written(d)
}

// crash stops the coordinator; recover starts a new leader that restores
// the ledger (each region's high-water mark) as the real one does.
func (e *engine) crash() { e.coordUp = false }

func (e *engine) recover() {
	e.epoch++
	e.book = lease.NewBook(e.policy.Limits().Amount(), e.policy.Failure, e.timing, e.epoch)
	for _, r := range slices.Sorted(maps.Keys(e.ledger)) {
		m := e.ledger[r]
		e.book.Restore(m.Region, m.Instance, m.Nonce, m.GrantID, m.Amount, m.Total, e.coordTime())
	}
	e.targets = map[string]int64{}
	e.idPlan = lease.NewIdentityPlan(e.policy.IdentityShareLimit())
	e.idPlan.SetEdge(e.policy.Edge != nil)
	e.coordUp = true
}

// reconfigure applies a config change: new limits; a new version starts
// every key fresh.
func (e *engine) reconfigure(ev scenario.Event) {
	p := *e.policy
	if ev.Limit > 0 {
		p.Limit = ev.Limit
	}
	if ev.Burst > 0 {
		p.Burst = ev.Burst
	}
	bumped := ev.Version != 0 && ev.Version != p.Version
	if bumped {
		p.Version = ev.Version
	}
	if p.Validate() != nil {
		return
	}
	if p.Limit > e.maxPolicy.Limit || p.Burst > e.maxPolicy.Burst {
		mp := *e.maxPolicy
		mp.Limit, mp.Burst = math.Max(mp.Limit, p.Limit), math.Max(mp.Burst, p.Burst)
		e.maxPolicy = &mp
	}
	e.policy = &p
	e.beginEpoch(&p, bumped)
	e.full = p.Limits()
	e.book.SetQuota(e.full.Amount(), p.Failure)
	for _, r := range e.regions { // as agents do when they load the changed policy
		r.holder.SetPolicy(p.Failure, e.full.Amount())
	}
	if bumped {
		for _, r := range e.regions {
			r.store, r.indep, r.static = map[int]policy.State{}, map[int]policy.State{}, map[int]policy.State{}
		}
		e.central = map[int]policy.State{}
	}
}

// arrive decides one request in every mode (with conversations, starts
// one).
func (e *engine) arrive(a arrival) {
	if e.conv != nil {
		e.converse(a)
		return
	}
	r := e.regions[a.region]
	cost := a.cost * policy.Micro
	rms := r.clock(e.now)
	full := e.full

	// The ideal global limiter: instant, never failing.
	best := e.decide(e.oracle, a.identity, full, e.now, cost)
	e.record(len(systems), a, best.Allowed, best.Allowed, e.now)

	// quota-lease: an Envoy instance's bucket, or the agent's admission
	// pipeline on the region's store.
	d, mode, ok := e.leased(r, a, best.Allowed)
	if !ok {
		return
	}
	e.record(0, a, d.Allowed, best.Allowed, e.now)
	e.res.Modes[0].countMode(mode)
	if e.out != nil {
		e.writeDecision(a, d, mode)
	}

	// Independent: every region the full limit.
	e.record(1, a, e.decide(r.indep, a.identity, full, rms, cost).Allowed, best.Allowed, e.now)
	// Static: an equal split, forever.
	split := full.Scale(1, int64(len(e.regions)))
	e.record(2, a, e.decide(r.static, a.identity, split, rms, cost).Allowed, best.Allowed, e.now)
	// Central: one counter across regions, reached after a one-way delay;
	// unreachable from a partitioned region or while it is down.
	ok = false
	if !r.partitioned && e.coordUp {
		ok = e.decide(e.central, a.identity, full, e.now+e.centralDelay, cost).Allowed
	}
	e.record(3, a, ok, best.Allowed, e.now+e.centralDelay)
}

// leased decides a under quota-lease: by the Envoy instance it arrived at,
// or by the region's agent (refused while the agent is down); ideal is the
// ideal limiter's decision. ok is false when the run must stop (e.err says
// why).
func (e *engine) leased(r *region, a arrival, ideal bool) (d policy.Decision, mode string, ok bool) {
	cost := a.cost * policy.Micro
	if a.envoy > 0 {
		in := r.edge.envoys[a.envoy-1]
		d.Allowed, mode = in.decide(a.identity), "edge"
		e.edgeRes.Requests++
		if ideal {
			e.edgeRes.IdealAdmitted++
		}
		if d.Allowed {
			e.edgeRes.Admitted++
			e.edgeWin.add(a.identity, e.now, cost, true)
			e.follow.admitted(in, a.identity)
		}
		return d, mode, true
	}
	if r.edge != nil && !r.edge.up {
		return policy.Decision{}, "agent-down", true
	}
	o, err := r.admit.Check(context.Background(), admission.Request{
		Policy:     e.policy.Name,
		Attributes: e.ids.attrs[a.identity],
		Cost:       a.cost,
	})
	d, mode = o.Decision, string(o.Mode)
	if err != nil {
		if !errors.Is(err, policy.ErrCostExceedsCapacity) {
			e.fail(fmt.Errorf("region %s, identity %s: %w", r.name, e.ids.names[a.identity], err))
			return d, mode, false
		}
		// A cost the policy's limit cannot hold (a trace's, after a config
		// change): the agent refuses it as bad input; counted as rejected.
		d, mode = policy.Decision{}, "refused"
	}
	e.observe(r, a.identity, cost, 0)
	if r.edge != nil {
		// the agent's observer: the direct part of the demand
		r.edge.rounds.ObserveDirect(e.policy.Name, e.ids.names[a.identity], cost)
		e.edgeRes.DirectRequests++
		if d.Allowed {
			e.edgeRes.DirectAdmitted++
			e.edgeWin.add(a.identity, e.now, cost, false)
		}
	}
	return d, mode, true
}

// observe counts cost asked by identity in region r over span (0: a
// check) as its agent's lease meter does (leaser.observe): against the identity's own share where the
// grant gives it one, else the default.
func (e *engine) observe(r *region, id int, cost int64, span time.Duration) {
	if g, _ := r.holder.Grant(); g.Owns(e.ids.names[id]) {
		r.meter.AddOwn(id, cost, span.Milliseconds(), e.now) // its own shares serve it, not the default
	} else {
		r.meter.Add(id, cost, span.Milliseconds(), e.now)
	}
}

func (e *engine) decide(m map[int]policy.State, id int, l policy.Limits, nowMs, cost int64) policy.Decision {
	if l.Validate() != nil || cost > l.Capacity && !l.PostHoc { // a charge after the fact is counted whatever it costs
		return policy.Decision{RetryAfterMs: 1000}
	}
	s, d, err := policy.Apply(m[id], l, nowMs, cost)
	if err != nil {
		return policy.Decision{RetryAfterMs: 1000}
	}
	m[id] = s
	return d
}

// decideStore decides on region r's Redis, as its scripts do: a key the
// store does not hold starts where policy.Fresh says for the store's
// birth marker, which the first check after a loss records.
func (e *engine) decideStore(r *region, id int, l policy.Limits, nowMs, cost int64) policy.Decision {
	if r.bornMs < 0 {
		r.bornMs = max(1, nowMs)
	}
	if _, ok := r.store[id]; !ok && l.Validate() == nil {
		if s := policy.Fresh(l, nowMs, r.bornMs); s.Exists {
			r.store[id] = s
		}
	}
	return e.decide(r.store, id, l, nowMs, cost)
}

func (e *engine) record(mode int, a arrival, allowed, idealAllowed bool, atMs int64) {
	mr := e.res.Modes[mode]
	mr.Requests++
	if allowed {
		mr.Admitted++
		name := mr.Mode
		e.observeWindow(mode, atMs, e.track[name].add(a.identity, atMs, a.cost*policy.Micro))
		e.series.add(mode, a.region, a.identity, atMs, a.cost)
	} else {
		mr.Rejected++
		if idealAllowed {
			mr.RejectedWhileFree++
		}
	}
}

func (e *engine) writeDecision(a arrival, d policy.Decision, mode string) {
	b := e.line[:0]
	b = append(b, `{"t_ms":`...)
	b = strconv.AppendInt(b, e.now, 10)
	b = append(b, `,"region":"`...)
	b = append(b, e.regions[a.region].name...)
	b = append(b, `","identity":"`...)
	b = append(b, e.ids.names[a.identity]...) // escaped: no quotes or backslashes
	b = append(b, `","cost":`...)
	b = strconv.AppendInt(b, a.cost, 10)
	b = append(b, `,"allowed":`...)
	b = strconv.AppendBool(b, d.Allowed)
	b = append(b, `,"retry_after_ms":`...)
	b = strconv.AppendInt(b, d.RetryAfterMs, 10)
	b = append(b, `,"mode":"`...)
	b = append(b, mode...)
	b = append(b, "\"}\n"...)
	e.line = b
	e.out.Write(b)
}

// deployment is the run's deployment as the bound sees it.
func (e *engine) deployment() bound.Deployment {
	return bound.Deployment{
		Regions:       len(e.s.Regions),
		Instances:     1,
		LeaseDuration: e.timing.ValidFor,
		Drift:         e.s.Lease.Drift,
		RedisOutages:  e.outages,
	}
}

// utilization is what m admitted over what the ideal limiter admitted:
// requests, or with conversations the tokens charged.
func (e *engine) utilization(m *ModeResult) float64 {
	best := e.res.Modes[len(e.res.Modes)-1]
	if e.conv != nil && best.Conversations.Tokens > 0 {
		return float64(m.Conversations.Tokens) / float64(best.Conversations.Tokens)
	}
	if best.Admitted > 0 {
		return float64(m.Admitted) / float64(best.Admitted)
	}
	return 0
}

// finish computes the bounds and the summary.
func (e *engine) finish() (*Result, error) {
	s := e.s
	w := time.Duration(s.Window)
	ref := bound.Reference(e.maxPolicy, w)
	for i, m := range e.res.Modes {
		// The headline figures are the worst epoch's: each epoch is judged
		// against its own policy (and its transition against both).
		epochs, overshoot, worst, within, err := e.epochResults(i, boundMode(m.Mode))
		if err != nil {
			return nil, err
		}
		t := e.track[m.Mode]
		m.Limit = ref
		m.Bound = worst
		m.BoundTerms = epochs[len(epochs)-1].BoundTerms // of the policy in force at the end
		m.Epochs = epochs
		m.MaxWindow = policy.Units(t.max)
		m.MaxWindowAtMs = t.maxAtT
		if t.max > 0 {
			m.MaxWindowIdentity = e.ids.names[t.maxID]
		}
		m.MaxOvershoot = overshoot
		m.WithinBound = within
		m.Utilization = e.utilization(m)
	}
	e.res.Modes[0].LeaseMessages = e.leaseMsgs
	if e.edgeRes != nil {
		e.finishEdge(e.res.Modes[0])
		e.res.Edge = e.edgeRes
	}
	e.res.Modes[3].AddedLatencyMs = float64(2 * e.centralDelay)
	e.res.Series = e.series.finish(e, ref, w)
	return e.res, nil
}
