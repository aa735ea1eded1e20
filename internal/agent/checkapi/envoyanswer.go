package checkapi

import (
	"errors"
	"math"
	"strconv"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/quota-lease/quota-lease/admission"
	"github.com/quota-lease/quota-lease/httplimit"
	"github.com/quota-lease/quota-lease/policy"
)

// This file encodes the outcomes of one ShouldRateLimit call as
// envoyproxy/ratelimit answers the same call (at the version pinned in
// the Makefile: src/service/ratelimit.go, shouldRateLimitWorker, and
// src/limiter/base_limiter.go, GetResponseDescriptorStatus), so an Envoy
// moved from it to the agent sees the same answers:
//
//   - a limit's current_limit.name is its configured rate_limit.name, or
//     empty (Answers.EnvoyPolicyNames: the policy's name, always);
//   - a descriptor over its limit reports limit_remaining 0, in shadow
//     mode too (Answers.EnvoyExactCounts: what is left);
//   - duration_until_reset is in whole seconds (rounded up: the original's
//     seconds to the end of the unit's window, on the same aligned windows;
//     Answers.EnvoyExactCounts: to the millisecond);
//   - an unlimited descriptor is OK with limit_remaining 4294967295 and no
//     current_limit;
//   - the agent's --shadow-mode (the original's SHADOW_MODE) leaves the
//     descriptors' codes and turns only the overall code OK;
//   - a descriptor over a limit in quota mode (the descriptor's
//     quota_mode, or Answers.EnvoyQuotaMode for every limit: the original's
//     QUOTA_MODE) is answered OK with its current_limit and
//     limit_remaining and no duration_until_reset, and does not make the
//     call OVER_LIMIT: a soft limit, which only a normal descriptor over
//     its limit turns into OVER_LIMIT;
//   - no headers unless asked: the limit headers of the descriptor the
//     original picks (Answers.EnvoyLimitHeaders), and quota-lease's own
//     retry-after (Answers.EnvoyRetryAfter);
//   - dynamic_metadata only when asked (Answers.EnvoyDynamicMetadata, the
//     original's RESPONSE_DYNAMIC_METADATA): envoyMetadata;
//   - a descriptor returning hits (is_negative_hits, which the original
//     does not serve) is OK: envoyReturnStatus.

// envoyDescriptor is one descriptor's answer and what it adds to the
// call's.
type envoyDescriptor struct {
	st *rlsv3.RateLimitResponse_DescriptorStatus
	// over: the limit rejects it, enforced (the overall code is
	// OVER_LIMIT) unless the agent's global shadow mode admits it.
	over, globalShadow bool
	retryMs            int64
}

// envoyAnswer is the answer to call req whose descriptors had results
// res, matched[i] saying what the configuration says of descriptor i.
func envoyAnswer(
	cfg *Answers,
	req *rlsv3.RateLimitRequest,
	res []admission.Result,
	matched []envoyMatched,
) *rlsv3.RateLimitResponse {
	out := &rlsv3.RateLimitResponse{
		OverallCode: rlsv3.RateLimitResponse_OK,
		Statuses:    make([]*rlsv3.RateLimitResponse_DescriptorStatus, len(res)),
	}
	var retryMs int64 = -1
	// The descriptor whose limit headers are sent: the fewest remaining,
	// the first of equals, unless one is over an enforced limit (the last
	// of those), as the original picks it.
	var closest *rlsv3.RateLimitResponse_DescriptorStatus
	minRemaining := uint32(math.MaxUint32)
	enforced := false
	var quotaViolations []int // descriptors over a limit in quota mode
	for i, r := range res {
		if matched[i].unlimited {
			out.Statuses[i] = &rlsv3.RateLimitResponse_DescriptorStatus{
				Code:           rlsv3.RateLimitResponse_OK,
				LimitRemaining: math.MaxUint32,
			}
			continue
		}
		if matched[i].ret { // never over a limit (envoyreturns.go)
			st := envoyReturnStatus(cfg, r)
			if out.Statuses[i] = st; st.CurrentLimit != nil && st.LimitRemaining < minRemaining {
				closest, minRemaining = st, st.LimitRemaining
			}
			continue
		}
		d := envoyStatus(cfg, r)
		out.Statuses[i] = d.st
		if d.st.CurrentLimit != nil && d.st.LimitRemaining < minRemaining {
			closest, minRemaining = d.st, d.st.LimitRemaining
		}
		if d.st.Code == rlsv3.RateLimitResponse_OVER_LIMIT && (cfg.EnvoyQuotaMode || matched[i].quota) {
			// A soft limit: reported OK, without a reset, and the call
			// stays OK for it (the original's quota mode). The limit
			// headers still read the status as decided.
			quotaViolations = append(quotaViolations, i)
			out.Statuses[i] = &rlsv3.RateLimitResponse_DescriptorStatus{Code: rlsv3.RateLimitResponse_OK,
				CurrentLimit: d.st.CurrentLimit, LimitRemaining: d.st.LimitRemaining}
			continue
		}
		if d.over {
			if d.st.CurrentLimit != nil {
				closest, minRemaining = d.st, 0
			}
			if !d.globalShadow {
				enforced = true
				retryMs = max(retryMs, d.retryMs)
			}
		}
	}
	if enforced {
		out.OverallCode = rlsv3.RateLimitResponse_OVER_LIMIT
	}
	if cfg.EnvoyLimitHeaders && closest != nil {
		out.ResponseHeadersToAdd = append(out.ResponseHeadersToAdd,
			&corev3.HeaderValue{Key: "RateLimit-Limit",
				Value: strconv.FormatUint(uint64(closest.CurrentLimit.RequestsPerUnit), 10)},
			&corev3.HeaderValue{Key: "RateLimit-Remaining",
				Value: strconv.FormatUint(uint64(closest.LimitRemaining), 10)},
			&corev3.HeaderValue{Key: "RateLimit-Reset",
				Value: httplimit.CeilSeconds(closest.DurationUntilReset.AsDuration().Milliseconds())})
	}
	if cfg.EnvoyRetryAfter && retryMs >= 0 {
		out.ResponseHeadersToAdd = append(out.ResponseHeadersToAdd,
			&corev3.HeaderValue{Key: "retry-after", Value: httplimit.RetryAfterSeconds(retryMs)})
	}
	if cfg.EnvoyDynamicMetadata {
		out.DynamicMetadata = envoyMetadata(req, quotaViolations, matched)
	}
	return out
}

// envoyStatus is one decided descriptor's answer.
func envoyStatus(cfg *Answers, r admission.Result) envoyDescriptor {
	ok := &rlsv3.RateLimitResponse_DescriptorStatus{Code: rlsv3.RateLimitResponse_OK}
	overNoLimit := &rlsv3.RateLimitResponse_DescriptorStatus{Code: rlsv3.RateLimitResponse_OVER_LIMIT}
	switch {
	case errors.Is(r.Err, admission.ErrUnknownPolicy), errors.Is(r.Err, policy.ErrInvalidIdentity),
		errors.Is(r.Err, admission.ErrInvalidRequest), errors.Is(r.Err, policy.ErrInvalidCost):
		return envoyDescriptor{st: ok} // unmatched: no limit applies, nothing was charged
	case errors.Is(r.Err, policy.ErrCostExceedsCapacity):
		// More hits than the limit holds can never be admitted.
		return envoyDescriptor{st: overNoLimit, over: true}
	case r.Err != nil:
		// Neither Redis nor the local fallback could decide: the policy's
		// failure mode says which way to fail.
		if r.Outcome.Policy != nil && r.Outcome.Policy.Failure.Mode == policy.FailOpen {
			return envoyDescriptor{st: ok}
		}
		return envoyDescriptor{st: overNoLimit, over: true, retryMs: admission.NoShareRetryMs}
	}
	// Over the limit: rejected, or admitted only by shadow mode.
	over := !r.Allowed || r.Shadow
	remaining := uint32(min(r.RemainingUnits(), int64(math.MaxUint32)))
	reset := durationpb.New(time.Duration(r.ResetAfterMs) * time.Millisecond)
	if !cfg.EnvoyExactCounts {
		if over {
			remaining = 0
		}
		reset = &durationpb.Duration{Seconds: (r.ResetAfterMs + 999) / 1000}
	}
	st := &rlsv3.RateLimitResponse_DescriptorStatus{Code: rlsv3.RateLimitResponse_OK,
		CurrentLimit: envoyLimit(cfg, r.Outcome), LimitRemaining: remaining, DurationUntilReset: reset}
	// The policy's own shadow_mode answers OK; the agent's --shadow-mode
	// only the call (Outcome.Shadow covers both).
	globalShadow := r.Shadow && !r.Policy.ShadowMode
	if !r.Allowed || globalShadow {
		st.Code = rlsv3.RateLimitResponse_OVER_LIMIT
	}
	return envoyDescriptor{
		st:           st,
		over:         over && (!r.Shadow || globalShadow),
		globalShadow: globalShadow,
		retryMs:      r.RetryAfterMs,
	}
}

// envoyUnits are Envoy's units, shortest first.
var envoyUnits = []struct {
	d time.Duration
	u rlsv3.RateLimitResponse_RateLimit_Unit
}{
	{time.Second, rlsv3.RateLimitResponse_RateLimit_SECOND},
	{time.Minute, rlsv3.RateLimitResponse_RateLimit_MINUTE},
	{time.Hour, rlsv3.RateLimitResponse_RateLimit_HOUR},
	{24 * time.Hour, rlsv3.RateLimitResponse_RateLimit_DAY},
	{7 * 24 * time.Hour, rlsv3.RateLimitResponse_RateLimit_WEEK},
	{30 * 24 * time.Hour, rlsv3.RateLimitResponse_RateLimit_MONTH},
	{365 * 24 * time.Hour, rlsv3.RateLimitResponse_RateLimit_YEAR},
}

// EnvoyUnit is how long Envoy's unit u of a limit is (0 for none).
func EnvoyUnit(u rlsv3.RateLimitResponse_RateLimit_Unit) time.Duration {
	for _, e := range envoyUnits {
		if e.u == u {
			return e.d
		}
	}
	return 0
}

// envoyLimit expresses the enforced limit in Envoy's units: the unit equal
// to the policy's period, else the shortest unit in which the limit is a
// whole number of requests, else the shortest in which it is at least one
// (rounded down), so that 5 per 10 s reads 30 per minute, never 0 per
// second. Its name is the configured one (policy.Policy.EnvoyLimitName),
// or with cfg.EnvoyPolicyNames the policy's.
func envoyLimit(cfg *Answers, o admission.Outcome) *rlsv3.RateLimitResponse_RateLimit {
	limit := enforcedLimit(o)
	period := time.Duration(o.Policy.Period)
	name := o.Policy.EnvoyLimitName()
	if cfg.EnvoyPolicyNames {
		name = o.Policy.Name
	}
	perUnit := func(d time.Duration) float64 { return limit * d.Seconds() / period.Seconds() }
	rl := func(v float64, u rlsv3.RateLimitResponse_RateLimit_Unit) *rlsv3.RateLimitResponse_RateLimit {
		return &rlsv3.RateLimitResponse_RateLimit{Name: name, RequestsPerUnit: uint32(min(v, math.MaxUint32)), Unit: u}
	}
	for _, u := range envoyUnits {
		if period == u.d {
			return rl(limit, u.u)
		}
	}
	for _, u := range envoyUnits {
		if v := perUnit(u.d); v >= 1 && v == math.Trunc(v) {
			return rl(v, u.u)
		}
	}
	for _, u := range envoyUnits {
		if v := perUnit(u.d); v >= 1 {
			return rl(math.Floor(v), u.u)
		}
	}
	last := envoyUnits[len(envoyUnits)-1]
	return rl(perUnit(last.d), last.u)
}

// Returned hits (Envoy's is_negative_hits, RateLimitDescriptor field 4:
// "the hits_addend value will be treated as negative", which Envoy sets
// from a rate limit action's hits_addend.is_negative_hits, typically on
// one applied on stream done, so that a request's end gives back what its
// start took). The descriptor's hits_addend, else the request's, is how
// many; 0 means the policy's default cost, as for a charge.
//
// Only a policy that accepts returns (policy.Policy.Returns) takes them
// (admission.Request.Return says what a return frees); a call returning
// hits to any other limit fails whole with INVALID_ARGUMENT, nothing
// charged (ShouldRateLimit). A returning descriptor is answered OK, never
// OVER_LIMIT, in any mode: with its limit and what remains after the
// return when the return was decided, else (unmatched, or dropped because
// Redis could not decide it) OK with no limit.

// envoyReturnStatus is the answer to a descriptor returning hits, decided
// with result r.
func envoyReturnStatus(cfg *Answers, r admission.Result) *rlsv3.RateLimitResponse_DescriptorStatus {
	if r.Err != nil || r.Policy == nil || r.Via != admission.ViaStore && r.Via != admission.ViaReplay {
		return &rlsv3.RateLimitResponse_DescriptorStatus{Code: rlsv3.RateLimitResponse_OK}
	}
	return envoyStatus(cfg, r).st // allowed: OK, its limit, what remains
}
