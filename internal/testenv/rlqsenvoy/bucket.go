package rlqsenvoy

import (
	"time"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
)

// bucket is one entry of Envoy's bucket cache (quota_bucket_cache.h,
// CachedBucket), with its timers kept as deadlines on the monotonic clock.
type bucket struct {
	id  *rlqsv3.BucketId
	set *settings

	// Usage since the last report (QuotaUsage).
	allowed, denied uint64
	lastReport      time.Duration

	// action is the cached action's strategy: an assignment (assigned) or
	// the expired-assignment fallback; nil means the default action
	// (no_assignment_behavior).
	action   *typev3.RateLimitStrategy
	assigned bool
	// expires is when action ends: the assignment's TTL or the fallback's
	// timeout, counted from when it began.
	expires time.Duration
	// limiter is the token bucket of a token-bucket action, else nil.
	limiter *tokenBucket
	// assignedOnce: the server has assigned the bucket since it was
	// created (for Instance.FirstAssignments).
	assignedOnce bool
}

func seconds(d time.Duration) float64 { return d.Seconds() }

// settle applies, in order and each at the instant it fell due, the timer
// events Envoy would have run by now: an expired assignment moves to the
// fallback (onActionExpirationTimer) or to the default action; an expired
// fallback moves to the default action (onFallbackExpirationTimer).
func (b *bucket) settle(now time.Duration) {
	for range 2 { // an assignment, then its fallback: at most two events
		if b.action == nil || now < b.expires {
			return
		}
		at := b.expires
		if !b.assigned || b.set.fallback == nil {
			b.action, b.assigned, b.limiter = nil, false, nil
			continue
		}
		fb := b.set.fallback
		var lim *tokenBucket
		if tb := fb.GetTokenBucket(); tb != nil {
			lim = b.limiterFor(tb, at)
		}
		b.action, b.assigned, b.expires, b.limiter = fb, false, at+b.set.fallbackFor, lim
	}
}

// limiterFor is the limiter a token-bucket strategy tb gets at instant at:
// the current one when the current action is a token bucket of the same
// configuration (shouldReplaceTokenBucket false), else a new one started
// from the current one's fill ratio, or full when there is none.
func (b *bucket) limiterFor(tb *typev3.TokenBucket, at time.Duration) *tokenBucket {
	if cur := b.action.GetTokenBucket(); cur != nil && b.limiter != nil && sameConfig(tb, cur) {
		return b.limiter
	}
	return newTokenBucket(tb, seconds(at), b.limiter)
}

// assign applies a quota assignment received at now (onQuotaResponseImpl)
// and says whether it was applied. requests_per_time_unit and an unset
// strategy are ignored: the bucket keeps its action and its deadline.
func (b *bucket) assign(qa *rlqsv3.RateLimitQuotaResponse_BucketAction_QuotaAssignmentAction, now time.Duration) bool {
	s := qa.GetRateLimitStrategy()
	var lim *tokenBucket
	switch x := s.GetStrategy().(type) {
	case *typev3.RateLimitStrategy_BlanketRule_:
	case *typev3.RateLimitStrategy_TokenBucket:
		lim = b.limiterFor(x.TokenBucket, now)
	default:
		return false
	}
	b.action, b.assigned, b.expires, b.limiter = s, true, now+ttl(qa.GetAssignmentTimeToLive()), lim
	return true
}

// assignNothing applies a BucketAction with neither an assignment nor an
// abandon: Envoy caches it as an action without a strategy, which allows
// all and, its TTL reading as zero, expires at once.
func (b *bucket) assignNothing(now time.Duration) {
	b.action, b.assigned, b.expires, b.limiter = &typev3.RateLimitStrategy{}, true, now, nil
}

// ttl is startActionExpirationTimer's duration: the whole seconds of
// assignment_time_to_live; unset, sub-second or negative is zero.
func ttl(d *durationpb.Duration) time.Duration {
	return time.Duration(max(d.GetSeconds(), 0)) * time.Second
}

// allow decides one request of a known bucket (shouldAllowRequest).
func (b *bucket) allow(now time.Duration) bool {
	s := b.action
	if s == nil {
		s = b.set.noAssignment
	}
	switch x := s.GetStrategy().(type) {
	case *typev3.RateLimitStrategy_BlanketRule_:
		return x.BlanketRule != typev3.RateLimitStrategy_DENY_ALL
	case *typev3.RateLimitStrategy_TokenBucket:
		if b.limiter == nil { // only a default-action token bucket, which parseSettings refuses
			return true
		}
		return b.limiter.consume(seconds(now))
	default: // requests_per_time_unit ("not yet supported") and unset allow all
		return true
	}
}

// count adds one decided request to the usage since the last report.
func (b *bucket) count(allowed bool) {
	if allowed {
		b.allowed++
	} else {
		b.denied++
	}
}

// usage is getUsageFromBucket: the counts since the last report, then
// reset, and the time since it in whole seconds.
func (b *bucket) usage(now time.Duration) *rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage {
	u := &rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{
		BucketId:           proto.Clone(b.id).(*rlqsv3.BucketId),
		TimeElapsed:        &durationpb.Duration{Seconds: int64((now - b.lastReport) / time.Second)},
		NumRequestsAllowed: b.allowed,
		NumRequestsDenied:  b.denied,
	}
	b.allowed, b.denied, b.lastReport = 0, 0, now
	return u
}
