package envoy

import "time"

// Bucket is one entry of Envoy's bucket cache (quota_bucket_cache.h,
// CachedBucket), with its timers kept as deadlines on the monotonic clock.
// Not safe for concurrent use.
type Bucket struct {
	set *Settings

	// Usage since the last report (QuotaUsage).
	allowed, denied uint64
	lastReport      time.Duration

	// action is the cached action's strategy: an assignment (assigned) or
	// the expired-assignment fallback; nil means the default action.
	action   *Strategy
	assigned bool
	// expires is when action ends: the assignment's time to live or the
	// fallback's timeout, counted from when it began.
	expires time.Duration
	// limiter is the token bucket of a token-bucket action, else nil.
	limiter *limiter
}

// New is a bucket created at now (createBucketImpl), with the settings its
// requests matched. Its first request is decided by set.FirstAllowed and
// counted by the caller.
func New(set *Settings, now time.Duration) *Bucket {
	return &Bucket{set: set, lastReport: now}
}

// Phase is where a bucket's action comes from.
type Phase uint8

// A bucket's phases.
const (
	// Default: no cached action, the no-assignment behaviour decides.
	Default Phase = iota
	// Assigned: the server's assignment, until its time to live ends.
	Assigned
	// Fallback: the expired-assignment fallback, until its timeout.
	Fallback
)

// State is what the bucket holds at the instant of its last Settle.
type State struct {
	Phase    Phase
	Strategy Strategy // the action's (the default action's in Default)
	// Until is when the action ends (Assigned, Fallback).
	Until time.Duration
	// Tokens is what its token bucket holds, if it has one; HasLimiter
	// says whether it does.
	Tokens     float64
	HasLimiter bool
}

// State is b's state at now, after any expiry that fell due.
func (b *Bucket) State(now time.Duration) State {
	b.Settle(now)
	st := State{Strategy: b.set.NoAssignment}
	if b.action != nil {
		st.Phase, st.Strategy, st.Until = Fallback, *b.action, b.expires
		if b.assigned {
			st.Phase = Assigned
		}
	}
	if b.limiter != nil {
		st.Tokens, st.HasLimiter = b.limiter.tokens(now.Seconds()), true
	}
	return st
}

// Settle applies, in order and each at the instant it fell due, the timer
// events Envoy would have run by now: an expired assignment moves to the
// fallback (onActionExpirationTimer) or to the default action; an expired
// fallback moves to the default action (onFallbackExpirationTimer).
func (b *Bucket) Settle(now time.Duration) {
	for range 2 { // an assignment, then its fallback: at most two events
		if b.action == nil || now < b.expires {
			return
		}
		at := b.expires
		if !b.assigned || b.set.Fallback == nil {
			b.action, b.assigned, b.limiter = nil, false, nil
			continue
		}
		fb := *b.set.Fallback
		var lim *limiter
		if fb.Kind == TokenBucket {
			lim = b.limiterFor(fb.Bucket, at)
		}
		b.action, b.assigned, b.expires, b.limiter = &fb, false, at+wholeSeconds(b.set.FallbackFor), lim
	}
}

// limiterFor is the limiter a token bucket c gets at instant at: the
// current one when the current action is a token bucket of the same
// configuration (shouldReplaceTokenBucket false), else a new one started
// from the current one's fill ratio, or full when there is none (or when
// the settings say Envoy predates fill ratios).
func (b *Bucket) limiterFor(c TokenBucketConfig, at time.Duration) *limiter {
	if b.action != nil && b.action.Kind == TokenBucket && b.limiter != nil && sameConfig(c, b.action.Bucket) {
		return b.limiter
	}
	if b.set.StartsFull {
		return newLimiter(c, at.Seconds(), nil)
	}
	return newLimiter(c, at.Seconds(), b.limiter)
}

// Assign applies a quota assignment of s for ttl received at now
// (onQuotaResponseImpl) and says whether it was applied: an
// Unsupported strategy is ignored, the bucket keeping its action and its
// deadline. The time to live counts in whole seconds; under one second the
// assignment expires at once.
func (b *Bucket) Assign(s Strategy, ttl, now time.Duration) bool {
	b.Settle(now)
	var lim *limiter
	switch s.Kind {
	case AllowAll, DenyAll:
	case TokenBucket:
		lim = b.limiterFor(s.Bucket, now)
	default:
		return false
	}
	b.action, b.assigned, b.expires, b.limiter = &s, true, now+wholeSeconds(ttl), lim
	return true
}

// AssignNothing applies a bucket action with neither an assignment nor an
// abandon: Envoy caches it as an action without a strategy, which allows
// all and, its time to live reading as zero, expires at once.
func (b *Bucket) AssignNothing(now time.Duration) {
	b.Settle(now)
	b.action, b.assigned, b.expires, b.limiter = &Strategy{Kind: Unsupported}, true, now, nil
}

// Allow decides one request at now (shouldAllowRequest) and counts it.
func (b *Bucket) Allow(now time.Duration) bool { return b.AllowN(now, 1) }

// AllowN decides a request that costs n units at now and counts it as n
// requests, which is how Envoy would count n requests of one unit: a
// token bucket admits it only with n tokens in it, and then takes them
// all. Envoy's filter only ever asks for one.
func (b *Bucket) AllowN(now time.Duration, n uint64) bool {
	b.Settle(now)
	s := b.action
	if s == nil {
		s = &b.set.NoAssignment
	}
	var ok bool
	switch s.Kind {
	case DenyAll:
	case TokenBucket:
		// A default action's token bucket gets no limiter: Envoy
		// dereferences a null one (settings refuse it); allowed here.
		ok = b.limiter == nil || b.limiter.consume(now.Seconds(), float64(n))
	default: // ALLOW_ALL, requests_per_time_unit and unset allow all
		ok = true
	}
	b.CountN(ok, n)
	return ok
}

// Count adds one decided request to the usage since the last report.
func (b *Bucket) Count(allowed bool) { b.CountN(allowed, 1) }

// CountN adds n decided requests to the usage since the last report.
func (b *Bucket) CountN(allowed bool, n uint64) {
	if allowed {
		b.allowed += n
	} else {
		b.denied += n
	}
}

// Usage is getUsageFromBucket: the counts since the last report, then
// reset, and the time since it in whole seconds (0 on a new bucket's first
// report).
func (b *Bucket) Usage(now time.Duration) (allowed, denied uint64, elapsed time.Duration) {
	allowed, denied, elapsed = b.allowed, b.denied, (now - b.lastReport).Truncate(time.Second)
	b.allowed, b.denied, b.lastReport = 0, 0, now
	return allowed, denied, elapsed
}
