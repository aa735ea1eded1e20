package bound

import (
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/quota-lease/quota-lease/policy"
)

// Mode is the way regions share a limit.
type Mode string

// The modes bound compares.
const (
	// Leased is quota-lease: shares of the global limit on leases.
	Leased Mode = "leased"
	// Independent gives every region the full limit, with no coordination.
	Independent Mode = "independent"
	// Static splits the limit into fixed shares by weight, forever.
	Static Mode = "static"
	// Central checks every request against one strongly consistent counter.
	Central Mode = "central"
)

// The names of the terms of a bound.
const (
	TermReference       = "reference"
	TermDrift           = "drift"
	TermDegraded        = "degraded"
	TermFallback        = "fallback"
	TermBurst           = "burst"
	TermLeaseTransition = "lease-transition"
	TermIndependent     = "independent"
	TermPreviousLimit   = "previous-limit"
	TermStoreLag        = "store-lag"
	TermShards          = "shards"
	TermWindowClock     = "window-clock"
	TermReturned        = "returned"
	TermEdge            = "edge"
	TermPostHoc         = "post-hoc"
)

// Deployment are the parameters of a deployment that enter the bound.
type Deployment struct {
	// Regions enforcing the policy; at least 1.
	Regions int
	// Instances is the number of agent instances per region; at least 1.
	Instances int
	// LeaseDuration is how long a grant holds.
	LeaseDuration time.Duration
	// Drift bounds every clock's rate error (e.g. 1e-4).
	Drift float64
	// FallbackFraction is the share of its region's share each agent
	// instance's in-process fallback bucket enforces when Redis is down; 0
	// means 1/Instances (the region's share split among its instances). A
	// negative value means no fallback (fail closed on Redis outage).
	FallbackFraction float64
	// RedisOutages: whether Redis outages (fallback) are part of the worst
	// case.
	RedisOutages bool
	// ConfigChanges under a new version within one window (each starts
	// every key full).
	ConfigChanges int
	// QuotaDecrease is how much (units per period) the limit was lowered
	// within the last lease duration.
	QuotaDecrease float64
	// PolicyDelay is how long after a change an agent may still enforce
	// the previous policy: until its next renewal brings a grant of the
	// new one (the renewal interval) plus the reload (at most a second).
	// Zero where agents learn a change at once (the simulator).
	PolicyDelay time.Duration
	// StoreLag is how much of its most recent writes, in time, a region's
	// Redis may lose when it fails over to a replica (the replication lag
	// it tolerates). Zero where a store either keeps its writes or loses
	// them all: a store restarted empty is caught by its birth marker
	// (policy.Fresh) and needs no term.
	StoreLag time.Duration
	// ClockStep is the most a region's Redis clock may step back within
	// one window (a wall-clock correction made by stepping, not slewing).
	// A fixed window's counters take the window from the Redis clock, and
	// an agent never goes back behind the latest time it decided at, but
	// agents that did not see the step do: the window-clock term. Zero
	// where Redis hosts slew their clocks (chrony's and ntpd's default
	// after boot).
	ClockStep time.Duration
	// Shares are the static split's fractions by region (Static mode, and
	// for stranded capacity); empty means equal shares.
	Shares []float64
}

// Result is a bound with its terms.
type Result struct {
	Mode Mode
	// Window is the length of the windows the bound is over.
	Window time.Duration
	// Limit is the reference: what one ideal global limiter admits at
	// most in any such window.
	Limit float64
	// WorstCase is the most the whole system can admit in any window.
	WorstCase float64
	// Overshoot is WorstCase - Limit, and Ratio is Overshoot / Limit.
	Overshoot, Ratio float64
	// Terms name the parts of WorstCase beyond Limit (and Limit itself as
	// "reference"); they add up to WorstCase.
	Terms map[string]float64
	// Stranded is the capacity (units per period) a quiet region holds
	// that busy regions cannot use.
	Stranded float64
}

// ErrInvalid is wrapped by every parameter error.
var ErrInvalid = errors.New("invalid bound parameters")

// Reference is the most one global limiter under p admits in any window
// of length w.
func Reference(p *policy.Policy, w time.Duration) float64 {
	period := time.Duration(p.Period).Seconds()
	n := math.Ceil(w.Seconds() / period)
	switch p.Algorithm {
	case policy.TokenBucket:
		return p.Burst + p.Limit/period*w.Seconds()
	case policy.SlidingLog:
		return p.Limit * n
	default: // fixed and sliding windows: a boundary inside w lets one more window through
		return p.Limit * (n + 1)
	}
}

// Compute returns the bound of policy p in deployment d under mode m, over
// windows of length w (0 means the policy's period).
func Compute(p *policy.Policy, d Deployment, m Mode, w time.Duration) (Result, error) {
	if err := d.validate(); err != nil {
		return Result{}, err
	}
	if w == 0 {
		w = time.Duration(p.Period)
	}
	if w <= 0 {
		return Result{}, fmt.Errorf("%w: window %s", ErrInvalid, w)
	}
	ref := Reference(p, w)
	r := Result{Mode: m, Window: w, Limit: ref, Terms: map[string]float64{TermReference: ref}}
	period := time.Duration(p.Period).Seconds()
	rateW := p.Limit / period * w.Seconds() // what refill (or windows) adds over w
	burst := ref - rateW                    // the part of the reference that is stored capacity
	if p.Algorithm != policy.TokenBucket {
		burst = p.Limit
	}
	n := float64(d.Regions)
	shares := d.shares()
	switch m {
	case Independent:
		r.Terms[TermIndependent] = (n - 1) * ref
	case Central:
		// One counter: exactly the reference.
	case Static:
		r.Terms[TermDrift] = d.Drift * rateW
		r.Stranded = maxOf(shares) * p.Limit
	case Leased:
		if err := leasedTerms(&r, p, d, w); err != nil {
			return Result{}, err
		}
	default:
		return Result{}, fmt.Errorf("%w: unknown mode %q", ErrInvalid, m)
	}
	if p.Returns {
		// A policy that accepts returns counts a returned unit as never
		// admitted (policy.Return frees no more than a replay without
		// the returned request would have left), so every term bounds
		// the units admitted and not returned; admissions themselves may
		// exceed the worst case by the units returned in the window. The
		// term is named, and 0, so that the bound says what it counts.
		r.Terms[TermReturned] = 0
	}
	if p.PostHoc {
		counters := d.Regions // each region's key crosses its share on its own
		if m == Central {
			counters = 1
		}
		if m == Leased && d.RedisOutages && d.FallbackFraction >= 0 {
			counters += d.Regions * d.Instances // and so does each instance's local fallback
		}
		if m == Leased {
			counters *= int(p.ShardCount()) // every shard of an identity is a key of its own
		}
		r.Terms[TermPostHoc] = PostHoc(p, counters, w)
	}
	if d.ConfigChanges > 0 {
		// A new version starts every key full: one burst per counter that
		// enforces the limit on its own (each region's, when independent or
		// region-scoped; a static split's shares add up to one burst).
		counters := 1.0
		if m == Independent || m == Leased && p.Scope == policy.ScopeRegion {
			counters = n
		}
		r.Terms[TermBurst] = float64(d.ConfigChanges) * counters * burst
	}
	for _, v := range r.Terms {
		r.WorstCase += v
	}
	r.Overshoot = r.WorstCase - r.Limit
	if r.Limit > 0 {
		r.Ratio = r.Overshoot / r.Limit
	}
	return r, nil
}

// leasedTerms adds to r, of policy p leased to d's regions over windows
// of length w, the terms of the leased mode beyond the reference, and the
// capacity a quiet region strands.
func leasedTerms(r *Result, p *policy.Policy, d Deployment, w time.Duration) error {
	ref, n := r.Limit, float64(d.Regions)
	period := time.Duration(p.Period).Seconds()
	rateW := p.Limit / period * w.Seconds()
	if p.Scope == policy.ScopeRegion {
		r.Terms[TermIndependent] = (n - 1) * ref // region-local by design
	} else {
		r.Terms[TermDrift] = d.Drift * rateW
		if p.Failure.Mode == policy.FailOpen && d.Regions > 1 {
			// Up to n-1 regions lapse, each admitting its open fraction
			// of the full limit, while the connected one is granted the
			// whole quota (their shares were freed at expiry).
			r.Terms[TermDegraded] = (n - 1) * p.Failure.OpenFraction * ref
		}
		if d.QuotaDecrease > 0 {
			r.Terms[TermLeaseTransition] = d.QuotaDecrease / period *
				math.Min((d.LeaseDuration+d.PolicyDelay).Seconds(), w.Seconds())
		}
	}
	if d.RedisOutages && d.FallbackFraction >= 0 {
		k := float64(d.Instances)
		phi := d.FallbackFraction
		if phi == 0 {
			phi = 1 / k
		}
		// Each instance's fallback is a limiter of its own at phi of
		// what its region's Redis bucket enforces at every instant,
		// never reset (policy.LocalBudget): over any window the k
		// instances of all regions admit at most k*phi times what the
		// Redis path can, however often Redis fails and recovers.
		redisPath := 0.0
		for _, v := range r.Terms {
			redisPath += v
		}
		r.Terms[TermFallback] = k * phi * redisPath
	}
	if p.ShardCount() > 1 {
		// Shards split what a region enforces for an identity into
		// parts rounded down (policy.ShardLimits): each part admits at
		// most its capacity plus its refill in any window, and the
		// parts add up to no more than the whole, so splitting admits
		// nothing beyond what one key would. The term is named, and 0,
		// so that the bound says it was counted.
		r.Terms[TermShards] = 0
	}
	if p.Algorithm == policy.FixedWindow {
		// An agent charges a fixed window's counter from its estimate
		// of the Redis clock, but the charge stands only if the Redis
		// clock read before and after it lies in that window (regional
		// package, window.go): the estimate's error costs a round trip,
		// never an admission, and the term is 0. A Redis clock stepped
		// back by S lets agents that did not see the step count in
		// windows the others have left: at any instant the windows in
		// use lie within S of each other, so a span W meets at most
		// ceil((W+S)/P) + 1 of them, where the reference counts
		// ceil(W/P) + 1. Each region steps on its own: a region-scoped
		// policy's regions each enforce the whole limit.
		regions := 1.0
		if p.Scope == policy.ScopeRegion {
			regions = n
		}
		r.Terms[TermWindowClock] = regions * p.Limit *
			(math.Ceil((w+d.ClockStep).Seconds()/period) - math.Ceil(w.Seconds()/period))
	}
	if d.StoreLag > 0 {
		// A failover to a replica StoreLag behind forgets what the
		// Redis path admitted in that time, which it may then admit
		// again: at most the Redis path's worst case over StoreLag
		// (one failover per region per window, all regions at once).
		dl := d
		dl.StoreLag, dl.RedisOutages, dl.ConfigChanges, dl.QuotaDecrease = 0, false, 0, 0
		rl, err := Compute(p, dl, Leased, min(d.StoreLag, w))
		if err != nil {
			return err
		}
		r.Terms[TermStoreLag] = rl.WorstCase - rl.Terms[TermEdge] // Envoy's fallback is no Redis path
	}
	// A quiet region keeps its floor: the static share it falls back to
	// and any explicit floor.
	floor := 0.0
	if p.Failure.Mode == policy.StaticShare || p.Failure.Mode == policy.LastLease {
		floor = p.Failure.StaticFraction * p.Limit
	}
	for _, f := range p.Floors {
		floor = math.Max(floor, f)
	}
	r.Stranded = floor
	if e := p.Edge; e != nil && p.Scope == policy.ScopeGlobal {
		// Envoy instances without an assignment (before the first, or
		// once one expired) follow their own fallback, which no
		// reservation covers: per region, every instance the policy
		// expects, each on its own (+Inf when the fallback allows all).
		// Assignments themselves stay within the region's share and add
		// nothing (package edge).
		r.Terms[TermEdge] = n * float64(e.Instances) * e.FallbackWorstCase(w) * float64(p.Cost)
	}
	return nil
}

// PostHoc is the post-hoc term over windows of length w of a policy that
// takes charges after the fact (policy.Policy.PostHoc), enforced on
// counters keys of each identity (one per region, or one central counter).
// Every request a check admitted while its counter was within its limit is
// charged when it ends, whether or not its cost still fits: a counter ends
// a window at most at its limit, as of its last admitted check, plus what
// was in flight then, at most MaxInFlight requests of at most MaxCost
// each. The counters reach that point at different times, so each can be
// over by the whole of it (the identity's requests may move between
// regions). It happens once per counter window: per fixed (or sliding)
// window, ceil(w/P)+1 of which meet a span w; per period of a sliding log,
// ceil(w/P); once for a token bucket, whose debt holds every later check
// until it is repaid. +Inf when the policy does not declare both: nothing
// then bounds what is charged.
func PostHoc(p *policy.Policy, counters int, w time.Duration) float64 {
	if !p.PostHoc {
		return 0
	}
	if p.MaxCost == 0 || p.MaxInFlight == 0 {
		return math.Inf(1)
	}
	windows := 1.0
	if n := math.Ceil(w.Seconds() / time.Duration(p.Period).Seconds()); p.Algorithm == policy.SlidingLog {
		windows = n
	} else if p.Algorithm != policy.TokenBucket {
		windows = n + 1
	}
	return float64(counters) * windows * float64(p.MaxInFlight) * float64(p.MaxCost)
}

// TransitionSpan is how long after a change of policy windows can still
// hold the previous policy's admissions or grants: a window reaching back
// before the change (w), grants of the previous total living out their
// lease, and agents not yet reloaded.
func TransitionSpan(d Deployment, w time.Duration) time.Duration {
	return w + d.LeaseDuration + d.PolicyDelay
}

// Transition bounds the windows ending within TransitionSpan after the
// policy changed from prev to next (with version bumped or not): next's
// bound with the lowered limit's lease-transition term and, if bumped,
// one fresh burst; plus a "previous-limit" term, what prev's bound exceeds
// next's by, since such a window reaches back before the change.
func Transition(prev, next *policy.Policy, bumped bool, d Deployment, m Mode, w time.Duration) (Result, error) {
	dn := d
	dn.QuotaDecrease = math.Max(0, prev.Limit-next.Limit)
	if bumped {
		dn.ConfigChanges++
	}
	r, err := Compute(next, dn, m, w)
	if err != nil {
		return Result{}, err
	}
	rp, err := Compute(prev, d, m, w)
	if err != nil {
		return Result{}, err
	}
	rn, err := Compute(next, d, m, w)
	if err != nil {
		return Result{}, err
	}
	if extra := rp.WorstCase - rn.WorstCase; extra > 0 {
		r.Terms[TermPreviousLimit] = extra
		r.WorstCase += extra
	}
	// The reference of a window straddling the change: what one ideal
	// limiter changing its limits at that moment may admit.
	r.Limit = math.Max(rp.Limit, rn.Limit)
	r.Overshoot = r.WorstCase - r.Limit
	if r.Limit > 0 {
		r.Ratio = r.Overshoot / r.Limit
	}
	return r, nil
}

func (d Deployment) validate() error {
	switch {
	case d.Regions < 1:
		return fmt.Errorf("%w: regions must be at least 1, got %d", ErrInvalid, d.Regions)
	case d.Instances < 1:
		return fmt.Errorf("%w: instances per region must be at least 1, got %d", ErrInvalid, d.Instances)
	case math.IsNaN(d.Drift) || d.Drift < 0 || d.Drift >= 0.01:
		return fmt.Errorf("%w: drift must be in [0, 0.01), got %v", ErrInvalid, d.Drift)
	case math.IsNaN(d.FallbackFraction) || d.FallbackFraction > 1:
		return fmt.Errorf("%w: fallback fraction must be at most 1, got %v", ErrInvalid, d.FallbackFraction)
	case d.ConfigChanges < 0 || d.QuotaDecrease < 0 || math.IsNaN(d.QuotaDecrease) ||
		d.PolicyDelay < 0 || d.StoreLag < 0 || d.ClockStep < 0:
		return fmt.Errorf("%w: config changes, quota decrease, policy delay, store lag and clock step must not "+
			"be negative", ErrInvalid)
	case len(d.Shares) > 0 && len(d.Shares) != d.Regions:
		return fmt.Errorf("%w: %d shares for %d regions", ErrInvalid, len(d.Shares), d.Regions)
	}
	var sum float64
	for _, s := range d.Shares {
		if math.IsNaN(s) || s < 0 {
			return fmt.Errorf("%w: share %v", ErrInvalid, s)
		}
		sum += s
	}
	if sum > 1+1e-9 {
		return fmt.Errorf("%w: shares sum to %v, more than 1", ErrInvalid, sum)
	}
	return nil
}

func (d Deployment) shares() []float64 {
	if len(d.Shares) > 0 {
		return d.Shares
	}
	out := make([]float64, d.Regions)
	for i := range out {
		out[i] = 1 / float64(d.Regions)
	}
	return out
}

func maxOf(v []float64) float64 {
	m := 0.0
	for _, x := range v {
		m = math.Max(m, x)
	}
	return m
}
