package agent

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"math"
	"strconv"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/quota-lease/quota-lease/admission"
	"github.com/quota-lease/quota-lease/policy"
)

// Envoy's global rate-limit service
// (envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit), with the
// semantics of envoyproxy/ratelimit, so Envoy or any client of that API
// uses the agent unchanged.
//
// Each descriptor is one check. In a domain loaded from an
// envoyproxy/ratelimit configuration (policy.ParseEnvoyConfig) the
// descriptor's entries pick the policy as that service does (envoyIndex),
// and a matched policy replaced by another matched one in the same request
// (replaces) is not applied. Otherwise its entry keyed "policy" (or
// Envoy's generic_key, as set by a generic_key action) names the policy.
// Every other entry is a request attribute named by
// policy.EnvoyAttribute (remote_address is ip). A descriptor's
// hits_addend, else the request's, is the cost (0 means the policy's
// default).
//
// Descriptors are answered one by one, never by failing the call: Envoy
// turns a failed call into "allow" (failure_mode_deny: false), so one odd
// descriptor would switch limiting off for all of them. A descriptor that
// names no known policy, or lacks an attribute its policy counts by, is
// OK with no limit, as envoyproxy/ratelimit answers an unmatched one; a
// value longer than regional.MaxAttributeValueBytes is counted by its
// hash, so a long header cannot bypass its limit. The answer is OVER_LIMIT
// if any descriptor is, with one retry-after, the longest.
type envoyServer struct {
	rlsv3.UnimplementedRateLimitServiceServer
	a *Agent
}

func registerEnvoy(s *grpc.Server, a *Agent) {
	rlsv3.RegisterRateLimitServiceServer(s, &envoyServer{a: a})
}

// envoyValue is an attribute value as the agent counts it: long values by
// their hash (distinct values stay distinct buckets).
func envoyValue(v string) string {
	if len(v) <= policy.MaxAttributeValueBytes {
		return v
	}
	sum := sha256.Sum256([]byte(v))
	return "sha256:" + hex.EncodeToString(sum[:])
}

func (s *envoyServer) ShouldRateLimit(ctx context.Context, req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	if len(req.Descriptors) == 0 || len(req.Descriptors) > MaxBatch {
		// Malformed as a whole (Envoy never sends this); nothing is charged.
		return nil, status.Errorf(codes.InvalidArgument, "a request holds 1-%d descriptors, got %d", MaxBatch, len(req.Descriptors))
	}
	ins := make([]admission.Request, len(req.Descriptors))
	var ix envoyIndex // nil until the policies are loaded: nothing configured
	if p := s.a.envoy.Load(); p != nil {
		ix = *p
	}
	var replaced map[string]bool // made only when a matched limit replaces another
	for i, d := range req.Descriptors {
		in := admission.Request{Attributes: map[string]string{}, Cost: int64(min(req.HitsAddend, math.MaxInt32))}
		if h := d.GetHitsAddend(); h != nil {
			in.Cost = int64(min(h.GetValue(), math.MaxInt32))
		}
		p, configured := ix.match(req.Domain, d.Entries)
		for _, e := range d.Entries {
			if !configured && (e.Key == "policy" || e.Key == "generic_key") {
				in.Policy = e.Value
				continue
			}
			in.Attributes[policy.EnvoyAttribute(e.Key)] = envoyValue(e.Value)
		}
		if configured {
			in.Policy = "" // unmatched unless the configuration has it
			if p != nil && !p.Envoy.Unlimited {
				in.Policy = p.Name
				for _, r := range p.Envoy.Replaces {
					if replaced == nil {
						replaced = map[string]bool{}
					}
					replaced[r] = true
				}
			}
		}
		ins[i] = in
	}
	for i := range ins {
		if replaced[ins[i].Policy] {
			ins[i].Policy = "" // another matched limit replaces it
		}
	}
	res := s.a.CheckBatch(ctx, ins)
	out := &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OK}
	var retryMs int64 = -1
	var closest *rlsv3.RateLimitResponse_DescriptorStatus // the fewest remaining, for the limit headers
	for _, r := range res {
		st, over, retry := envoyStatus(r)
		if over {
			out.OverallCode = rlsv3.RateLimitResponse_OVER_LIMIT
			retryMs = max(retryMs, retry)
		}
		if st.CurrentLimit != nil && (closest == nil || st.LimitRemaining < closest.LimitRemaining) {
			closest = st
		}
		out.Statuses = append(out.Statuses, st)
	}
	if retryMs >= 0 {
		out.ResponseHeadersToAdd = append(out.ResponseHeadersToAdd, &corev3.HeaderValue{Key: "retry-after", Value: retryAfterSeconds(retryMs)})
	}
	if s.a.cfg.EnvoyLimitHeaders && closest != nil {
		out.ResponseHeadersToAdd = append(out.ResponseHeadersToAdd,
			&corev3.HeaderValue{Key: "RateLimit-Limit", Value: strconv.FormatUint(uint64(closest.CurrentLimit.RequestsPerUnit), 10)},
			&corev3.HeaderValue{Key: "RateLimit-Remaining", Value: strconv.FormatUint(uint64(closest.LimitRemaining), 10)},
			&corev3.HeaderValue{Key: "RateLimit-Reset", Value: ceilSeconds(closest.DurationUntilReset.AsDuration().Milliseconds())})
	}
	return out, nil
}

// envoyStatus is one descriptor's answer, whether it is over the limit,
// and its retry delay.
func envoyStatus(r admission.Result) (st *rlsv3.RateLimitResponse_DescriptorStatus, over bool, retryMs int64) {
	ok := &rlsv3.RateLimitResponse_DescriptorStatus{Code: rlsv3.RateLimitResponse_OK}
	switch {
	case errors.Is(r.Err, admission.ErrUnknownPolicy), errors.Is(r.Err, policy.ErrInvalidIdentity),
		errors.Is(r.Err, admission.ErrInvalidRequest), errors.Is(r.Err, policy.ErrInvalidCost):
		return ok, false, 0 // unmatched: no limit applies, nothing was charged
	case errors.Is(r.Err, policy.ErrCostExceedsCapacity):
		// More hits than the limit holds can never be admitted.
		return &rlsv3.RateLimitResponse_DescriptorStatus{Code: rlsv3.RateLimitResponse_OVER_LIMIT}, true, 0
	case r.Err != nil:
		// Neither Redis nor the local fallback could decide: the policy's
		// failure mode says which way to fail.
		if r.Outcome.Policy != nil && r.Outcome.Policy.Failure.Mode == policy.FailOpen {
			return ok, false, 0
		}
		return &rlsv3.RateLimitResponse_DescriptorStatus{Code: rlsv3.RateLimitResponse_OVER_LIMIT}, true, admission.NoShareRetryMs
	}
	st = &rlsv3.RateLimitResponse_DescriptorStatus{Code: rlsv3.RateLimitResponse_OK,
		CurrentLimit:       envoyLimit(r.Outcome),
		LimitRemaining:     uint32(min(r.RemainingUnits(), int64(math.MaxUint32))),
		DurationUntilReset: durationpb.New(time.Duration(r.ResetAfterMs) * time.Millisecond)}
	if !r.Allowed {
		st.Code = rlsv3.RateLimitResponse_OVER_LIMIT
		return st, true, r.RetryAfterMs
	}
	return st, false, 0
}

// envoyUnits are Envoy's units, shortest first.
var envoyUnits = []struct {
	d time.Duration
	u rlsv3.RateLimitResponse_RateLimit_Unit
}{{time.Second, rlsv3.RateLimitResponse_RateLimit_SECOND}, {time.Minute, rlsv3.RateLimitResponse_RateLimit_MINUTE},
	{time.Hour, rlsv3.RateLimitResponse_RateLimit_HOUR}, {24 * time.Hour, rlsv3.RateLimitResponse_RateLimit_DAY},
	{7 * 24 * time.Hour, rlsv3.RateLimitResponse_RateLimit_WEEK}, {30 * 24 * time.Hour, rlsv3.RateLimitResponse_RateLimit_MONTH},
	{365 * 24 * time.Hour, rlsv3.RateLimitResponse_RateLimit_YEAR}}

// envoyLimit expresses the enforced limit in Envoy's units: the unit equal
// to the policy's period, else the shortest unit in which the limit is a
// whole number of requests, else the shortest in which it is at least one
// (rounded down), so that 5 per 10 s reads 30 per minute, never 0 per
// second.
func envoyLimit(o admission.Outcome) *rlsv3.RateLimitResponse_RateLimit {
	limit := enforcedLimit(o)
	period := time.Duration(o.Policy.Period)
	perUnit := func(d time.Duration) float64 { return limit * d.Seconds() / period.Seconds() }
	rl := func(v float64, u rlsv3.RateLimitResponse_RateLimit_Unit) *rlsv3.RateLimitResponse_RateLimit {
		return &rlsv3.RateLimitResponse_RateLimit{Name: o.Policy.Name, RequestsPerUnit: uint32(min(v, math.MaxUint32)), Unit: u}
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
