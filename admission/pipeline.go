// Package admission is the one path a request takes to be admitted or
// refused, whichever entry point asked (HTTP, gRPC, Envoy's rate-limit
// service) and in the simulator too:
//
//  1. prepare: look up the policy, resolve and validate the request once
//     (Resolve), and put it under the limits its region may enforce now:
//     the lease's share, its degraded budget, or nothing (Ticket.Enforce,
//     CheckCapacity);
//  2. decide: from the replay cache (a retried idempotency key), refused
//     outright (no share holds the cost), from the over-limit cache, by
//     the region's store (Redis, or the simulator's model of it), or by the
//     in-process fallback when the store fails or its breaker is open;
//  3. finish: shadow mode, the replay record, and the Observer (metrics,
//     demand).
//
// A check is a batch of one. The package links no I/O library: the store,
// the shares and the clock are given to it.
package admission

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/quota-lease/quota-lease/clock"
	"github.com/quota-lease/quota-lease/lease"
	"github.com/quota-lease/quota-lease/policy"
)

// Policies looks up the policy a request names.
type Policies interface {
	Policy(name string) (*policy.Policy, bool)
}

// Shares says what a region may enforce of each global policy now: the
// amount its lease grants an identity (policy.Limits.Share; its own share
// or the default, lease.Grant.AmountFor) and the mode that comes from, and
// how many live instances of the region enforce it (the local fallback
// takes its part of the share).
type Shares interface {
	Enforce(policy, identity string, now time.Time) (amount int64, mode lease.Mode)
	Instances() int
}

// Store decides tickets on the region's shared state, in order, each as if
// alone, and atomically each. The regional engine is the store on Redis;
// the simulator models it.
type Store interface {
	Decide(ctx context.Context, ts []*Ticket) []Decided
}

// Decided is a store's answer for one ticket: a decision, or why it could
// not decide (the pipeline then falls back, unless IsInputError(Err)).
type Decided struct {
	Decision policy.Decision
	Err      error
}

// Observer is told about every outcome: the agent counts metrics and
// demand with it. Its methods must be quick and safe for concurrent use.
type Observer interface {
	// Observe is called once for every outcome but replayed ones.
	Observe(t Ticket, o Outcome)
	// Replayed is called for an outcome answered from the replay cache.
	Replayed(t Ticket)
	// FellBack is called when the fallback decides t: storeErr is why the
	// store did not (nil when the breaker was open), full that the
	// fallback's table was full and refused t as a new identity.
	FellBack(t Ticket, storeErr error, full bool)
}

// Via names the stage that decided an outcome.
type Via uint8

// The stages, in the order they are tried.
const (
	ViaStore     Via = iota // the region's store
	ViaReplay               // the replay cache: an idempotency key decided before
	ViaNoShare              // refused without asking: the limits in force cannot hold the cost
	ViaOverLimit            // the over-limit cache: a rejection the store gave, still in force
	ViaFallback             // the in-process fallback: the store failed or its breaker is open
)

// Outcome is a decided request.
type Outcome struct {
	policy.Decision
	// Mode it was decided in: leased, degraded, unleased, local-fallback
	// or region.
	Mode lease.Mode
	// Policy decided under.
	Policy *policy.Policy
	// Limits enforced (the share for global policies).
	Limits policy.Limits
	// Shadow: rejected by the limit, allowed by shadow mode.
	Shadow bool
	// Via is the stage that decided it.
	Via Via
	// Reservation names an admitted reservation (Request.Reserve), for
	// its settlement; "" for any other outcome.
	Reservation string
}

// Result is one result of CheckBatch: an outcome or a refused request.
type Result struct {
	Outcome
	Err error
}

// Config configures a Pipeline. Start from DefaultConfig and set Policies,
// Store, Shares and Observer: as everywhere in quota-lease, a zero is a
// value, never a request for the default (a zero timeout is none, a zero
// size turns its cache off).
type Config struct {
	// Policies and Store are required.
	Policies Policies
	Store    Store
	// Shares, when nil, puts every request under its policy's full limits
	// (region mode), as for an engine without leases.
	Shares Shares
	// Observer, when nil, is told nothing.
	Observer Observer
	// Clock reads the time shares, caches and the fallback are measured on;
	// its Now must carry a monotonic reading (time.Now's do), since every
	// deadline is a difference of two of them.
	Clock clock.Clock
	// StoreTimeout bounds one call to the store; past it the fallback
	// decides. 0: no bound. Default 20ms.
	StoreTimeout time.Duration
	// FallbackKeys bounds the fallback's table; 0 keeps none, so a failing
	// store refuses everything. Default 100,000.
	FallbackKeys int
	// BreakerThreshold store failures in a row stop calls to it for
	// BreakerCooldown; 0: no breaker. Defaults 3 and 1s.
	BreakerThreshold int
	BreakerCooldown  time.Duration
	// OverLimitKeys bounds the over-limit cache; 0: no cache. Default
	// 100,000.
	OverLimitKeys int
	// ReplayKeys bounds the replay cache, whose entries live for
	// ReplayWindow; 0: no cache. Defaults 100,000 and 10s.
	ReplayKeys   int
	ReplayWindow time.Duration
	// Shadow admits every request a limit rejects (policy.Policy.ShadowMode
	// for every policy).
	Shadow bool
}

// DefaultConfig returns a Config with every setting at the regional
// agent's default, on the system clock.
func DefaultConfig() Config {
	return Config{
		Clock:            clock.System(),
		StoreTimeout:     20 * time.Millisecond,
		FallbackKeys:     100_000,
		BreakerThreshold: 3,
		BreakerCooldown:  time.Second,
		OverLimitKeys:    100_000,
		ReplayKeys:       100_000,
		ReplayWindow:     10 * time.Second,
	}
}

// ValidateConfig reports every setting of c that cannot work, joined.
func ValidateConfig(c Config) error {
	var errs []error
	if c.Policies == nil || c.Store == nil || c.Clock == nil {
		errs = append(errs, errors.New("policies, store and clock are required"))
	}
	if c.StoreTimeout < 0 || c.BreakerCooldown < 0 || c.ReplayWindow < 0 {
		errs = append(errs, fmt.Errorf("store timeout %s, breaker cooldown %s and replay window %s must not be "+
			"negative", c.StoreTimeout, c.BreakerCooldown, c.ReplayWindow))
	}
	if c.FallbackKeys < 0 || c.BreakerThreshold < 0 || c.OverLimitKeys < 0 || c.ReplayKeys < 0 {
		errs = append(errs, fmt.Errorf("fallback keys %d, breaker threshold %d, over-limit keys %d and replay "+
			"keys %d must not be negative",
			c.FallbackKeys, c.BreakerThreshold, c.OverLimitKeys, c.ReplayKeys))
	}
	if c.ReplayKeys > 0 && c.ReplayWindow == 0 {
		errs = append(errs, errors.New("a replay cache needs a positive replay window"))
	}
	return errors.Join(errs...)
}

// Pipeline decides requests. It is safe for concurrent use.
type Pipeline struct {
	cfg    Config
	start  time.Time // the fallback's clock origin
	fb     *fallback
	br     *breaker   // nil without one
	over   *overLimit // nil without one
	replay *replay    // nil without one
}

// New returns a pipeline.
func New(cfg Config) (*Pipeline, error) {
	if err := ValidateConfig(cfg); err != nil {
		return nil, fmt.Errorf("admission config: %w", err)
	}
	p := &Pipeline{cfg: cfg, start: cfg.Clock.Now(), fb: newFallback(cfg.FallbackKeys)}
	if cfg.BreakerThreshold > 0 {
		p.br = newBreaker(cfg.BreakerThreshold, cfg.BreakerCooldown, cfg.Clock.Now)
	}
	if cfg.OverLimitKeys > 0 {
		p.over = newOverLimit(cfg.OverLimitKeys)
	}
	if cfg.ReplayKeys > 0 {
		p.replay = newReplay(cfg.ReplayWindow, cfg.ReplayKeys)
	}
	return p, nil
}

// BreakerOpen reports whether requests currently bypass the store.
func (p *Pipeline) BreakerOpen() bool { return p.br != nil && p.br.isOpen() }

// BreakerOpened is signalled when the breaker in front of the store opens
// (nil without one, which never opens): a prober waits on it instead of
// polling BreakerOpen.
func (p *Pipeline) BreakerOpened() <-chan struct{} {
	if p.br == nil {
		return nil
	}
	return p.br.opened
}

// ProbeStore lets the caller probe the store while the breaker is open, so
// that the breaker closes when the store answers again although no request
// comes to probe it: an idle agent, or one its load balancer stopped
// sending to because it reported itself unready. When the breaker is open,
// its cooldown has passed and no request is probing, ping is called (within
// StoreTimeout, as a request would be) in the half-open slot a request
// would take: its success closes the breaker, its failure keeps it open for
// another cooldown. probed reports whether ping was called, err what it
// returned.
func (p *Pipeline) ProbeStore(ctx context.Context, ping func(context.Context) error) (probed bool, err error) {
	if p.br == nil || !p.br.probe() {
		return false, nil
	}
	if p.cfg.StoreTimeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, p.cfg.StoreTimeout)
		defer cancel()
	}
	err = ping(ctx)
	if err != nil && errors.Is(ctx.Err(), context.Canceled) {
		p.br.release() // the caller gave up (shutting down): that proves nothing
		return true, err
	}
	p.br.result(err == nil)
	return true, err
}

// Check decides one request: a batch of one.
func (p *Pipeline) Check(ctx context.Context, r Request) (Outcome, error) {
	var out [1]Result
	p.run(ctx, []Request{r}, out[:])
	return out[0].Outcome, out[0].Err
}

// CheckBatch decides many requests, those the store decides in one call.
// Results are in order; a refused request has Err set.
func (p *Pipeline) CheckBatch(ctx context.Context, rs []Request) []Result {
	out := make([]Result, len(rs))
	p.run(ctx, rs, out)
	return out
}

// lone holds a single request's ticket on its way to the store, in one
// allocation.
type lone struct {
	t    [1]Ticket
	send [1]*Ticket
	idx  [1]int
}

// run decides rs into out.
func (p *Pipeline) run(ctx context.Context, rs []Request, out []Result) {
	if refuseOwnLimits(rs, out) || p.refuseReturns(rs, out) {
		return
	}
	now := p.cfg.Clock.Now()
	if len(rs) == 1 { // a check: nothing allocated unless it goes to the store
		var t Ticket
		if p.settle(rs[0], &t, now, &out[0]) {
			l := &lone{t: [1]Ticket{t}}
			l.send[0] = &l.t[0]
			p.decide(ctx, l.send[:], l.idx[:], out)
		}
		return
	}
	ts := make([]Ticket, len(rs))
	var send []*Ticket
	var idx []int
	for i, r := range rs {
		if p.settle(r, &ts[i], now, &out[i]) {
			send = append(send, &ts[i])
			idx = append(idx, i)
		}
	}
	if len(send) > 0 {
		p.decide(ctx, send, idx, out)
	}
}

// settle prepares r into t and answers it into out if it can without the
// store (refused, or early); it reports whether t still needs the store.
func (p *Pipeline) settle(r Request, t *Ticket, now time.Time, out *Result) bool {
	var err error
	if *t, err = p.prepare(r, now); err != nil {
		out.Err = err
		return false
	}
	if o, ok := p.early(t, now); ok {
		out.Outcome = o
		return false
	}
	return true
}

// prepare resolves r and puts it under the limits its region may enforce
// at now.
func (p *Pipeline) prepare(r Request, now time.Time) (Ticket, error) {
	pol, ok := p.cfg.Policies.Policy(r.Policy)
	if !ok {
		return Ticket{}, fmt.Errorf("%w %q", ErrUnknownPolicy, r.Policy)
	}
	if r.Limit != nil {
		return p.prepareOwn(pol, r, now)
	}
	t, err := Resolve(pol, r, pol.Limits())
	if err != nil || pol.Scope == policy.ScopeRegion || p.cfg.Shares == nil {
		return t, err
	}
	t.Enforce(p.cfg.Shares.Enforce(pol.Name, t.Identity, now))
	return t, nil
}

// early answers t without the store when it can: a replayed key, no
// share, or a rejection still in force.
func (p *Pipeline) early(t *Ticket, now time.Time) (Outcome, bool) {
	if t.replayKey != "" && p.replay != nil {
		if o, ok := p.replay.get(t.replayKey, now); ok {
			p.observeReplay(t)
			o.Via = ViaReplay
			return o, true
		}
	}
	if t.noShare && t.Return {
		return p.dropReturn(t, t.Mode, ViaNoShare), true
	}
	if t.noShare {
		return p.finish(t, policy.Decision{RetryAfterMs: NoShareRetryMs}, t.Mode, ViaNoShare), true
	}
	if p.over != nil && t.cachesRejections() {
		if d, ok := p.over.get(t.tableKey(), t.Limits, t.Cost*policy.Micro, now); ok {
			return p.finish(t, d, t.Mode, ViaOverLimit), true
		}
	}
	return Outcome{}, false
}

// decide asks the store about ts (out[idx[j]] is ts[j]'s result), and
// the fallback about those it could not decide.
func (p *Pipeline) decide(ctx context.Context, ts []*Ticket, idx []int, out []Result) {
	if p.br != nil && !p.br.allow() {
		for j, t := range ts {
			out[idx[j]].Outcome, out[idx[j]].Err = p.fallback(t, nil)
		}
		return
	}
	sctx, cancel := ctx, context.CancelFunc(nil)
	if p.cfg.StoreTimeout > 0 {
		sctx, cancel = context.WithTimeout(ctx, p.cfg.StoreTimeout)
	}
	sent := p.cfg.Clock.Now()
	res := p.cfg.Store.Decide(sctx, ts)
	if cancel != nil {
		cancel()
	}
	failed, asked := false, false
	for j, r := range res {
		t, o := ts[j], &out[idx[j]]
		asked = asked || !IsInputError(r.Err)
		switch {
		case r.Err == nil:
			if p.over != nil && t.cachesRejections() && !r.Decision.Allowed {
				p.over.put(t.tableKey(), t.Limits, t.Cost*policy.Micro, r.Decision, sent)
			}
			o.Outcome = p.finish(t, r.Decision, t.Mode, ViaStore)
		case IsInputError(r.Err):
			o.Err = r.Err
		default:
			failed = true
			o.Outcome, o.Err = p.fallback(t, r.Err)
		}
	}
	switch {
	case p.br == nil:
	case asked:
		p.br.result(!failed)
	default: // the store refused every ticket before asking: it proved nothing
		p.br.release()
	}
}

// fallback decides t in-process on the region's share divided among its
// live instances. storeErr is why the store did not decide it (nil when
// the breaker is open): after a timeout the store may still have decided,
// so the request may be charged twice (never admitted twice).
func (p *Pipeline) fallback(t *Ticket, storeErr error) (Outcome, error) {
	if t.Return { // the fallback takes no returns (returns.go)
		p.observeFallback(t, storeErr, false)
		return p.dropReturn(t, lease.ModeLocalFallback, ViaFallback), nil
	}
	if t.Estimate > 0 && t.Charged() == 0 { // a settlement with nothing to charge, and nothing here to give back to
		p.observeFallback(t, storeErr, false)
		return p.finish(t, policy.Decision{Allowed: true}, lease.ModeLocalFallback, ViaFallback), nil
	}
	n := int64(1)
	if p.cfg.Shares != nil {
		n = int64(max(1, p.cfg.Shares.Instances()))
	}
	l := t.Limits.Scale(1, n)
	if holds(l, t.Charged()) != nil {
		p.observeFallback(t, storeErr, false)
		return p.finish(t, policy.Decision{RetryAfterMs: NoShareRetryMs}, lease.ModeLocalFallback, ViaFallback), nil
	}
	now := p.cfg.Clock.Now()
	nowMs := now.Sub(p.start).Milliseconds() + 1_000_000 // monotonic, never negative
	// A settlement charges only its excess here: the fallback holds no
	// reservation to give back to.
	d, full, err := p.fb.decide(t.tableKey(), l, t.Policy.Failure.FallbackStart, nowMs, t.Charged()*policy.Micro)
	p.observeFallback(t, storeErr, full)
	if err != nil {
		return Outcome{Policy: t.Policy}, fmt.Errorf("local fallback: %w", err)
	}
	return p.finish(t, d, lease.ModeLocalFallback, ViaFallback), nil
}

// finish applies shadow mode, records a keyed outcome for replay, tells
// the observer and returns the outcome.
func (p *Pipeline) finish(t *Ticket, d policy.Decision, mode lease.Mode, via Via) Outcome {
	shadow := !d.Allowed && (t.Policy.ShadowMode || p.cfg.Shadow)
	if shadow { // would have been rejected: admitted, and counted as such
		d.Allowed, d.RetryAfterMs = true, 0
	}
	o := Outcome{Decision: d, Mode: mode, Policy: t.Policy, Limits: t.Limits, Shadow: shadow, Via: via}
	if d.Allowed {
		o.Reservation = t.Reservation()
	}
	if t.replayKey != "" && p.replay != nil {
		p.replay.put(t.replayKey, o, p.cfg.Clock.Now())
	}
	if p.cfg.Observer != nil {
		p.cfg.Observer.Observe(*t, o)
	}
	return o
}

func (p *Pipeline) observeReplay(t *Ticket) {
	if p.cfg.Observer != nil {
		p.cfg.Observer.Replayed(*t)
	}
}

func (p *Pipeline) observeFallback(t *Ticket, storeErr error, full bool) {
	if p.cfg.Observer != nil {
		p.cfg.Observer.FellBack(*t, storeErr, full)
	}
}
